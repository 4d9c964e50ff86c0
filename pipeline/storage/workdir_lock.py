"""One writer per workdir: a second run on a held workdir stops in one line.

A local workdir is held with an exclusive `flock` on `<workdir>/.writer`,
which the kernel releases when the process ends however it ends (`kill -9`,
out of memory): a restart right after a crash never waits and needs no
cleaning up. The file also names the holder (host, process id, start, last
sign of life) for the message a second run prints.

A gs:// workdir is held with a lease object, `<workdir>/.writer`, created
only if absent (`if_generation_match=0`: of two machines, GCS lets one
win), renewed every quarter of `lease_s` (again conditional on its own
generation), deleted when the run ends. A run that finds a lease watches it
for up to `lease_s`: a holder that renews it is alive (the run stops in one
line naming it); one that does not (a preempted or killed machine) lets it
lapse, and the run takes it over and goes on. A run that loses its lease
(another took it over after a network outage longer than `lease_s`) stops
at the next execution boundary rather than write beside the new holder.

Only a multi-worker run's chief holds it; readers (launch.evaluate,
launch.predict, launch.compare's report) never take it.
"""

import dataclasses
import fcntl
import json
import os
import socket
import threading
import time
import uuid

from absl import logging
from google.api_core import exceptions

from pipeline.errors import UserError

NAME = '.writer'


@dataclasses.dataclass
class Holder:
  """Who holds a workdir, as its lock file or lease object records it."""
  host: str
  pid: int
  started: float  # Seconds since the epoch.
  renewed: float  # The holder's last sign of life.
  run_id: str

  @classmethod
  def me(cls):
    now = time.time()
    return cls(socket.gethostname(), os.getpid(), now, now, uuid.uuid4().hex)

  @classmethod
  def parse(cls, text):
    try:
      return cls(**json.loads(text))
    except (TypeError, ValueError):
      return None  # Being written, or not ours.

  def to_json(self):
    return json.dumps(dataclasses.asdict(self))

  def describe(self, now=None):
    now = now or time.time()
    started = time.strftime('%Y-%m-%d %H:%M:%S', time.localtime(self.started))
    return (f'{self.host} (process {self.pid}), started {started}, last sign '
            f'of life {now - self.renewed:.0f} s ago')


def _held_error(url, holder, now=None):
  who = holder.describe(now) if holder else 'another run'
  return UserError(
      f'workdir {url} is in use by {who}; wait for that run to finish or stop '
      'it, or use another --workdir (launch.evaluate reads it meanwhile)')


class _LocalLock:
  """An flock on the workdir's `.writer` file, with the holder inside."""

  lost = None  # A lock the kernel holds for us is never taken over.

  def __init__(self, directory, url):
    self.url = url
    self.path = os.path.join(directory, NAME)
    self.holder = Holder.me()
    self._fd = None

  def read_holder(self):
    try:
      with open(self.path) as f:
        return Holder.parse(f.read())
    except OSError:
      return None

  def acquire(self):
    os.makedirs(os.path.dirname(self.path), exist_ok=True)
    fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
      fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
      os.close(fd)
      raise _held_error(self.url, self.read_holder()) from None
    self._fd = fd
    self.renew()

  def renew(self):
    self.holder.renewed = time.time()
    os.ftruncate(self._fd, 0)
    os.pwrite(self._fd, self.holder.to_json().encode(), 0)

  def check(self):
    """For --dry_run: the one line if another process holds it."""
    if not os.path.exists(self.path):
      return
    fd = os.open(self.path, os.O_RDONLY)
    try:
      fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
      raise _held_error(self.url, self.read_holder()) from None
    finally:
      os.close(fd)

  def release(self):
    if self._fd is not None:
      fcntl.flock(self._fd, fcntl.LOCK_UN)
      os.close(self._fd)
      self._fd = None


class _Lease:
  """A lease object in the bucket, conditional on its generation."""

  def __init__(self, location, lease_s):
    self.location = location
    self.url = location.url
    self.lease_s = lease_s
    self.holder = Holder.me()
    self.generation = None
    self.lost = None  # The message, once another run took the lease over.

  def _blob(self):
    return self.location.bucket.blob(self.location.name(NAME))

  def read(self):
    """(Holder or None, generation or None) of the lease in the bucket."""
    what = f'reading {self.url}/{NAME}'
    try:
      blob = self.location.call(what, self.location.bucket.get_blob,
                                self.location.name(NAME))
      if blob is None:
        return None, None
      generation = int(blob.generation)  # The download may clear it.
      text = self.location.call(what, blob.download_as_bytes,
                                if_generation_match=generation)
    except (exceptions.NotFound, exceptions.PreconditionFailed):
      return self.read()  # Replaced or deleted between the two calls.
    return Holder.parse(text.decode()), generation

  def _write(self, generation):
    """Writes our holder record if the object's generation is `generation`
    (0: absent); True if it did."""
    self.holder.renewed = time.time()
    blob = self._blob()
    try:
      self.location.call(f'writing {self.url}/{NAME}',
                         blob.upload_from_string, self.holder.to_json(),
                         if_generation_match=generation)
    except exceptions.PreconditionFailed:
      return False
    # Read back: GCS's precondition makes the write atomic; this also holds
    # where a store ignores it (gcp-storage-emulator does).
    holder, self.generation = self.read()
    return holder is not None and holder.run_id == self.holder.run_id

  def acquire(self):
    """Takes the lease, waiting for a silent holder's to lapse; a one-line
    UserError if its holder renews it meanwhile."""
    seen, waited_since = None, None
    while True:
      holder, generation = self.read()
      if holder is None and generation is None:
        if self._write(0):
          return
        continue
      if holder and holder.run_id == self.holder.run_id:
        self.generation = generation  # A retried write that had landed.
        return
      now = time.time()
      if seen is not None and holder and holder.renewed != seen.renewed:
        raise _held_error(self.url, holder, now)  # It renewed: alive.
      seen = seen or holder
      if holder is None or now - holder.renewed >= self.lease_s:
        logging.warning('Taking over the lapsed lease of %s on %s',
                        holder.describe(now) if holder else 'an unknown run',
                        self.url)
        if self._write(generation):
          return
        continue
      if waited_since is None:
        waited_since = now
        logging.warning(
            'Workdir %s is leased by %s: waiting up to %.0f s for that run '
            'to renew it (then this one stops) or for the lease to lapse '
            '(a stopped machine; then this one goes on)', self.url,
            holder.describe(now), holder.renewed + self.lease_s - now)
      time.sleep(min(self.lease_s / 8, holder.renewed + self.lease_s - now))

  def check(self):
    holder, _ = self.read()
    now = time.time()
    if holder and now - holder.renewed < self.lease_s:
      raise _held_error(self.url, holder, now)

  def renew(self):
    """Renews the lease if it is still ours (read first: a store that
    ignores the precondition would let a stale holder write over the new
    one); else marks it lost."""
    if self.lost:
      return
    holder, _ = self.read()
    if (holder is None or holder.run_id != self.holder.run_id or
        not self._write(self.generation)):
      holder, _ = self.read()
      self.lost = str(_held_error(self.url, holder)).replace(
          'is in use by', 'was taken over by')

  def release(self):
    if self.generation is not None and not self.lost:
      try:
        self.location.call(f'deleting {self.url}/{NAME}', self._blob().delete,
                           if_generation_match=self.generation)
      except (exceptions.NotFound, exceptions.PreconditionFailed):
        pass
      self.generation = None


class WorkdirLock:
  """Holds a storage.Workdir for one run; a context manager. A gs://
  workdir's lease lapses `workdir.lease_s` after its last renewal."""

  def __init__(self, workdir):
    self.url = workdir.url
    self._lock = (_Lease(workdir.remote, workdir.lease_s) if workdir.remote
                  else _LocalLock(workdir.local, workdir.url))
    self._renew_every_s = workdir.lease_s / 4 if workdir.remote else 30.0
    self._stop = threading.Event()
    self._renewer = None

  def check(self):
    """--dry_run: the one-line UserError a run would stop with now."""
    self._lock.check()

  def acquire(self):
    self._lock.acquire()
    self._renewer = threading.Thread(target=self._renew_loop, daemon=True,
                                     name='workdir-lock')
    self._renewer.start()
    return self

  def _renew_loop(self):
    while not self._stop.wait(self._renew_every_s):
      try:
        self._lock.renew()
      except UserError as e:  # GCS out of reach: the lease may lapse.
        logging.warning('Could not renew the hold on %s: %s', self.url, e)

  def raise_if_lost(self):
    """At an execution boundary: a one-line UserError if another run took
    the lease over (this run must stop writing)."""
    if self._lock.lost:
      raise UserError(f'{self._lock.lost}; this run stopped without writing '
                      'more')

  def release(self):
    self._stop.set()
    if self._renewer:
      self._renewer.join()
    self._lock.release()

  def __enter__(self):
    return self.acquire()

  def __exit__(self, *exc):
    self.release()
