"""The training pipeline, in folders by role (imports only point down this list):

  errors.py   the one-line errors a run stops with
  storage/    workdirs, their lock, GCS, the checkpoint series and formats
  data/       sources, decoding, augmentation, caching, the tf.data input
  training/   the model, its optimizer, objective and moving average; the
              loop and its periodic actions
  backends/   the Backend and Trainer interface, TensorFlow's and JAX's
              implementations, and the choice between them
  run/        the request, the resolved plan, process settings (console,
              signals, compile cache)
  reports/    evaluation, metrics, export, benchmark, compare, predict

launch/ parses flags and calls into run/, training/ and reports/.
"""
