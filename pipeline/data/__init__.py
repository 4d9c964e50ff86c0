"""The input: sources and their records, decoding, augmentation, caching.

kinds.py (each value of config.dataset and what a run asks of it),
sources.py (their loaders: tfds, TFRecord files, image folders, the
bundled sets photos.py and sklearn_digits.py), tfrecords.py (writing and reading records), decode.py
(JPEG decoding and crops), augment.py (RandAugment, mixup, CutMix),
cache.py (what to cache), inputs.py (the tf.data pipelines per input
context, and the run's batches from either pipeline), data_service.py (a
tf.data service), dali.py and dali_index.py (NVIDIA DALI's pipelines and
their index files). Imports pipeline.errors and storage/ only: both
backends read the same tf.data pipelines, and run the same DALI pipelines
through their own DALI plugins.
"""
