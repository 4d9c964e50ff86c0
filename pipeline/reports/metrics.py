"""metrics.json: what a finished run reports, for people and for tools.

The keys are stable (launch.compare and users' scripts read them); the
resolved settings come from the Plan, the figures from the run.
"""

import resource

from absl import logging

from pipeline.reports import learning
from pipeline.run import console
from pipeline.rules.config import validation


def run_metrics(plan, trainer, progress, final_eval, *, initial_step,
                initial_weights_sha256, checkpoint_blocked_s,
                export_dir):
  """The metrics.json dict of a finished run."""
  config = plan.recipe
  hardware = plan.hardware
  images_per_sec, wait_fraction = progress.meter.overall()
  return {
      'backend': plan.backend.name,
      'policy': plan.policy,
      'strategy': hardware.strategy_name,
      'num_replicas': hardware.num_replicas,
      'num_workers': hardware.num_workers,
      'joined_by': hardware.cluster or None,
      'device_kind': hardware.device_kind,
      'xla': plan.xla,
      'model': config.model,
      'dataset': plan.source.name,
      'input_pipeline': str(plan.input_pipeline),
      'image_size': plan.image_sizes.train,
      'eval_image_size': plan.image_sizes.eval,
      'global_batch_size': plan.global_batch_size,
      'steps_per_execution': plan.steps_per_execution,
      'initial_step': initial_step,
      'train_steps': plan.total_steps - initial_step,
      'total_steps': plan.total_steps,
      'compile_s': progress.meter.compile_s,
      'train_images_per_sec': images_per_sec,
      'input_wait_fraction': wait_fraction,
      # Training records that could not be decoded, counted each time read
      # (a decoded cache reads them once).
      'skipped_records': progress.skipped_records,
      'skipped_steps': trainer.skipped_steps,
      'checkpoint_blocked_s': checkpoint_blocked_s,
      'final_loss_scale': trainer.loss_scale,
      # With a moving average (ema_decay), eval_* are the averaged weights'
      # (what is exported) and eval_*_raw the model's own; else *_raw None.
      validation.Metric.EVAL_ACCURACY: final_eval['accuracy'],
      'eval_accuracy_raw': final_eval.get('accuracy_raw'),
      # Top-5 of 5 classes or fewer is always 1: reported from 6 classes.
      'eval_top5_accuracy': (final_eval['top5_accuracy']
                             if plan.source.num_classes > 5 else None),
      'eval_top5_accuracy_raw': (final_eval.get('top5_accuracy_raw')
                                 if plan.source.num_classes > 5 else None),
      validation.Metric.EVAL_LOSS: final_eval['loss'],
      'eval_loss_raw': final_eval.get('loss_raw'),
      'eval_examples': int(final_eval['examples']),
      # One line where the final evaluation shows a model that has not
      # learned (one class for nearly every example, chance's accuracy).
      'learning_warning': learning.not_learned(
          final_eval['confusion'], plan.source.class_names, plan.total_steps,
          plan.source.num_train_examples, plan.steps_per_epoch) or None,
      'eval_skipped_records': plan.source.num_eval_examples -
                              int(final_eval['examples']),
      'export_dir': export_dir,
      'weights_sha256': trainer.weights_sha256(),
      'initial_weights_sha256': initial_weights_sha256,
      'seed': config.seed,
      'epochs': config.epochs,
      'steps_per_epoch': plan.steps_per_epoch,
      'examples_per_epoch': plan.examples_per_epoch,
      **peak_memory(plan.backend, hardware),
  }


def log_done(result, workdir_url):
  """The run's last line (a warning line before it where it has not
  learned)."""
  rate, wait = result['train_images_per_sec'], result['input_wait_fraction']
  raw, top5 = result['eval_accuracy_raw'], result['eval_top5_accuracy']
  warning = result.get('learning_warning')
  if warning:
    logging.warning('%s', warning)
  logging.info('Done: eval_accuracy %.4f%s%s, %s img/s, input wait %s, '
               'wall time %s, weights sha256 %s; metrics in %s%s',
               result[validation.Metric.EVAL_ACCURACY],
               '' if top5 is None else f', top-5 {top5:.4f}',
               '' if raw is None else
               f' (moving average; raw weights {raw:.4f})',
               f'{rate:.0f}' if rate else '-',
               f'{wait:.0%}' if wait is not None else '-',
               console.duration(result['wall_s']),
               result['weights_sha256'][:16], f'{workdir_url}/metrics.json',
               '; warning: the model has not learned yet (the line above)' if warning
               else '')


def peak_memory(backend, hardware):
  """This process's peak memory: the accelerator's, as its backend counts
  it, else the host's RSS."""
  peak = backend.peak_device_memory(hardware)
  if peak is not None:
    return {'peak_memory_bytes': int(peak),
            'peak_memory_kind': f'{hardware.device_kind}:0 device'}
  # ru_maxrss is in KiB on Linux.
  rss_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
  return {'peak_memory_bytes': rss_kib * 1024, 'peak_memory_kind': 'host RSS'}
