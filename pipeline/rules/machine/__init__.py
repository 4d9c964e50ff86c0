"""What this process runs on and beside: the machine (hardware.py,
probes.py), the cluster (cluster.py, slurm_variables.py), the GPUs it
takes (placement.py), the signals that stop it (stopping.py), and each
device model's peak compute and memory bandwidth (peaks.py)."""
