"""How a run is cut into steps: per execution, per epoch."""

from pipeline.errors import UserError

# Steps per execution when the config leaves it at 0. Each execution is one
# host round trip: on a TPU that is a launch of a whole XLA program (over the
# network on a TPU Node) for steps of a few milliseconds, so it takes many
# steps to hide; tensorflow/tpu's EfficientNet ran an epoch per loop
# (iterations_per_loop). On CPU and GPU a call costs far less than a step and
# 8 only trims Python overhead; more would delay logs and preemption saves.
_AUTO_STEPS_PER_EXECUTION = {'TPU': 100, 'GPU': 8, 'CPU': 8}
# The input one device holds for the next execution while the current one
# runs (the JAX backend stages it: backends/jax/staging.py), at most: a
# sixteenth of the smallest chip lent today (a v5e's 16 GiB), so the
# running and the staged executions' images take an eighth.
STAGED_INPUT_BYTES_PER_DEVICE = 1 << 30


def choose_steps_per_execution(requested, device_kind,
                               input_bytes_per_step=0):
  """Returns (steps, reason): `requested` if 1 or more; 0 picks per device,
  no more steps than STAGED_INPUT_BYTES_PER_DEVICE holds of one device's
  `input_bytes_per_step` (its share of a batch, as uint8 pixels)."""
  if requested:
    return requested, 'set in the config'
  steps = _AUTO_STEPS_PER_EXECUTION[device_kind]
  fits = STAGED_INPUT_BYTES_PER_DEVICE // max(input_bytes_per_step, 1)
  if fits < steps:
    return max(fits, 1), (
        f'auto for {device_kind}: as many steps as 1 GiB of staged input '
        f'per device holds ({input_bytes_per_step / 2**20:.1f} MiB a step)')
  return steps, f'auto for {device_kind}: 100 on TPU, 8 on CPU and GPU'


def epoch_steps(requested_examples, num_train_examples, global_batch_size):
  """Steps per epoch for one run: see examples_per_epoch."""
  return examples_per_epoch(requested_examples, num_train_examples,
                            [global_batch_size]) // global_batch_size


def examples_per_epoch(requested, num_train_examples, batch_sizes):
  """Examples per epoch that every global batch in `batch_sizes` divides.

  `requested` (the config's examples_per_epoch) if set: it must be whole
  batches, so runs with different batches (launch.compare) see exactly the
  same examples. 0: the largest multiple of the biggest batch that fits in
  the training set (for one batch, the set rounded down to whole batches).
  """
  if requested:
    for batch in sorted(set(batch_sizes)):
      if requested < 0 or requested % batch:
        raise UserError(f'examples_per_epoch={requested} must be 0 (the '
                        'training set) or a multiple of the global batch; '
                        f'it is not a multiple of global batch {batch}')
    return requested
  biggest = max(batch_sizes)
  examples = num_train_examples // biggest * biggest
  if not examples:
    raise UserError(f'global_batch_size={biggest} is larger than the '
                    f'{num_train_examples} training examples')
  for batch in batch_sizes:
    if examples % batch:  # Only when batches are not multiples of each other.
      raise UserError(f'global batches {sorted(set(batch_sizes))} have no '
                      'common multiple that fits the training set; set '
                      '--config.examples_per_epoch')
  return examples
