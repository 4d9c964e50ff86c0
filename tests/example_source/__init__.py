"""A source as small as one can be, to show what adding one takes: this
package (its declaration here, its reader in stripes.py) and one line,
`sources.SOURCES.register(example_source.Stripes())`
(tests/test_new_source.py). Images of vertical or horizontal stripes,
made on the fly: two classes, no files."""

from pipeline.data.sources.source import DataSource


class Stripes(DataSource):
  """Striped images; the class is the stripes' direction."""
  name = 'stripes'
  description = 'images of vertical or horizontal stripes, made on the fly'
  keys = {}  # It takes no settings; a source's own keys would be here.

  def inputs(self, settings):
    return {}  # Nothing read: the images are made.

  def load(self, settings, prepare=True):
    from example_source import stripes  # pylint: disable=g-import-not-at-top
    del settings, prepare  # Nothing to prepare: the images are made.
    return stripes.load(16)
