"""One run, resolved once, and the process around it.

plan.py (the frozen Plan and `resolve`, the one place that chooses: backend,
hardware, precision, XLA, input, cache, workdir), environment.py (what must
happen before TensorFlow or JAX load: the backend, the compile cache,
native stderr), console.py (lines and the log file). Imports everything
below it: rules/, recipe/, backends/, data/, storage/.
"""
