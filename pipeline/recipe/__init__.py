"""What both backends compile: the network, its optimizer, loss and average.

models.py (the EfficientNets with a float32 head), optimizers.py
(optimizers and learning-rate schedules), objective.py (loss, labels, L2,
evaluation counts), moving_average.py (the average's rule). Everything
here that runs inside a compiled step is keras.ops, never TensorFlow: JAX
traces it too. Imports pipeline.errors and rules/ only.
"""
