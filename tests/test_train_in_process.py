"""The library's train_and_evaluate, called in this process on a tiny run.

As the Flax ImageNet example's train_test.py does: no launcher, no child
process; the plan is resolved from a config and a Request, the run trains,
checkpoints, evaluates and exports, and the returned metrics are checked.
A periodic action plugged in from outside sees every execution.
"""

import os

import tensorflow as tf

from configs import default
from pipeline import devices
from pipeline import plan as plan_lib
from pipeline import storage
from pipeline import train


def test_train_and_evaluate_in_process(tmp_path, tfds_dir):
  config = default.get_config()
  config.update(data_dir=tfds_dir, train_split='train[:128]',
                eval_split='test[:64]', global_batch_size=32, epochs=2,
                steps_per_execution=2, log_every_steps=2, eval_every_epochs=1,
                checkpoint_every_steps=3)
  workdir = str(tmp_path / 'run')
  hardware = devices.Hardware(tf.distribute.get_strategy(), 'CPU',
                              detail='host CPU')
  plan = plan_lib.resolve(config, plan_lib.Request(workdir=workdir), hardware)
  assert (plan.steps_per_epoch, plan.total_steps) == (4, 8)
  assert plan.policy == 'float32' and plan.steps_per_execution == 2

  executions = []
  metrics = train.train_and_evaluate(
      config, plan, extra_actions=[lambda e: executions.append(
          (e.first_step, e.step, e.is_last, sorted(e.outputs)))])

  # The plugged-in action ran once per execution, after the built-in ones.
  outputs = ['accuracy', 'input_wait_s', 'loss']
  assert executions == [(0, 2, False, outputs), (2, 4, False, outputs),
                        (4, 6, False, outputs), (6, 8, True, outputs)]
  assert metrics['initial_step'] == 0 and metrics['train_steps'] == 8
  assert metrics['strategy'] == 'DefaultStrategy'
  assert metrics['eval_examples'] == 64
  assert 0.0 <= metrics['eval_accuracy'] <= 1.0
  assert metrics['eval_loss'] > 0 and metrics['train_images_per_sec'] > 0
  assert metrics['weights_sha256'] != metrics['initial_weights_sha256']
  assert metrics['export_dir'] == f'{workdir}/export'
  assert os.path.exists(os.path.join(workdir, 'export', 'saved_model.pb'))
  # Checkpoints at the multiples of 3 the executions crossed, and the end.
  state = tf.train.get_checkpoint_state(os.path.join(workdir, 'checkpoints'))
  assert [int(p.rsplit('-', 1)[1]) for p in
          state.all_model_checkpoint_paths] == [4, 6, 8]
  # run.json is the plan written out; metrics.json what was returned.
  run = storage.read_json(os.path.join(workdir, 'run.json'))
  assert run['resolved'] == plan.to_json()
  assert run['resolved']['steps_per_epoch'] == 4
  assert storage.read_json(os.path.join(workdir, 'metrics.json')) == metrics
