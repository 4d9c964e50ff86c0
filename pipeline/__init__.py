"""The training pipeline, in folders by role, one floor each; a module
imports only from its own floor and the floors below it (the bottom first):

  errors.py   the one-line errors a run stops with
  storage/    workdirs, their lock, GCS, the checkpoint series and formats
  data/       sources, decoding, augmentation, caching, the tf.data input
  rules/      what every layer decides by: the request, hardware, the
              cluster, precision, schedule, stopping, validation, saved
              measurements
  recipe/     what both backends compile: model, optimizer, loss, average
  backends/   the Backend and Trainer interface, TensorFlow's and JAX's
              implementations, and the choice between them
  run/        the resolved plan and the process around it (environment,
              console), and a TPU slice's workers started from one place
  reports/    evaluation, metrics, export, benchmark, compare, predict
  training/   the loop and its periodic actions, fine-tuning

launch/ parses flags and calls into run/, training/ and reports/.
tests/test_layout.py holds every import to this order.
"""

FLOORS = ('errors', 'storage', 'data', 'rules', 'recipe', 'backends', 'run',
          'reports', 'training')
