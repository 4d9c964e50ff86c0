"""The loop that trains a resolved run, on any backend.

loop.py (train_and_evaluate, one screen), actions.py (periodic work after
each execution), progress.py (lines, bars, TensorBoard), preemption.py
(saving on SIGTERM or Ctrl-C), stages.py (progressive learning's stage
changes), tracking.py (MLflow and Weights & Biases); a new run's first
weights are
recipe/finetune.py's.
The loop reaches the backend only through plan.backend and its Trainer
(backends/interface.py); it writes its reports through reports/.
"""
