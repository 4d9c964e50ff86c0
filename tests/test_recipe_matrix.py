"""Every shipped config and every recipe option builds its programs on the
backend of this environment.

Each config of configs/ with its data swapped for the bundled digits at
32 px, and each recipe option on the default config: optimizers and
schedules, moving average, L2, label smoothing, mixup and CutMix,
RandAugment, accumulation, a V2 model, ResNet-50, Keras' own batch norm and
squeeze-excite forms, float16 and bfloat16, fine-tuning
from a weights file (backbone frozen first). The run is resolved and built
as launch.train does, a real batch of its input taken, and every program
the run compiles is traced with that batch's shapes:

- on JAX (CI's JAX environment) each program is lowered: a TensorFlow op in
  what JAX traces (a schedule, a loss) fails there, before XLA compiles,
  so a case costs seconds where a compile costs a minute on this CPU;
- on TensorFlow each tf.function is traced (about 25 s a case here): in the
  slow tier, the shipped configs and the options whose programs differ on
  TensorFlow alone (float16's loss scaling, a frozen phase); the others
  are trained on TensorFlow by test_recipe.py and the end-to-end tests,
  and a TensorFlow op in them fails on JAX, not here. Every case traces
  on one replica, since
  MirroredStrategy traces a step once for each replica (twice the time),
  and replicas are what test_recipe.py's mirrored cases and the end-to-end
  runs test.

A whole run of configs/imagenet.py on JAX is BUILD_NOTES.md's command.
"""

import importlib
import os

import keras
import pytest

from configs import default
from pipeline.data import inputs
from pipeline.run import plan as plan_lib
from pipeline.rules.config import request as request_lib
from pipeline.recipe import finetune

ON_JAX = keras.backend.backend() == 'jax'
CONFIGS = sorted(name[:-3] for name in os.listdir(
    os.path.join(os.path.dirname(__file__), '..', 'configs'))
                 if name.endswith('.py') and name != '__init__.py')
# The options run on B0's code at a fraction of its size (the option is what
# is tested; the shipped configs and the V2 model keep their networks, and
# fine-tuning B0's weights file needs B0).
TINY = dict(model='efficientnet_tiny')
OPTIONS = {
    'sgd': dict(optimizer='sgd'),
    'rmsprop_exponential': dict(optimizer='rmsprop', lr_schedule='exponential'),
    'moving_average': dict(ema_decay=0.99),
    'l2_and_label_smoothing': dict(l2_weight_decay=1e-4, label_smoothing=0.1),
    'mixup_and_cutmix': dict(mixup_alpha=0.2, cutmix_alpha=1.0),
    'randaugment': dict(augment='inception_randaugment'),
    'accumulation': dict(gradient_accumulation_steps=2),
    'v2_model': dict(model='efficientnetv2_b0'),
    'resnet50': dict(model='resnet50'),
    'keras_layer_forms': dict(batch_norm='keras', squeeze_excite='conv'),
    'float16': dict(policy='mixed_float16'),
    'bfloat16': dict(policy='mixed_bfloat16'),
    'finetune_from_a_file': dict(init_from='WEIGHTS',
                                 freeze_backbone_epochs=1.0, epochs=2),
}
# On TensorFlow each case traces for about 25 s: the slow tier, and the
# options whose TensorFlow programs differ (see the docstring).
_TIER = [] if ON_JAX else [pytest.mark.slow]
TENSORFLOW_OPTIONS = ('float16', 'finetune_from_a_file')


def _digits(config, tfds_dir):
  """`config` with its data swapped for the digits at 32 px."""
  config.update(dataset='sklearn_digits', data_dir=tfds_dir, image_size=32,
                num_classes=10, global_batch_size=16,
                train_split='train[:64]', eval_split='test[:32]',
                steps_per_execution=2, data_service='', cache='memory')
  if config.init_from:  # The ImageNet weights need the network.
    config.init_from = 'WEIGHTS'
  return config


def _cases():
  for name in CONFIGS:
    yield pytest.param(name, {}, id=f'configs/{name}.py', marks=_TIER)
  for name, fields in OPTIONS.items():
    if not (ON_JAX or name in TENSORFLOW_OPTIONS):
      continue
    network = ({} if name in ('v2_model', 'resnet50', 'finetune_from_a_file')
               else TINY)
    yield pytest.param('default', dict(network, **fields), id=name,
                       marks=_TIER)


@pytest.fixture(scope='module')
def weights_file(tmp_path_factory):
  """A headless B0's weights at 32 px, as a downloaded .h5 would hold."""
  path = str(tmp_path_factory.mktemp('weights') / 'b0_notop.weights.h5')
  config = _digits(default.get_config(), '')
  keras.utils.set_random_seed(1)
  finetune.headless(finetune.FineTuning.of(config), None).save_weights(
      path)
  return path


@pytest.mark.parametrize('config_name, fields', _cases())
def test_every_program_of_the_run_traces(config_name, fields, tfds_dir,
                                         weights_file):
  config = _digits(importlib.import_module(f'configs.{config_name}')
                   .get_config(), tfds_dir)
  fields = dict(fields)
  policy = fields.pop('policy', 'float32')
  config.update(fields)
  if config.init_from == 'WEIGHTS':
    config.init_from = weights_file
  one_replica = None
  if not ON_JAX:  # See the docstring.
    from pipeline.rules.machine import hardware  # pylint: disable=g-import-not-at-top
    import tensorflow as tf  # pylint: disable=g-import-not-at-top
    one_replica = hardware.Hardware(tf.distribute.get_strategy(), 'CPU',
                                    detail='host CPU')
  plan = plan_lib.resolve(config, request_lib.Request(policy=policy),
                          one_replica)
  trainer = plan.backend.build_trainer(plan)
  if config.init_from:
    finetune.load_init_from(finetune.FineTuning.of(config), trainer.model,
                            (), '')  # A weights file.
    trainer.read_back()
  train = iter(plan.backend.distribute(plan.hardware, inputs.train_input(plan)))
  evaluation = iter(plan.backend.distribute(plan.hardware,
                                            inputs.eval_input(plan)))
  traced = (_lowered_on_jax if ON_JAX else _traced_on_tensorflow)(
      trainer, train, evaluation)
  assert traced == ['train', 'evaluate'] + (
      ['train with the backbone frozen'] if plan.frozen_steps else [])


def _lowered_on_jax(trainer, train, evaluation):
  """Lowers the trainer's programs (a tracing error raises here)."""
  strategy = trainer.strategy
  images, labels = strategy.to_devices(tuple(next(train)[:2]))
  programs = [('train', trainer.train_step)]
  if trainer.frozen_step:
    programs.append(('train with the backbone frozen', trainer.frozen_step))
  done = []
  for name, program in programs:
    program.lower(trainer.state, images, labels)
    done.append(name)
  trainer.eval_program.lower(trainer.state.trainable,
                             trainer.state.non_trainable,
                             *strategy.to_devices(next(evaluation)))
  done.insert(1, 'evaluate')
  return done


def _traced_on_tensorflow(trainer, train, evaluation):
  """Traces the trainer's tf.functions (a graph error raises here)."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  done = []
  trainer.train_fn.get_concrete_function(train, tf.constant(1))
  done.append('train')
  trainer.eval_fn.get_concrete_function(evaluation, tf.constant(1))
  done.append('evaluate')
  if trainer.frozen_train_fn:
    trainer.frozen_train_fn.get_concrete_function(train, tf.constant(1))
    done.append('train with the backbone frozen')
  return done
