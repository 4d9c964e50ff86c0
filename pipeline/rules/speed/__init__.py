"""The choices that make a run fast: precision (precision.py), measured
policies and backends (saved_policy.py), the rate launch.probe saved
(saved_rate.py), XLA's saved autotune picks (autotune.py), the compile
cache (compile_cache.py), steps and examples per epoch (step_counts.py)."""
