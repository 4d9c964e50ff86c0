"""Input staged on the devices one execution ahead of the program.

JAX dispatches a compiled program and returns at once; the trainer pulls
the next execution's batches and starts their transfers while the devices
run the current one, and only then waits for its outputs (as Keras 3.15's
own JAX trainer does one batch ahead, keras/src/backend/jax/trainer.py's
`_one_batch_ahead_iterator`). A step then never waits for input that
arrived while the previous execution ran.

The batches are placed one by one, no more than `max_bytes` of them per device
(rules/speed/step_counts.py: STAGED_INPUT_BYTES_PER_DEVICE); the rest are pulled
when their execution is taken. A failure while staging (a bad label, the end of
the data) is kept and raised by the execution that would have taken that
batch, as it would have been without staging.
"""

import collections
import time

import jax
import numpy as np


class Staging:
  """Batches of one iterator already on the devices, oldest first."""

  def __init__(self, strategy, max_bytes):
    self.strategy = strategy
    self.max_bytes = max_bytes  # Per device.
    self.iterator = None
    self.batches = collections.deque()  # (on-device arrays, skipped records)
    self.error = None  # Raised when the batch it stands for is taken.

  def take(self, iterator, count):
    """`count` staged batches of `iterator` (pulled now where too few were
    staged): ([(images, labels) on the devices], skipped records, seconds
    spent waiting here)."""
    self._follow(iterator)
    start = time.perf_counter()
    while len(self.batches) < count:
      if self.error:
        error, self.error = self.error, None
        raise error
      self._pull()
    wait_s = time.perf_counter() - start
    taken = [self.batches.popleft() for _ in range(count)]
    return ([arrays for arrays, _ in taken],
            sum(skipped for _, skipped in taken), wait_s)

  def stage(self, iterator, count, running):
    """Pulls up to `count` batches of `iterator` onto the devices while the
    program whose `running` outputs are given runs. Returns the seconds the
    devices waited: from when the program was seen done to the end of
    staging (0 if it was still running)."""
    self._follow(iterator)
    done_at = None
    while (len(self.batches) < count and not self.error and
           self._room_for_another()):
      try:
        self._pull()
      except Exception as e:  # pylint: disable=broad-except
        self.error = e  # StopIteration too: the data ended here.
      if done_at is None and _ready(running):
        done_at = time.perf_counter()
    return time.perf_counter() - done_at if done_at else 0.0

  def _room_for_another(self):
    """Whether one more batch (as large as the last) stays within
    max_bytes per device."""
    if not self.batches:
      return True
    each = self.strategy.bytes_per_device(self.batches[-1][0])
    return (len(self.batches) + 1) * each <= self.max_bytes

  def _follow(self, iterator):
    if iterator is not self.iterator:  # Another pass: the staged are stale.
      self.iterator, self.error = iterator, None
      self.batches.clear()

  def _pull(self):
    batch = next(self.iterator)
    skipped = int(np.sum(batch[2])) if len(batch) > 2 else 0
    self.batches.append((self.strategy.to_devices(tuple(batch[:2])), skipped))


def _ready(outputs):
  """Whether every array of `outputs` is computed."""
  return all(leaf.is_ready() for leaf in jax.tree.leaves(outputs))
