"""Where a run's files live and how they are written so nothing is lost.

workdirs.py (a local or gs:// workdir staged locally), workdir_lock.py (one
writer per workdir), gcs.py (the bucket client), checkpoint.py (the series
of committed checkpoints, restored newest first), checkpoint_gcs.py (its
commit protocol on a bucket), checkpoint_files.py (the two file formats,
each backend's, read by both), checkpoint_format.py (which one a workdir
holds), user_cache.py (this user's cache folder). Imports pipeline.errors and TensorFlow's
file layer only.
"""
