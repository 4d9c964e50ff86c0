"""Set a TPU Node's runtime version to match this TensorFlow (cloud-tpu-client).

A TPU Node's workers run their own TensorFlow runtime, chosen when the Node
was created; a client of another version fails in obscure ways (unknown ops,
mismatched protocols). `--tpu_runtime_version=match` asks the TPU to switch to
this process's version before connecting. TPU VMs (`--tpu=local`) have no such
switch: their software version is fixed when the VM is created.

cloud-tpu-client is optional and installed with `--no-deps`
(requirements-tpu-client.txt): its declared dependencies would downgrade
google-api-core and protobuf. It needs google-api-python-client only for TPUs
by name; we build that Cloud TPU API service ourselves with google-auth
credentials (the ones google-cloud-storage uses), so the client's oauth2client
path is never taken.
"""

import os

import tensorflow as tf

from pipeline.errors import UserError
from pipeline.errors import first_line

INSTALL = 'pip install --no-deps -r requirements-tpu-client.txt'
# cloud-tpu-client's own variable for a Cloud TPU API discovery document.
DISCOVERY_URL_ENV = 'TPU_API_DISCOVERY_URL'
_SCOPES = ('https://www.googleapis.com/auth/cloud-platform',)


def runtime_version(requested, tensorflow_version=tf.__version__):
  """The version --tpu_runtime_version asks for: '' leaves the TPU as it is.

  'match' is this TensorFlow's version; anything else is taken as given
  (e.g. '2.12.0' or 'nightly'), and the TPU says if it has no such version.
  """
  requested = requested.strip()
  if requested == 'match':
    # A local build suffix (2.20.0+tpu) is not a runtime the TPU knows.
    return tensorflow_version.split('+')[0]
  return requested


def _client_module():
  try:
    import cloud_tpu_client  # pylint: disable=g-import-not-at-top
  except ImportError:
    raise UserError('--tpu_runtime_version needs cloud-tpu-client, which is '
                    f'not installed; install it with: {INSTALL}') from None
  return cloud_tpu_client


def _tpu_api(credentials, discovery_url):
  """The Cloud TPU API v1 (TPU Nodes) as a googleapiclient service."""
  try:
    from googleapiclient import discovery  # pylint: disable=g-import-not-at-top
    import google.auth  # pylint: disable=g-import-not-at-top
    from google.auth import exceptions  # pylint: disable=g-import-not-at-top
  except ImportError:
    raise UserError('a TPU by name needs google-api-python-client for the '
                    f'Cloud TPU API; install it with: {INSTALL}') from None
  if credentials is None:
    try:
      credentials, _ = google.auth.default(scopes=_SCOPES)
    except exceptions.DefaultCredentialsError as e:
      raise UserError(f'no Google Cloud credentials for the Cloud TPU API '
                      f'({first_line(e)}); run `gcloud auth '
                      'application-default login` or use a VM service '
                      'account') from None
  discovery_url = discovery_url or os.environ.get(DISCOVERY_URL_ENV)
  # Without a discovery URL googleapiclient uses its bundled tpu v1 document:
  # no request before the first API call.
  return discovery.build('tpu', 'v1', credentials=credentials,
                         discoveryServiceUrl=discovery_url,
                         cache_discovery=False)


def configure(tpu, version, zone=None, project=None, credentials=None,
              discovery_url=None, healthy_timeout_s=1200):
  """Switches a TPU Node's workers to `version`, restarting them only if needed.

  Args:
    tpu: a TPU name (looked up through the Cloud TPU API) or grpc://HOST:PORT
      (the worker's version switcher is asked directly, on HOST:8475).
    version: the runtime version, e.g. from runtime_version().
    zone, project: where a named TPU lives; None asks the GCE metadata server.
    credentials: google-auth credentials for the Cloud TPU API; None: ADC.
    discovery_url: a Cloud TPU API discovery document; None: the bundled one
      (or $TPU_API_DISCOVERY_URL).
    healthy_timeout_s: how long a named TPU may take to report HEALTHY.

  Raises:
    UserError: cloud-tpu-client missing, no credentials, or the TPU refused
      or could not be reached; one line.
  """
  client_lib = _client_module()
  by_name = not tpu.startswith('grpc://')
  service = _tpu_api(credentials, discovery_url) if by_name else None
  try:
    client = client_lib.Client(tpu=tpu, zone=zone, project=project,
                               service=service)
    client.configure_tpu_version(version, restart_type='ifNeeded')
    # Health comes from the Cloud TPU API; a grpc:// worker has none to ask
    # (the client's wait would poll None until its timeout).
    if by_name and hasattr(client, 'wait_for_healthy'):
      client.wait_for_healthy(timeout_s=healthy_timeout_s)
  except Exception as e:  # urllib, googleapiclient and the client's own.
    raise UserError(f'TPU {tpu!r}: setting its runtime version to '
                    f'{version!r} failed: {first_line(e)}') from None
