"""launch.benchmark --save_policy: keeps what was measured on this GPU
model where `--policy=auto` (rules/speed/saved_policy.py) and `--backend=auto`
(rules/speed/measured.py) read it."""

from pipeline import backends
from pipeline.errors import UserError
from pipeline.rules.speed import measured
from pipeline.rules.speed import precision
from pipeline.rules.speed import saved_policy


def save_sweep(sweep):
  """Saves a sweep's fastest policy for this GPU model, or this CPU and the
  sweep's network and size, and this software; the line that says so."""
  if not sweep['fastest']:
    raise UserError('--save_policy: no policy was measured, nothing to keep')
  software = backends.chosen()[0].software()
  on_cpu = sweep['device_kind'] == 'CPU'
  device = precision.cpu_info()[0] if on_cpu else sweep['gpu_name']
  step = (saved_policy.step_of(sweep['model'], sweep['image_size'])
          if on_cpu else '')
  target = saved_policy.save(sweep, device, software, step)
  return (f'saved {sweep["fastest"]["policy"]} for {device}'
          f'{" and " + step if step else ""} with {software}: --policy=auto '
          f'takes it there ({target})')


def gpu_to_save_for(save, names):
  """The GPU model a --backends comparison will be saved for (None without
  --save_policy), or a one-line UserError before anything is measured."""
  if not save:
    return None
  if set(names) != set(backends.BACKENDS[1:]):
    raise UserError('--save_policy with --backends keeps the faster of both: '
                    '--backends=tensorflow,jax')
  gpus = backends.gpu_models()
  if not gpus:
    raise UserError('--save_policy keeps a backend for a GPU model; this '
                    'machine has no NVIDIA GPU')
  return gpus[0]


def save_backends(comparison, gpu_name):
  """Saves the faster backend of a --backends comparison for this GPU and
  both backends' software; the line that says so."""
  software = backends.both_software()
  record, target = measured.save(comparison, gpu_name, software)
  return (f'saved {record["backend"]} ({record["policy"]}) for {gpu_name} '
          f'with {software}: --backend=auto takes it there ({target})')
