"""What both backends compile: the network, its optimizer, loss and average.

models/ (each family of networks, with a float32 head), layers.py (the
layer forms: the one-pass batch norm, squeeze-excite as matrix products,
the depthwise convolution in float32), optimizers.py and schedules.py,
objective.py (loss, labels, L2, evaluation counts), moving_average.py
(the average's rule), progressive.py (progressive learning's stages),
finetune.py (a start from published or another run's weights). Everything here that runs inside a
compiled step is keras.ops, never TensorFlow: JAX traces it too. Imports
pipeline.parts, pipeline.errors, rules/ and storage/ (fine-tuning reads
checkpoints) only.
"""


def tables():
  """The recipe's tables of named parts (pipeline/parts.py): models,
  optimizers, schedules, and the layer forms."""
  # Here, not at the top: `import pipeline.recipe.x` need not build these.
  from pipeline.recipe import layers, models, optimizers, schedules  # pylint: disable=g-import-not-at-top
  return (models.MODELS, optimizers.OPTIMIZERS, schedules.SCHEDULES,
          *layers.FORM_TABLES)
