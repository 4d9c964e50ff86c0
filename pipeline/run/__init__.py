"""One run, resolved once: the request, the plan, and the process around it.

request.py (what the flags asked for), plan.py (the frozen Plan and
`resolve`, the one place that chooses), hardware.py (the Hardware a backend
finds), precision.py (the policy rule), schedule.py (steps per execution
and per epoch), validation.py (the config's values), saved_policy.py
(measured policies per GPU), compile_cache.py (persistent compile caches),
environment.py (what must happen before TensorFlow or JAX load), console.py
(lines and log file), stopping.py (SIGTERM and Ctrl-C). Imports errors,
storage/, data/, training/ (models, finetune) and the backends package's
choice, never a backend package.
"""
