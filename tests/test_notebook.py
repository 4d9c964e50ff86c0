"""The Colab notebook runs top to bottom here, on the CPU, offline.

papermill executes notebooks/train_on_colab.ipynb in a real Jupyter kernel
with the parameters that switch off what needs Colab or the network
(install, upload) and a tiny run on a folder of class folders made from the
digits (its "your own images" cell); every other cell runs as a user's would,
from notebooks/ as Jupyter starts it (it finds the checkout it is in):
the runtime check, a dry run, training, TensorBoard inline, evaluation and
a prediction with the export. A failing command fails its cell. In the
JAX environment (KERAS_BACKEND=jax) the notebook trains on JAX, as it does
on a Colab TPU, over two CPU devices standing in for the chips.
"""

import json
import os
import re

import pytest

from conftest import REPO
from conftest import make_tree

NOTEBOOK = os.path.join(REPO, 'notebooks', 'train_on_colab.ipynb')
ON_JAX = os.environ.get('KERAS_BACKEND') == 'jax'
# On JAX this is the Colab TPU route itself, so CI's JAX tier runs it every
# time; on TensorFlow (GPUs), the slow tier.
_TIER = (lambda test: test) if ON_JAX else pytest.mark.slow


@_TIER
def test_the_colab_notebook_runs_top_to_bottom(tmp_path, tfds_dir):
  import papermill  # pylint: disable=g-import-not-at-top
  workdir = str(tmp_path / 'run')
  executed = str(tmp_path / 'executed.ipynb')
  make_tree(tmp_path / 'images', per_class=12)  # "Your own images".
  papermill.execute_notebook(
      NOTEBOOK, executed, cwd=os.path.join(REPO, 'notebooks'),
      kernel_name='python3',
      parameters=dict(
          INSTALL=False, UPLOAD=False, WORKDIR=workdir,
          IMAGES=str(tmp_path / 'images'),
          TRAIN_FLAGS=(f'--config.data_dir={tfds_dir} '
                       '--config.train_split=train[:128] --config.epochs=1 '
                       '--config.global_batch_size=32 '
                       '--config.model=efficientnet_tiny'
                       + (' --backend=jax --num_cpu_devices=2' if ON_JAX
                          else ''))))
  with open(executed) as f:
    cells = json.load(f)['cells']
  text = ''.join(''.join(output.get('text', ''))
                 for cell in cells for output in cell.get('outputs', []))
  assert 'Runtime: CPU' in text
  assert ('Backend: jax (asked for with --backend=jax)' if ON_JAX else
          'Backend: tensorflow (no TPU') in text
  assert f'Project in {REPO}' in text
  assert 'dry run: everything checks out' in text
  assert 'Done: eval_accuracy' in text
  assert 'Training on the class folders in' in text
  assert 'Classes: eight, five, four, nine, one, seven' in text
  assert re.search(r'Evaluated step [1-9]', text)
  assert 'digit.png' in text  # The prediction's line names the image.
  assert os.path.exists(os.path.join(workdir, 'export', 'saved_model.pb'))
