"""The rules every layer decides by, below the trainers that follow them,
in three topics:

machine/ what this process runs on and beside: what the machine has, read
  without loading a framework (probes), the Hardware a backend finds
  (hardware), each device model's peak compute and bandwidth (peaks), who
  started the hosts (cluster), each process's GPUs and reachable address
  (placement), SIGTERM and Ctrl-C (stopping).
speed/ the choices that make it fast: the precision policy (precision),
  what the user measured on a GPU model (saved_policy, measured), where
  compiled programs are kept (compile_cache), steps per execution and per
  epoch (step_counts).
config/ what was asked and whether it can run: the flags (request), the
  config's values (validation, handed the tables of named parts by the
  plan), a run's class names against the data's (classes).

Imports pipeline.errors, pipeline.parts and storage/ only.
"""
