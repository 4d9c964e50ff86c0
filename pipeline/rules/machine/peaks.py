"""How close a run is to its device's limits: peak compute and memory
bandwidth per device model, and the fractions a benchmark or the probe
reached.

Dense figures (no structured sparsity) per device as JAX and TensorFlow
count devices: a GPU, a TPU chip (v4 on: one device per chip) or core (v2,
v3: two devices per chip). 16-bit is the tensor units' bfloat16/float16
rate; float32 the plain float32 rate (TensorFlow and JAX may run float32
matrix products as TF32 on Ampere and later, which is faster: a float32
fraction can pass 1 there). Sources: NVIDIA's datasheets for each card,
Google Cloud's TPU system architecture pages (November 2026).
"""

import re

# (device name pattern, 16-bit FLOP/s, float32 FLOP/s or None, bytes/s,
# source); the first match wins.
PEAKS = (
    # GH200 before H200 and H100: its name holds 'H200', its GPU is an H100
    # with HBM3 (96 GB) or HBM3e (144 GB).
    (r'GH200.*144', 989e12, 67e12, 4.9e12,
     'NVIDIA GH200 datasheet (144GB HBM3e)'),
    (r'GH200', 989e12, 67e12, 4.0e12, 'NVIDIA GH200 datasheet (96GB HBM3)'),
    (r'H200', 989e12, 67e12, 4.8e12, 'NVIDIA H200 datasheet (SXM)'),
    (r'H100.*NVL', 835e12, 60e12, 3.9e12, 'NVIDIA H100 datasheet (NVL)'),
    (r'H100.*PCIe', 756e12, 51e12, 2.0e12, 'NVIDIA H100 datasheet (PCIe)'),
    (r'H100', 989e12, 67e12, 3.35e12, 'NVIDIA H100 datasheet (SXM)'),
    (r'A100.*80GB', 312e12, 19.5e12, 2.039e12,
     'NVIDIA A100 datasheet (80GB SXM)'),
    (r'A100', 312e12, 19.5e12, 1.555e12, 'NVIDIA A100 datasheet (40GB)'),
    (r'\bL4\b', 121e12, 30.3e12, 0.3e12, 'NVIDIA L4 datasheet'),
    (r'V100', 125e12, 15.7e12, 0.9e12, 'NVIDIA V100 datasheet (SXM2)'),
    (r'\bT4\b', 65e12, 8.1e12, 0.32e12, 'NVIDIA T4 datasheet'),
    (r'TPU v6 lite', 918e12, None, 1.64e12, 'Cloud TPU v6e (Trillium) docs'),
    (r'TPU v5 lite', 197e12, None, 0.819e12, 'Cloud TPU v5e docs'),
    (r'TPU v5', 459e12, None, 2.765e12, 'Cloud TPU v5p docs'),
    (r'TPU v4', 275e12, None, 1.2e12, 'Cloud TPU v4 docs'),
    (r'TPU v3', 61.5e12, None, 0.45e12, 'Cloud TPU v3 docs (per core)'),
    (r'TPU v2', 22.5e12, None, 0.3e12, 'Cloud TPU v2 docs (per core)'),
)


def peak(device_name, sixteen_bit):
  """(FLOP/s, bytes/s, source) of one device named `device_name` at the
  policy's precision, or None where the table has no figure."""
  for pattern, half, single, bandwidth, source in PEAKS:
    if re.search(pattern, device_name or ''):
      flops = half if sixteen_bit else single
      return (flops, bandwidth, source) if flops else None
  return None


def fractions(cost, images_per_sec, device_name, devices, sixteen_bit):
  """The run's share of its devices' peak compute and bandwidth, from the
  step's `cost` per image (Trainer.step_cost) at `images_per_sec`; with the
  achieved rates. Keys absent where the table or the cost has no figure."""
  result = {}
  if 'flops' not in cost:
    return result
  result['achieved_flops_per_sec'] = cost['flops'] * images_per_sec
  result['achieved_bytes_per_sec'] = cost['bytes'] * images_per_sec
  found = peak(device_name, sixteen_bit)
  if found:
    flops, bandwidth, source = found
    result.update(
        peak_flops_per_sec=flops * devices,
        peak_bytes_per_sec=bandwidth * devices, peak_source=source,
        fraction_of_peak_flops=result['achieved_flops_per_sec'] / (
            flops * devices),
        fraction_of_peak_bandwidth=result['achieved_bytes_per_sec'] / (
            bandwidth * devices))
  return result
