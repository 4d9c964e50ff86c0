"""Train a config with Keras' own model.fit instead of this project's loop:
the peer `launch.compare --keras_fit` runs beside each policy's run.

  python -m launch.keras_fit --policy=mixed_bfloat16 --workdir=/tmp/fit

The same flags as launch.train; the same input, network (keras.applications'
layers), optimizer, schedule, policy and steps per execution
(pipeline/reports/compare/keras_fit.py). Writes WORKDIR/metrics.json.
"""

import sys

from pipeline.run import environment

environment.prepare(sys.argv)  # Before TensorFlow loads.

# pylint: disable=g-import-not-at-top,wrong-import-position
from absl import flags

from launch import cli
from pipeline.reports.compare import keras_fit
from pipeline.run import plan as plan_lib
from pipeline.rules.config import validation
from pipeline.storage import workdirs

flags.adopt_module_key_flags(cli)
FORMS = flags.DEFINE_bool(
    'forms', False, "Build the network with this project's layer forms "
    '(config.batch_norm, squeeze_excite, depthwise) instead of '
    "keras.applications' own: model.fit against this project's loop alone.")


def main(config):
  plan = plan_lib.resolve(config, cli.request(config))
  metrics = keras_fit.train(plan, FORMS.value)
  plan.workdir.write_json(workdirs.File.METRICS, metrics)
  print(f"Done: eval_accuracy {metrics[validation.Metric.EVAL_ACCURACY]:.4f}, "
        f"{metrics['train_images_per_sec'] or 0:.1f} img/s (Keras' "
        f'model.fit); {plan.workdir.url}/metrics.json', flush=True)


if __name__ == '__main__':
  cli.run(main)
