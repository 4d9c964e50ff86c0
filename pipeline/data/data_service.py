"""tf.data service: the training input runs on other machines' CPUs.

When one host's cores cannot feed its accelerators, a dispatcher and
workers (started with launch.data_service on CPU VMs) run the input
pipeline and stream batches to the trainers.

Sharding policy OFF: every worker runs the whole training pipeline (its own
file order, shuffle and random crops; its own cache, so a decoded cache
needs RAM on every worker), and the trainers of one run share the streams
under one job name: each produced batch reaches exactly one trainer. An
epoch is then "about once per example": a worker's stream is an endless,
reshuffled pass over the whole set, not a split of it. We chose it over
DYNAMIC sharding (each example at most once per epoch), because DYNAMIC
cannot cache on the workers, needs a source the dispatcher can split, and
drops a restarted worker's unfinished splits for that epoch; under OFF a
worker that restarts simply starts a new stream and the run goes on with
the others in the meantime. Evaluation stays on the trainer: it must see
every held-out example exactly once.

Skipped-record counts travel inside the batches (decode.py), so they hold on
the workers too.
"""

import tensorflow as tf


def distribute(dataset, address, job_name):
  """`dataset`, run by the service's workers under `job_name`."""
  return dataset.apply(tf.data.experimental.service.distribute(
      processing_mode=tf.data.experimental.service.ShardingPolicy.OFF,
      service=address, job_name=job_name))


def start_dispatcher(port):
  """A dispatcher serving on `port`; .join() blocks."""
  return tf.data.experimental.service.DispatchServer(
      tf.data.experimental.service.DispatcherConfig(port=port))


def start_worker(port, dispatcher, host='localhost'):
  """A worker on `port`, registered with `dispatcher` (HOST:PORT); trainers
  reach it at `host`:`port`."""
  return tf.data.experimental.service.WorkerServer(
      tf.data.experimental.service.WorkerConfig(
          dispatcher_address=dispatcher.removeprefix('grpc://'),
          worker_address=f'{host}:{port}', port=port))
