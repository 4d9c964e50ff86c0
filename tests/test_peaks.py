"""The peaks table and the fractions of them a benchmark reports."""

import pytest

from pipeline.rules.machine import peaks


@pytest.mark.parametrize('name, sixteen_bit, expected', [
    ('NVIDIA H100 80GB HBM3', True, (989e12, 3.35e12)),
    ('NVIDIA H100 PCIe', True, (756e12, 2.0e12)),
    ('NVIDIA H200', False, (67e12, 4.8e12)),
    # An H100 NVL is not an SXM H100, and a GH200 not an H200.
    ('NVIDIA H100 NVL', True, (835e12, 3.9e12)),
    ('NVIDIA GH200 480GB', True, (989e12, 4.0e12)),
    ('NVIDIA GH200 144G HBM3e', True, (989e12, 4.9e12)),
    ('NVIDIA A100-SXM4-80GB', True, (312e12, 2.039e12)),
    ('NVIDIA A100-SXM4-40GB', True, (312e12, 1.555e12)),
    ('Tesla T4', True, (65e12, 0.32e12)),
    ('Tesla V100-SXM2-16GB', False, (15.7e12, 0.9e12)),
    ('NVIDIA L4', True, (121e12, 0.3e12)),
    ('8 x TPU v5 lite', True, (197e12, 0.819e12)),
    ('4 x TPU v4', True, (275e12, 1.2e12)),
])
def test_each_device_finds_its_own_row(name, sixteen_bit, expected):
  flops, bandwidth, source = peaks.peak(name, sixteen_bit)
  assert (flops, bandwidth) == expected and source


@pytest.mark.parametrize('name, sixteen_bit', [
    ('NVIDIA L40S', True),  # Not an L4.
    ('host CPU', False),
    ('8 x TPU v4', False),  # TPUs: no float32 figure.
    (None, True),
])
def test_devices_without_a_figure_have_none(name, sixteen_bit):
  assert peaks.peak(name, sixteen_bit) is None


def test_fractions_of_the_peak_over_every_device():
  # B0 at 224 px: about 2.56 GFLOP per image for a training step.
  cost = {'flops': 2.56e9, 'bytes': 60e6}
  result = peaks.fractions(cost, 7330.0, 'NVIDIA H100 80GB HBM3', 2, True)
  assert result['achieved_flops_per_sec'] == pytest.approx(2.56e9 * 7330)
  assert result['fraction_of_peak_flops'] == pytest.approx(
      2.56e9 * 7330 / (2 * 989e12))
  assert result['fraction_of_peak_bandwidth'] == pytest.approx(
      60e6 * 7330 / (2 * 3.35e12))
  assert result['peak_source'] == 'NVIDIA H100 datasheet (SXM)'
  on_a_cpu = peaks.fractions(cost, 100.0, 'host CPU', 1, False)
  assert set(on_a_cpu) == {'achieved_flops_per_sec', 'achieved_bytes_per_sec'}
  assert peaks.fractions({'reason': 'no jaxlib'}, 100.0, 'NVIDIA L4', 1,
                         True) == {}
