"""Spent tf.data iterators, destroyed on a thread of their own.

Destroying a tf.data iterator joins its autotuning thread, which sleeps
between optimisations for a period that doubles from 10 ms to 60 s as the
iterator ages, and is not always woken: TensorFlow's cancellation runs the
callback that wakes it before it marks itself cancelled, so the thread,
woken, can find it not yet cancelled and sleep out the rest of its period
(tf.data's Model::OptimizeLoop against tsl's CancellationManager). On the
training thread that is the run standing still: 6 of 10 stage changes of
progressive runs here waited 18 to 45 s for the last stage's iterator to
go (BUILD_NOTES.md), and evaluations 0.2 to 0.6 s each.

So a stage's input, and an evaluation's, is handed here when spent and
dropped by the release thread, where the wait blocks nothing (TensorFlow
lets go of the GIL while it deletes a tensor handle).
"""

import gc
import os
import queue
import sys
import threading
import time

from absl import logging

# How long the release thread waits for the caller to let go of what it
# handed over (its own references end as release() returns) before it
# drops its reference all the same.
HANDOVER_S = 10.0

_spent = queue.SimpleQueue()
_start = threading.Lock()
_thread = None


def release(iterator):
  """Destroys `iterator` on the release thread once the caller, which
  drops its own references right after, has let go of it."""
  global _thread
  with _start:
    if _thread is None:
      _thread = threading.Thread(target=_release_each, daemon=True,
                                 name='spent-iterators')
      _thread.start()
  _spent.put(iterator)


def _release_each():
  while True:
    iterator = _spent.get()
    deadline = time.monotonic() + HANDOVER_S
    # Two references: this frame's and getrefcount's own argument.
    while sys.getrefcount(iterator) > 2 and time.monotonic() < deadline:
      time.sleep(0.01)
    held = sys.getrefcount(iterator) > 2
    started = time.monotonic()
    del iterator
    if held:  # In a reference cycle of some wrapper: collected here too.
      gc.collect()
    logging.debug('Destroyed a spent input in %.1f s (off the training '
                  'thread)', time.monotonic() - started)


def _forget_thread():
  """A forked child has no release thread: release() starts its own."""
  global _thread, _spent
  _thread, _spent = None, queue.SimpleQueue()


os.register_at_fork(after_in_child=_forget_thread)
