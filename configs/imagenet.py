"""EfficientNet-B0 on ImageNet (tfds imagenet2012) at 224 px.

  python -m launch.train --config=configs/imagenet.py --tpu=local \
      --config.data_dir=gs://BUCKET/tensorflow_datasets --workdir=gs://BUCKET/b0

tensorflow/tpu's reference reaches top-1 76.7 after 350 epochs at batch
4096 on TPU; this config keeps its recipe's shape (SGD, cosine decay,
label smoothing 0.1) at a shorter schedule. imagenet2012 must be prepared in
data_dir beforehand (tfds needs the manually downloaded archives).

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
  config.image_size = 224
  # tensorflow/tpu's crops: decoded straight from the JPEG's crop window.
  config.augment = 'inception'
  # 1.28 M JPEGs: about 140 GB as stored, 335 GB decoded at 256 px. Uncached,
  # each epoch decodes only the crops. --config.cache=memory caches the
  # encoded records where half the host's RAM holds them (a TPU VM's does),
  # else refuses in one line.
  config.cache = ''
  config.shuffle_buffer = 1024  # Of encoded records, before decoding.
  config.global_batch_size = 1024
  config.epochs = 90
  config.optimizer = 'sgd'
  config.base_learning_rate = 0.1
  config.warmup_epochs = 5.0
  config.weight_decay = 5e-5
  config.batch_norm_momentum = 0.99
  config.steps_per_execution = 100
  config.log_every_steps = 500
  config.checkpoint_every_steps = 5000
  config.eval_every_epochs = 5
  return config
