"""The rules every layer decides by, below the trainers that follow them,
in three topics:

machine/ what this process runs on and beside: what the machine has, read
  without loading a framework (probes), the Hardware a backend finds
  (hardware), who started the hosts (cluster), each process's GPUs and
  reachable address (placement), SIGTERM and Ctrl-C (stopping).
speed/ the choices that make it fast: the precision policy (precision),
  what the user measured on a GPU model (saved_policy, measured), where
  compiled programs are kept (compile_cache), steps per execution and per
  epoch (schedule).
config/ what was asked and whether it can run: the flags (request), the
  config's values (validation), what a fine-tuning source may be
  (init_from), a run's class names against the data's (classes).

Imports pipeline.errors and storage/ only.
"""
