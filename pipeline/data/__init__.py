"""The input: sources and their records, decoding, augmentation, caching.

sources/ (each value of config.dataset, one module each: what a run asks
of it and its loader), augmentations.py (each value of config.augment:
what it does), tfrecords.py, image_folder.py and csv_files.py (reading
records, folders and CSVs), photos.py and sklearn_digits.py (the bundled
sets), decode.py (JPEG decoding and crops), augment.py (the augmentations
on tf.data, mixup, CutMix), input_spec.py (what the pipelines take of a
run's config), cache.py (what to cache), inputs.py (the
tf.data pipelines per input context, and the run's batches from either
pipeline), data_service.py (a tf.data service), dali.py and dali_index.py
(NVIDIA DALI's pipelines and their index files). Imports pipeline.errors,
pipeline.parts and storage/ only: both backends read the same tf.data
pipelines, and run the same DALI pipelines through their own DALI plugins.
"""
