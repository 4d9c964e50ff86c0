"""EfficientNet-B0 on ImageNet (tfds imagenet2012) at 224 px: tensorflow/tpu's
recipe. Another network trains and evaluates at its own sizes
(--config.model=efficientnet_b4: 380 px; efficientnetv2_s: 300, and 384).

  python -m launch.train --config=configs/imagenet.py --tpu=local \
      --config.data_dir=gs://BUCKET/tensorflow_datasets --workdir=gs://BUCKET/b0

The recipe of tensorflow/tpu's models/official/efficientnet (main.py and
utils.py defaults): RMSProp (decay 0.9, momentum 0.9, epsilon 1e-3) at 0.016
per 256 images (batch 2048), 5 warmup epochs, then x0.97 every 2.4 epochs;
L2 weight decay 1e-5 in the loss (not on batch norm); label smoothing 0.1;
moving average 0.9999; stochastic depth 0.2 (survival 0.8); dropout 0.2;
batch-norm momentum 0.99; 218,949 steps, about 350 epochs. Its README
reports top-1 76.7% for B0 with this standard preprocessing (77.1% with
AutoAugment). imagenet2012 must be prepared in data_dir beforehand (tfds
needs the manually downloaded archives).

Input: uncached, about 620-660 images/s per core at 224 px (2-core Xeon,
photographs of ImageNet's size; BUILD_NOTES.md, launch.benchmark
--input_only), at par with tensorflow/tpu's own preprocessing. EfficientNet-B0
with mixed precision trains at 3,454 images/s on one A100 (NVIDIA's figure),
so each A100 needs about 6 such cores: 48 of an 8-GPU VM's 96 vCPUs. Short
of cores, move the input to CPU machines with --config.data_service.
"""

from configs import default


def get_config():
  config = default.get_config()
  config.dataset = 'imagenet2012'
  config.image_size = 0  # The network's own: B0 224, B4 380, V2-S 300/384.
  # tensorflow/tpu's crops: decoded straight from the JPEG's crop window.
  config.augment = 'inception'
  # 1.28 M JPEGs: about 140 GB as stored, 335 GB decoded at 256 px. Uncached,
  # each epoch decodes only the crops. --config.cache=memory caches the
  # encoded records where half the host's RAM holds them (a TPU VM's does),
  # else refuses in one line.
  config.cache = ''
  config.shuffle_buffer = 1024  # Of encoded records, before decoding.

  config.model = 'efficientnet_b0'
  # Progressive learning as the network's recipe: EfficientNetV2's four
  # stages (128 px up to its own size), none for the others.
  config.progressive_stages = -1
  config.dropout_rate = 0.2
  config.drop_connect_rate = 0.2
  config.batch_norm_momentum = 0.99

  config.global_batch_size = 2048
  config.epochs = 350
  config.optimizer = 'rmsprop'
  config.base_learning_rate = 0.016
  config.warmup_epochs = 5.0
  config.lr_schedule = 'exponential'
  config.lr_decay_rate = 0.97
  config.lr_decay_epochs = 2.4
  config.weight_decay = 0.0
  config.l2_weight_decay = 1e-5
  config.label_smoothing = 0.1
  config.ema_decay = 0.9999

  # Auto: on a TPU as many steps as 1 GiB of input staged per chip holds
  # (27 at 256 images of 224 px a chip: a v5e-8); 100 would stage 3.9 GB
  # of a v5e chip's 16 GiB beside as much running.
  config.steps_per_execution = 0
  config.log_every_steps = 500
  config.checkpoint_every_steps = 5000
  config.eval_every_epochs = 5
  return config
