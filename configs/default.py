"""Offline default: EfficientNet-B0 on scikit-learn's handwritten digits.

  python -m launch.train

Needs no network: the data ship with scikit-learn. What the config leaves
open (the image size, the augmentation), the data decide: the 8 px digits
train at 32 px with random shifts, a folder of photographs at its own
size with mirrored crops. Expected on a 2-core CPU:
see BUILD_NOTES.md for the measured time and eval_accuracy. Any field can be
overridden on the command line, e.g. --config.epochs=5.
"""

import ml_collections


def get_config():
  """The default run; other configs import this and change a few fields."""
  config = ml_collections.ConfigDict()
  _data(config)
  _recipe(config)
  _execution(config)
  return config


def _data(config):
  """What the run trains on, and how its input is prepared."""
  # Data: a source of pipeline/data/sources/ by name (docs/configs-and-data.md),
  # or any tensorflow-datasets image classification name. Each source's own
  # keys follow (its module says what each means; a test holds every named
  # part's keys to this file, their one home).
  config.dataset = 'sklearn_digits'
  config.data_dir = ''  # tensorflow-datasets' sets
  config.train_split = 'train'
  config.eval_split = ''
  config.train_files = ''  # tfrecord
  config.eval_files = ''
  config.label_offset = 0
  config.num_train_examples = 0
  config.num_eval_examples = 0
  config.train_dir = ''  # image_folder
  config.eval_dir = ''
  config.train_csv = ''  # csv
  config.eval_csv = ''
  config.num_classes = 0  # tfrecord, image_folder, csv
  config.eval_fraction = 0.1  # image_folder, csv
  # Pixels a side. 0: the data decide: the network's own, as its
  # published recipe trains it (B0 224, B4 380, V2-S 300:
  # pipeline/recipe/models/), capped by the median shorter side of a
  # sample of the training images rounded up to a multiple of 16, never
  # below 32 (the 8 px digits: 32; 120 px photographs: 128).
  # eval_image_size 0: the training size where image_size is given or the
  # data cap it, else the network's own evaluation size (V2-S 384).
  config.image_size = 0
  config.eval_image_size = 0
  # 'memory': decoded images where they fit in half the free RAM, else the
  # encoded records (decoded and cropped each epoch); a local file prefix:
  # decoded images on disk; '' (off): decode every epoch, cropping as it
  # decodes (a JPEG's crop window alone is decoded).
  config.cache = 'memory'
  config.shuffle_buffer = 10_000
  # A transform of pipeline/data/augmentations/ (docs/configs-and-data.md);
  # '': the source's own: inception (a random resized crop and a flip) for
  # photographs, translate for digits and letters (a mirrored 2 is no 2).
  config.augment = ''
  # inception_randaugment's: operations an image, and their strength on the
  # paper's 0-30 scale (15: Keras' factor 0.5).
  config.randaugment_layers = 2
  config.randaugment_magnitude = 15.0
  # Batch-level mixup and CutMix: Beta(alpha, alpha) blends; 0 is off, both
  # on alternate at random. Labels become soft; training accuracy then
  # counts the dominant label.
  config.mixup_alpha = 0.0
  config.cutmix_alpha = 0.0
  config.deterministic_input = False  # True trades speed for repeatable order.
  # tf.data, or dali: NVIDIA DALI decodes the TFRecord files' JPEGs on the
  # GPU (requirements-gpu.txt); auto takes DALI on a GPU where
  # launch.benchmark --input_only --save_policy measured it faster.
  config.input_pipeline = 'tf.data'
  # grpc://HOST:PORT of a tf.data service dispatcher (launch.data_service):
  # its workers run the training input. '' runs it here.
  config.data_service = ''


def _recipe(config):
  """The network and how it learns."""
  # A network of pipeline/recipe/models/ by name (docs/configs-and-data.md).
  config.model = 'efficientnet_b0'
  config.dropout_rate = 0.2
  # Progressive learning (EfficientNetV2's; pipeline/recipe/progressive.py):
  # 0 is off, -1 the network's recipe (4 for EfficientNetV2); N splits the epochs into N stages whose image size, RandAugment
  # magnitude, mixup and dropout grow from the first stage's values (-1,
  # and a size of 0: the network's, EfficientNetV2's 128 px, magnitude 5,
  # no mixup, dropout 0.1; else half the size) to the run's own.
  config.progressive_stages = 0
  config.progressive_first_image_size = 0
  config.progressive_first_randaugment_magnitude = -1.0
  config.progressive_first_mixup_alpha = -1.0
  config.progressive_first_dropout_rate = -1.0
  # Stochastic depth, where the network has it (EfficientNet: block i of n
  # drops its residual branch with probability about rate * i / n).
  config.drop_connect_rate = 0.2
  # 0.99 (keras.applications') lags too far behind in a run of minutes.
  config.batch_norm_momentum = 0.9
  # The form of three layers, the same weights either way (the forms of
  # pipeline/recipe/layers.py): fewer reads of each activation. Depthwise
  # convolutions stay Keras' ('conv_in_float32' computes them in float32
  # under a 16-bit policy); the probe times its experiments against it.
  config.batch_norm = 'one_pass'
  config.squeeze_excite = 'matmul'
  config.depthwise = 'conv'

  # Optimisation. The peak rate is base_learning_rate * global_batch / 256.
  config.global_batch_size = 64
  config.epochs = 20
  # Examples per epoch, a multiple of global_batch_size; 0: the training set
  # rounded down to whole batches. launch.compare sets it so runs with
  # different batches see the same examples.
  config.examples_per_epoch = 0
  # An optimizer of pipeline/recipe/optimizers.py, on a learning-rate
  # schedule of pipeline/recipe/schedules.py (each its own keys, added
  # here), after warmup_epochs of linear warmup.
  config.optimizer = 'adamw'
  config.base_learning_rate = 1e-2
  config.warmup_epochs = 2.0
  config.lr_schedule = 'cosine'
  config.lr_decay_rate = 0.97  # exponential
  config.lr_decay_epochs = 2.4
  config.weight_decay = 0.05  # Decoupled (the optimizer's), not in the loss.
  config.l2_weight_decay = 0.0  # l2 * sum(w^2) / 2 in the loss instead.
  config.label_smoothing = 0.1
  # Gradients clipped to this global norm before each update (after the
  # loss scale is taken out); 0 is off. The progress lines give the norm.
  config.grad_clip_norm = 0.0
  # Moving average of the weights, evaluated and exported; 0 is off.
  # Its decay warms up as min(ema_decay, (1 + n) / (10 + n)) over updates.
  config.ema_decay = 0.0
  # Updates of global_batch_size made of this many micro-batches (for a
  # batch that does not fit at once); steps count updates.
  config.gradient_accumulation_steps = 1
  config.seed = 0

  # Fine-tuning: '' (random start), 'imagenet' (keras.applications'
  # weights, downloaded once), a .h5 weights file of the headless network
  # (local or gs://), or another run's workdir (its newest checkpoint).
  config.init_from = ''
  # A run's head comes too when it trained these very class names (a warm
  # start); other names are refused. False: its backbone alone, a new head.
  config.init_head = True
  # Train the head alone (backbone frozen) for this many epochs first.
  config.freeze_backbone_epochs = 0.0


def _execution(config):
  """How the run executes, what it keeps, and when it recovers."""
  # Execution. Steps per compiled call: fewer host round trips. 0 picks one
  # for the device: 100 on TPU, 8 on CPU and GPU, fewer where 1 GiB of
  # staged input per device holds fewer (pipeline/rules/speed/step_counts.py).
  config.steps_per_execution = 0
  # Where XLA's compiled programs are kept across runs: '' a per-user folder
  # on a GPU or TPU (off on a CPU), 'off', or a local folder (any device).
  # Read as TensorFlow loads, so give it on the command line
  # (pipeline/rules/speed/compile_cache.py).
  config.compile_cache_dir = ''
  config.log_every_steps = 50
  config.checkpoint_every_steps = 200
  config.keep_checkpoints = 3
  # 'eval_accuracy' or 'eval_loss': keep the best checkpoint by it in
  # checkpoints_best/ (never pruned) and export it to export_best/ too.
  config.keep_best_metric = ''
  # Export the trained model (a SavedModel in export/, export_best/ with
  # keep_best_metric) at the end; False skips it, as a sweep of short runs
  # may (launch.evaluate --export=export-NAME writes one later).
  config.export = True
  # '' (off), 'float32' or 'float16' (weights): also write export/model.tflite
  # for LiteRT, from a float32 rebuild of the model (about 17 s for B0).
  config.export_tflite = ''
  # Also write export/model.onnx (requirements-onnx.txt), converted from the
  # SavedModel and checked against it on one batch (metadata.json says by
  # how much they differ; over ONNX_TOLERANCE, no file).
  config.export_onnx = False
  config.eval_every_epochs = 5.0  # 0: evaluate only at the end; 0.5 works.
  # Experiment tracking beside TensorBoard (requirements-tracking.txt):
  # '' (off), 'mlflow', 'wandb' or both, comma-separated; the project (an
  # MLflow experiment, a W&B project): '' names it <model>_<dataset>.
  config.tracking = ''
  config.tracking_project = ''
  # 'START,STOP': a profiler trace of the executions covering those steps,
  # in TensorBoard's profile tab (tensorboard-plugin-profile); '' is off.
  config.profile_steps = ''

  # Divergence: a non-finite loss (float32, bfloat16), or under float16 a
  # loss scale below 1 or this many executions in a row with every step
  # skipped, rolls back to the newest checkpoint, at most this many times.
  config.recovery_max_trials = 3
  config.recovery_max_skipped_executions = 5
