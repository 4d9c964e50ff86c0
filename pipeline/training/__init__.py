"""What training is, on any backend, and the loop that runs it.

The rules both backends follow: models.py (the networks), optimizers.py
(optimizers and learning-rate schedules), objective.py (loss, labels, L2,
evaluation counts), moving_average.py (the average's rule), finetune.py
(a new run's first weights). The loop: loop.py (train_and_evaluate, one
screen), actions.py (periodic work after each execution), progress.py
(lines, bars, TensorBoard), preemption.py (saving on SIGTERM or Ctrl-C).
The loop reaches the backend only through plan.backend and its Trainer
(backends/interface.py). Imports errors, storage/, data/, run/'s process
settings (console, stopping, validation) and the backends package's
choice, never a backend package.
"""
