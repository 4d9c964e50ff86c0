"""Adding a source is one package and one registration line: a small one
(tests/example_source/) registered, checked, and read through the same
pipelines as the others."""

import pytest
import tensorflow as tf

from configs import default
import example_source
from pipeline import parts
from pipeline.data import inputs
from pipeline.data import sources
from pipeline.data.input_spec import InputSpec
from pipeline.errors import UserError
from pipeline.rules.config import validation


@pytest.fixture
def registered(monkeypatch):
  table = parts.Table('source', 'dataset', sources.SOURCES.accepted)
  for part in sources.SOURCES.parts():
    table.register(part, fallback=part is sources.SOURCES.fallback)
  monkeypatch.setattr(sources, 'SOURCES', table)
  sources.SOURCES.register(example_source.Stripes())  # The one line.
  yield


def _config(**overrides):
  config = default.get_config()
  config.update(dataset='stripes', image_size=32, eval_image_size=32,
                augment='translate_flip', **overrides)
  return config


def test_a_registered_source_is_checked_and_read_as_the_others(registered):
  config = _config()
  from pipeline import recipe  # pylint: disable=g-import-not-at-top
  from pipeline.data import augmentations  # pylint: disable=g-import-not-at-top
  validation.validate(config, 1, recipe.tables(),
                      (sources.SOURCES, augmentations.AUGMENTATIONS))
  source = sources.load_source(config)
  assert (source.name, source.num_classes, source.num_train_examples,
          source.num_eval_examples) == ('stripes', 2, 16, 4)
  context = tf.distribute.InputContext(1, 0, 1)
  spec = InputSpec.of(config)
  images, labels, skipped = next(iter(
      inputs.train_input_fn(spec, source, 8)(context)))
  assert images.shape == (8, 32, 32, 3) and images.dtype == tf.uint8
  assert sorted(set(labels.numpy().tolist())) == [0, 1]
  assert int(tf.reduce_sum(skipped)) == 0
  evaluated = list(inputs.eval_input_fn(spec, source, 4)(context))
  assert [batch[0].shape for batch in evaluated] == [(4, 32, 32, 3)]
  # Horizontal stripes differ down a column, vertical ones along a row.
  image, label = evaluated[0][0][1].numpy(), int(evaluated[0][1][1])
  assert label == 1 and image[:, 16].std() > image[16, :].std()


def test_without_its_line_the_source_is_unknown():
  with pytest.raises(UserError, match="unknown dataset 'stripes'"):
    sources.load_source(_config())
