"""What the command line asked for, before anything is resolved."""

import dataclasses
from typing import Optional


@dataclasses.dataclass(frozen=True)
class Request:
  """What the command line asked for (launch/cli.py fills it from flags)."""
  workdir: Optional[str] = None  # None: a run that writes none (benchmark).
  # Not named on the command line: a changed recipe trains beside it
  # (pipeline/run/run_workdir.py) rather than being refused.
  default_workdir: bool = False
  # Keys (config keys, 'policy') whose change from the workdir's run is
  # accepted: it trains on under the new values, run.json records them.
  accept_changes: tuple = ()
  staging_dir: str = '/tmp/pipeline-staging'  # Local copy of a gs:// workdir.
  policy: str = 'auto'
  policy_from: str = '--policy'  # Where a policy other than auto came from.
  xla: str = 'auto'
  tpu: str = ''
  tpu_zone: Optional[str] = None
  gcp_project: Optional[str] = None
  tpu_runtime_version: str = ''
  gpus: str = ''
  num_cpu_devices: int = 1
  split_gpus: int = 1  # Logical GPUs per GPU (TensorFlow).
  collective: str = 'auto'
  collective_timeout_s: float = 300.0  # Bounds every collective.
  allow_cpu: bool = False  # Train on the CPU beside unusable NVIDIA GPUs.
  # A gs:// workdir's lease lapses this long after its holder's last renewal.
  workdir_lease_s: float = 120.0
  trains: bool = True  # False: reads another run's workdir (launch.evaluate).
  # --dry_run: resolve and check, read no more than the plan needs
  # (headers of a sample), download, prepare and write nothing.
  dry_run: bool = False
  input_pipeline: str = 'tf.data'  # The config's: DALI shares the GPUs.
