"""Spent iterators are destroyed on the release thread, never the caller's
(pipeline/data/spent_iterators.py)."""

import queue
import subprocess
import sys
import threading
import weakref

import tensorflow as tf

from conftest import REPO
from pipeline.data import spent_iterators


def test_a_slow_destruction_never_blocks_the_caller():
  """The destructor waits on a gate the test opens only once release() has
  returned: run on the caller's thread it would hold the caller 10 s and
  report that thread's name."""
  gate, destroyed = threading.Event(), queue.Queue()

  class Spent:

    def __del__(self):
      gate.wait(10)
      destroyed.put(threading.current_thread().name)

  spent_iterators.release(Spent())
  assert destroyed.empty()
  gate.set()
  assert destroyed.get(timeout=10) == 'spent-iterators'


def test_a_tf_data_iterator_is_destroyed_on_the_release_thread():
  """A real autotuned pipeline's iterator, consumed, then handed over: the
  weak reference's callback runs where the iterator is deallocated."""
  dataset = tf.data.Dataset.range(10_000).map(
      lambda x: x * 2, num_parallel_calls=tf.data.AUTOTUNE).prefetch(
          tf.data.AUTOTUNE)
  iterator = iter(dataset)
  assert [int(next(iterator)) for _ in range(3)] == [0, 2, 4]
  destroyed = queue.Queue()
  watch = weakref.ref(iterator, lambda _: destroyed.put(
      threading.current_thread().name))
  spent_iterators.release(iterator)
  del iterator
  assert destroyed.get(timeout=60 + spent_iterators.HANDOVER_S) == (
      'spent-iterators')
  assert watch() is None


def test_a_destruction_still_waiting_does_not_hold_the_process_at_exit():
  """A run stopped (SIGTERM's exit 143) while an iterator is still being
  destroyed exits at once with its own status."""
  code = ('import sys, threading\n'
          'from pipeline.data import spent_iterators\n'
          'entered = threading.Event()\n'
          'class Spent:\n'
          '  def __del__(self):\n'
          '    entered.set()\n'
          '    threading.Event().wait()\n'
          'spent_iterators.release(Spent())\n'
          'assert entered.wait(10)\n'
          'sys.exit(143)\n')
  result = subprocess.run([sys.executable, '-c', code], cwd=REPO,
                          timeout=60, check=False)
  assert result.returncode == 143
