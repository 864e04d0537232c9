"""nn.dot_product_attention against a float64 numpy reference (grouped heads, bias, masks, causal, sequence lengths,
local windows, residual), finite-difference gradients, jit/vmap; jnp.linalg.qr and the orthogonal initializer."""
from __future__ import annotations

import numpy as np
import pytest

import tinyjax as tj
import tinyjax.numpy as tnp
from tinyjax import nn, random

RNG = np.random.default_rng(0)


def reference_attention(q, k, v, bias=None, keep=None, scale=None):
  """Per batch and head: softmax(q k^T * scale + bias, masked by `keep`) v, in float64 (q: B T N H, k/v: B S K H)."""
  q, k, v = (x.astype(np.float64) for x in (q, k, v))
  batch, target, heads, dim = q.shape
  groups = heads // k.shape[2]
  scale = 1 / np.sqrt(dim) if scale is None else scale
  out = np.zeros_like(q)
  for b in range(batch):
    for n in range(heads):
      logits = q[b, :, n] @ k[b, :, n // groups].T * scale
      if bias is not None: logits = logits + np.broadcast_to(bias, (batch, heads) + logits.shape)[b, n]
      if keep is not None:
        logits = np.where(np.broadcast_to(keep, (batch, heads) + logits.shape)[b, n], logits,
                          -0.7 * np.finfo(np.float32).max)
      weights = np.exp(logits - logits.max(axis=-1, keepdims=True))
      out[b, :, n] = (weights / weights.sum(axis=-1, keepdims=True)) @ v[b, :, n // groups]
  return out


B, T, S, N, K, H = 2, 5, 7, 4, 2, 8
Q = RNG.standard_normal((B, T, N, H)).astype(np.float32)
KEY = RNG.standard_normal((B, S, K, H)).astype(np.float32)
V = RNG.standard_normal((B, S, K, H)).astype(np.float32)


def test_attention_matches_reference():
  close = lambda got, want: np.testing.assert_allclose(np.asarray(got), want, rtol=2e-5, atol=2e-5)  # noqa: E731
  close(nn.dot_product_attention(Q, KEY, V), reference_attention(Q, KEY, V))
  bias = RNG.standard_normal((1, N, T, S)).astype(np.float32)
  mask = RNG.random((B, 1, T, S)) > 0.3
  causal = np.tril(np.ones((T, S), bool))
  close(nn.dot_product_attention(Q, KEY, V, bias=bias, mask=mask, is_causal=True, scale=0.3),
        reference_attention(Q, KEY, V, bias, mask & causal, 0.3))
  rows, cols = np.arange(T)[:, None], np.arange(S)[None, :]
  close(nn.dot_product_attention(Q, KEY, V, local_window_size=(1, 2)),
        reference_attention(Q, KEY, V, keep=(cols >= rows - 1) & (cols <= rows + 2)))
  kv_lengths, q_lengths = np.array([3, 6], np.int32), np.array([4, 2], np.int32)
  keep = (cols[None] < kv_lengths[:, None, None]) & (rows[None] < q_lengths[:, None, None])
  want = reference_attention(Q, KEY, V, keep=keep[:, None]) * (np.arange(T)[None, :, None, None] <
                                                                 q_lengths[:, None, None, None])
  close(nn.dot_product_attention(Q, KEY, V, key_value_seq_lengths=kv_lengths, query_seq_lengths=q_lengths), want)
  unbatched = nn.dot_product_attention(Q[0], KEY[0], V[0], is_causal=True)
  close(unbatched, reference_attention(Q[:1], KEY[:1], V[:1], keep=causal)[0])
  out, residual = nn.dot_product_attention(Q, KEY, V, return_residual=True)
  logits = np.einsum("btnh,bsnh->btns", Q.astype(np.float64), np.repeat(KEY, N // K, axis=2)) / np.sqrt(H)
  np.testing.assert_allclose(np.asarray(residual), np.log(np.exp(logits).sum(-1)), rtol=1e-5, atol=1e-5)
  with pytest.raises(ValueError, match="multiple"):
    nn.dot_product_attention(Q[:, :, :3], KEY, V)
  with pytest.raises(ValueError, match="bool"):
    nn.dot_product_attention(Q, KEY, V, mask=np.ones((B, 1, T, S), np.float32))


def test_attention_gradients_and_transformations():
  def loss(q, k, v): return (nn.dot_product_attention(q, k, v, is_causal=True) ** 2).sum()
  q, k, v = (x[:1, :3, :2, :4].astype(np.float64) for x in (Q, KEY, V))
  k, v = k[:, :, :1], v[:, :, :1]
  grads = tj.jit(tj.grad(loss, argnums=(0, 1, 2)))(*(tnp.asarray(x.astype(np.float32)) for x in (q, k, v)))
  for which, (grad, x) in enumerate(zip(grads, (q, k, v))):
    numeric = np.zeros_like(x)
    for index in np.ndindex(x.shape):
      step = np.zeros_like(x)
      step[index] = 1e-3
      args = [q, k, v]
      args[which] = x + step
      plus = float(loss(*(tnp.asarray(a.astype(np.float32)) for a in args)))
      args[which] = x - step
      numeric[index] = (plus - float(loss(*(tnp.asarray(a.astype(np.float32)) for a in args)))) / 2e-3
    np.testing.assert_allclose(np.asarray(grad), numeric, rtol=2e-2, atol=2e-2)
  per_example = tj.vmap(lambda q, k, v: nn.dot_product_attention(q, k, v, is_causal=True))(Q, KEY, V)
  np.testing.assert_allclose(np.asarray(per_example), np.asarray(nn.dot_product_attention(Q, KEY, V, is_causal=True)),
                             rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("shape", [(5, 3), (3, 5), (4, 4), (2, 6, 4), (1, 1)], ids=str)
def test_qr_matches_numpy(shape):
  a = RNG.standard_normal(shape).astype(np.float32)
  q, r = tnp.linalg.qr(a)
  want_q, want_r = np.linalg.qr(a.astype(np.float64))
  assert q.shape == want_q.shape and r.shape == want_r.shape
  # unique up to the signs of R's diagonal
  signs = np.sign(np.diagonal(np.asarray(r), axis1=-2, axis2=-1))[..., None, :]
  want_signs = np.sign(np.diagonal(want_r, axis1=-2, axis2=-1))[..., None, :]
  np.testing.assert_allclose(np.asarray(q) * signs, want_q * want_signs, rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(np.asarray(q) @ np.asarray(r), a, rtol=1e-5, atol=1e-5)
  assert (np.tril(np.asarray(r), -1) == 0).all()
  complete_q, complete_r = tnp.linalg.qr(a, mode="complete")
  m = shape[-2]
  np.testing.assert_allclose(np.swapaxes(np.asarray(complete_q), -1, -2) @ np.asarray(complete_q),
                             np.broadcast_to(np.eye(m), complete_q.shape), atol=1e-5)
  np.testing.assert_allclose(np.asarray(complete_q) @ np.asarray(complete_r), a, rtol=1e-5, atol=1e-5)
  np.testing.assert_array_equal(np.asarray(tnp.linalg.qr(a, mode="r")), np.asarray(r))


def test_qr_gradient_and_errors():
  a = RNG.standard_normal((4, 3))

  def f(x):
    q, r = tnp.linalg.qr(x)
    return (q[:, 0] * tnp.sign(r[0, 0])).sum() + tnp.abs(r[1, 1])
  grad = np.asarray(tj.grad(f)(tnp.asarray(a.astype(np.float32))))

  def reference(x):
    q, r = np.linalg.qr(x)
    return (q[:, 0] * np.sign(r[0, 0])).sum() + abs(r[1, 1])
  numeric = np.zeros_like(a)
  for index in np.ndindex(a.shape):
    step = np.zeros_like(a)
    step[index] = 1e-6
    numeric[index] = (reference(a + step) - reference(a - step)) / 2e-6
  np.testing.assert_allclose(grad, numeric, rtol=1e-3, atol=1e-3)
  with pytest.raises(ValueError, match="mode"):
    tnp.linalg.qr(a, mode="economic")
  with pytest.raises(ValueError, match="2 dimensions"):
    tnp.linalg.qr(np.ones(3))


def test_orthogonal_initializer_matches_jax():
  key = random.PRNGKey(42)
  # JAX 0.10.2's values for the same key (nn.initializers.orthogonal(1.5))
  want = {(3, 3): [-0.02929, 1.4929, 0.14278, 0.15892, -0.13892, 1.48508, -1.49127, -0.04413, 0.15545],
          (2, 3): [-0.13189, 1.37789, -0.57796, 1.3084, 0.3867, 0.62335]}
  for shape, values in want.items():
    got = np.asarray(nn.initializers.orthogonal(1.5)(key, shape))
    np.testing.assert_allclose(got.ravel(), values, atol=2e-5)
  w = np.asarray(nn.initializers.orthogonal()(key, (6, 4)))
  np.testing.assert_allclose(w.T @ w, np.eye(4), atol=1e-5)
  conv = np.asarray(nn.initializers.orthogonal(column_axis=0)(key, (3, 4, 2)))
  flat = np.moveaxis(conv, 0, -1).reshape(8, 3)
  np.testing.assert_allclose(flat.T @ flat, np.eye(3), atol=1e-5)
  np.testing.assert_array_equal(np.asarray(nn.initializers.orthogonal()(key, (6, 4))), w)  # deterministic
  batch = np.asarray(random.orthogonal(key, 3, (2,)))
  np.testing.assert_allclose(np.einsum("bij,bkj->bik", batch, batch), np.broadcast_to(np.eye(3), (2, 3, 3)),
                             atol=1e-5)
  with pytest.raises(ValueError, match="2D"):
    nn.initializers.orthogonal()(key, (4,))
