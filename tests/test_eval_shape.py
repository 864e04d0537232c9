"""Abstract evaluation: the shapes, dtypes and weak types tracing predicts (eval_shape, make_jaxpr, jit) equal what
eager evaluation produces, for every op family, and eval_shape runs nothing."""
import numpy as np
import pytest

import tinyjax as tj
import tinyjax.nn as nn
import tinyjax.numpy as tnp
from tinyjax import lax

X = np.arange(24, dtype=np.float32).reshape(2, 3, 4) / 10
I = np.arange(12, dtype=np.int32).reshape(3, 4)

PROGRAMS = {
  "elementwise": (lambda x: tnp.exp(x) * 2 + tnp.sin(x) / 3.0, X),
  "weak_scalar": (lambda x: x * 2.0, 1.5),
  "promotion": (lambda i: i * 1.5 + (i > 3), I),
  "integer": (lambda i: i // 3 + i % 5 - (i << 1), I),
  "reductions": (lambda x: (x.sum(axis=1), x.max(axis=(0, 2), keepdims=True), x.argmax(axis=-1), x.var()), X),
  "int_reductions": (lambda i: (i.sum(), i.mean(axis=0), i.astype(tnp.uint8).sum(axis=1), (i > 2).any()), I),
  "movement": (lambda x: (x.T, x.reshape(4, -1), tnp.moveaxis(x, 0, -1), x[:, ::-2, 1:], tnp.pad(x, 1)), X),
  "concat_stack": (lambda x: (tnp.concatenate([x, x], axis=1), tnp.stack([x, x]), tnp.flip(x, 1)), X),
  "matmul": (lambda x: (x @ x.transpose(0, 2, 1), tnp.dot(x[0], x[0].T), lax.dot_general(
    x, x, (((2,), (2,)), ((0,), (0,))))), X),
  "nn": (lambda x: (nn.softmax(x), nn.logsumexp(x, axis=-1), nn.one_hot(tnp.arange(3), 5)), X),
  "casts": (lambda x: (x.astype(tnp.bfloat16) + 1, x.astype(tnp.float16) * x.astype(tnp.float16), x.astype(bool)), X),
  "grad": (tj.grad(lambda x: (tnp.tanh(x) ** 2).sum()), X),
  "vmap": (tj.vmap(lambda row: row @ row.T), X),
}


def _avals(tree):
  return tj.tree_util.tree_map(lambda a: (tuple(a.shape), np.dtype(a.dtype), bool(a.weak_type)), tree)


@pytest.mark.parametrize("name", sorted(PROGRAMS))
def test_traced_avals_equal_eager_results(name):
  fun, arg = PROGRAMS[name]
  eager = _avals(fun(tnp.asarray(arg)))
  assert _avals(tj.eval_shape(fun, arg)) == eager
  assert _avals(tj.jit(fun)(arg)) == eager
  jaxpr = tj.make_jaxpr(fun)(arg)
  assert [(tuple(out.shape), out.dtype) for out in jaxpr.sink.src] == [
    (shape, dtype) for shape, dtype, _ in tj.tree_util.tree_leaves(eager, is_leaf=lambda v: isinstance(v, tuple)
                                                                    and len(v) == 3 and isinstance(v[1], np.dtype))]


def test_eval_shape_takes_shape_dtype_structs_and_runs_nothing():
  counters_before = tj.runtime_stats()["kernels_launched"]
  spec = tj.ShapeDtypeStruct((1000, 1000), np.float32)
  out = tj.eval_shape(lambda a, b: (a @ b).sum(axis=0), spec, spec)
  assert out == tj.ShapeDtypeStruct((1000,), np.float32)
  assert tj.runtime_stats()["kernels_launched"] == counters_before
  with pytest.raises(TypeError, match="no values"):
    tj.jit(lambda a: a)(spec)
