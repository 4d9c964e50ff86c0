"""Google Cloud Storage through the google-cloud-storage client.

TF's own gs:// file system has its endpoints compiled in: no environment
variable points it at an emulator (BUILD_NOTES.md). The client honours
STORAGE_EMULATOR_HOST, so the tests run against a real GCS server on
loopback. Credentials are Application Default Credentials; the
client finds them, and nothing here ever prints or logs them.

Every call retries 429, 5xx and dropped connections with exponential backoff
up to `timeout_s`; what still fails raises GcsError, a UserError: the
launchers print its one line and exit non-zero.
"""

import functools
import json
import os

from google.api_core import exceptions
from google.api_core import retry as retries
import google.auth.exceptions
from google.cloud import storage
from google.cloud.storage.retry import DEFAULT_RETRY

from pipeline.errors import UserError
from pipeline.errors import first_line


class GcsError(UserError):
  """A GCS call that failed after its retries: one line, like any mistake a
  user can act on (the network, the bucket, its permissions). What the run
  wrote stays in its local staging copy."""

  def __init__(self, detail):
    super().__init__(f'{detail}; the staged copy is kept: rerun the same '
                     'command once GCS is reachable')
    self.detail = detail  # What failed, without the advice.


def is_gcs(path):
  return str(path).startswith('gs://')


def emulated():
  """Whether gs:// is a GCS emulator (STORAGE_EMULATOR_HOST, which the
  client honours and TensorFlow's own gs:// does not)."""
  return bool(os.environ.get('STORAGE_EMULATOR_HOST'))


def read_object(url):
  """The bytes of the object at `url`, through one client per bucket."""
  location = _location(url[:url.index('/', len('gs://'))])
  relative = url[len(location.url) + 1:]
  return location.call(f'reading {url}',
                       location.bucket.blob(location.name(relative))
                       .download_as_bytes)


@functools.lru_cache(maxsize=None)
def _location(bucket_url):
  return Location(bucket_url)


def split_url(url):
  """gs://bucket/a/b -> ('bucket', 'a/b')."""
  bucket, _, prefix = url[len('gs://'):].partition('/')
  if not bucket:
    raise UserError(f'{url!r} names no bucket; use gs://BUCKET/PATH')
  return bucket, prefix.strip('/')


class Location:
  """A bucket and a prefix in it; names passed to methods are relative."""

  def __init__(self, url, timeout_s=120.0):
    self.url = url.rstrip('/')
    self.bucket_name, self.prefix = split_url(url)
    self.timeout_s = timeout_s
    self.retry = DEFAULT_RETRY.with_deadline(timeout_s).with_delay(
        initial=0.5, maximum=8.0, multiplier=2.0)
    self._client = None

  @property
  def bucket(self):
    if self._client is None:
      try:
        self._client = storage.Client()
      except google.auth.exceptions.DefaultCredentialsError:
        raise UserError(
            f'no Google Cloud credentials to reach {self.url}: run `gcloud '
            'auth application-default login` or set '
            'GOOGLE_APPLICATION_CREDENTIALS') from None
    return self._client.bucket(self.bucket_name)

  def name(self, relative):
    return f'{self.prefix}/{relative}' if self.prefix else relative

  def call(self, what, function, *args, **kwargs):
    """`function(*args, **kwargs)` with this location's retry; a lasting
    failure as one GcsError line naming `what`."""
    try:
      return function(*args, **kwargs, retry=self.retry)
    except (exceptions.NotFound, exceptions.PreconditionFailed):
      raise  # Answers, not faults: the caller decides.
    except (exceptions.GoogleAPIError, retries.exceptions.RetryError,
            ConnectionError, OSError) as e:
      raise GcsError(f'{what} failed after retrying for {self.timeout_s:g} s '
                     f'({first_line(e)})') from None

  def preflight(self):
    """Proves the bucket exists and this run can write and delete in it."""
    probe = self.name(f'.preflight-{os.getpid()}')
    try:
      blob = self.bucket.blob(probe)
      self.call(f'writing gs://{self.bucket_name}/{probe}',
                 blob.upload_from_string, b'ok')
      self.call(f'deleting gs://{self.bucket_name}/{probe}', blob.delete)
    except exceptions.NotFound:
      raise UserError(f'bucket {self.bucket_name!r} does not exist (workdir '
                      f'{self.url}); create it or fix --workdir') from None
    except exceptions.Forbidden as e:
      raise UserError(f'no permission to write to bucket {self.bucket_name!r}'
                      f' ({self.url}): {first_line(e)}') from None
    except GcsError as e:
      raise UserError(f'workdir {self.url} is not reachable: {e.detail}'
                      ) from None

  def upload(self, local_path, relative):
    """Uploads a file; the client verifies its CRC32C against the server's."""
    blob = self.bucket.blob(self.name(relative))
    self.call(f'uploading {local_path} to {self.url}/{relative}',
               blob.upload_from_filename, local_path, checksum='crc32c')
    return blob.crc32c

  def download(self, relative, local_path):
    blob = self.bucket.blob(self.name(relative))
    self.call(f'downloading {self.url}/{relative}', blob.download_to_filename,
               local_path, checksum='crc32c')

  def write_text(self, relative, text):
    blob = self.bucket.blob(self.name(relative))
    self.call(f'writing {self.url}/{relative}', blob.upload_from_string,
               text.encode())

  def read_json(self, relative):
    blob = self.bucket.blob(self.name(relative))
    try:
      return json.loads(self.call(f'reading {self.url}/{relative}',
                                   blob.download_as_bytes))
    except exceptions.NotFound:
      return None

  def list(self, relative_prefix=''):
    """Relative names of the objects under `relative_prefix`."""
    start = len(self.prefix) + 1 if self.prefix else 0
    # Names alone, kept as they arrive: an image folder can list millions.
    return self.call(
        f'listing {self.url}/{relative_prefix}',
        lambda retry: [blob.name[start:] for blob in
                       self.bucket.client.list_blobs(
                           self.bucket_name, prefix=self.name(relative_prefix),
                           fields='items(name),nextPageToken', retry=retry)])

  def delete(self, relative):
    try:
      self.call(f'deleting {self.url}/{relative}',
                 self.bucket.blob(self.name(relative)).delete)
    except exceptions.NotFound:
      pass
