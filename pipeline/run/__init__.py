"""One run, resolved once, and the process around it.

plan.py (the frozen Plan and `resolve`, the one place that chooses: backend,
hardware, precision, XLA, input, cache, workdir), environment.py (what must
happen before TensorFlow or JAX load: the backend, the compile cache,
native stderr), console.py (lines and the log file), left_open.py (what
the data choose for the keys a config leaves open), plan_lines.py (the
plan described), run_workdir.py (a rerun's identity and accepted
changes), config_file.py (--print_config), pod_slice.py and
pod_commands.py (a TPU slice's workers). Imports everything
below it: rules/, recipe/, backends/, data/, storage/.
"""
