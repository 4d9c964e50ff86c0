"""The networks a config names, each family one object in one module here,
registered in MODELS by every model name it builds: efficientnet.py
(EfficientNet B0-B7, V2, and a tiny one for checks), resnet.py
(ResNet-50). A new family is a module here (a models.family.ModelFamily)
and its registration line below.

Every model takes uint8 images (the input pipeline ships a quarter of
float32's bytes; the cast happens on the device), runs its family's
headless keras.applications network, and ends in a float32 head, so
logits and loss stay float32 under every policy (keras.applications' own
top would run softmax in the compute dtype). The headless network is one
nested layer, `backbone(model)`: what published weights load into, what
fine-tuning freezes.
"""

import dataclasses

import keras

from pipeline import parts
from pipeline.errors import UserError
from pipeline.recipe import layers
from pipeline.recipe.progressive import SIZE_STEP
from pipeline.recipe.progressive import SMALLEST
from pipeline.recipe.models import efficientnet
from pipeline.recipe.models import resnet

MODELS = parts.Table('model', 'model')
# The order is the docs' (configs-and-data.md) and the errors'.
MODELS.register(efficientnet.EfficientNet())
MODELS.register(resnet.ResNet())


@dataclasses.dataclass(frozen=True)
class ImageSizes:
  """The sizes a run trains and evaluates at, and where they came from."""
  train: int
  eval: int
  train_from: str
  eval_from: str

  def describe(self):
    """'380 px training, 380 px evaluation (efficientnet_b4's own: ...)'."""
    if self.train_from == self.eval_from:
      return (f'{self.train} px training, {self.eval} px evaluation '
              f'({self.train_from})')
    return (f'{self.train} px training ({self.train_from}), {self.eval} px '
            f'evaluation ({self.eval_from})')

  def to_json(self):
    return dataclasses.asdict(self)

  def check_source(self, source_name, image_side):
    """A one-line UserError where a given eval_image_size is larger than
    both the training size and the source's images (`image_side`, their
    longer side where the source fixes it; 0: they vary): evaluating
    larger than the images adds no detail, only cost."""
    largest = max(self.train, image_side)
    if (self.eval_from == 'eval_image_size' and image_side and
        self.eval > largest):
      raise UserError(
          f'eval_image_size={self.eval} is larger than the images of '
          f'{source_name} ({image_side} px) and the training size '
          f'({self.train} px), which adds no detail: use 0 (the training '
          f'size) or at most {largest}')


def image_sizes(model, image_size, eval_image_size, detail=None):
  """The ImageSizes of a run of `model` asked for at `image_size` and
  `eval_image_size`. A size given wins. image_size 0 is the network's own
  (as its published recipe trains and evaluates it) capped by the data's
  detail (`detail`, sources' Detail: the median shorter side of a sample
  of its images; None or unknown: no cap): the smallest multiple of 16
  at or above it, never below 32. A network trained below its own size
  evaluates at the training size (the data hold no more detail);
  eval_image_size 0 beside a given image_size is that size too."""
  train, evaluation, recipe = MODELS[model].image_sizes(model)
  own = f"{model}'s own: {recipe}"
  if image_size:
    sizes = (image_size, 'image_size')
    default_eval = (image_size, 'the training size')
  else:
    sizes, default_eval = (train, own), (evaluation, own)
    side = detail.side if detail else 0
    capped = max(SMALLEST, -(-side // SIZE_STEP) * SIZE_STEP)
    if side and capped < train:
      sizes = (capped, f'the data: {detail.describe()}, rounded up to '
               f'{SIZE_STEP}s from {SMALLEST}; {model}\'s own is {train}')
      default_eval = (capped, 'the training size')
    elif side:
      sizes = (train, f'{own}; the data hold as much: {detail.describe()}')
  if eval_image_size:
    default_eval = (eval_image_size, 'eval_image_size')
  return ImageSizes(sizes[0], default_eval[0], sizes[1], default_eval[1])


def build_model(name, num_classes, image_size, dropout_rate=0.2,
                batch_norm_momentum=0.99, drop_connect_rate=0.2,
                weights=None, forms=None):
  """Returns a Keras model: uint8 [B, H, W, 3] images -> float32 logits,
  at `image_size` (None: any size, as a run evaluated at another size
  than it trains at needs; each size is its own compiled program).

  keras.applications fixes batch-norm momentum (0.99 in most), tuned for
  hundreds of ImageNet epochs; a short run needs faster-moving inference
  statistics, or eval (which uses them) lags far behind training accuracy.

  `weights`: None (random), 'imagenet' (Keras downloads its published
  headless weights) or a local weights file of the same headless network.
  `forms`: {'batch_norm', 'squeeze_excite', 'depthwise'} forms of those
  layers (layers.py; a run's come from its config, model_of_config), or
  None for keras.applications' own: the same weights either way, so what
  only reads or writes weights (an export, a source run's checkpoint)
  needs none.
  """
  family = MODELS[name]
  images = keras.Input((image_size, image_size, 3), dtype='uint8', name='image')
  # Rescaling(1) only casts uint8 to the policy's compute dtype on the device.
  x = keras.layers.Rescaling(1.0, name='to_float')(images)
  preprocessing = family.preprocessing(name)
  if preprocessing is not None:
    x = preprocessing(x)
  network = family.headless(name, weights, (image_size, image_size, 3))
  if forms:
    network = layers.swap(network, **forms)
  family.set_stochastic_depth(network, drop_connect_rate)
  for layer in network.layers:
    if isinstance(layer, keras.layers.BatchNormalization):
      layer.momentum = batch_norm_momentum
  x = network(x)
  x = keras.layers.Dropout(dropout_rate, name='head_dropout')(x)
  logits = keras.layers.Dense(num_classes, dtype='float32', name='logits')(x)
  return keras.Model(images, logits, name=name)


def model_of_run(plan):
  """The run's network (build it inside the strategy's scope on TensorFlow):
  at its one image size, or any size where it evaluates at another or
  trains in progressive stages."""
  sizes = plan.image_sizes
  fixed = sizes.eval == sizes.train and len(plan.stages) == 1
  return model_of_config(plan.recipe, plan.source.num_classes,
                         sizes.train if fixed else None)


def model_of_config(config, num_classes, image_size):
  """The network `config` describes, for `num_classes` (launch.probe's,
  which has no plan, and the run's), at `image_size` (None: any size)."""
  return build_model(config.model, num_classes, image_size,
                     config.dropout_rate, config.batch_norm_momentum,
                     config.drop_connect_rate,
                     forms={table.key: config[table.key]
                            for table in layers.FORM_TABLES})


def rebuilt(name, num_classes, weights, image_size=None, policy='float32'):
  """The network `name` built anew under `policy` with keras.applications'
  own layers (no layer forms: plain Keras, which any Keras reads without
  this project) and given `weights`, a trained model's (its variables are
  float32 under every policy); at `image_size` (None: any). The global
  policy is as it was after."""
  before = keras.mixed_precision.global_policy()
  keras.mixed_precision.set_global_policy(policy)
  try:
    model = build_model(name, num_classes, image_size)
  finally:
    keras.mixed_precision.set_global_policy(before)
  model.set_weights(weights)
  return model


def set_head_dropout(model, rate):
  """The dropout before the logits, for the programs traced from now on
  (a stage of progressive learning sets its own; each stage's new input
  size traces anew)."""
  model.get_layer('head_dropout').rate = rate


def backbone(model):
  """The headless keras.applications network inside a build_model model."""
  nested = [layer for layer in model.layers if isinstance(layer, keras.Model)]
  assert len(nested) == 1, [layer.name for layer in model.layers]
  return nested[0]


def with_softmax(model):
  """The exported form: the same weights, float32 class probabilities out."""
  probabilities = keras.layers.Softmax(dtype='float32', name='probabilities')(
      model.output)
  return keras.Model(model.input, probabilities, name=model.name)
