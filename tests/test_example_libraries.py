"""tinyjax.example_libraries (JAX's optimizers and stax): the same numbers as JAX 0.10.2 for the same inputs, keys and
steps; pytrees of states through jit; stax layers against numpy; errors."""
from __future__ import annotations

import numpy as np
import pytest

import tinyjax as tj
import tinyjax.numpy as tnp
from tinyjax import random
from tinyjax.example_libraries import optimizers as O
from tinyjax.example_libraries import stax

# JAX 0.10.2's parameters after 5 jitted steps on the same problem (see run_optimizer), per optimizer
JAX_VALUES = {
  "sgd": [[0.239544, -0.05236],
         [0.670904, -9.6455202, 0.391976]],
  "mom": [[0.142149, -0.139527],
         [0.160941, -29.3008537, 0.220799]],
  "nest": [[0.106885, -0.188626],
         [0.11284, -293.276001, 0.175733]],
  "adagrad": [[0.207296, -0.096678],
         [0.906654, -2.095592, 0.407548]],
  "rms": [[0.198666, -0.111317],
         [0.897423, -2.1081879, 0.399618]],
  "rmsm": [[0.008381, -0.329739],
         [0.707509, -2.315372, 0.215563]],
  "adam": [[0.250147, -0.050086],
         [0.950097, -2.0500381, 0.450162]],
  "adamax": [[0.251462, -0.049004],
         [0.950969, -2.0495839, 0.451575]],
  "sched": [[0.264893, -0.028766],
         [0.787771, -4.1893959, 0.435156]],
  "pw": [[0.252882, -0.038366],
         [0.711314, -4.7485619, 0.412623]],
  "inv": [[0.252867, -0.039653],
         [0.729319, -6.0390601, 0.414327]],
  "poly": [[0.275867, -0.019247],
         [0.845734, -3.140589, 0.454664]],
}

OPTIMIZERS = {
  "sgd": lambda: O.sgd(0.1), "mom": lambda: O.momentum(0.1, 0.9), "nest": lambda: O.nesterov(0.1, 0.9),
  "adagrad": lambda: O.adagrad(0.1), "rms": lambda: O.rmsprop(0.01), "rmsm": lambda: O.rmsprop_momentum(0.01),
  "adam": lambda: O.adam(0.01), "adamax": lambda: O.adamax(0.01),
  "sched": lambda: O.sgd(O.exponential_decay(0.1, 2, 0.5)),
  "pw": lambda: O.momentum(O.piecewise_constant([1, 2], [0.1, 0.05, 0.01]), 0.5),
  "inv": lambda: O.sgd(O.inverse_time_decay(0.1, 2, 0.5, staircase=True)),
  "poly": lambda: O.sgd(O.polynomial_decay(0.1, 3, 0.01, 2.0)),
}


@pytest.mark.parametrize("name", list(OPTIMIZERS))
def test_optimizers_match_jax(name):
  params = {"w": tnp.asarray(np.array([1.0, -2.0, 0.5], np.float32)),
            "b": [tnp.asarray(np.array([0.3, 0.0], np.float32))]}
  init, update, get_params = OPTIMIZERS[name]()
  state = init(params)
  step = tj.jit(lambda i, s: update(i, tj.tree.map(lambda x: x * x - 0.2 * x + 0.1, get_params(s)), s))
  for i in range(5): state = step(i, state)
  got = [np.asarray(x).tolist() for x in tj.tree.leaves(get_params(state))]
  for ours, theirs in zip(got, JAX_VALUES[name]):
    np.testing.assert_allclose(ours, theirs, rtol=2e-6, atol=1e-6)


def test_optimizer_utilities():
  grads = {"a": tnp.asarray(np.array([3.0, 4.0], np.float32))}
  assert float(O.l2_norm(grads)) == 5.0
  np.testing.assert_allclose(np.asarray(O.clip_grads(grads, 1.0)["a"]), [0.6, 0.8], rtol=1e-6)
  init, update, get_params = O.momentum(0.1, 0.9)
  params = {"x": tnp.ones(2), "y": (tnp.zeros(3),)}
  state = init(params)
  unpacked = O.unpack_optimizer_state(state)
  repacked = O.pack_optimizer_state(unpacked, tj.tree.structure(params))
  assert tj.tree.structure(get_params(repacked)) == tj.tree.structure(params)
  with pytest.raises(TypeError, match="gradient tree"):
    update(0, {"x": tnp.ones(2)}, state)


def test_stax_network_matches_numpy_and_trains():
  init, apply = stax.serial(stax.Conv(4, (3, 3), padding="SAME"), stax.Relu, stax.MaxPool((2, 2), strides=(2, 2)),
                            stax.Flatten, stax.Dense(3), stax.LogSoftmax)
  shape, params = init(random.PRNGKey(0), (-1, 6, 6, 2))
  assert shape == (-1, 3)
  x = np.random.default_rng(0).random((5, 6, 6, 2)).astype(np.float32)
  (w, b), _, _, _, (dense_w, dense_b), _ = params
  padded = np.pad(x.astype(np.float64), ((0, 0), (1, 1), (1, 1), (0, 0)))
  windows = np.lib.stride_tricks.sliding_window_view(padded, (3, 3), axis=(1, 2))  # n h w c i j
  conv = np.einsum("nhwcij,ijco->nhwo", windows, np.asarray(w, np.float64)) + np.asarray(b)
  pooled = np.maximum(conv, 0).reshape(5, 3, 2, 3, 2, 4).max(axis=(2, 4))
  logits = pooled.reshape(5, -1) @ np.asarray(dense_w) + np.asarray(dense_b)
  want = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
  np.testing.assert_allclose(np.asarray(apply(params, x)), want, rtol=1e-4, atol=1e-5)
  labels = np.eye(3)[[0, 1, 2, 1, 0]]
  opt_init, opt_update, get_params = O.adam(0.02)

  @tj.jit
  def step(i, state):
    loss = lambda p: -(apply(p, x) * labels).sum()  # noqa: E731
    return opt_update(i, tj.grad(loss)(get_params(state)), state)
  state = opt_init(params)
  first = -(np.asarray(apply(params, x)) * labels).sum()
  for i in range(100): state = step(i, state)
  assert -(np.asarray(apply(get_params(state), x)) * labels).sum() < 0.5 * first


def test_stax_combinators_dropout_and_shapes():
  init, apply = stax.serial(stax.FanOut(2), stax.parallel(stax.Dense(4), stax.Identity), stax.FanInConcat())
  shape, params = init(random.PRNGKey(1), (2, 3))
  assert shape == (2, 7)
  x = tnp.ones((2, 3))
  out = np.asarray(apply(params, x))
  np.testing.assert_array_equal(out[:, 4:], np.ones((2, 3)))
  init, apply = stax.serial(stax.Dense(8), stax.Dropout(0.5))
  _, params = init(random.PRNGKey(0), (4, 3))
  with pytest.raises(ValueError, match="rng"):
    apply(params, tnp.ones((4, 3)))
  kept = np.asarray(apply(params, tnp.ones((4, 3)), rng=random.PRNGKey(2)))
  assert ((kept == 0) | (np.abs(kept) > 0)).all() and (kept == 0).any()
  _, test_apply = stax.Dropout(0.5, mode="test")
  np.testing.assert_array_equal(np.asarray(test_apply((), tnp.ones(3))), np.ones(3))
  for pool, want in ((stax.AvgPool((2, 2), padding="SAME"), (1, 3, 3, 1)), (stax.SumPool((3, 3)), (1, 1, 1, 1)),
                     (stax.MaxPool((2, 2), strides=(2, 2)), (1, 1, 1, 1))):
    pool_init, pool_apply = pool
    shape, _ = pool_init(None, (1, 3, 3, 1))
    assert shape == want == pool_apply((), tnp.ones((1, 3, 3, 1))).shape
  # SAME average pooling divides by the elements actually in each window
  np.testing.assert_allclose(np.asarray(stax.AvgPool((2, 2), padding="SAME")[1]((), tnp.ones((1, 3, 3, 1)))),
                             np.ones((1, 3, 3, 1)))


def test_stax_exports_the_functions_stax_code_calls():
  """JAX's stax re-exports jax.nn's activations and the aliases old code calls (`stax.logsoftmax(logits)` in JAX's
  examples/differentially_private_sgd.py): the same functions as tinyjax.nn's, values as numpy's."""
  x = np.array([[0.5, -1.0, 2.0]], np.float32)
  want = x - np.log(np.exp(x.astype(np.float64)).sum(-1, keepdims=True))
  np.testing.assert_allclose(np.asarray(stax.logsoftmax(x)), want, rtol=1e-6)
  assert stax.log_softmax is tj.nn.log_softmax and stax.relu is tj.nn.relu and stax.standardize is tj.nn.standardize
  assert stax.glorot is stax.glorot_normal and stax.randn is stax.normal
  for name in ("softmax", "softplus", "sigmoid", "elu", "leaky_relu", "selu", "gelu"):
    assert getattr(stax, name) is getattr(tj.nn, name)
