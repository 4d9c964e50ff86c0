"""What this process runs on and beside: the machine, the cluster, the
GPUs it takes, the signals that stop it, and each device model's peak
compute and memory bandwidth (peaks.py)."""
