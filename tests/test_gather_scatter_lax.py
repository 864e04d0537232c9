"""lax.gather / lax.scatter* with XLA dimension numbers against a literal numpy transcription of XLA's operation
semantics (loops over output / update elements), plus gradients (finite differences), vmap against loops, jit, modes,
x.at[].apply and errors."""
from __future__ import annotations

import itertools

import numpy as np
import pytest

import tinyjax as tj
import tinyjax.numpy as jnp
from tinyjax import lax

G, S = lax.GatherDimensionNumbers, lax.ScatterDimensionNumbers


def reference_gather(operand, indices, dn, sizes, mode):
  """XLA's Gather, element by element (index_vector_dim = last axis of indices)."""
  batch_shape = indices.shape[:-1]
  offset_axes = [d for d in range(operand.ndim) if d not in dn.collapsed_slice_dims and d not in
                 dn.operand_batching_dims]
  rank = len(batch_shape) + len(offset_axes)
  batch_positions = [p for p in range(rank) if p not in dn.offset_dims]
  out_shape = [0] * rank
  for p, d in zip(batch_positions, batch_shape): out_shape[p] = d
  for p, d in zip(dn.offset_dims, offset_axes): out_shape[p] = sizes[d]
  out = np.zeros(out_shape, operand.dtype)
  for out_index in itertools.product(*(range(d) for d in out_shape)):
    batch = tuple(out_index[p] for p in batch_positions)
    start = [0] * operand.ndim
    for column, axis in enumerate(dn.start_index_map): start[axis] = int(indices[batch + (column,)])
    for ob, ib in zip(dn.operand_batching_dims, dn.start_indices_batching_dims): start[ob] = batch[ib]
    fits = all(0 <= start[d] <= operand.shape[d] - sizes[d] for d in range(operand.ndim))
    start = [min(max(s, 0), operand.shape[d] - sizes[d]) for d, s in enumerate(start)]
    offset = [0] * operand.ndim
    for p, axis in zip(dn.offset_dims, offset_axes): offset[axis] = out_index[p]
    value = operand[tuple(s + o for s, o in zip(start, offset))]
    out[out_index] = value if fits or mode != "fill" else np.nan
  return out


def reference_scatter(operand, indices, updates, dn, combine, mode):
  """XLA's Scatter, update element by update element, in order."""
  out = operand.copy()
  window_axes = [d for d in range(operand.ndim) if d not in dn.inserted_window_dims and d not in
                 dn.operand_batching_dims]
  scatter_dims = [d for d in range(updates.ndim) if d not in dn.update_window_dims]
  sizes = [1] * operand.ndim
  for axis, d in zip(window_axes, dn.update_window_dims): sizes[axis] = updates.shape[d]
  for update_index in itertools.product(*(range(d) for d in updates.shape)):
    batch = tuple(update_index[d] for d in scatter_dims)
    start = [0] * operand.ndim
    for column, axis in enumerate(dn.scatter_dims_to_operand_dims): start[axis] = int(indices[batch + (column,)])
    for ob, ib in zip(dn.operand_batching_dims, dn.scatter_indices_batching_dims): start[ob] = batch[ib]
    if mode == "clip": start = [min(max(s, 0), operand.shape[d] - sizes[d]) for d, s in enumerate(start)]
    elif not all(0 <= start[d] <= operand.shape[d] - sizes[d] for d in range(operand.ndim)): continue
    target = list(start)
    for axis, d in zip(window_axes, dn.update_window_dims): target[axis] += update_index[d]
    target = tuple(target)
    out[target] = combine(out[target], updates[update_index])
  return out


RNG = np.random.default_rng(0)
X = RNG.standard_normal((4, 5, 6))

GATHERS = {
  "rows": (np.array([[2], [0], [3]]), G((1, 2), (0,), (0,)), (1, 5, 6)),
  "windows_interleaved": (np.array([[1, 2], [3, 0], [4, 4]]), G((0, 2), (1,), (1, 2)), (3, 1, 3)),
  "out_of_bounds": (np.array([[[4, 1]], [[0, -1]], [[2, 9]]]), G((2,), (0, 1), (0, 1)), (1, 1, 4)),
  "batching_dims": (np.array([[1], [3], [0], [2]]), G((1,), (1,), (1,), (0,), (0,)), (1, 1, 6)),
  "reversed_map": (np.array([[2, 1], [0, 3]]), G((1,), (0, 2), (2, 0)), (1, 5, 1)),
  "partial_rest": (np.array([[1]]), G((1, 2, 3), (), (0,)), (2, 3, 4)),
  "no_index": (np.zeros((2, 0), np.int64), G((1, 2, 3), (), ()), (2, 2, 2)),
}


@pytest.mark.parametrize("mode", [None, "clip", "fill"])
@pytest.mark.parametrize("case", list(GATHERS))
def test_gather_matches_xla_semantics(case, mode):
  indices, dn, sizes = GATHERS[case]
  got = lax.gather(X.astype(np.float32), indices.astype(np.int32), dn, sizes, mode=mode)
  want = reference_gather(X, indices, dn, sizes, mode)
  assert got.shape == want.shape
  np.testing.assert_allclose(np.asarray(got, np.float64), want, rtol=1e-6, equal_nan=True)
  jitted = tj.jit(lambda x, i: lax.gather(x, i, dn, sizes, mode=mode))(X.astype(np.float32), indices.astype(np.int32))
  np.testing.assert_array_equal(np.asarray(jitted), np.asarray(got))


SCATTERS = {
  "rows": (np.array([[2], [0], [2]]), (3, 5, 6), S((1, 2), (0,), (0,))),
  "windows_interleaved": (np.array([[1, 2], [3, 0], [4, 4]]), (4, 3, 3), S((0, 2), (1,), (1, 2))),
  "batching_dims": (np.array([[1], [3], [0], [3]]), (4, 2), S((1,), (1,), (1,), (0,), (0,))),
  "partial_rest": (np.array([[1], [5], [0]]), (3, 2, 3, 4), S((1, 2, 3), (), (1,))),
  "elements": (np.array([[0, 1, 2], [3, 4, 5], [0, 1, 2], [9, 0, 0]]), (4,), S((), (0, 1, 2), (0, 1, 2))),
}
COMBINE = {"scatter": lambda a, b: b, "scatter_add": np.add, "scatter_mul": np.multiply, "scatter_min": np.minimum,
           "scatter_max": np.maximum, "scatter_sub": np.subtract}


@pytest.mark.parametrize("mode", [None, "clip"])
@pytest.mark.parametrize("fn", list(COMBINE))
@pytest.mark.parametrize("case", list(SCATTERS))
def test_scatter_matches_xla_semantics(case, fn, mode):
  indices, update_shape, dn = SCATTERS[case]
  updates = RNG.standard_normal(update_shape)
  operand = X + 1
  got = getattr(lax, fn)(operand.astype(np.float32), indices.astype(np.int32), updates.astype(np.float32), dn,
                         mode=mode)
  want = reference_scatter(operand, indices, updates, dn, COMBINE[fn], mode)
  np.testing.assert_allclose(np.asarray(got, np.float64), want, rtol=1e-5, atol=1e-6)


def test_gather_scatter_gradients_vmap_and_apply():
  indices, dn, sizes = GATHERS["windows_interleaved"]
  indices = indices.astype(np.int32)

  def f(x): return (lax.gather(x, indices, dn, sizes) ** 2).sum()
  x = X.astype(np.float32)
  grad = np.asarray(tj.jit(tj.grad(f))(x))
  # d/dx sum(g^2) = scatter-add of 2g into the gathered positions (the reference scatter of the gather's windows)
  gathered = reference_gather(X, indices, dn, sizes, None)
  want = reference_scatter(np.zeros_like(X), np.clip(indices, 0, [4, 3]), 2 * gathered,
                           S((0, 2), (1,), (1, 2)), np.add, None)
  np.testing.assert_allclose(grad, want, rtol=1e-5, atol=1e-6)
  s_indices, shape, s_dn = SCATTERS["rows"]
  updates = RNG.standard_normal(shape).astype(np.float32)

  def g(x, u): return (lax.scatter_add(x, s_indices.astype(np.int32), u, s_dn) ** 2).sum()
  gx, gu = tj.grad(g, argnums=(0, 1))(x, updates)
  out = reference_scatter(X, s_indices, updates.astype(np.float64), s_dn, np.add, None)
  np.testing.assert_allclose(np.asarray(gx), 2 * out, rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(np.asarray(gu), 2 * out[s_indices[:, 0]], rtol=1e-5, atol=1e-5)
  # vmap over the operand and the indices, against a loop
  xs = RNG.standard_normal((3, 4, 5, 6)).astype(np.float32)
  many = RNG.integers(0, 4, (3, 2, 1)).astype(np.int32)
  rows = GATHERS["rows"][1]
  batched = tj.vmap(lambda a, i: lax.gather(a, i, rows, (1, 5, 6)))(xs, many)
  for b in range(3):
    np.testing.assert_array_equal(np.asarray(batched[b]), np.asarray(lax.gather(xs[b], many[b], rows, (1, 5, 6))))
  # x.at[].apply: once per update, duplicates twice (as JAX), out-of-bounds dropped unless mode='clip'
  base = jnp.zeros(4)
  np.testing.assert_array_equal(np.asarray(base.at[jnp.array([0, 0, 2])].apply(lambda v: v + 1)), [2, 0, 1, 0])
  np.testing.assert_array_equal(np.asarray(base.at[jnp.array([0, 7])].apply(lambda v: v + 1)), [1, 0, 0, 0])
  np.testing.assert_array_equal(np.asarray(base.at[jnp.array([0, 7])].apply(lambda v: v + 1, mode="clip")),
                                [1, 0, 0, 1])
  jitted = tj.jit(lambda v, i: v.at[i].apply(jnp.sin))(jnp.ones(4), jnp.array([1, 1, 3]))
  np.testing.assert_allclose(np.asarray(jitted), [1, np.sin(np.sin(1.0)), 1, np.sin(1.0)], rtol=1e-6)
  grad = tj.grad(lambda v: v.at[jnp.array([1, 1, 3])].apply(jnp.sin).sum())(jnp.ones(4))
  np.testing.assert_allclose(np.asarray(grad), [1, np.cos(np.sin(1.0)) * np.cos(1.0), 1, np.cos(1.0)], rtol=1e-6)
  applied = lax.scatter_apply(jnp.zeros(5), jnp.array([[1], [1], [3]]), lambda v: v * 2 + 1,
                              S((), (0,), (0,)), update_shape=(3,))
  np.testing.assert_array_equal(np.asarray(applied), [0, 3, 0, 1, 0])


def test_gather_scatter_errors():
  x = jnp.ones((4, 5))
  with pytest.raises(TypeError, match="integer"):
    lax.gather(x, jnp.ones((2, 1)), G((1,), (0,), (0,)), (1, 5))
  with pytest.raises(TypeError, match="slice_sizes"):
    lax.gather(x, jnp.zeros((2, 1), np.int32), G((1,), (0,), (0,)), (1,))
  with pytest.raises(TypeError, match="start_index_map"):
    lax.gather(x, jnp.zeros((2, 2), np.int32), G((1,), (0,), (0,)), (1, 5))
  with pytest.raises(TypeError, match="slice size"):
    lax.gather(x, jnp.zeros((2, 1), np.int32), G((1,), (0,), (0,)), (2, 5))
  with pytest.raises(ValueError, match="mode"):
    lax.gather(x, jnp.zeros((2, 1), np.int32), G((1,), (0,), (0,)), (1, 5), mode="wrap")
  with pytest.raises(TypeError, match="dtype"):
    lax.scatter_add(x, jnp.zeros((2, 1), np.int32), jnp.ones((2, 5), np.int32), S((1,), (0,), (0,)))
  with pytest.raises(TypeError, match="batch shape"):
    lax.scatter_add(x, jnp.zeros((2, 1), np.int32), jnp.ones((3, 5)), S((1,), (0,), (0,)))
