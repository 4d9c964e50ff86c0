"""What every family of networks answers for (a registered part), and the
error for a network without published weights."""

from pipeline import parts
from pipeline.errors import UserError


class ModelFamily(parts.Part):
  """What a run asks of a family of networks."""
  # How it drops residual branches at random, as the plan says it.
  stochastic_depth = ''

  def headless(self, name, weights, input_shape):
    """keras.applications' network `name` without its top, pooled: random
    (`weights` None), its published ImageNet weights ('imagenet',
    downloaded by Keras once) or a weights file of it."""
    raise NotImplementedError

  def with_its_top(self, name, num_classes, input_shape):
    """keras.applications' network `name` as a user would build it: random
    weights, its own top of `num_classes` (the probe's peer)."""
    raise NotImplementedError

  def preprocessing(self, name):
    """A layer between the float pixels [0, 255] and the network, where the
    network expects them otherwise (and its published weights were trained
    so); None where it normalises them itself."""
    del name

  def image_sizes(self, name):
    """(training, evaluation) sizes in pixels that `name`'s published
    recipe uses, and where they come from: what image_size and
    eval_image_size 0 take."""
    raise NotImplementedError

  def progressive_first(self, name):
    """The first stage of progressive learning its published recipe
    trains `name` with ({'image_size', 'randaugment_magnitude',
    'mixup_alpha', 'dropout_rate'}), or None where it has none
    (recipe/progressive.py then starts at half the size)."""
    del name

  def progressive_stages(self, name):
    """The stages its published recipe trains `name` in (0: none), what
    progressive_stages=-1 takes."""
    del name
    return 0

  def published_file(self, name):
    """The file name of Keras' published headless ImageNet weights of
    `name`, for a user fetching them by hand; a one-line UserError for a
    network that has none."""
    raise NotImplementedError

  def load(self, name, network, source, published):
    """Copies the weights of `source` (a network `headless` built) into
    `network` (a build_model backbone), `published`: Keras' ImageNet
    weights, where a network built with them differs from one built
    without; the layers that derive constants from their weights
    (Normalization's mean and variance) derive them again."""
    del name, published
    network.set_weights(source.get_weights())
    for layer in network.layers:
      if hasattr(layer, 'finalize_state'):
        layer.finalize_state()

  def set_stochastic_depth(self, network, rate):
    """Sets the rate at which `network` drops residual branches (the
    deepest's, others in proportion); nothing where it has none."""
    del network, rate

  def describe_stochastic_depth(self, rate):
    """How the plan says it, for `rate`."""
    return f'stochastic depth {rate:g}' if self.stochastic_depth else (
        'no stochastic depth')


def no_published_weights(name):
  """The one-line error for a network Keras publishes no weights of."""
  return UserError(f'{name} has no published ImageNet weights; accepted '
                   'for init_from: a .h5 weights file of its headless '
                   'network, or the workdir of a run of it')
