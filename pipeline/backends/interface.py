"""What a backend is, and what its trainer does: the one seam.

Keras 3 keeps one `Trainer` interface and a trainer per backend
(keras/src/backend/{tensorflow,jax}/trainer.py); so does this pipeline. The
training loop, its actions, the evaluator, the benchmark and the export
call only what is declared here, with plain Python values at the seam (an
`int` step, floats and numpy arrays out of `train` and `evaluate`). The
types are named, not imported (the plan is a floor above; data's inputs
load TensorFlow): the seam costs no import.
"""

import contextlib
from typing import Callable, Iterable, Optional, Protocol, Union

import numpy as np

from pipeline.storage.checkpoint_format import Format

# The types at the seam, by the names their modules give them:
# rules.config.request.Request, rules.machine.hardware.Hardware,
# run.plan.Plan, data.inputs.TfDataInput, data.dali.Input (DaliInput here),
# each backend's ema.MovingAverage and keras.Model.


class Trainer(Protocol):
  """A run's model, optimizer and compiled programs on one backend."""

  model: 'keras.Model'  # Exported, and loaded by init_from.
  # The moving average (reset() restarts it; each backend's ema.py), or None.
  ema: Optional['MovingAverage']
  num_classes: int

  @property
  def step(self) -> int:
    """Every step taken so far (skipped ones included)."""

  @property
  def skipped_steps(self) -> int:
    """Steps the loss scale skipped (non-finite gradients)."""

  @property
  def loss_scale(self) -> Optional[float]:
    """The dynamic loss scale, or None without loss scaling."""

  def learning_rate(self) -> float:
    """The learning rate of the next step."""

  def train(self, iterator, num_steps: int) -> dict:
    """Runs `num_steps` steps in one compiled execution; returns floats:
    loss, accuracy, grad_norm (the mean of each step's gradient's global
    norm, unscaled and before clipping), input_wait_s, skipped_records, and
    step_losses (numpy).
    A one-line UserError for what a user can act on (out of memory, a label
    outside the classes, a worker lost)."""

  def evaluate(self, dataset, num_steps: int) -> dict:
    """loss, accuracy, top5_accuracy, examples (floats) and the confusion
    matrix (numpy) over `num_steps` batches; with a moving average those
    of the averaged weights, and the model's own as *_raw."""

  def exported_weights(self) -> contextlib.AbstractContextManager:
    """A context in which `model` holds what is exported."""

  def weights_sha256(self) -> str:
    """SHA-256 of every weight: equal digests mean equal models."""

  def checkpoint_files(self, directory: str, max_to_keep: int,
                       written_as: Optional[Format] = ...):
    """The local layer of pipeline.storage.checkpoint.Checkpointer: save,
    latest, paths, restore. `written_as`: the backend's own Format unless
    given; another (a run trained on the other backend), or None (a run
    whose run.json names none: by its files), is read only."""

  def compiled_programs(self) -> int:
    """How many programs the training step has compiled (traced) in this
    process: one per input shape (a stage of progressive learning's size)."""

  def read_back(self) -> None:
    """Takes the model's weights (just loaded into it) as the run's state."""

  def step_cost(self) -> dict:
    """FLOPs and bytes per image of one micro-batch's forward and backward
    pass, counted from the program before XLA optimises it (both backends
    count the same arithmetic: backends/hlo_cost.py): 'flops', 'bytes'
    (before fusion) and 'counted', what was analysed; else {'reason': why
    there are none}, never an exception. After a train() call."""


class Backend(Protocol):
  """A Keras backend as the pipeline uses it."""

  name: str  # 'tensorflow' or 'jax': --backend's value, run.json's record.
  checkpoint_format: Format  # What its trainers write.

  def software(self) -> str:
    """The versions compiled programs and saved measurements hold for,
    e.g. 'tf-2.21.0-cudnn-9.28.0.42'."""

  def compile_cache(self, setting: str, environ: dict, gpus: list,
                    accelerator: bool, versions: str):
    """rules.speed.compile_cache.Settings for compile_cache_dir=`setting`,
    before TensorFlow or JAX load (`environ` is not changed here)."""

  def check_compile_cache(self, directory: str) -> None:
    """Readies the cache folder before TensorFlow or JAX load (sets aside
    entries that would fail the run)."""

  def resolve_hardware(self, request: 'Request') -> 'Hardware':
    """The rules.machine.hardware.Hardware of this process for a
    rules.config.request.Request, or a one-line UserError."""

  def policy(self, requested: str, policy: str, reason: str):
    """(policy, reason): the shared rule's choice, adjusted to what this
    backend can do, or a one-line UserError for a policy it cannot run."""

  def choose_xla(self, requested: str, hardware: 'Hardware',
                 policy: str) -> tuple:
    """(on, reason) for --xla=auto|on|off."""

  def build_trainer(self, plan: 'Plan') -> Trainer:
    """Sets the policy and the seed and builds the Trainer."""

  def distribute(self, hardware: 'Hardware',
                 batches: Union['TfDataInput', 'DaliInput']) -> Iterable:
    """The batches data/ describes (a data.inputs.TfDataInput: a tf.data
    input function of a tf.distribute.InputContext; or a data.dali.Input:
    DALI's pipelines, decoded on the GPUs where the run has them) as the
    trainer takes them (iter() gives a fresh pass)."""

  def repeated(self, hardware: 'Hardware', images: np.ndarray,
               labels: np.ndarray, delay_s: float = 0.0) -> Iterable:
    """One batch (this host's share, numpy) forever, as the trainer takes
    it: placed on the devices once where the backend can keep it there;
    each handed over `delay_s` seconds late (an input as slow as that)."""

  def sum_over_workers(self, hardware: 'Hardware') -> Callable:
    """A function numpy vector -> the element-wise sum of every worker's,
    which every worker calls at the same step."""

  def profiler(self) -> tuple:
    """(start(logdir), stop()) of the profiler that writes TensorBoard's
    Profile tab."""

  def export(self, task: str, model: 'keras.Model', metadata: dict,
             path: str, *args, io_device: Optional[str] = None):
    """Writes `model` (the export's weights in it) at `path` as `task`
    (backends/tensorflow_exports.py, a plain TensorFlow graph whichever
    backend trained it): 'saved_model'; 'tflite' (args: the weights'
    kind), a float32 rebuild's LiteRT; 'onnx' (args: check_images,
    export_dir), a float32 rebuild's ONNX converted from the SavedModel at
    export_dir, returning its largest difference in probability from that
    SavedModel on `check_images` images."""

  def peak_device_memory(self, hardware: 'Hardware') -> Optional[int]:
    """Peak bytes this process held on its first accelerator, as the
    backend's own allocator counts them; None where it counts none (a
    CPU)."""
