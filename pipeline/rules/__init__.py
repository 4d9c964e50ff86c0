"""The rules every layer decides by, below the trainers that follow them.

request.py (what the flags asked for), hardware.py (the Hardware a backend
finds, and the GPU checks), cluster.py (who started the hosts),
placement.py (each process's GPUs, its host's reachable address),
probes.py (what this machine has, read without loading a framework),
precision.py (the policy rule), schedule.py (steps per execution and per
epoch), stopping.py (SIGTERM and Ctrl-C), validation.py (the config's
values), init_from.py (what a fine-tuning source may be), classes.py (a
run's class names against the data's), compile_cache.py (where compiled
programs are kept), saved_policy.py and measured.py (what the user
measured on a GPU model).
Imports pipeline.errors and storage/ only.
"""
