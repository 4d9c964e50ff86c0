"""What a run produces for people and programs beyond its checkpoints.

evaluation.py (a committed checkpoint on a held-out split), metrics.py
(metrics.json), learning.py (a run that learned nothing), export.py
(SavedModel, LiteRT, ONNX, model.keras, metadata), predict.py (the export
on images), benchmark/ (throughput and sweeps: measured in its __init__,
tabled in tables.py, layer_times.py by kind of layer), compare/ (runs
side by side: run in its __init__, reported in report.py; the time to
accuracy, the race against Keras' example, Keras' own model.fit beside a
run), reference_input.py (tensorflow/tpu's input, the benchmark's
baseline), saved_measurements.py (what --save_policy keeps). Builds trainers through plan.backend; never imports
a backend package.
"""
