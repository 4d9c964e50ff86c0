"""Evaluate a run's committed checkpoint on its held-out split, or another.

  python -m launch.evaluate --workdir=runs/x                 # newest checkpoint
  python -m launch.evaluate --workdir=gs://b/run --checkpoint=2000
  python -m launch.evaluate --workdir=runs/x --config.eval_split='train[:10%]'

  python -m launch.evaluate --workdir=gs://b/run --follow  # beside training
  python -m launch.evaluate --workdir=runs/x --export=export-tensorflow

The run's own config comes from its run.json; --config.KEY=VALUE overrides
fields of it (another split, TFRecord glob or batch). Hardware flags are
launch.train's; the policy is the run's unless --policy is given. Prints
loss, accuracy, top-5 and the confusion matrix and writes them, with a
picture, to <workdir>/evaluation/; never writes into the checkpoints.
--export=export-NAME also exports the evaluated checkpoint to
<workdir>/export-NAME on this machine's backend (a JAX run's export made
with TensorFlow, or the reverse).
"""

import dataclasses
import sys

from pipeline.run import environment

environment.prepare(sys.argv)  # Before TensorFlow loads.

# pylint: disable=g-import-not-at-top,wrong-import-position
from absl import flags
from ml_collections import config_flags

from launch import cli
from pipeline.errors import UserError
from pipeline.reports import evaluation
from pipeline.run import plan as plan_lib

# --helpshort lists the flags every launcher takes from launch/cli.py too.
flags.adopt_module_key_flags(cli)

CHECKPOINT = flags.DEFINE_integer(
    'checkpoint', None, 'Step of the committed checkpoint to evaluate; '
    'default: the newest.')
FOLLOW = flags.DEFINE_bool(
    'follow', False, 'Evaluate each new committed checkpoint of a running '
    'job once, until its final step (TensorBoard: tensorboard/evaluator).')
POLL_S = flags.DEFINE_float('poll_s', 30.0, 'With --follow: seconds between '
                            'looks for a new checkpoint.')
FOLLOW_TIMEOUT_S = flags.DEFINE_float(
    'follow_timeout_s', 3600.0, 'With --follow: stop after this long without '
    'a new checkpoint.')

EXPORT = flags.DEFINE_string(
    'export', None, 'Also export the evaluated checkpoint to <workdir>/NAME '
    'on this backend, as launch.train exports (NAME starts with "export-").')


def main(config):
  del config  # The run's own, from its run.json.
  if not cli.WORKDIR.value:
    raise UserError('--workdir=DIR is required: the run to evaluate')
  if flags.FLAGS['config'].present:
    raise UserError("launch.evaluate reads the run's config from its "
                    'run.json; change fields with --config.KEY=VALUE')
  config, policy, written_as = evaluation.run_config(
      cli.WORKDIR.value, cli.STAGING_DIR.value,
      config_flags.get_override_values(flags.FLAGS['config']))
  request = dataclasses.replace(cli.request(config), trains=False)
  if not cli.POLICY.present:
    request = dataclasses.replace(request, policy=policy,
                                  policy_from="the run's, from its run.json")
  if EXPORT.value:
    if FOLLOW.value:
      raise UserError('--export exports one checkpoint: without --follow')
    evaluation.check_export_name(EXPORT.value)
  plan = plan_lib.resolve(config, request)
  evaluator = evaluation.Evaluator(plan, written_as)
  if FOLLOW.value:  # SIGTERM or Ctrl-C ends it between checkpoints.
    reports = evaluator.follow(POLL_S.value, FOLLOW_TIMEOUT_S.value)
    print(f'followed {plan.workdir.url}: evaluated {len(reports)} '
          'checkpoint(s), steps '
          f'{", ".join(str(r["step"]) for r in reports) or "none"}')
    return
  report = evaluator.evaluate(CHECKPOINT.value)
  exported = EXPORT.value and evaluator.export(EXPORT.value)
  print('\n'.join(evaluation.summary_lines(report)))
  if exported:
    print(f'Exported step {report["step"]} to {exported}')


if __name__ == '__main__':
  cli.run(main)
