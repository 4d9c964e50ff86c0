"""The ONNX export (export_onnx): converted from the SavedModel, checked
against it on one batch, and kept only within the tolerance.

Whole runs that export ONNX on each backend are in test_train_in_process.py
(TensorFlow) and test_across_backends.py (JAX); here the export alone, of
a freshly built network under each policy, and what happens over the
tolerance.
"""

import logging
import os

import keras
import pytest

from conftest import check_onnx_agrees_with_the_saved_model
from pipeline import backends
from pipeline.errors import UserError
from pipeline.recipe import models
from pipeline.reports import export
from pipeline.reports import predict
from pipeline.storage import workdirs

METADATA = {'model': 'efficientnet_tiny',
            'class_names': [str(i) for i in range(10)],
            'preprocessing': {'image_size': 32}}


def _exported(tmp_path, policy='float32'):
  keras.mixed_precision.set_global_policy(policy)
  try:
    model = models.build_model('efficientnet_tiny', 10, 32)
  finally:
    keras.mixed_precision.set_global_policy('float32')
  workdir = workdirs.Workdir(str(tmp_path), str(tmp_path))
  export.export_model(model, workdir, True, METADATA, onnx=True,
                      backend=backends.load('tensorflow'))
  return tmp_path / 'export'


def test_a_float32_export_has_an_onnx_model_that_computes_the_same(tmp_path):
  check_onnx_agrees_with_the_saved_model(_exported(tmp_path))


@pytest.mark.slow  # A second network built and converted: the fast suite's time.
def test_a_bfloat16_exports_onnx_from_a_float32_rebuild(tmp_path):
  """onnxruntime runs no mixed bfloat16 graph: the ONNX model is a float32
  rebuild's, checked against that rebuild, and metadata.json says so."""
  exported = _exported(tmp_path, 'mixed_bfloat16')
  metadata = workdirs.read_json(str(exported / 'metadata.json'))
  assert metadata['onnx'] == 'model.onnx'
  assert metadata['onnx_checked_against'] == (
      "a float32 rebuild's SavedModel (the SavedModel computes in "
      'mixed_bfloat16)')
  assert metadata['onnx_max_difference'] <= 1e-4


def test_over_the_tolerance_it_is_one_line_and_no_file(tmp_path, monkeypatch,
                                                        caplog):
  """A conversion that differs (here: a tolerance nothing meets) leaves no
  model.onnx, says so in one warning, and metadata.json keeps the figure."""
  monkeypatch.setattr(export, 'ONNX_TOLERANCE', -1.0)
  with caplog.at_level(logging.WARNING):
    exported = _exported(tmp_path)
  assert not os.path.exists(exported / 'model.onnx')
  assert (exported / 'saved_model.pb').exists()
  metadata = workdirs.read_json(str(exported / 'metadata.json'))
  assert metadata['onnx'] is None and metadata['onnx_max_difference'] >= 0
  warned = [r.getMessage() for r in caplog.records
            if r.levelno == logging.WARNING and 'model.onnx' in r.getMessage()]
  assert len(warned) == 1 and warned[0].startswith(
      "model.onnx not written: its probabilities differ from those of the "
      'SavedModel by '), warned


def test_predict_names_a_file_that_is_no_onnx_model(tmp_path):
  exported = _exported(tmp_path)
  broken = exported / 'model.onnx'
  broken.write_bytes(b'not a model')
  with pytest.raises(UserError) as raised:
    predict.load(str(broken))
  assert str(raised.value).startswith(
      f'{broken} is not an ONNX model onnxruntime reads: ')
  assert '\n' not in str(raised.value)
