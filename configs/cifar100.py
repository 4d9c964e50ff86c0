"""EfficientNet-B0 on CIFAR-100 at 224 px: the seed notebook's experiment.

  python -m launch.train --config=configs/cifar100.py --policy=mixed_float16

The notebook's anchor (one V100): float32 at batch 128 took 158 s/epoch and
reached test accuracy 0.524; mixed_float16 at batch 256 took 67 s/epoch and
0.506. Needs the network once, to download CIFAR-100 into data_dir.
"""

from configs import default


def get_config():
  config = default.get_config()
  config.dataset = 'cifar100'
  config.image_size = 224
  config.augment = 'translate_flip'
  config.global_batch_size = 256
  config.epochs = 15
  config.optimizer = 'sgd'
  config.base_learning_rate = 0.1
  config.weight_decay = 5e-5
  config.batch_norm_momentum = 0.99
  config.steps_per_execution = 32
  config.log_every_steps = 100
  config.checkpoint_every_steps = 1000
  config.eval_every_epochs = 1
  return config
