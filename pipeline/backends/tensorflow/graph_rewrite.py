"""--policy=rewrite: TensorFlow's automatic mixed precision, a grappler pass
over the compiled graph (rules/speed/precision.py holds what it computes in)."""

import tensorflow as tf

from pipeline.errors import UserError
from pipeline.rules.speed.precision import REWRITE_OPTIONS
from pipeline.rules.speed.precision import graph_rewrite_dtype


def onednn_enabled():
  """True if this process's TensorFlow runs oneDNN kernels and rewrites."""
  # pylint: disable-next=g-import-not-at-top
  from tensorflow.python.util import _pywrap_util_port
  return _pywrap_util_port.IsMklEnabled()


def enable_graph_rewrite(device_kind):
  """Turns on grappler's automatic mixed precision for functions run later.

  Process-global, like the Keras policy: every tf.function executed after
  this call is rewritten (functions compiled with XLA are not: grappler does
  not run on them). Returns the dtype the rewrite computes in.
  """
  dtype = graph_rewrite_dtype(device_kind)  # A one-line error on a TPU.
  option = REWRITE_OPTIONS[device_kind][0]
  if device_kind == 'CPU' and not onednn_enabled():
    # TensorFlow reads TF_ENABLE_ONEDNN_OPTS once, when it loads, and leaves
    # oneDNN off on CPUs without AVX-512; the bfloat16 rewrite is oneDNN's.
    raise UserError('--policy=rewrite on CPU needs oneDNN, which is off in '
                    'this process; unset TF_ENABLE_ONEDNN_OPTS=0 or start '
                    'with TF_ENABLE_ONEDNN_OPTS=1')
  tf.config.optimizer.set_experimental_options({option: True})
  return dtype
