"""FLOPs and bytes per image of one training step, counted from the
program before XLA optimises it: what both backends' step_cost report.

Why before optimising: compiled for a GPU, XLA's cost analysis counts each
custom call (cuDNN's convolutions, cuBLAS' products: nearly all of
EfficientNet's work) as -1 FLOP (jax#16008, jax#17912), and JAX's PJRT
plugins (CUDA, libtpu) analyse nothing before compiling; compiled for this
CPU, each backend's program is rewritten differently (XLA's CPU backend
computes a depthwise filter gradient as a dense convolution). The HLO
before optimisation is the arithmetic as the framework wrote it, the same
on every device, so each backend's forward and backward pass of one
micro-batch counts the same work. Bytes are counted before fusion: an
upper bound on what the device moves. jaxlib's cost analysis on JAX's CPU
client reads it (TensorFlow has none in Python).
"""

from pipeline.errors import first_line

COUNTED = ("one micro-batch's forward and backward pass, counted from the "
           "unoptimized program (XLA's CPU cost model; bytes before fusion)")


def per_image(hlo_text, examples, cpu_client):
  """{'flops', 'bytes', 'counted'} per image of the HLO module that
  `hlo_text()` writes, for `examples` images, read on `cpu_client` (a
  JAX CPU client); {'reason': why not}, never an exception."""
  try:
    # Private, as no public API of JAX analyses an HLO module it did not
    # compile (TensorFlow's, or one before optimisation).
    from jax._src.lib import xla_client  # pylint: disable=g-import-not-at-top
    from jaxlib import _hlo  # pylint: disable=g-import-not-at-top
  except ImportError:
    return {'reason': "XLA's cost analysis is read through jaxlib, which is "
                      'not installed here (requirements-gpu.txt has it)'}
  try:
    analysis = xla_client._xla.hlo_module_cost_analysis(  # pylint: disable=protected-access
        cpu_client(), _hlo.hlo_module_from_text(hlo_text()))
    flops, accessed = analysis['flops'], analysis['bytes accessed']
  except Exception as e:  # pylint: disable=broad-except
    return {'reason': 'XLA could not analyse the step here '
                      f'({type(e).__name__}: {first_line(e)})'}
  return {'flops': flops / examples, 'bytes': accessed / examples,
          'counted': COUNTED}
