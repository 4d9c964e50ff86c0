"""launch.probe: what the JAX route does on whatever accelerator JAX sees,
measured in a few minutes with nothing but JAX and Keras (no TensorFlow),
beside Keras' own model. A tool that uses the JAX backend's programs, not
a part of the backend:

  runner.py        the probe: its stages in order within a budget, and
                   what it saves for this card (the policy, the rate)
  stages.py        each stage's measurement
  variants.py      the same step with config keys, the policy or XLA's
                   flags changed, timed against the baseline
  repeats.py       stage (a) in fresh processes: the spread between them
  step_profile.py  a compiled step's instructions in kernel classes, and
                   the bytes it moves
  kernel_times.py  a trace's kernels in those classes, per step
  picks.py         XLA's saved autotune picks: which a process loaded
  gpu_call.py      launch.gpu_call's parts for a lent GPU, in one budget;
                   call_parts.py how each runs, call_summary.py what
                   their records show
"""
