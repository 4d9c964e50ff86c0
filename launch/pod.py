"""Train on every worker of a Cloud TPU VM slice from one command.

  python -m launch.pod --tpu=my-v5e-32 --zone=us-west4-a -- \\
      --workdir=gs://BUCKET/run --config=configs/imagenet.py

Run with gcloud signed in, where the session can stay connected (tmux, or
a small VM): a dropped connection is followed again, and where it cannot
be the trainers go on and the launcher says how to follow them. The
arguments after
`--` go to `python -m launch.train` on each worker, started in --repo_dir
(a checkout with the TPU requirements installed on every worker). Earlier
runs still holding a worker's TPU are ended first; worker 0's lines are
shown, every worker's are in --worker_logs. See pipeline/run/pod_slice.py.
"""

import os
import sys
import time

from pipeline.rules.machine import stopping

stopping.install()

# pylint: disable=g-import-not-at-top,wrong-import-position
from absl import app
from absl import flags

from pipeline.errors import UserError
from pipeline.run import pod_slice

_TPU = flags.DEFINE_string('tpu', None, 'The TPU VM slice\'s name.',
                           required=True)
_ZONE = flags.DEFINE_string('zone', None, 'Its zone.', required=True)
_PROJECT = flags.DEFINE_string('project', '', 'Its project (default: '
                               "gcloud's).")
_REPO_DIR = flags.DEFINE_string(
    'repo_dir', '~/pipeline', 'This repository\'s checkout on every worker.')
_PYTHON = flags.DEFINE_string(
    'python', 'python3', 'The Python on the workers that has the TPU '
    'requirements installed (a virtual environment\'s bin/python).')
_LOGS = flags.DEFINE_string(
    'worker_logs', '', 'Where each worker\'s log is written (default: '
    'pod_logs/TPU-TIME).')

_RECONNECT_WAIT_S = flags.DEFINE_float(
    'reconnect_wait_s', 10, 'After a dropped connection to a worker (ssh '
    'exit 255), how long to wait before following its trainer again.')
_HEALTHY_S = flags.DEFINE_float(
    'healthy_s', 300, 'A connection to a worker that stayed up this long '
    'starts the count of dropped connections again (3 in a row give up).')
_STOP_WAIT_S = flags.DEFINE_float(
    'stop_wait_s', 300, 'Once a worker fails, how long the others get to '
    'commit a checkpoint after SIGTERM before SIGKILL.')


def main(argv):
  train_args = argv[1:]
  log_dir = _LOGS.value or os.path.join(
      'pod_logs', f'{_TPU.value}-{time.strftime("%Y%m%d-%H%M%S")}')
  try:
    status = pod_slice.run(
        pod_slice.Slice(_TPU.value, _ZONE.value, _PROJECT.value),
        _REPO_DIR.value, _PYTHON.value, train_args, log_dir,
        _STOP_WAIT_S.value, reconnect_wait_s=_RECONNECT_WAIT_S.value,
        healthy_s=_HEALTHY_S.value)
  except UserError as e:
    sys.exit(f'error: {e}')
  sys.exit(status)


if __name__ == '__main__':
  app.run(main)
