"""launch.benchmark's results as text tables (measuring is benchmark.py)."""


def sweep_table(result):
  """The sweep as a small text table, the fastest pair last."""
  lines = [f'{result["model"]} at {result["image_size"]} px, batch '
           f'{result["global_batch_size"]}, {result["device_kind"]} '
           f'({result["detail"]}), {result["strategy"]}',
           f'{"policy":<16} {"xla":<4} {"images/s":>10} {"compile s":>10}']
  for row in result['rows']:
    if 'skipped' in row:
      lines.append(f'{row["policy"]:<16} {row["xla"]:<4} skipped: '
                   f'{row["skipped"]}')
    else:
      lines.append(f'{row["policy"]:<16} {row["xla"]:<4} '
                   f'{row["images_per_sec"]:>10.1f} {row["compile_s"]:>10.1f}')
  fastest = result['fastest']
  if fastest:
    speedup = result['speedup_over_float32']
    lines.append(
        f'fastest: --policy={fastest["policy"]} --xla={fastest["xla"]}, '
        f'{fastest["images_per_sec"]:.1f} images/s'
        + (f', {speedup:.2f}x the fastest float32' if speedup else ''))
  return '\n'.join(lines)


def table(result):
  """A small text table of the benchmark's figures."""
  r = result
  rows = [
      (f'input alone, first pass (cache: {r["cache"]})',
       r['input_cold_images_per_sec'], None),
      ('input alone, second pass', r['input_warm_images_per_sec'], None),
      (f'  per core ({r["cores"]} cores)', r['input_images_per_sec_per_core'],
       None),
  ]
  if 'reference_input_images_per_sec' in r:
    rows.append(('reference input (tensorflow/tpu)',
                 r['reference_input_images_per_sec'], None))
  if 'dali_decodes_on' in r:
    rate = r['pipelines_images_per_sec']['dali']
    rows += [(f'DALI ({r["dali_decodes_on"]}), same files', rate, None),
             (f'  per core ({r["cores"]} cores)', rate / r['cores'], None)]
  if 'train_synthetic_images_per_sec' in r:
    rows += [('train, synthetic on device', r['train_synthetic_images_per_sec'],
              r['train_synthetic_input_wait_fraction']),
             ('train, real input', r['train_real_images_per_sec'],
              r['train_real_input_wait_fraction'])]
  if 'overlap_wall_vs_sum' in r:
    rows.append((f'train, input {r["slow_input_delay_s"] * 1e3:.0f} ms a batch',
                 r['train_slow_input_images_per_sec'], None))
  lines = [f'{r["model"]} at {r["image_size"]} px, batch '
           f'{r["global_batch_size"]}, {r["policy"]}, {r["strategy"]} '
           f'x{r["num_replicas"]}, augment {r["augment"]}',
           f'{"what":<36} {"images/s":>10} {"input wait":>11}']
  for name, rate, wait in rows:
    lines.append(f'{name:<36} {rate:>10.1f} '
                 f'{"" if wait is None else f"{wait:.1%}":>11}')
  if 'input_vs_reference' in r:
    lines.append(
        f'input / reference preprocessing: {r["input_vs_reference"]:.2f}x '
        f'(median of {len(r["input_rounds_images_per_sec"])} alternated '
        'rounds: ' + ', '.join(
            f'{o:.0f}/{f:.0f}' for o, f in zip(
                r['input_rounds_images_per_sec'],
                r['reference_rounds_images_per_sec'])) + ')')
  if 'dali_vs_tf_data' in r:
    lines.append(
        f'DALI / tf.data: {r["dali_vs_tf_data"]:.2f}x (median of '
        f'{len(r["dali_rounds_images_per_sec"])} alternated rounds: '
        + ', '.join(f'{d:.0f}/{o:.0f}' for d, o in zip(
            r['dali_rounds_images_per_sec'], r['input_rounds_images_per_sec']))
        + ')')
  if 'target_images_per_sec' in r:
    lines.append(
        f'target {r["target_images_per_sec"]:.0f} images/s: '
        + ('fed' if r['input_feeds_target'] else 'NOT fed')
        + f' by these {r["cores"]} cores; at this rate it needs '
        f'{r["cores_for_target"]} cores')
  lines += _overlap_lines(r)
  if 'compile_s' in r:
    lines.append(f'compile (first call): {r["compile_s"]:.1f} s; input '
                 f'/ model ceiling: {r["input_headroom"]:.1f}x')
  lines += _cost_lines(r)
  return '\n'.join(lines)


def _cost_lines(r):
  """The step's cost per image, labelled by what XLA counted, and how near
  the device's peaks the synthetic rate comes."""
  if 'flops_per_image' not in r:
    return ([f'FLOPs per image: none ({r["step_cost_reason"]})']
            if 'step_cost_reason' in r else [])
  counted = r.get('step_cost_counted', "XLA's cost analysis")
  lines = [f'per image ({counted}): '
           f'{r["flops_per_image"] / 1e9:.3g} GFLOP, '
           f'{r["bytes_per_image"] / 1e6:.4g} MB accessed; at the synthetic '
           f'rate {r["achieved_flops_per_sec"] / 1e12:.3g} TFLOP/s, '
           f'{r["achieved_bytes_per_sec"] / 1e9:.4g} GB/s']
  if 'peak_source' in r:
    lines.append(f'of the peak ({r["peak_source"]}, x{r["num_replicas"]}): '
                 f'{r["fraction_of_peak_flops"]:.1%} of compute, '
                 f'{r["fraction_of_peak_bandwidth"]:.1%} of memory '
                 'bandwidth')
  else:
    lines.append(f'of the peak: no figure for {r["detail"]} '
                 '(pipeline/rules/machine/peaks.py)')
  return lines


def backends_table(result):
  """launch.benchmark --backends: one row per Keras backend; a backend
  that failed is its row's one line."""
  measured = [r for _, r in result['backends'] if 'failed' not in r]
  first = measured[0] if measured else None
  lines = ([f'{first["model"]} at {first["image_size"]} px, batch '
            f'{first["global_batch_size"]}, {first["policy"]}, '
            f'{first["device_kind"]} ({first["detail"]})'] if first else [])
  lines.append(f'{"backend":<12} {"strategy":<20} {"synthetic img/s":>16} '
               f'{"real img/s":>11} {"compile s":>10}')
  for name, r in result['backends']:
    if 'failed' in r:
      lines.append(f'{name:<12} failed: {r["failed"]}')
      continue
    where = f'{r["strategy"]} x{r["num_replicas"]}'
    lines.append(f'{name:<12} {where:<20} '
                 f'{r["train_synthetic_images_per_sec"]:>16.1f} '
                 f'{r["train_real_images_per_sec"]:>11.1f} '
                 f'{r["compile_s"]:>10.1f}')
  for name, r in result['backends']:
    lines += [f'{name}: {line}' for line in _cost_lines(r) + _overlap_lines(r)]
  return '\n'.join(lines)


def _overlap_lines(r):
  if 'overlap_wall_vs_sum' not in r:
    return []
  return [f'input as slow as the model: wall time '
          f'{r["overlap_wall_vs_sum"]:.2f} x (input + model); 0.5 overlaps '
          'them fully, 1.0 not at all']
