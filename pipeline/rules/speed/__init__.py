"""The choices that make a run fast: precision, measured policies and
backends, the compile cache, steps per execution."""
