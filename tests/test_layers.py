"""nn layers against float64 numpy references, gradients against finite differences, state and key handling, and a
jitted training step; bad inputs raise errors naming the shapes."""
from __future__ import annotations

import numpy as np
import pytest

import tinyjax as tj
import tinyjax.numpy as tnp
from tinyjax import nn, random
from tests.gradcheck import numeric_grad

KEY = random.PRNGKey(0)
RNG = np.random.default_rng(0)


def close(got, want, tol=1e-5):
  np.testing.assert_allclose(np.asarray(got, np.float64), want, rtol=tol, atol=tol)


def test_linear_and_conv_match_numpy():
  linear = nn.Linear(5, 3)
  params = linear.init(KEY)
  assert params["w"].shape == (5, 3) and params["b"].shape == (3,)
  x = RNG.standard_normal((4, 5)).astype(np.float32)
  w, b = (np.asarray(params[k], np.float64) for k in ("w", "b"))
  close(linear.apply(params, x), x @ w + b)
  assert "b" not in nn.Linear(5, 3, use_bias=False).init(KEY)
  conv = nn.Conv2d(2, 4, (3, 2), stride=(1, 2), padding="VALID")
  params = conv.init(KEY)
  assert params["w"].shape == (3, 2, 2, 4)
  images = RNG.standard_normal((2, 6, 7, 2)).astype(np.float32)
  kernel = np.asarray(params["w"], np.float64)
  windows = np.lib.stride_tricks.sliding_window_view(images.astype(np.float64), (3, 2), axis=(1, 2))[:, :, ::2]
  want = np.einsum("nhwcij,ijco->nhwo", windows, kernel) + np.asarray(params["b"])
  close(conv.apply(params, images), want)
  channels_first = nn.Conv2d(2, 4, (3, 2), stride=(1, 2), padding="VALID", data_format="NCHW")
  close(channels_first.apply(params, np.transpose(images, (0, 3, 1, 2))), np.transpose(want, (0, 3, 1, 2)))
  grouped = nn.Conv2d(4, 6, 3, groups=2)
  assert grouped.init(KEY)["w"].shape == (3, 3, 2, 6)
  assert grouped.apply(grouped.init(KEY), tnp.ones((1, 5, 5, 4))).shape == (1, 5, 5, 6)


def test_norms_match_numpy():
  x = RNG.standard_normal((3, 4, 6)).astype(np.float32)
  layer = nn.LayerNorm(6)
  params = {"scale": tnp.asarray(RNG.random(6).astype(np.float32)), "bias": tnp.asarray(np.arange(6, dtype=np.float32))}
  x64 = x.astype(np.float64)
  normed = (x64 - x64.mean(-1, keepdims=True)) / np.sqrt(x64.var(-1, keepdims=True) + 1e-5)
  close(layer.apply(params, x), normed * np.asarray(params["scale"]) + np.arange(6))
  rms = nn.RMSNorm(6)
  close(rms.apply(rms.init(), x), x64 / np.sqrt((x64 ** 2).mean(-1, keepdims=True) + 1e-6))
  bn = nn.BatchNorm(6, momentum=0.8)
  params, state = bn.init()
  y, new_state = bn.apply(params, state, x, train=True)
  mean, var = x64.reshape(-1, 6).mean(0), x64.reshape(-1, 6).var(0)
  close(y, (x64 - mean) / np.sqrt(var + 1e-5))
  close(new_state["mean"], 0.2 * mean)
  close(new_state["var"], 0.8 + 0.2 * var * 12 / 11)
  y_eval, same = bn.apply(params, new_state, x, train=False)
  close(y_eval, (x64 - 0.2 * mean) / np.sqrt(0.8 + 0.2 * var * 12 / 11 + 1e-5))
  assert same is new_state


def test_layer_gradients_against_finite_differences():
  x = RNG.standard_normal((2, 5, 5, 2)).astype(np.float64)
  conv = nn.Conv2d(2, 3, 3, stride=2)
  params = conv.init(KEY)
  norm = nn.LayerNorm(3)
  norm_params = norm.init()

  def loss(images):
    return (tnp.tanh(norm.apply(norm_params, conv.apply(params, tnp.asarray(images, tnp.float32)))) ** 2).sum()
  grad = np.asarray(tj.jit(tj.grad(loss))(tnp.asarray(x, tnp.float32)))
  close(grad, numeric_grad(loss, x), tol=2e-2)
  mha = nn.MultiHeadAttention(4, 2, causal=True)
  mha_params = mha.init(KEY)
  tokens = RNG.standard_normal((1, 3, 4))

  def attention_loss(t): return (mha.apply(mha_params, tnp.asarray(t, tnp.float32)) ** 2).sum()
  close(tj.grad(attention_loss)(tnp.asarray(tokens, tnp.float32)), numeric_grad(attention_loss, tokens), tol=2e-2)


def test_attention_embedding_dropout_sequential():
  mha = nn.MultiHeadAttention(8, 2, causal=True)
  params = mha.init(KEY)
  x = RNG.standard_normal((2, 4, 8)).astype(np.float32)
  # causal: the first position's output depends on the first token only
  changed = x.copy()
  changed[:, 1:] += 1.0
  close(np.asarray(mha.apply(params, changed))[:, 0], np.asarray(mha.apply(params, x))[:, 0])
  emb = nn.Embedding(10, 3)
  table = emb.init(KEY)
  ids = np.array([[1, 9], [0, 1]])
  close(emb.apply(table, ids), np.asarray(table["table"])[ids])
  close(emb.attend(table, np.ones((2, 3), np.float32)), np.ones((2, 3)) @ np.asarray(table["table"]).T)
  with pytest.raises(TypeError, match="integer"):
    emb.apply(table, np.ones(2, np.float32))
  drop = nn.Dropout(0.25)
  ones = tnp.ones((200, 100))
  dropped = np.asarray(drop.apply({}, ones, key=KEY))
  assert set(np.unique(dropped)) <= {0.0, np.float32(1 / 0.75)} and abs((dropped == 0).mean() - 0.25) < 0.02
  np.testing.assert_array_equal(np.asarray(drop.apply({}, ones, key=KEY)), dropped)  # a key gives one mask
  np.testing.assert_array_equal(np.asarray(drop.apply({}, ones, deterministic=True)), np.ones((200, 100)))
  with pytest.raises(ValueError, match="key"):
    drop.apply({}, ones)
  model = nn.Sequential(nn.Linear(3, 4), nn.relu, nn.Dropout(0.5), nn.Linear(4, 2))
  model_params = model.init(KEY)
  assert model_params[1] == {} and model_params[2] == {}
  inputs = RNG.standard_normal((5, 3)).astype(np.float32)
  hidden = np.maximum(inputs @ np.asarray(model_params[0]["w"]) + np.asarray(model_params[0]["b"]), 0)
  close(model.apply(model_params, inputs, deterministic=True),
        hidden @ np.asarray(model_params[3]["w"]) + np.asarray(model_params[3]["b"]))
  a = model.apply(model_params, inputs, key=random.PRNGKey(1))
  b = model.apply(model_params, inputs, key=random.PRNGKey(2))
  assert not np.array_equal(np.asarray(a), np.asarray(b))
  with pytest.raises(TypeError, match="BatchNorm"):
    nn.Sequential(nn.BatchNorm(3))


def test_pooling_helpers():
  x = RNG.standard_normal((2, 6, 6, 3)).astype(np.float32)
  blocks = x.reshape(2, 3, 2, 3, 2, 3)
  close(nn.max_pool(x, (2, 2)), blocks.max(axis=(2, 4)))
  close(nn.avg_pool(x, (2, 2)), blocks.astype(np.float64).mean(axis=(2, 4)))
  assert nn.max_pool(x, (3, 3), strides=(1, 1), padding="SAME").shape == (2, 6, 6, 3)
  assert nn.flatten(x).shape == (2, 108)


def test_training_step_under_jit_and_per_example_gradients():
  model = nn.Sequential(nn.Conv2d(1, 4, 3), nn.relu, lambda x: nn.max_pool(x, (2, 2)), nn.flatten, nn.Linear(64, 3))
  params = model.init(KEY)
  images = RNG.standard_normal((12, 8, 8, 1)).astype(np.float32)
  labels = RNG.integers(0, 3, 12)

  def loss(p, x, y):
    logits = model.apply(p, x)
    return -(nn.log_softmax(logits) * nn.one_hot(y, 3)).sum(-1).mean()

  @tj.jit
  def step(p, x, y):
    value, grads = tj.value_and_grad(loss)(p, x, y)
    return value, tj.tree.map(lambda w, g: w - 0.1 * g, p, grads)
  first, _ = step(params, images, labels)
  for _ in range(30): value, params = step(params, images, labels)
  assert float(value) < 0.5 * float(first)
  per_example = tj.vmap(tj.grad(loss), in_axes=(None, 0, 0))(params, images[:, None], labels[:, None])
  mean_grad = tj.grad(loss)(params, images, labels)
  for got, want in zip(tj.tree.leaves(per_example), tj.tree.leaves(mean_grad)):
    close(np.asarray(got).mean(0), want, tol=1e-4)


def test_bad_inputs_name_the_shapes():
  conv = nn.Conv2d(3, 4, 3)
  with pytest.raises(ValueError, match=r"4-d inputs .*\(8, 8, 3\)"):
    conv.apply(conv.init(KEY), tnp.ones((8, 8, 3)))
  with pytest.raises(ValueError, match="3 features"):
    conv.apply(conv.init(KEY), tnp.ones((1, 8, 8, 2)))
  with pytest.raises(ValueError, match="5 features"):
    nn.Linear(5, 2).apply(nn.Linear(5, 2).init(KEY), tnp.ones((2, 4)))
  with pytest.raises(ValueError, match="num_heads"):
    nn.MultiHeadAttention(6, 4)
  with pytest.raises(ValueError, match="rate"):
    nn.Dropout(1.0)
