"""Start a tf.data service dispatcher or worker for --config.data_service.

  # On one CPU machine:
  python -m launch.data_service --role=dispatcher --port=5050
  # On each input machine (reaching the data: gs:// or a shared path):
  python -m launch.data_service --role=worker --port=5051 \
      --dispatcher=DISPATCHER_HOST:5050 --host=$(hostname)
  # The trainers:
  python -m launch.train --config.data_service=grpc://DISPATCHER_HOST:5050 ...

Runs until stopped (Ctrl-C or SIGTERM). See pipeline/data/data_service.py for
what the run does with the workers' streams.
"""

import sys

from pipeline.run import environment

environment.prepare(sys.argv)  # Before TensorFlow loads.

# pylint: disable=g-import-not-at-top,wrong-import-position
from absl import app
from absl import flags
from absl import logging

from pipeline.data import data_service

_ROLE = flags.DEFINE_enum('role', None, ['dispatcher', 'worker'],
                          'What to start.', required=True)
_PORT = flags.DEFINE_integer('port', None, 'Port to serve on.', required=True)
_DISPATCHER = flags.DEFINE_string(
    'dispatcher', '', 'Workers: the dispatcher as HOST:PORT.')
_HOST = flags.DEFINE_string(
    'host', 'localhost', 'Workers: the name trainers reach this machine by.')


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f'unexpected arguments: {" ".join(argv[1:])}')
  if _ROLE.value == 'dispatcher':
    server = data_service.start_dispatcher(_PORT.value)
    logging.info('tf.data service dispatcher at grpc://%s:%d', _HOST.value,
                 _PORT.value)
  else:
    if not _DISPATCHER.value:
      sys.exit('error: --role=worker needs --dispatcher=HOST:PORT')
    server = data_service.start_worker(_PORT.value, _DISPATCHER.value,
                                       _HOST.value)
    logging.info('tf.data service worker at %s:%d, dispatcher %s',
                 _HOST.value, _PORT.value, _DISPATCHER.value)
  server.join()


if __name__ == '__main__':
  app.run(main)
