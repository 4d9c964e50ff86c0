"""The gs:// checkpoint commit protocol against a real GCS server on loopback."""

import gc
import os
import re
import threading
import time

import pytest
import tensorflow as tf

from pipeline.storage import checkpoint_format
from pipeline.storage import workdirs
from pipeline.storage.checkpoint_format import Format
from pipeline.storage.checkpoint import Checkpointer
from pipeline.storage.checkpoint import UploadError
from pipeline.errors import UserError

from conftest import tensorflow_files



def _checkpointer(url, staging, keep=2, timeout_s=60.0):
  workdir = workdirs.Workdir(url, str(staging), timeout_s=timeout_s)
  value = tf.Variable(0.0)
  return (Checkpointer(workdir, keep, True,
                       files=tensorflow_files(value=value)), value, workdir)


def test_commit_marker_last_newest_restored_old_pruned(emulator, tmp_path):
  url = 'gs://runs/protocol'
  saver, value, _ = _checkpointer(url, tmp_path / 'a')
  for step in (10, 20, 30):
    value.assign(float(step))
    saver.save(step)
  saver.wait()
  names = emulator.names('runs', 'protocol/checkpoints/')
  assert 'protocol/checkpoints/ckpt-30/COMMITTED' in names
  assert not any('ckpt-10/' in n for n in names)  # Only the newest 2 kept.
  # A fresh machine: empty staging, newest committed checkpoint restored.
  fresh, fresh_value, _ = _checkpointer(url, tmp_path / 'b')
  assert fresh.restore_latest() == 30 and float(fresh_value.numpy()) == 30.0
  # The uploads' threads are gone with their uploads, though the saver
  # lives on: the launcher's exit joins every thread that is not a daemon.
  assert not [t.name for t in threading.enumerate()
              if t.name.startswith('checkpoint-upload')]


def test_uncommitted_upload_is_ignored_and_cleaned(emulator, tmp_path):
  url = 'gs://runs/partial'
  saver, value, workdir = _checkpointer(url, tmp_path / 'a')
  value.assign(5.0)
  saver.save(5)
  saver.wait()
  # A crash mid-upload of step 9: its data file landed, its marker did not.
  half = tmp_path / 'half.data'
  half.write_bytes(b'partial bytes')
  workdir.remote.upload(str(half), 'checkpoints/ckpt-9/ckpt-9.index')
  fresh, fresh_value, _ = _checkpointer(url, tmp_path / 'b')
  assert fresh.restore_latest() == 5 and float(fresh_value.numpy()) == 5.0
  assert not any('ckpt-9' in n for n in emulator.names('runs', 'partial/'))


def test_persistent_outage_keeps_the_staged_copy_and_resumes(emulator,
                                                             tmp_path):
  url = 'gs://runs/outage'
  staging = tmp_path / 'staging'
  saver, value, workdir = _checkpointer(url, staging, timeout_s=3.0)
  value.assign(1.0)
  saver.save(1)
  saver.wait()
  emulator.stop()
  try:
    value.assign(2.0)
    saver.save(2)  # Does not wait for the network.
    with pytest.raises(UploadError, match=r'failed: .*kept in .*rerun'):
      saver.wait()
    # A synchronous publish (run.json, the log, metrics.json) in the same
    # outage: one UserError line naming the file and what to do.
    (staging / 'runs' / 'outage' / 'metrics.json').write_text('{}')
    with pytest.raises(UserError) as error:
      workdir.publish('metrics.json')
    assert re.fullmatch(
        r'uploading \S+/metrics.json to gs://runs/outage/metrics.json failed '
        r'after retrying for 3 s \(.*\); the staged copy is kept: rerun the '
        'same command once GCS is reachable', str(error.value)), error.value
  finally:
    emulator.start()
  assert os.listdir(staging / 'runs' / 'outage' / 'checkpoints' /
                    'uploading') == [
      'ckpt-2']
  # Network back: the same command finishes the upload, then restores it.
  again, again_value, _ = _checkpointer(url, staging)
  assert again.restore_latest() == 2 and float(again_value.numpy()) == 2.0
  assert 'outage/checkpoints/ckpt-2/COMMITTED' in emulator.names('runs')


def test_a_reader_of_a_gs_workdir_leaves_no_folder_behind(emulator, tmp_path):
  """launch.evaluate and init_from read a run as a worker that is not the
  chief: the checkpoint they fetch lives in a folder of their own, gone
  with the reader (left behind, every evaluation kept a whole checkpoint)."""
  saver, value, _ = _checkpointer('gs://runs/read', tmp_path / 'a')
  value.assign(7.0)
  saver.save(7)
  saver.wait()
  workdir = workdirs.Workdir('gs://runs/read', str(tmp_path / 'b'),
                            timeout_s=60.0)
  read = tf.Variable(0.0)
  reader = Checkpointer(workdir, 2, False, files=tensorflow_files(value=read))
  assert reader.restore_latest() == 7 and float(read.numpy()) == 7.0
  folder = reader.directory
  assert os.path.basename(folder).startswith('checkpoints-worker-')
  assert os.listdir(os.path.join(folder, 'restored', 'ckpt-7'))  # Fetched.
  del reader
  gc.collect()
  assert not os.path.exists(folder)


def test_missing_bucket_fails_preflight(emulator, tmp_path):
  from pipeline.errors import UserError  # pylint: disable=g-import-not-at-top
  workdir = workdirs.Workdir('gs://no-such-bucket/run', str(tmp_path))
  with pytest.raises(UserError, match=r"bucket 'no-such-bucket' does not exist"):
    workdir.check()


def test_local_io_device_saves_and_restores(tmp_path):
  """The TPU Node setting (files read and written by this host) round-trips.

  Only its plumbing can be checked here: no remote TPU host exists on this
  machine to prove the files would otherwise land there.
  """
  workdir = workdirs.Workdir(str(tmp_path / 'run'), str(tmp_path / 'staging'))
  value = tf.Variable(3.0)
  saver = Checkpointer(workdir, 2, True, files=tensorflow_files(
      io_device='/job:localhost', value=value))
  saver.save(7)
  saver.wait()
  value.assign(0.0)
  fresh = Checkpointer(workdir, 2, True, files=tensorflow_files(
      io_device='/job:localhost', value=value))
  assert fresh.restore_latest() == 7 and float(value.numpy()) == 3.0


def _truncate(path):
  with open(path, 'r+b') as f:
    f.truncate(os.path.getsize(path) // 2)


def test_damaged_newest_checkpoint_falls_back_to_an_older_one(tmp_path):
  """A truncated data file (full disk, partial copy): warn, restore the
  next older one, keep the damaged files; none restores: one line."""
  from pipeline.errors import UserError  # pylint: disable=g-import-not-at-top
  workdir = workdirs.Workdir(str(tmp_path / 'run'), str(tmp_path / 'staging'))
  value = tf.Variable(tf.zeros(1000))
  saver = Checkpointer(workdir, 3, True, files=tensorflow_files(value=value))
  for step in (1, 2, 3):
    value.assign(tf.fill([1000], float(step)))
    saver.save(step)
  folder = tmp_path / 'run' / 'checkpoints'
  _truncate(next(folder.glob('ckpt-3.data-*')))
  value.assign(tf.zeros(1000))
  fresh = Checkpointer(workdir, 3, True, files=tensorflow_files(value=value))
  assert fresh.restore_latest() == 2
  assert float(value[0]) == 2.0
  assert sorted(p.name.split('.')[0] for p in (folder / 'damaged').iterdir()
                ) == ['ckpt-3', 'ckpt-3']  # Index and data file, kept.
  assert not list(folder.glob('ckpt-3.*'))
  # Every remaining checkpoint damaged: one line naming them, nothing moved.
  for step in (1, 2):
    _truncate(next(folder.glob(f'ckpt-{step}.data-*')))
  with pytest.raises(UserError, match=r'no checkpoint of .* restores: '
                     r'.*ckpt-2, .*ckpt-1 are damaged'):
    Checkpointer(workdir, 3, True,
                 files=tensorflow_files(value=value)).restore_latest()


def test_damaged_committed_checkpoint_on_gcs_is_set_aside(emulator, tmp_path):
  url = 'gs://runs/damaged'
  saver, value, workdir = _checkpointer(url, tmp_path / 'a')
  for step in (10, 20):
    value.assign(float(step))
    saver.save(step)
  saver.wait()
  data = [n for n in emulator.names('runs', 'damaged/checkpoints/ckpt-20/')
          if '.data-' in n]
  workdir.remote.delete(data[0][len('damaged/'):])  # Deleted after its commit.
  fresh, fresh_value, _ = _checkpointer(url, tmp_path / 'b')
  assert fresh.restore_latest() == 10 and float(fresh_value.numpy()) == 10.0
  names = emulator.names('runs', 'damaged/checkpoints/ckpt-20/')
  assert 'damaged/checkpoints/ckpt-20/DAMAGED' in names
  assert 'damaged/checkpoints/ckpt-20/COMMITTED' not in names
  assert 'damaged/checkpoints/ckpt-20/ckpt-20.index' in names  # Kept.
  # The next start restores 10 directly and keeps the damaged objects.
  again, again_value, _ = _checkpointer(url, tmp_path / 'c')
  assert again.restore_latest() == 10 and float(again_value.numpy()) == 10.0
  assert 'damaged/checkpoints/ckpt-20/ckpt-20.index' in emulator.names(
      'runs', 'damaged/checkpoints/ckpt-20/')


def test_best_checkpoint_is_kept_when_accuracy_falls_late(tmp_path):
  """KeepBest fed the eval results a run would report: the best step's
  weights stay in their own series, beside a rolling one that prunes."""
  from pipeline.training import actions  # pylint: disable=g-import-not-at-top
  workdir = workdirs.Workdir(str(tmp_path / 'run'), str(tmp_path / 'staging'))
  value = tf.Variable(0.0)
  rolling = Checkpointer(workdir, 1, True, files=tensorflow_files(value=value))
  best = actions.KeepBest(
      'eval_accuracy', Checkpointer(workdir, 1, True,
                                    tensorflow_files(value=value),
                                    series='checkpoints_best'),
      workdir, True)
  for step, accuracy in ((4, 0.5), (8, 0.7), (12, 0.6), (16, 0.65)):
    value.assign(float(step))
    rolling.save(step)
    best(step, {'accuracy': accuracy, 'loss': 1.0})
  assert best.metrics() == {'best_metric': 'eval_accuracy', 'best_step': 8,
                            'best_value': 0.7}
  assert tf.train.latest_checkpoint(str(tmp_path / 'run' / 'checkpoints')
                                    ).endswith('ckpt-16')
  kept = Checkpointer(workdir, 1, True, tensorflow_files(value=value),
                      series='checkpoints_best')
  assert kept.restore_latest() == 8 and float(value.numpy()) == 8.0
  # A resumed run compares with the recorded best, not from scratch.
  again = actions.KeepBest('eval_accuracy', kept, workdir, True)
  again(20, {'accuracy': 0.69, 'loss': 0.1})
  assert again.metrics()['best_step'] == 8
  # For eval_loss lower is better.
  by_loss = actions.KeepBest('eval_loss', kept, workdir, True)
  by_loss.best = None
  by_loss(24, {'accuracy': 0.1, 'loss': 0.3})
  by_loss(28, {'accuracy': 0.1, 'loss': 0.4})
  assert by_loss.metrics()['best_step'] == 24


def test_export_with_the_tpu_node_io_device_loads(tmp_path):
  """The TPU Node setting reaches the SavedModel writer and the export
  loads; no remote TPU host exists here to show where files would land."""
  import keras  # pylint: disable=g-import-not-at-top
  import numpy as np  # pylint: disable=g-import-not-at-top
  from pipeline.reports import export  # pylint: disable=g-import-not-at-top
  images = keras.Input((8, 8, 3), dtype='uint8')
  logits = keras.layers.Dense(3)(keras.layers.Flatten()(
      keras.layers.Rescaling(1 / 255)(images)))
  workdir = workdirs.Workdir(str(tmp_path / 'run'), str(tmp_path / 'staging'))
  url = export.export_model(keras.Model(images, logits), workdir, True,
                            {'model': 'tiny'}, io_device='/job:localhost')
  loaded = tf.saved_model.load(url)
  probabilities = loaded.serve(np.zeros((2, 8, 8, 3), np.uint8)).numpy()
  np.testing.assert_allclose(probabilities.sum(-1), 1.0, rtol=1e-6)
  assert workdirs.read_json(os.path.join(url, 'metadata.json')) == {
      'model': 'tiny', 'tflite': None, 'onnx': None}


def test_sigterm_during_a_log_write_is_not_lost(tmp_path):
  """SIGTERM while the main thread is inside a write to its log stream (a
  full pipe: the write blocks, the signal interrupts it, and Python runs
  the handler in the middle of it). A handler that logged there failed as
  a reentrant write before setting its flag, and the run trained on to
  its end; this one still stops at the next boundary with a checkpoint."""
  import logging as std_logging  # pylint: disable=g-import-not-at-top
  import signal  # pylint: disable=g-import-not-at-top
  import sys  # pylint: disable=g-import-not-at-top
  import threading  # pylint: disable=g-import-not-at-top
  from absl import logging  # pylint: disable=g-import-not-at-top
  from pipeline.training import actions  # pylint: disable=g-import-not-at-top
  from pipeline.training import preemption as preemption_lib  # pylint: disable=g-import-not-at-top
  from pipeline.rules.machine import stopping  # pylint: disable=g-import-not-at-top

  workdir = workdirs.Workdir(str(tmp_path / 'run'), str(tmp_path / 'staging'))
  value = tf.Variable(1.0)
  save_on_stop = preemption_lib.SaveOnStop(
      Checkpointer(workdir, 1, True, tensorflow_files(value=value)), workdir)
  read_end, write_end = os.pipe()
  stream = os.fdopen(write_end, 'w', buffering=1)  # As the launchers' is.
  log_to_pipe = std_logging.StreamHandler(stream)
  logging.get_absl_logger().addHandler(log_to_pipe)

  def signal_then_drain():
    time.sleep(1.0)  # The main thread is blocked in its write by now.
    signal.pthread_kill(threading.main_thread().ident, signal.SIGTERM)
    while os.read(read_end, 1 << 16):
      pass

  previous = signal.getsignal(signal.SIGTERM)
  with stopping.armed():
    drainer = threading.Thread(target=signal_then_drain)
    drainer.start()
    real_stderr, sys.stderr = sys.stderr, stream  # Where logging's errors go.
    try:
      start = time.time()
      for _ in range(20_000):  # Far more than a pipe holds.
        logging.warning('a line of the run')
      assert time.time() - start > 0.9  # It blocked until the drain.
    finally:
      sys.stderr = real_stderr
      logging.get_absl_logger().removeHandler(log_to_pipe)
      stream.close()
      drainer.join()
      os.close(read_end)
    assert stopping.requested() == signal.SIGTERM
    with pytest.raises(stopping.Stopped,
                       match='preempted: SIGTERM: checkpoint of step 8 '
                       'committed') as stopped:
      save_on_stop(actions.Execution(4, 8, 100, 1.0, {}))
  assert stopped.value.exit_status == 143
  assert tf.train.latest_checkpoint(str(tmp_path / 'run' / 'checkpoints')
                                    ).endswith('ckpt-8')
  assert signal.getsignal(signal.SIGTERM) == previous


@pytest.mark.parametrize('written_as', list(Format))
def test_a_run_json_naming_no_format_is_read_by_its_files(tmp_path,
                                                          written_as):
  """A run.json from before it named its checkpoint format: the reader
  goes by the files, either format's, into a model built anew."""
  import keras  # pylint: disable=g-import-not-at-top
  from pipeline.storage import checkpoint_files  # pylint: disable=g-import-not-at-top

  def model(seed):
    keras.utils.set_random_seed(seed)
    inputs = keras.Input((3,))
    return keras.Model(inputs, keras.layers.Dense(2)(inputs))

  saved, step = model(1), checkpoint_files.Variables('step', shapes=[()],
                                                     dtype='int32')
  step.values[0].assign(7)
  folder = str(tmp_path / 'checkpoints')
  if written_as is Format.KERAS_WEIGHTS:
    checkpoint_files.KerasFiles({'model': saved, 'step': step}, folder,
                                1).save(7)
  else:
    checkpoint_files.TensorFlowFiles(
        {'model': saved, 'step': step.values[0]}, folder, 1).save(7)
  assert checkpoint_format.of_run({'backend': 'any'}) is None
  read, read_step = model(2), checkpoint_files.Variables(
      'step', shapes=[()], dtype='int32')
  files = checkpoint_files.reader(None, {'model': read, 'step': read_step},
                                  folder, read_only='read only')
  assert files.restore(files.latest()) == []
  assert int(read_step.values[0].numpy()) == 7
  for ours, theirs in zip(read.get_weights(), saved.get_weights()):
    assert (ours == theirs).all()
  with pytest.raises(UserError, match='read only'):
    files.save(8)


def test_a_run_json_names_its_format_and_a_wrong_name_is_one_line():
  assert checkpoint_format.of_run(
      {'checkpoint_format': 'keras .weights.h5'}) is Format.KERAS_WEIGHTS
  with pytest.raises(ValueError, match="'orbax' is none of "
                     "'tf.train.Checkpoint', 'keras .weights.h5'"):
    checkpoint_format.of_run({'checkpoint_format': 'orbax'})
