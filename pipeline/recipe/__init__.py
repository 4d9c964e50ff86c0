"""What both backends compile: the network, its optimizer, loss and average.

models.py (the EfficientNets with a float32 head), optimizers.py
(optimizers and learning-rate schedules), objective.py (loss, labels, L2,
evaluation counts), moving_average.py (the average's rule). Everything
here that runs inside a compiled step is keras.ops, never TensorFlow: JAX
traces it too. Imports pipeline.errors and rules/ only.
"""


def choices():
  """{config key: the names it accepts} for the recipe's named parts, for
  rules/config/validation.py (which cannot import this floor): a model,
  optimizer or schedule added to its module's table is accepted from then on."""
  # Here, not at the top: `import pipeline.recipe.x` need not build these.
  from pipeline.recipe import layers, models, optimizers  # pylint: disable=g-import-not-at-top
  return {'model': tuple(models.MODELS),
          'batch_norm': tuple(layers.BATCH_NORMS),
          'squeeze_excite': tuple(layers.SQUEEZE_EXCITES),
          'optimizer': tuple(optimizers.OPTIMIZERS),
          'lr_schedule': tuple(optimizers.SCHEDULES)}
