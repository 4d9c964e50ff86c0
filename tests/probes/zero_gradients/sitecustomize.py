"""Multiplies every gradient by zero before Keras' optimizers apply it.

Patched in from outside the library, for a run of the suite:
  PYTHONPATH=tests/probes/zero_gradients python -m pytest -q ...
Installs an import hook, so Keras loads as usual and only its
BaseOptimizer.apply (what AdamW, SGD, RMSprop and LossScaleOptimizer's inner
optimizer run) changes. The loss-scale check still sees the real gradients.
"""
import importlib.abc
import importlib.machinery
import sys

_TARGET = 'keras.src.optimizers.base_optimizer'


def _patch(module):
  original = module.BaseOptimizer.apply

  def apply(self, grads, trainable_variables=None):
    grads = [None if g is None else g * 0 for g in grads]
    return original(self, grads, trainable_variables)

  module.BaseOptimizer.apply = apply
  print('zero_gradients: BaseOptimizer.apply multiplies gradients by 0',
        file=sys.stderr)


class _Hook(importlib.abc.MetaPathFinder):

  def find_spec(self, name, path, target=None):
    if name != _TARGET:
      return None
    sys.meta_path.remove(self)
    spec = importlib.machinery.PathFinder.find_spec(name, path)
    run = spec.loader.exec_module

    def exec_module(module):
      run(module)
      _patch(module)

    spec.loader.exec_module = exec_module
    return spec


sys.meta_path.insert(0, _Hook())
