"""The backend choice: explicit, or auto on what is installed and attached.

`choose` is given what is installed and attached (a TPU chip cannot exist
here); each case is the rule a user on that machine meets.
"""

import pytest

from pipeline import backends
from pipeline.errors import UserError


@pytest.mark.parametrize('requested, tpu, installed, attached, expected', [
    # Colab's TPU runtime and TPU7x: no tensorflow-tpu, JAX installed.
    ('auto', 'local', dict(tensorflow_tpu=False, jax=True), False, 'jax'),
    ('auto', '', dict(tensorflow_tpu=False, jax=True), True, 'jax'),
    # A TPU VM on a TF 2.20 image keeps TensorFlow's TPU build.
    ('auto', 'local', dict(tensorflow_tpu=True, jax=True), False,
     'tensorflow'),
    # TPU Nodes are TensorFlow's, JAX installed or not.
    ('auto', 'my-tpu', dict(tensorflow_tpu=False, jax=True), False,
     'tensorflow'),
    ('auto', 'grpc://10.0.0.2:8470', dict(tensorflow_tpu=True, jax=False),
     False, 'tensorflow'),
    # No TPU: TensorFlow, even with JAX installed.
    ('auto', '', dict(tensorflow_tpu=False, jax=True), False, 'tensorflow'),
    ('jax', '', dict(tensorflow_tpu=False, jax=True), False, 'jax'),
    ('tensorflow', 'local', dict(tensorflow_tpu=False, jax=True), False,
     'tensorflow'),
])
def test_each_machine_gets_its_backend_and_a_reason(requested, tpu, installed,
                                                     attached, expected):
  name, reason = backends.choose(requested, tpu, attached=attached, **installed)
  assert name == expected
  assert reason and ('--backend' in reason if requested != 'auto'
                     else '--backend' not in reason)


def test_auto_on_a_tpu_says_why_it_picked_jax():
  _, reason = backends.choose('auto', 'local', tensorflow_tpu=False, jax=True,
                             attached=False)
  assert reason == ('--tpu=local and no TensorFlow TPU build is installed '
                    '(tensorflow-tpu); Keras runs on JAX')


@pytest.mark.parametrize('requested, tpu, installed, message', [
    ('torch', '', dict(jax=True),
     '--backend=torch is not a backend; accepted: auto, tensorflow, jax'),
    ('jax', '', dict(jax=False), '--backend=jax needs JAX, which is not '
     'installed; pip install -r requirements-jax.txt'),
    ('jax', 'my-tpu', dict(jax=True), '--backend=jax cannot drive a TPU Node '
     '(--tpu=my-tpu)'),
    ('auto', 'local', dict(jax=False), '--tpu=local, but neither '
     'tensorflow-tpu nor JAX is installed'),
])
def test_a_backend_that_cannot_run_is_one_line(requested, tpu, installed,
                                               message):
  with pytest.raises(UserError) as raised:
    backends.choose(requested, tpu, tensorflow_tpu=False, attached=False,
                   **installed)
  assert str(raised.value).startswith(message)
  assert '\n' not in str(raised.value)


@pytest.mark.parametrize('trained_on, backend_now, trains, refused', [
    ('jax', 'tensorflow', True, True),
    ('tensorflow', 'jax', True, True),
    (None, 'jax', True, True),  # A run.json from before backends: TensorFlow.
    ('jax', 'jax', True, False),
    ('jax', 'tensorflow', False, False),  # launch.evaluate reads either.
])
def test_a_run_resumes_on_the_backend_it_trained_on(trained_on, backend_now,
                                                    trains, refused,
                                                    tmp_path):
  from configs import default  # pylint: disable=g-import-not-at-top
  from pipeline.run import plan  # pylint: disable=g-import-not-at-top
  from pipeline.storage import workdirs  # pylint: disable=g-import-not-at-top
  config = default.get_config()
  resolved = {'backend': trained_on} if trained_on else {}
  workdirs.write_json(str(tmp_path / 'run.json'), {
      'config': {key: config[key] for key in plan.RUN_IDENTITY},
      'resolved': resolved})
  workdir = workdirs.Workdir(str(tmp_path), str(tmp_path / 'staging'))
  check = lambda: plan._check_same_run(workdir, config,
                                       backends.load(backend_now) if trains
                                       else None)
  if not refused:
    assert check() is True
    return
  with pytest.raises(UserError) as raised:
    check()
  on = trained_on or 'tensorflow'
  assert str(raised.value) == (
      f"workdir '{tmp_path}' holds a run trained on {on}, which resumes "
      f'there only: --backend={on}, or another --workdir')
