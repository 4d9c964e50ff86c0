"""The input: sources and their records, decoding, augmentation, caching.

sources/ (each value of config.dataset, one package each: what a run asks
of it, its reader, its bundled sets), augmentations/ (each value of
config.augment: what it does, and its operations on tf.data, mixup,
CutMix), decode.py (JPEG decoding and crops), input_spec.py (what the
pipelines take of a run's config), cache.py (what to cache), inputs.py (the
tf.data pipelines per input context, and the run's batches from either
pipeline), input_pipeline.py (which pipeline: tf.data or DALI),
data_service.py (a tf.data service), spent_iterators.py (spent iterators
destroyed off the training thread), dali/ (NVIDIA DALI's pipelines in its
__init__, their index files in index.py). Imports pipeline.errors,
pipeline.parts and storage/ only: both backends read the same tf.data
pipelines, and run the same DALI pipelines through their own DALI plugins.
"""
