"""The training pipeline, in folders by role, one floor each; a module
imports only from its own floor and the floors below it (the bottom first):

  errors.py   the one-line errors a run stops with
  launchers.py  the modules the library starts as processes of their own
  parts.py    named parts: the tables every source, augmentation, model,
              optimizer, schedule and layer form is registered in by name
  storage/    workdirs, their lock, GCS, the checkpoint series and formats
  rules/      what every layer decides by: the request, hardware, the
              cluster, precision, steps, stopping, validation, saved
              measurements
  data/       sources, decoding, augmentation, caching, the tf.data input
  recipe/     what both backends compile: model, optimizer, loss, average;
              fine-tuning's first weights
  backends/   the Backend and Trainer interface, TensorFlow's and JAX's
              implementations, and the choice between them
  probe/      launch.probe: the JAX route measured on a machine beside
              Keras' own model (it names the JAX backend: its tool)
  run/        the resolved plan and the process around it (environment,
              console), and a TPU slice's workers started from one place
  reports/    evaluation, metrics, export, benchmark, compare, predict
  training/   the loop and its periodic actions

rules/ and data/ import neither the other: they stand side by side.
configs/ (plain values, every key's one default) stands below every floor;
launch/ above them parses flags and calls into run/, training/, reports/
and probe/. tests/test_layout.py holds every import to this order.
"""

FLOORS = ('errors', 'launchers', 'parts', 'storage', 'rules', 'data', 'recipe',
          'backends', 'probe', 'run', 'reports', 'training')
