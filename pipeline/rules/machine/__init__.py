"""What this process runs on and beside: the machine, the cluster, the
GPUs it takes, and the signals that stop it."""
