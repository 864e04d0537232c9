"""lower/: symbolic index folding, fusion decisions and rangeify, checked with a small reference interpreter of
kernel ASTs (so these tests say nothing about codegen) against numpy."""
import itertools
import math

import numpy as np
import pytest

import tinyjax as tj
import tinyjax.numpy as tnp

from tinyjax.codegen.opt import linear_strides
from tinyjax.lower import schedule as schedule_module
from tinyjax.lower import symbolic
from tinyjax.lower.schedule import REREAD_LIMIT, ROW_LOOP_MIN, find_buffers, schedule
from tinyjax.uop import INDEX_DTYPE, Ops, PatternMatcher, UOp, UPat, graph_rewrite

F32 = np.dtype(np.float32)


# ---------------------------------------------------------------------------------------------------------------------
# a reference interpreter of kernel ASTs: slow, obviously right

def _eval(node: UOp, env: dict, buffers: list[np.ndarray], memo: dict):
  key = (node, tuple(sorted((k.arg[0], v) for k, v in env.items())))
  if key in memo: return memo[key]
  op = node.op
  if op is Ops.CONST: value = node.arg
  elif op is Ops.RANGE: value = env[node]
  elif op is Ops.LOAD:
    gate = _eval(node.src[2], env, buffers, memo) if len(node.src) == 3 else True
    if gate:
      index = _eval(node.src[1], env, buffers, memo)
      flat = buffers[node.src[0].arg].reshape(-1)
      assert 0 <= index < flat.size, f"out of bounds read {index} of {flat.size}"
      value = flat[index]
    else:
      value = 0
  elif op is Ops.REDUCE:
    ranges = node.src[1:]
    values = []
    for combo in itertools.product(*(range(r.src[0].arg) for r in ranges)):
      inner = dict(env) | dict(zip(ranges, combo))
      values.append(_eval(node.src[0], inner, buffers, {}))
    value = {Ops.ADD: sum, Ops.MAX: max, Ops.MUL: math.prod}[node.arg](values)
  else:
    args = [_eval(s, env, buffers, memo) for s in node.src]
    value = {Ops.ADD: lambda a, b: a + b, Ops.MUL: lambda a, b: a * b, Ops.IDIV: lambda a, b: int(a / b),
             Ops.MOD: lambda a, b: int(math.fmod(a, b)), Ops.CMPLT: lambda a, b: a < b, Ops.AND: lambda a, b: a and b,
             Ops.WHERE: lambda c, a, b: a if c else b, Ops.NEG: lambda a: -a, Ops.MAX: max,
             Ops.EXP2: lambda a: 2.0 ** a, Ops.SIN: math.sin, Ops.FDIV: lambda a, b: a / b}[op](*args)
  memo[key] = value
  return value


def interpret(sink: UOp, inputs: list[np.ndarray]) -> list[np.ndarray]:
  """Run a program (SINK over outputs, PARAM inputs) through schedule() with the reference interpreter."""
  sched = schedule(sink)
  slots = list(inputs) + [np.zeros(shape, dtype) for shape, dtype in sched.slot_specs]
  for kernel in sched.kernels:
    buffers = [slots[s] for s in kernel.slots]
    ranges = sorted({n for n in kernel.ast.toposort if n.op is Ops.RANGE and n.arg[1] == "global"},
                    key=lambda r: r.arg[0])
    for combo in itertools.product(*(range(r.src[0].arg) for r in ranges)):
      env = dict(zip(ranges, combo))
      for store in kernel.ast.src:  # a kernel's STOREs in order (merged elementwise kernels have several)
        index = _eval(store.src[1], env, buffers, {})
        buffers[store.src[0].arg].reshape(-1)[index] = _eval(store.src[2], env, buffers, {})
  return [slots[s] for s in sched.outputs]


def param(index, shape): return UOp(Ops.PARAM, F32, (), (index, tuple(shape)))
def node(op, *src, arg=None): return UOp(op, F32, tuple(src), arg)


# movement ops as (UOp builder, numpy equivalent)
MOVES = {
  "permute": (lambda x: node(Ops.PERMUTE, x, arg=tuple(reversed(range(len(x.shape))))), lambda a: a.transpose()),
  "flip0": (lambda x: node(Ops.FLIP, x, arg=(True,) + (False,) * (len(x.shape) - 1)), lambda a: a[::-1]),
  "shrink": (lambda x: node(Ops.SHRINK, x, arg=tuple((1, d) if d > 1 else (0, d) for d in x.shape)),
             lambda a: a[tuple(slice(1, None) if d > 1 else slice(None) for d in a.shape)]),
  "pad": (lambda x: node(Ops.PAD, x, arg=tuple((1, 2) for _ in x.shape)),
          lambda a: np.pad(a, [(1, 2)] * a.ndim)),
  "reshape_flat": (lambda x: node(Ops.RESHAPE, x, arg=(math.prod(x.shape),)), lambda a: a.reshape(-1)),
  "reshape_merge": (lambda x: node(Ops.RESHAPE, x, arg=(x.shape[0] * x.shape[1], *x.shape[2:])),
                    lambda a: a.reshape(a.shape[0] * a.shape[1], *a.shape[2:])),
}


def build_chain(chain: tuple[str, ...], data: np.ndarray) -> tuple[UOp, np.ndarray]:
  """The movement ops `chain` (MOVES names, innermost first) over a PARAM holding `data`, and numpy's result."""
  graph, expected = param(0, data.shape), data
  for name in chain:
    build, reference = MOVES[name]
    graph, expected = build(graph), reference(expected)
  return graph, expected


@pytest.mark.parametrize("chain", [("permute",), ("flip0",), ("pad",), ("shrink",), ("permute", "reshape_flat"),
                                   ("pad", "permute", "shrink"), ("flip0", "pad", "reshape_flat"),
                                   ("shrink", "flip0", "permute", "pad")])
def test_movement_chains_match_numpy(chain):
  rng = np.random.default_rng(0)
  data = rng.standard_normal((3, 4, 5)).astype(np.float32)
  graph, expected = build_chain(chain, data)
  (out,) = interpret(node(Ops.SINK, graph), [data])
  np.testing.assert_array_equal(out, expected)


@pytest.mark.parametrize("chain,mods", [(("reshape_flat", "pad"), 0), (("reshape_merge", "reshape_flat", "pad"), 0),
                                        (("permute", "reshape_merge", "reshape_flat", "pad"), 2),
                                        (("pad", "reshape_merge", "pad", "flip0", "reshape_flat", "pad"), 3)])
def test_reshape_under_a_pad_folds_its_index(chain, mods):
  """A reshape read through a pad: where the pad's gate is false the index is negative, so it is clamped in bounds
  first (lower/schedule.py) and the reshape's div / mod fold instead of stacking one MOD per reshape."""
  rng = np.random.default_rng(2)
  data = rng.standard_normal((3, 4, 5)).astype(np.float32)
  graph, expected = build_chain(chain, data)
  (out,) = interpret(node(Ops.SINK, graph), [data])
  np.testing.assert_array_equal(out, expected)
  (kernel,) = schedule(node(Ops.SINK, graph)).kernels
  assert not any(n.op is Ops.MOD and n.src[0].op is Ops.MOD for n in kernel.ast.toposort)
  assert sum(n.op is Ops.MOD for n in kernel.ast.toposort) == mods  # a permute's transposed order needs two


def test_padded_max_pool_gradient_divides_outside_the_channel_loop():
  """A max-pool gradient padded for the next convolution (the CNN example's): under the pad's gate its reshapes read a
  flat index whose terms the source's strides divide, shifted non-negative by whole periods instead of clamped, so
  every division folds out of the loop over the channels (a clamp kept 10 of them per element there). Values against
  numpy's gradient of the pooling."""
  from tinyjax import lax
  from tinyjax.lower.schedule import kernels_of
  rng = np.random.default_rng(4)
  x = rng.standard_normal((4, 14, 14, 64)).astype(np.float32)
  g = rng.standard_normal((4, 7, 7, 64)).astype(np.float32)

  def f(x, g):
    dx = tj.grad(lambda x: (lax.reduce_window(x, -np.inf, lax.max, (1, 2, 2, 1), (1, 2, 2, 1), "VALID") * g).sum())(x)
    return tnp.pad(dx, ((0, 0), (1, 1), (1, 1), (0, 0))) * 3
  (padded,) = [k for k in kernels_of(tj.jit(f).lower(x, g)._compiled.schedule.schedule.kernels)
               if k.name.startswith("e_4_16_16_64")]
  channels = [n for n in padded.ast.toposort if n.op is Ops.RANGE][-1]
  assert channels.src[0].arg == 64
  assert not [n for n in padded.ast.toposort if n.op in (Ops.IDIV, Ops.MOD) and channels in n.toposort]
  windows = x.reshape(4, 7, 2, 7, 2, 64)
  dx = ((windows == windows.max(axis=(2, 4), keepdims=True)) * g[:, :, None, :, None, :]).reshape(x.shape)
  np.testing.assert_array_equal(np.asarray(tj.jit(f)(x, g)), np.pad(dx, ((0, 0), (1, 1), (1, 1), (0, 0))) * 3)


@pytest.mark.parametrize("chain", [("pad",), ("flip0", "pad"), ("shrink", "pad"), ("permute", "pad", "permute")])
def test_elementwise_kernel_reading_across_the_flat_order_loops_over_rows(chain):
  """A pad or a transpose with a last axis of ROW_LOOP_MIN or more: the kernel gets a loop over the rows and one over
  the last axis, no division of the flat index per element, and the same values."""
  rng = np.random.default_rng(1)
  data = rng.standard_normal((3, 2, 24)).astype(np.float32)
  graph, expected = build_chain(chain, data)
  assert expected.shape[-1] >= ROW_LOOP_MIN
  (kernel,) = schedule(node(Ops.SINK, graph)).kernels
  ranges = [n for n in kernel.ast.toposort if n.op is Ops.RANGE]
  assert [r.src[0].arg for r in ranges] == [math.prod(expected.shape[:-1]), expected.shape[-1]]
  inner = ranges[-1]
  assert not any(n.op in (Ops.IDIV, Ops.MOD) and inner in n.toposort for n in kernel.ast.toposort)
  (out,) = interpret(node(Ops.SINK, graph), [data])
  np.testing.assert_array_equal(out, expected)


def test_elementwise_kernel_with_a_short_last_axis_loops_over_its_last_axes():
  """A transpose whose last axis is shorter than ROW_LOOP_MIN (an HWCN image's 8 samples): the fewest last axes that
  make a row of ROW_LOOP_MIN elements get a loop each, the rows one flat loop, so no division of the flat index per
  element (five of them per element before: a 7x7 convolution's im2col copy ran at 2.6 GB/s). Same values."""
  rng = np.random.default_rng(2)
  data = rng.standard_normal((5, 6, 3, 8)).astype(np.float32)
  graph = node(Ops.PERMUTE, param(0, data.shape), arg=(2, 0, 1, 3))
  (kernel,) = schedule(node(Ops.SINK, graph)).kernels
  ranges = sorted((n for n in kernel.ast.toposort if n.op is Ops.RANGE), key=lambda r: r.arg[0])
  assert [r.src[0].arg for r in ranges] == [3 * 5, 6, 8] and 6 * 8 >= ROW_LOOP_MIN > 8
  assert not any(n.op in (Ops.IDIV, Ops.MOD) and any(r in n.toposort for r in ranges[1:])
                 for n in kernel.ast.toposort)
  (out,) = interpret(node(Ops.SINK, graph), [data])
  np.testing.assert_array_equal(out, data.transpose(2, 0, 1, 3))


def test_reshape_round_trip_folds_to_plain_index():
  rng_node = UOp(Ops.RANGE, INDEX_DTYPE, (symbolic.const(24),), (0, "global"))
  parts = [symbolic.mod(symbolic.idiv(rng_node, 12), 2), symbolic.mod(symbolic.idiv(rng_node, 4), 3),
           symbolic.mod(rng_node, 4)]
  flat = symbolic.add(symbolic.add(symbolic.mul(parts[0], 12), symbolic.mul(parts[1], 4)), parts[2])
  assert flat is rng_node



def test_reshape_round_trip_of_a_chunked_axis_folds_to_plain_index():
  """A flattened (7, 7, 64) axis read in chunks of 392 (a split sum's partials, lower/split.py): the flat position
  392*p + r gives h, w and c by division, and c's remainder reduces its coefficient ((8*p + r) % 64), yet the three
  add back up to 392*p + r (`_recombine` matches expressions congruent modulo the divisor). Checked exhaustively."""
  p, r = (UOp(Ops.RANGE, INDEX_DTYPE, (symbolic.const(n),), (i, "global")) for i, n in enumerate((8, 392)))
  flat = symbolic.add(symbolic.mul(p, 392), r)
  h, w, c = symbolic.idiv(flat, 448), symbolic.mod(symbolic.idiv(flat, 64), 7), symbolic.mod(flat, 64)
  assert c.src[0] is not flat  # (the remainder's own operand: 8*p + r)
  index = symbolic.add(symbolic.add(symbolic.mul(h, 448), symbolic.mul(w, 64)), c)
  assert index is flat and linear_strides(index) == ({p: 392, r: 1}, set())
  # (in either order, and in part: w and c alone fold into flat % 448)
  assert symbolic.add(c, symbolic.add(symbolic.mul(w, 64), symbolic.mul(h, 448))) is flat
  part = symbolic.add(symbolic.mul(w, 64), c)
  for i, j in itertools.product(range(8), range(392)):
    assert _eval(part, {p: i, r: j}, [], {}) == (392 * i + j) % 448
  # (not congruent: 392*p + r and 392*p + r + 1 leave different remainders, nothing folds)
  off = symbolic.mod(symbolic.add(flat, symbolic.const(1)), 64)
  kept = symbolic.add(symbolic.mul(symbolic.idiv(flat, 64), 64), off)
  for i, j in itertools.product(range(8), range(392)):
    assert _eval(kept, {p: i, r: j}, [], {}) == (392 * i + j) // 64 * 64 + (392 * i + j + 1) % 64

@pytest.mark.parametrize("divisor", [1, 2, 3, 7, 12])
def test_symbolic_divmod_exhaustive(divisor):
  outer = UOp(Ops.RANGE, INDEX_DTYPE, (symbolic.const(5),), (0, "global"))
  inner = UOp(Ops.RANGE, INDEX_DTYPE, (symbolic.const(6),), (1, "global"))
  expr = symbolic.add(symbolic.mul(outer, 6), inner)
  quotient, remainder = symbolic.idiv(expr, divisor), symbolic.mod(expr, divisor)
  for i, j in itertools.product(range(5), range(6)):
    env = {outer: i, inner: j}
    assert _eval(quotient, env, [], {}) == (i * 6 + j) // divisor
    assert _eval(remainder, env, [], {}) == (i * 6 + j) % divisor


@pytest.mark.parametrize("divisor", [2, 4, 6, 16, 24, 48, 96])
def test_symbolic_divmod_by_a_common_factor_exhaustive(divisor):
  """(g*X + s) // d == X // (d/g) and (g*X + s) % d == g*(X % (d/g)) + s for 0 <= s < g, g dividing d: a pooling
  window's row in a flattened (h, w, c) index, (24*h + 4*w + c) // 48 == h // 2, folds to plain range arithmetic."""
  h, w, c = (UOp(Ops.RANGE, INDEX_DTYPE, (symbolic.const(n),), (i, "global")) for i, n in enumerate((5, 6, 4)))
  expr = symbolic.add(symbolic.add(symbolic.mul(h, 24), symbolic.mul(w, 4)), c)
  quotient, remainder = symbolic.idiv(expr, divisor), symbolic.mod(expr, divisor)
  for i, j, k in itertools.product(range(5), range(6), range(4)):
    env = {h: i, w: j, c: k}
    assert _eval(quotient, env, [], {}) == (24 * i + 4 * j + k) // divisor
    assert _eval(remainder, env, [], {}) == (24 * i + 4 * j + k) % divisor
  if divisor == 48:  # no division is left over w or c: the quotient is h // 2, the remainder linear in w and c
    assert symbolic.idiv(expr, 48) is symbolic.idiv(h, 2)
    assert c not in {node for node in symbolic.idiv(expr, 48).toposort}
    strides, other = linear_strides(remainder)
    assert strides[w] == 4 and strides[c] == 1 and other == {h}


def test_fusion_softmax_is_one_kernel_on_the_cpu_and_correct(on_cpu):
  """The row's max and sum are reductions over the kernel's trailing axis, read broadcast back along it: they stay
  in the kernel (computed once per row, before its loop); a GPU schedule gives them kernels of their own, as do rows
  shorter than ROW_FUSE_MIN and a single row (each launch chunk would compute its reductions again)."""
  from tinyjax.lower.schedule import ROW_FUSE_MIN

  def softmax_of(shape):
    x = param(0, shape)
    row_max = node(Ops.REDUCE_AXIS, x, arg=(Ops.MAX, (1,)))
    exps = node(Ops.EXP2, node(Ops.ADD, x, node(Ops.NEG, node(Ops.EXPAND, row_max, arg=shape))))
    total = node(Ops.REDUCE_AXIS, exps, arg=(Ops.ADD, (1,)))
    return node(Ops.SINK, node(Ops.FDIV, exps, node(Ops.EXPAND, total, arg=shape)))
  data = np.random.default_rng(1).standard_normal((4, 2 * ROW_FUSE_MIN)).astype(np.float32)
  sink = softmax_of(data.shape)
  assert len(schedule(sink).kernels) == 1 and len(schedule(sink, gpu=True).kernels) == 3
  assert len(schedule(softmax_of((4, ROW_FUSE_MIN // 2))).kernels) == 3
  assert len(schedule(softmax_of((1, 2 * ROW_FUSE_MIN))).kernels) == 3
  (out,) = interpret(softmax_of((2, 3)), [data[:2, :3]])  # (the interpreter recomputes a nested reduction per term)
  expected = np.exp2(data[:2, :3] - data[:2, :3].max(1, keepdims=True))
  np.testing.assert_allclose(out, expected / expected.sum(1, keepdims=True), rtol=1e-6)
  # the fused kernel, compiled: jax.nn.softmax and a layer norm against numpy in float64
  import tinyjax as tj
  import tinyjax.numpy as tnp
  softmax = tj.jit(lambda x: tj.nn.softmax(x, axis=-1))
  layer_norm = tj.jit(lambda x: (x - x.mean(1, keepdims=True)) / tnp.sqrt(x.var(1, keepdims=True) + 1e-5))
  for f in (softmax, layer_norm): assert len(f.lower(data)._compiled.schedule.schedule.kernels) == 1
  wide = data.astype(np.float64)
  want = np.exp(wide - wide.max(1, keepdims=True))
  np.testing.assert_allclose(np.asarray(softmax(data)), want / want.sum(1, keepdims=True), rtol=2e-6, atol=1e-7)
  want = (wide - wide.mean(1, keepdims=True)) / np.sqrt(wide.var(1, keepdims=True) + 1e-5)
  np.testing.assert_allclose(np.asarray(layer_norm(data)), want, rtol=1e-5, atol=1e-5)


def test_matmul_is_one_kernel_of_movement_multiply_reduce():
  a_data, b_data = np.arange(12, dtype=np.float32).reshape(3, 4), np.arange(20, dtype=np.float32).reshape(4, 5)
  a, b = param(0, (3, 4)), param(1, (4, 5))
  lhs = node(Ops.EXPAND, node(Ops.RESHAPE, a, arg=(3, 1, 4)), arg=(3, 5, 4))
  rhs = node(Ops.EXPAND, node(Ops.RESHAPE, node(Ops.PERMUTE, b, arg=(1, 0)), arg=(1, 5, 4)), arg=(3, 5, 4))
  product = node(Ops.RESHAPE, node(Ops.REDUCE_AXIS, node(Ops.MUL, lhs, rhs), arg=(Ops.ADD, (2,))), arg=(3, 5))
  sink = node(Ops.SINK, product)
  assert len(schedule(sink).kernels) == 1
  (out,) = interpret(sink, [a_data, b_data])
  np.testing.assert_array_equal(out, a_data @ b_data)


def test_reduce_consumed_without_broadcast_fuses_nested():
  data = np.arange(12, dtype=np.float32).reshape(3, 4)
  x = param(0, data.shape)
  inner = node(Ops.REDUCE_AXIS, x, arg=(Ops.ADD, (1,)))               # (3, 1)
  outer = node(Ops.REDUCE_AXIS, node(Ops.EXP2, node(Ops.MUL, inner, node(Ops.EXPAND, node(
    Ops.RESHAPE, UOp.const(F32, 0.01), arg=(1, 1)), arg=(3, 1)))), arg=(Ops.ADD, (0,)))
  sink = node(Ops.SINK, outer)
  assert find_buffers(sink) == [outer]
  (out,) = interpret(sink, [data])
  np.testing.assert_allclose(out.reshape(()), np.exp2(data.sum(1) * np.float32(0.01)).sum(), rtol=1e-6)


@pytest.mark.parametrize("pad, axes, ranges", [(False, (0, 1, 2), 1), (False, (0, 1, 3), 2), (False, (0, 2), 2),
                                               (True, (1, 2), 2)])
def test_adjacent_reduced_axes_are_one_reduce_range(pad, axes, ranges):
  """A sum over adjacent axes (an NHWC batch norm's N, H, W) loops once over them all, with a plain stride, where
  every index reads them linearly; through a pad (whose gate needs each axis) they keep a range each."""
  rng = np.random.default_rng(1)
  data = rng.standard_normal((4, 3, 5, 6)).astype(np.float32)
  x = param(0, data.shape)
  if pad: x = node(Ops.PAD, x, arg=((0, 0), (1, 2), (2, 1), (0, 0)))
  sink = node(Ops.SINK, node(Ops.REDUCE_AXIS, node(Ops.MUL, x, x), arg=(Ops.ADD, axes)))
  (kernel,) = schedule(sink, threads=1).kernels
  nodes = kernel.ast.toposort
  assert sum(n.op is Ops.RANGE and n.arg[1] == "reduce" for n in nodes) == ranges
  assert not any(n.op in (Ops.IDIV, Ops.MOD) for n in nodes)
  (out,) = interpret(sink, [data])
  padded = np.pad(data, ((0, 0), (1, 2), (2, 1), (0, 0))) if pad else data
  np.testing.assert_allclose(out, (padded.astype(np.float64) ** 2).sum(axes, keepdims=True), rtol=1e-5)


@pytest.mark.usefixtures("avx512_tiles")  # (plans sized for AVX-512 registers)
def test_reduced_axes_after_one_read_alone_are_one_range_and_get_register_tiles():
  """A sum over (N, H, W) of an NHWC product with an operand read per (N, C) (a global average pool's gradient):
  H and W merge into one range, N keeps its own, and the nest gets register tiles over C (the stream tile takes one
  range only). Values against numpy."""
  from tinyjax.codegen.opt import choose_opts
  rng = np.random.default_rng(3)
  data = rng.standard_normal((4, 3, 5, 96)).astype(np.float32)
  per_n = rng.standard_normal((4, 1, 1, 96)).astype(np.float32)
  x, y = param(0, data.shape), param(1, per_n.shape)
  value = node(Ops.MUL, x, node(Ops.EXPAND, y, arg=data.shape))
  sink = node(Ops.SINK, node(Ops.REDUCE_AXIS, value, arg=(Ops.ADD, (0, 1, 2))))
  (kernel,) = schedule(sink, threads=1).kernels
  ranges = [n for n in kernel.ast.toposort if n.op is Ops.RANGE and n.arg[1] == "reduce"]
  assert sorted(r.src[0].arg for r in ranges) == [4, 15]
  plan = choose_opts(kernel.ast)
  assert plan is not None and not plan.stream and plan.columns == 64
  want = (data.astype(np.float64) * per_n).sum((0, 1, 2), keepdims=True)
  (out,) = interpret(sink, [data, per_n])
  np.testing.assert_allclose(out, want, rtol=1e-5)
  import tinyjax as tj
  compiled = tj.jit(lambda a, b: (a * b).sum((0, 1, 2), keepdims=True))(data, per_n)
  np.testing.assert_allclose(np.asarray(compiled), want, rtol=1e-5, atol=1e-5)


def test_kernels_of_one_structure_are_built_once_over_their_own_slots():
  """Kernels whose expressions are alike down to their buffers (ResNet's repeated blocks) share one AST, each over
  its own slots; reading one buffer twice (x + x) is a different kernel from reading two (x + y)."""
  rng = np.random.default_rng(2)
  data = [rng.standard_normal((8, 16)).astype(np.float32) for _ in range(3)]
  x, y, z = (param(i, (8, 16)) for i in range(3))

  def reduced(a, b): return node(Ops.REDUCE_AXIS, node(Ops.EXP2, node(Ops.ADD, a, b)), arg=(Ops.ADD, (1,)))
  sink = node(Ops.SINK, reduced(x, y), reduced(y, z), reduced(z, z), reduced(x, x))
  kernels = schedule(sink, threads=1).kernels
  assert len(kernels) == 4
  assert kernels[0].ast is kernels[1].ast and kernels[2].ast is kernels[3].ast and kernels[0].ast is not kernels[2].ast
  assert kernels[0].slots != kernels[1].slots and kernels[2].slots != kernels[3].slots
  outs = interpret(sink, data)
  for out, (a, b) in zip(outs, [(0, 1), (1, 2), (2, 2), (0, 0)]):
    want = np.exp2(data[a].astype(np.float64) + data[b]).sum(1, keepdims=True)
    np.testing.assert_allclose(out, want, rtol=1e-5)


def test_kernels_with_a_reduction_are_reported_as_they_are_built():
  """`schedule(built=...)` hands over each kernel with a reduction as soon as it is built, the object the schedule
  keeps (elementwise ones may still merge, so they are not reported): get_schedule starts compiling the contractions
  while the rest is lowered."""
  x, w = param(0, (32, 64)), param(1, (64, 16))
  lhs = node(Ops.EXPAND, node(Ops.RESHAPE, x, arg=(32, 64, 1)), arg=(32, 64, 16))
  rhs = node(Ops.EXPAND, node(Ops.RESHAPE, w, arg=(1, 64, 16)), arg=(32, 64, 16))
  product = node(Ops.REDUCE_AXIS, node(Ops.MUL, lhs, rhs), arg=(Ops.ADD, (1,)))
  sink = node(Ops.SINK, node(Ops.EXP2, product), node(Ops.ADD, x, x), node(Ops.REDUCE_AXIS, x, arg=(Ops.MAX, (0,))))
  reported = []
  kernels = schedule(sink, threads=1, built=reported.append).kernels
  reducing = [k for k in kernels if any(n.op is Ops.REDUCE for n in k.ast.toposort)]
  assert len(reducing) == 2 and len(kernels) == 3
  assert len(reported) == 2 and all(any(k is r for k in reducing) for r in reported)


def test_empty_reduction_gives_identity():
  x = param(0, (3, 0))
  sink = node(Ops.SINK, node(Ops.REDUCE_AXIS, x, arg=(Ops.MAX, (1,))), node(Ops.REDUCE_AXIS, x, arg=(Ops.ADD, (1,))))
  maxes, sums = interpret(sink, [np.zeros((3, 0), np.float32)])
  assert np.all(maxes == -np.inf) and np.all(sums == 0)


def test_program_returning_its_input_needs_no_kernel():
  x = param(0, (3,))
  sched = schedule(node(Ops.SINK, x))
  assert sched.kernels == () and sched.outputs == (0,)


# ---------------------------------------------------------------------------------------------------------------------
# the IR itself

def test_uop_hash_consing_and_float_keys():
  assert param(0, (2,)) is param(0, (2,))
  assert UOp.const(F32, 0.0) is not UOp.const(F32, -0.0)
  assert UOp.const(F32, float("nan")) is UOp.const(F32, float("nan"))


def test_buffer_nodes_are_one_per_buffer_through_its_weak_reference():
  """A BUFFER node is named by its buffer (a weak reference the buffer holds, not an entry of the node cache): the
  same buffer gives the same node while it lives, a new one after it died, and other buffers other nodes."""
  import gc
  import weakref
  from tinyjax.devices.buffer import Buffer
  buffer, other = Buffer((3,), F32), Buffer((3,), F32)
  node = UOp.new_buffer(F32, buffer)
  assert UOp(Ops.BUFFER, F32, (), buffer) is node and UOp(Ops.BUFFER, F32, (), other) is not node
  assert all(value is not node for value in UOp._cache.values())
  dead = weakref.ref(node)
  del node
  gc.collect()
  assert dead() is None
  again = UOp(Ops.BUFFER, F32, (), buffer)
  assert again.arg is buffer and UOp(Ops.BUFFER, F32, (), buffer) is again


def test_pattern_matcher_commutative_and_graph_rewrite_to_fixed_point():
  x = param(0, ())
  zero = UOp.const(F32, 0.0)
  rules = PatternMatcher([(UPat(Ops.ADD, src=(UPat.var("a"), UPat.cvar("c"))), lambda a, c: a if c.arg == 0 else None),
                          (UPat(Ops.NEG, src=(UPat(Ops.NEG, src=(UPat.var("a"),)),)), lambda a: a)])
  graph = node(Ops.NEG, node(Ops.NEG, node(Ops.ADD, zero, node(Ops.ADD, x, zero))))
  assert graph_rewrite(graph, rules) is x


def test_graph_rewrite_handles_deep_graphs():
  x = param(0, ())
  one = UOp.const(F32, 1.0)
  graph = x
  for _ in range(5000): graph = node(Ops.MUL, graph, one)
  rules = PatternMatcher([(UPat(Ops.MUL, src=(UPat.var("a"), UPat.cvar("c"))), lambda a, c: a if c.arg == 1 else None)])
  assert graph_rewrite(graph, rules) is x


def _matmul(lhs: UOp, rhs: UOp) -> UOp:
  (m, k), (_, n) = lhs.shape, rhs.shape
  lhs3 = node(Ops.EXPAND, node(Ops.RESHAPE, lhs, arg=(m, 1, k)), arg=(m, n, k))
  rhs3 = node(Ops.EXPAND, node(Ops.RESHAPE, node(Ops.PERMUTE, rhs, arg=(1, 0)), arg=(1, n, k)), arg=(m, n, k))
  return node(Ops.RESHAPE, node(Ops.REDUCE_AXIS, node(Ops.MUL, lhs3, rhs3), arg=(Ops.ADD, (2,))), arg=(m, n))


def test_costly_operand_of_a_contraction_is_computed_once_into_a_buffer():
  a_data, b_data = np.linspace(-1, 1, 12, dtype=np.float32).reshape(3, 4), np.ones((4, 5), np.float32)
  a, b = param(0, (3, 4)), param(1, (4, 5))
  two = node(Ops.EXPAND, node(Ops.RESHAPE, UOp.const(F32, 2.0), arg=(1, 1)), arg=(3, 4))
  cheap = node(Ops.SINK, _matmul(node(Ops.MUL, a, two), b))
  costly = node(Ops.SINK, _matmul(node(Ops.EXP2, a), b))
  assert len(schedule(cheap).kernels) == 1                 # a scaled operand stays fused
  assert len(schedule(costly).kernels) == 2                # exp2(a): once per element of a, not per (m, n, k)
  (out,) = interpret(costly, [a_data, b_data])
  np.testing.assert_allclose(out, np.exp2(a_data) @ b_data, rtol=1e-6)


def test_costly_epilogue_of_a_contraction_gets_its_own_kernel_but_not_of_a_row_reduction():
  """A costly epilogue that the register tile would run per element (sin) gets a kernel of its own; one it runs on
  its accumulator vectors (float32 exp2, codegen's vector epilogue) stays in the contraction's kernel."""
  a_data, b_data = np.linspace(-1, 1, 12, dtype=np.float32).reshape(3, 4), np.ones((4, 5), np.float32)
  a, b = param(0, (3, 4)), param(1, (4, 5))
  product = _matmul(a, b)
  one = node(Ops.EXPAND, node(Ops.RESHAPE, UOp.const(F32, 1.0), arg=(1, 1)), arg=(3, 5))
  assert len(schedule(node(Ops.SINK, node(Ops.ADD, product, one))).kernels) == 1   # bias-like epilogue fuses
  costly = node(Ops.SINK, node(Ops.SIN, product))
  assert len(schedule(costly).kernels) == 2
  (out,) = interpret(costly, [a_data, b_data])
  np.testing.assert_allclose(out, np.sin(a_data @ b_data), rtol=1e-6)
  vectorised = node(Ops.SINK, node(Ops.EXP2, product))
  assert len(schedule(vectorised).kernels) == 1
  (out,) = interpret(vectorised, [a_data, b_data])
  np.testing.assert_allclose(out, np.exp2(a_data @ b_data), rtol=1e-6)
  # below a reduction (a loss summed over exp2 of its logits, or over their squares) the contraction is a buffer: in
  # the reduction's kernel it would be a nested loop, not a tile
  for epilogue, reference in ((Ops.EXP2, np.exp2), (Ops.MUL, np.square)):
    value = node(Ops.EXP2, product) if epilogue is Ops.EXP2 else node(Ops.MUL, product, product)
    total = node(Ops.SINK, node(Ops.REDUCE_AXIS, value, arg=(Ops.ADD, (0, 1))))
    assert len(schedule(total).kernels) == 2
    (out,) = interpret(total, [a_data, b_data])
    np.testing.assert_allclose(out.reshape(()), reference(a_data.astype(np.float64) @ b_data).sum(), rtol=1e-6)
  row_sum = node(Ops.REDUCE_AXIS, a, arg=(Ops.ADD, (1,)))
  assert len(schedule(node(Ops.SINK, node(Ops.EXP2, row_sum))).kernels) == 1       # plain reductions keep it
  vector = _matmul(param(0, (1, 4)), b)  # a vector-matrix product (an RNN step): no rows to tile, one kernel
  assert len(schedule(node(Ops.SINK, node(Ops.EXP2, vector))).kernels) == 1
  (out,) = interpret(node(Ops.SINK, node(Ops.EXP2, vector)), [a_data[:1], b_data])
  np.testing.assert_allclose(out, np.exp2(a_data[:1] @ b_data), rtol=1e-6)


@pytest.mark.parametrize("n", [32, 100])
def test_strided_contraction_operand_is_packed_or_copied_into_the_tile_layout(n):
  """a @ w.T (a matmul's input gradient): w is read along the output column with a stride. Where the register tile
  packs w per column tile (whole column tiles: 32 columns), the pack reads it transposed, in the one kernel; else (100
  columns end in a partial tile, read in place) a copy kernel lays it out column-innermost first, then the
  contraction is tiled."""
  from tinyjax.codegen.opt import applied_opts
  m, k = 16, 16
  rng = np.random.default_rng(3)
  a_data, w_data = rng.standard_normal((m, k)).astype(np.float32), rng.standard_normal((n, k)).astype(np.float32)
  a, w = param(0, (m, k)), param(1, (n, k))
  program = node(Ops.SINK, _matmul(a, node(Ops.PERMUTE, w, arg=(1, 0))))
  kernels = schedule(program).kernels
  if n == 32:
    (product,) = kernels
    assert ("pack", 1, 1) in applied_opts(product.ast)
  else:
    copy, product = kernels
    assert not any(n.op is Ops.REDUCE for n in copy.ast.toposort) and applied_opts(product.ast)
  (out,) = interpret(program, [a_data, w_data])
  np.testing.assert_allclose(out, a_data.astype(np.float64) @ w_data.T, rtol=1e-5, atol=1e-5)
  # a small contraction (less work than RELAYOUT_WORK_RATIO times the copy) keeps its one kernel
  small = node(Ops.SINK, _matmul(param(0, (2, 64)), node(Ops.PERMUTE, param(1, (48, 64)), arg=(1, 0))))
  assert len(schedule(small).kernels) == 1


def test_relayout_copy_read_by_two_contractions_is_made_once():
  """h @ w and g @ w.T (a classifier's forward and its input gradient) both read the narrow w with the reduction
  innermost: one copy kernel serves both contractions (w.T's 100 columns end in a partial tile: not packed)."""
  m, k, n = 32, 100, 10
  h, g, w = param(0, (m, k)), param(1, (m, n)), param(2, (k, n))
  program = node(Ops.SINK, _matmul(h, w), _matmul(g, node(Ops.PERMUTE, w, arg=(1, 0))))
  kernels = schedule(program).kernels
  copies = [kernel for kernel in kernels if not any(x.op is Ops.REDUCE for x in kernel.ast.toposort)]
  assert len(copies) == 1 and len(kernels) == 3
  assert all(copies[0].slots[0] in kernel.slots[1:] for kernel in kernels if kernel is not copies[0])
  rng = np.random.default_rng(5)
  data = [rng.standard_normal(shape).astype(np.float32) for shape in ((m, k), (m, n), (k, n))]
  forward, backward = interpret(program, data)
  np.testing.assert_allclose(forward, data[0].astype(np.float64) @ data[2], rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(backward, data[1].astype(np.float64) @ data[2].T, rtol=1e-5, atol=1e-5)


def test_scalar_read_through_a_broadcast_is_computed_in_each_reader():
  """Adam's bias correction 1 / (1 - 0.9 ** count) scales a whole parameter: a costly scalar, but computed once per
  kernel (before its loops), so it gets no kernel of its own, and the updates around it still merge into one."""
  shape = (6, 5)
  count, m, p = param(0, ()), param(1, shape), param(2, shape)
  power = node(Ops.EXP2, node(Ops.MUL, count, UOp.const(F32, math.log2(0.9))))
  correction = node(Ops.FDIV, UOp.const(F32, 1.0), node(Ops.ADD, UOp.const(F32, 1.0), node(Ops.NEG, power)))
  scale = node(Ops.EXPAND, node(Ops.RESHAPE, correction, arg=(1, 1)), arg=shape)
  new_m = node(Ops.MUL, m, _fill(0.9, shape))
  new_p = node(Ops.ADD, p, node(Ops.MUL, new_m, scale))
  program = node(Ops.SINK, new_m, new_p)
  (kernel,) = schedule(program).kernels
  assert sum(x.op is Ops.STORE for x in kernel.ast.src) == 2
  rng = np.random.default_rng(6)
  md, pd = rng.random(shape, np.float32), rng.random(shape, np.float32)
  got_m, got_p = interpret(program, [np.float32(3.0), md, pd])
  np.testing.assert_allclose(got_m, 0.9 * md.astype(np.float64), rtol=1e-6)
  np.testing.assert_allclose(got_p, pd + 0.9 * md.astype(np.float64) / (1 - 0.9 ** 3), rtol=1e-5)
  # a scalar reduction read through a broadcast still gets its buffer (recomputed per element it would cost n * n)
  x = param(0, (64,))
  total = node(Ops.RESHAPE, node(Ops.REDUCE_AXIS, x, arg=(Ops.ADD, (0,))), arg=())
  centred = node(Ops.ADD, x, node(Ops.NEG, node(Ops.EXPAND, node(Ops.RESHAPE, total, arg=(1,)), arg=(64,))))
  assert len(schedule(node(Ops.SINK, centred)).kernels) == 2


def test_packed_tile_cut_by_rows_runs_one_chunk_per_thread():
  """x.T @ g (a weight gradient) with too few column tiles to cut by columns: its rows are cut into one chunk per
  thread (the launch grain), since every chunk packs all of g again."""
  from tinyjax.codegen.opt import choose_opts
  x, g = param(0, (64, 96)), param(1, (64, 64))
  program = node(Ops.SINK, _matmul(node(Ops.PERMUTE, x, arg=(1, 0)), g))
  for threads in (2, 4, 3):
    (kernel,) = schedule(program, threads).kernels
    plan = choose_opts(kernel.ast)
    grain = -(-96 // (threads * plan.rows)) * plan.rows  # whole tiles (96 rows, 2 threads: 48)
    assert plan.packed and kernel.outer_size == 96 and kernel.grain == grain and grain * threads >= 96


@pytest.mark.parametrize("rows,steps", [(512, 512), (784, 512), (96, 64), (96, 1024)])
def test_row_operand_read_across_its_rows_is_copied_when_past_l2(rows, steps):
  """x.T @ g (a weight gradient) whose x (steps, rows) takes RELAYOUT_ACROSS_BYTES or more: x.T is copied first, by a
  register transpose, and the product reads its rows contiguous along the sum (as a @ b's), cut into column tiles;
  a smaller x is read in place. Values against numpy in float64, also under jit(grad)."""
  import tinyjax as tj
  from tinyjax.codegen.opt import applied_opts, choose_opts
  from tinyjax.lower.schedule import RELAYOUT_ACROSS_BYTES
  x, g = param(0, (steps, rows)), param(1, (steps, 64))
  kernels = schedule(node(Ops.SINK, _matmul(node(Ops.PERMUTE, x, arg=(1, 0)), g)), 2).kernels
  copied = rows * steps * 4 >= RELAYOUT_ACROSS_BYTES
  assert len(kernels) == (2 if copied else 1)
  if copied:
    assert kernels[0].name.startswith(f"e_{rows}_{steps}_") and ("transpose", 32) in applied_opts(kernels[0].ast)
    assert kernels[0].slots[0] in kernels[1].slots and choose_opts(kernels[1].ast).row is not None
  rng = np.random.default_rng(rows)
  xs, gs = rng.standard_normal((steps, rows)).astype(np.float32), rng.standard_normal((steps, 64)).astype(np.float32)
  np.testing.assert_allclose(np.asarray(tj.jit(lambda a, b: a.T @ b)(xs, gs)), xs.T.astype(np.float64) @ gs,
                             rtol=1e-4, atol=1e-4)
  w = rng.standard_normal((rows, 64)).astype(np.float32)
  dw = tj.jit(tj.grad(lambda w: ((xs @ w) * gs).sum()))(w)  # (the gradient is x.T @ g)
  np.testing.assert_allclose(np.asarray(dw), xs.T.astype(np.float64) @ gs, rtol=1e-4, atol=1e-4)


def test_reduction_read_by_two_kernels_is_computed_once():
  """A gradient feeding both of Adam's moments: the reduction gets its own buffer, stored in the layout its readers
  read it (through the same permute), instead of being recomputed inside each reader's kernel."""
  x = param(0, (8, 6))
  total = node(Ops.PERMUTE, node(Ops.REDUCE_AXIS, node(Ops.RESHAPE, x, arg=(1, 8, 6)), arg=(Ops.ADD, (1,))),
               arg=(2, 1, 0))
  scaled = node(Ops.MUL, total, total)
  two = node(Ops.EXPAND, node(Ops.RESHAPE, UOp.const(F32, 2.0), arg=(1, 1, 1)), arg=(6, 1, 1))
  program = node(Ops.SINK, node(Ops.ADD, total, two), scaled)
  kernels = schedule(program).kernels
  with_reduce = [k for k in kernels if any(n.op is Ops.REDUCE for n in k.ast.toposort)]
  assert len(with_reduce) == 1 and len(kernels) == 2  # the two readers: one elementwise kernel with two outputs
  data = np.arange(48, dtype=np.float32).reshape(8, 6)
  first, second = interpret(program, [data])
  want = data.sum(0).reshape(6, 1, 1)
  np.testing.assert_allclose(first, want + 2)
  np.testing.assert_allclose(second, want * want)


def test_narrow_contraction_is_vectorised_along_its_reduction():
  """h @ w with 10 output columns (a classifier): w is read with a stride along the reduction, so it is copied with the
  reduction innermost and every load of the contraction is contiguous along it (the plain nest vectorises it)."""
  from tinyjax.lower.schedule import NARROW_COLUMN
  from tinyjax.codegen.opt import linear_strides
  m, k, n = 32, 64, 10
  assert n < NARROW_COLUMN
  rng = np.random.default_rng(4)
  h_data, w_data = rng.standard_normal((m, k)).astype(np.float32), rng.standard_normal((k, n)).astype(np.float32)
  program = node(Ops.SINK, _matmul(param(0, (m, k)), param(1, (k, n))))
  copy, product = schedule(program).kernels
  (reduce_node,) = [x for x in product.ast.toposort if x.op is Ops.REDUCE]
  inner = reduce_node.src[-1]
  loads = [x for x in product.ast.toposort if x.op is Ops.LOAD]
  assert loads and all(linear_strides(x.src[1])[0].get(inner, 0) in (0, 1) for x in loads)
  (out,) = interpret(program, [h_data, w_data])
  np.testing.assert_allclose(out, h_data.astype(np.float64) @ w_data, rtol=1e-5, atol=1e-5)


def _fill(value: float, shape: tuple[int, ...]) -> UOp:
  return node(Ops.EXPAND, node(Ops.RESHAPE, UOp.const(F32, value), arg=(1,) * len(shape)), arg=shape)


@pytest.mark.parametrize("n", [REREAD_LIMIT + 1, 3])
def test_elementwise_operand_reread_by_a_contraction_gets_a_buffer(n):
  """relu(a @ w1 + b) feeding `@ w2`: with many columns in w2 the bias and ReLU are computed once per element, in the
  first contraction's kernel (its epilogue), instead of inside the second contraction for each of its columns; with
  few columns they stay fused into the second. The values are the same either way."""
  m, k, h = 4, 8, 6
  a, w1, b, w2 = param(0, (m, k)), param(1, (k, h)), param(2, (h,)), param(3, (h, n))
  bias = node(Ops.EXPAND, node(Ops.RESHAPE, b, arg=(1, h)), arg=(m, h))
  hidden = node(Ops.MAX, node(Ops.ADD, _matmul(a, w1), bias), _fill(0.0, (m, h)))
  program = node(Ops.SINK, _matmul(hidden, w2))
  kernels = schedule(program).kernels
  contractions = [kernel for kernel in kernels if any(x.op is Ops.REDUCE for x in kernel.ast.toposort)]
  has_max = [any(x.op is Ops.MAX for x in kernel.ast.toposort) for kernel in contractions]
  assert has_max == ([True, False] if n > REREAD_LIMIT else [False, True])
  rng = np.random.default_rng(2)
  data = [rng.standard_normal(shape).astype(np.float32) for shape in ((m, k), (k, h), (h,), (h, n))]
  (out,) = interpret(program, data)
  want = np.maximum(data[0].astype(np.float64) @ data[1] + data[2], 0) @ data[3]
  np.testing.assert_allclose(out, want, rtol=1e-5, atol=1e-5)


def test_elementwise_kernels_over_one_loop_merge_into_one_with_several_outputs():
  """Adam's update of one parameter (both moments, then the parameter from the new moments): one kernel with three
  STOREs that loads the gradient and each state once and uses the new moments without loading them back."""
  shape = (5, 7)
  g, mu, nu, p = (param(i, shape) for i in range(4))
  new_mu = node(Ops.ADD, node(Ops.MUL, _fill(0.9, shape), mu), node(Ops.MUL, _fill(0.1, shape), g))
  new_nu = node(Ops.ADD, node(Ops.MUL, _fill(0.999, shape), nu),
                node(Ops.MUL, _fill(0.001, shape), node(Ops.MUL, g, g)))
  step = node(Ops.FDIV, new_mu, node(Ops.ADD, new_nu, _fill(1e-3, shape)))
  new_p = node(Ops.ADD, p, node(Ops.MUL, _fill(-0.01, shape), step))
  program = node(Ops.SINK, new_mu, new_nu, new_p)
  (merged,) = schedule(program).kernels
  assert sum(x.op is Ops.STORE for x in merged.ast.src) == 3
  loaded = [merged.slots[x.src[0].arg] for x in merged.ast.toposort if x.op is Ops.LOAD]
  assert sorted(loaded) == [0, 1, 2, 3]
  rng = np.random.default_rng(3)
  gd, mud, nud, pd = (rng.random(shape, np.float32) for _ in range(4))
  got = interpret(program, [gd, mud, nud, pd])
  want_mu, want_nu = 0.9 * mud + 0.1 * gd, 0.999 * nud + 0.001 * gd * gd
  want = [want_mu, want_nu, pd - 0.01 * want_mu / (want_nu + 1e-3)]
  for out, expected in zip(got, want): np.testing.assert_allclose(out, expected, rtol=1e-5)


def test_a_loss_is_computed_before_the_updates_and_the_updates_still_merge():
  """Outputs that depend on much less than the others (a loss) are computed first, so they read the parameters
  before any update may overwrite one in place; a parameter's update stays beside its moments' (one kernel)."""
  shape = (5, 7)
  mu, p = param(1, shape), param(2, shape)
  g = param(0, shape)
  for _ in range(12): g = node(Ops.ADD, node(Ops.MUL, g, g), _fill(0.5, shape))  # (the backward pass: long)
  new_mu = node(Ops.ADD, node(Ops.MUL, _fill(0.9, shape), mu), node(Ops.MUL, _fill(0.1, shape), g))
  new_p = node(Ops.ADD, p, node(Ops.MUL, _fill(-0.01, shape), new_mu))
  loss = node(Ops.RESHAPE, node(Ops.REDUCE_AXIS, node(Ops.MUL, p, p), arg=(Ops.ADD, (0, 1))), arg=())
  kernels = schedule(node(Ops.SINK, new_p, new_mu, loss)).kernels
  assert len(kernels) == 2
  first, updates = kernels
  assert any(x.op is Ops.REDUCE for x in first.ast.toposort)  # the loss, reading p before its update
  assert sum(x.op is Ops.STORE for x in updates.ast.src) == 2


def test_kernels_that_can_not_merge_stay_apart():
  """A kernel reading another's output at other elements (a transpose), or over a loop of another size, is not
  merged into it."""
  x = param(0, (4, 4))
  y = node(Ops.ADD, x, _fill(1.0, (4, 4)))
  transposed = node(Ops.MUL, node(Ops.PERMUTE, y, arg=(1, 0)), _fill(2.0, (4, 4)))
  assert len(schedule(node(Ops.SINK, y, transposed)).kernels) == 2
  other = node(Ops.MUL, param(1, (3,)), _fill(3.0, (3,)))
  assert len(schedule(node(Ops.SINK, y, other)).kernels) == 2
  data = np.arange(16, dtype=np.float32).reshape(4, 4)
  first, second = interpret(node(Ops.SINK, y, transposed), [data])
  np.testing.assert_array_equal(second, (data + 1).T * 2)


def test_elementwise_value_recomputed_by_several_kernels_from_many_buffers_gets_its_own():
  """A residual block's gradient: a chain of adds and ReLU masks over six full-size buffers, read by two
  column reductions (the batch-norm sums) and an elementwise output. Each of those kernels recomputed the chain,
  six buffers read three times; the chain gets a kernel of its own (six reads, one write) that the three read.
  Below SHARED_MIN_SAVED_BYTES (a small one), or read by a single kernel, it stays fused. Values against numpy."""
  import tinyjax as tj
  import tinyjax.numpy as tnp
  from tinyjax.lower.schedule import SHARED_MIN_SAVED_BYTES

  def block_gradient(a, b, c, d, e, f):
    chain = tnp.where(a > 0, tnp.where(b > 0, c + d, 0.0) + e, 0.0) * f
    return chain.sum(axis=0), (chain * a).sum(axis=0), chain * 2.0

  def loads_per_kernel(shape):
    args = [np.zeros(shape, F32)] * 6
    kernels = tj.jit(block_gradient).lower(*args)._compiled.schedule.schedule.kernels
    return sorted(len(k.slots) - 1 for k in kernels)
  rows, columns = 256, 128
  assert 8 * rows * columns * 4 >= SHARED_MIN_SAVED_BYTES  # (3 * 6 - 6 - 1 - 3) buffers' worth saved
  assert loads_per_kernel((rows, columns)) == [1, 1, 2, 6]  # the chain's kernel reads the six, the others read it
  assert loads_per_kernel((8, 16)) == [6, 6, 6]  # small: each kernel computes the chain from the six
  rng = np.random.default_rng(0)
  arrays = [rng.standard_normal((rows, columns)).astype(F32) for _ in range(6)]
  a, b, c, d, e, f = (x.astype(np.float64) for x in arrays)
  chain = np.where(a > 0, np.where(b > 0, c + d, 0.0) + e, 0.0) * f
  for got, want in zip(tj.jit(block_gradient)(*arrays), (chain.sum(0), (chain * a).sum(0), chain * 2)):
    np.testing.assert_allclose(np.asarray(got), want, rtol=1e-5, atol=1e-4)


def test_two_contractions_summed_get_a_kernel_each():
  """relu-masked g1 @ w1.T + g2 @ w2.T (where two branches' input gradients meet): the first contraction gets a
  kernel of its own, the second adds it in its epilogue; each kernel has one REDUCE and gets a register tile (one
  kernel with both had none). Values against numpy."""
  import tinyjax as tj
  import tinyjax.numpy as tnp
  from tinyjax.codegen.opt import applied_opts

  def meet(g1, w1, g2, w2, x): return tnp.where(x > 0, g1 @ w1.T + g2 @ w2.T, 0.0)
  rng = np.random.default_rng(2)
  args = [rng.standard_normal(shape).astype(F32) for shape in ((256, 96), (64, 96), (256, 128), (64, 128), (256, 64))]
  kernels = tj.jit(meet).lower(*args)._compiled.schedule.schedule.kernels
  assert len(kernels) == 2
  for kernel in kernels: assert sum(n.op is Ops.REDUCE for n in kernel.ast.toposort) == 1 and applied_opts(kernel.ast)
  g1, w1, g2, w2, x = (a.astype(np.float64) for a in args)
  np.testing.assert_allclose(np.asarray(tj.jit(meet)(*args)), np.where(x > 0, g1 @ w1.T + g2 @ w2.T, 0.0),
                             rtol=1e-5, atol=1e-4)


def test_narrow_contraction_is_computed_transposed_then_copied_into_place():
  """A classifier's weight gradient h.T @ g (10 columns; h read along its rows): computed as a (10, rows) register
  tile over h's contiguous rows, then copied into place (a small copy), instead of copying all of h transposed. Also
  with an epilogue reading an array of the output's layout (an update w - lr * grad, in eager mode fused with it).
  Launched over its column tiles (its 10 rows are one launch chunk). Values against numpy."""
  import tinyjax as tj
  from tinyjax.codegen.opt import applied_opts
  rng = np.random.default_rng(3)
  h, g, w = (rng.standard_normal(shape).astype(F32) for shape in ((256, 512), (256, 10), (512, 10)))
  for fun, want in ((lambda h, g, w: h.T @ g, h.astype(np.float64).T @ g),
                    (lambda h, g, w: w - 0.1 * (h.T @ g), w - 0.1 * (h.astype(np.float64).T @ g))):
    kernels = tj.jit(fun).lower(h, g, w)._compiled.schedule.schedule.kernels
    product, copy = kernels
    assert product.outer_size > 1 and applied_opts(product.ast) and product.name.startswith("r_512_10")
    assert not any(n.op is Ops.REDUCE for n in copy.ast.toposort) and copy.slots[1] == product.slots[0]
    np.testing.assert_allclose(np.asarray(tj.jit(fun)(h, g, w)), want, rtol=1e-5, atol=1e-4)


def test_sum_of_a_sum_is_one_reduction():
  """A sum of a sum (through permutes and reshapes of length-1 axes) is one reduction (lower/schedule.py
  `merge_sums`), unless the inner sum is read elsewhere too."""
  import tinyjax as tj
  import tinyjax.numpy as jnp
  x = np.random.default_rng(0).standard_normal((3, 4, 5)).astype(np.float32)
  f = tj.jit(lambda v: v.sum(axis=1).T.sum(axis=1))
  np.testing.assert_allclose(np.asarray(f(x)), x.astype(np.float64).sum(axis=(0, 1)), rtol=1e-5)
  assert len(f.lower(x)._compiled.schedule.schedule.kernels) == 1
  g = tj.jit(lambda v: (v.sum(axis=2) * 2, v.sum(axis=2).sum(0)))
  doubled, total = g(x)
  np.testing.assert_allclose(np.asarray(doubled), x.astype(np.float64).sum(axis=2) * 2, rtol=1e-5)
  np.testing.assert_allclose(np.asarray(total), x.astype(np.float64).sum(axis=(2, 0)), rtol=1e-5)
  h = tj.jit(lambda v: jnp.max(v.sum(axis=0), axis=0))  # (a max of a sum is left as it is)
  np.testing.assert_allclose(np.asarray(h(x)), x.astype(np.float64).sum(axis=0).max(axis=0), rtol=1e-5)


# ---- long chains and a lowering that does not depend on memory layout

@pytest.mark.parametrize("steps", [300, 2000])
def test_long_fused_chains_lower_eagerly_under_jit_and_grad(steps):
  """A chain of thousands of elementwise operations (an eager loop that never reads its value, an unrolled loop
  under jit, and its gradient) is built as kernels of at most MAX_FUSED_DEPTH operations (merge_elementwise may join
  them again, iteratively): it raised RecursionError from 400 operations on (the kernel builder recurses over them,
  and so did the shapes of a transposed graph)."""
  start = np.linspace(-1.0, 1.0, 8).astype(np.float32)

  def chain(y):
    for _ in range(steps): y = y * 1.0001 + 0.5
    return y
  expected = start.copy()  # (float32 steps, as the program's: rounding accumulates over thousands of them)
  for _ in range(steps): expected = expected * np.float32(1.0001) + np.float32(0.5)
  np.testing.assert_allclose(np.asarray(chain(tnp.asarray(start))), expected, rtol=1e-5)
  np.testing.assert_allclose(np.asarray(tj.jit(chain)(start)), expected, rtol=1e-5)
  gradient = tj.jit(tj.grad(lambda y: chain(y).sum()))(start)
  np.testing.assert_allclose(np.asarray(gradient), np.full(8, np.float64(np.float32(1.0001)) ** steps), rtol=1e-4)


def test_kernel_regions_are_walked_in_program_order():
  """find_buffers' helpers visit the kernels' roots in the program's order, whatever order the set of roots
  iterates in (it is the nodes' addresses: two processes lowering one program once made 30 and 31 kernels)."""
  x = tnp.ones((4, 4))
  roots = [tnp.sin(x + k).uop for k in range(6)]
  order = {root: position for position, root in enumerate(roots)}

  class Scrambled(set):
    def __iter__(self): return iter(sorted(set.__iter__(self), key=lambda node: -order[node]))
  regions = schedule_module._Regions(Scrambled(roots), order)
  assert [root for root, _ in regions.walk("test", lambda node, found: False)] == roots


def test_a_costly_epilogue_reading_another_operand_gets_a_kernel_of_its_own():
  """A contraction followed by a costly vector operation computed from another operand of the product's size (a
  GELU's derivative times the gradient of the layer after it, `(g @ w.T) * gelu'(h)`) is stored by its own kernel and
  the rest streams in another (`_costly_epilogue_contractions`); `tanh(x @ w + b)` keeps its epilogue (a bias is no
  such operand), as does `(g @ w.T) * (h > 0)` (no costly operation). Values against float64."""
  from tinyjax.lower.schedule import kernels_of
  rng = np.random.default_rng(3)
  g, w, h = (rng.standard_normal(shape).astype(np.float32) for shape in ((64, 32), (48, 32), (64, 48)))
  b = rng.standard_normal(48).astype(np.float32)

  def gelu_grad(x):
    t = tnp.tanh(0.7978846 * (x + 0.044715 * x ** 3))
    return 0.5 * (1 + t) + 0.5 * x * (1 - t * t) * 0.7978846 * (1 + 0.134145 * x * x)

  def counts(f, *args):
    kernels = kernels_of(tj.jit(f).lower(*args)._compiled.schedule.schedule.kernels)
    return len(kernels), sum(any(node.op is Ops.REDUCE for node in kernel.ast.toposort) for kernel in kernels)
  backward = lambda g, w, h: (g @ w.T) * gelu_grad(h)  # noqa: E731
  assert counts(backward, g, w, h) == (2, 1)
  assert counts(lambda x, w, b: tnp.tanh(x @ w.T + b), g, w, b) == (1, 1)
  assert counts(lambda g, w, h: (g @ w.T) * (h > 0), g, w, h) == (1, 1)
  g64, w64, h64 = (a.astype(np.float64) for a in (g, w, h))
  t = np.tanh(0.7978846 * (h64 + 0.044715 * h64 ** 3))
  want = (g64 @ w64.T) * (0.5 * (1 + t) + 0.5 * h64 * (1 - t * t) * 0.7978846 * (1 + 0.134145 * h64 * h64))
  np.testing.assert_allclose(np.asarray(tj.jit(backward)(g, w, h)), want, rtol=1e-5, atol=1e-5)


def test_a_contraction_read_by_two_kernels_is_computed_once_beside_a_loop():
  """The passes that give a shared contraction a buffer of its own (`_shared_reductions` ...) also run when the last
  kernel root explored is a loop's output (a PROJECT): they were skipped, so `x @ w` was computed in both of its
  readers' kernels, with different roundings; a data-parallel step over MPI (its allreduces are PROJECTs) then got
  relu's derivative (x == max(x, 0)) wrong where the two disagreed."""
  from tinyjax import lax
  from tinyjax.lower.schedule import kernels_of

  def f(c0, x, w):
    carry, _ = lax.scan(lambda c, _: (c * 2.0, None), c0, None, length=3)  # its result is the first output
    pre = x @ w
    return carry, tnp.maximum(pre, 0.0), pre * 3.0
  rng = np.random.default_rng(0)
  args = (np.ones(4, np.float32), rng.standard_normal((64, 32)).astype(np.float32),
          rng.standard_normal((32, 48)).astype(np.float32))
  kernels = kernels_of(tj.jit(f).lower(*args)._compiled.schedule.schedule.kernels)
  assert sum(any(node.op is Ops.REDUCE for node in kernel.ast.toposort) for kernel in kernels) == 1
  carry, relu, tripled = tj.jit(f)(*args)
  pre = args[1].astype(np.float64) @ args[2]
  np.testing.assert_allclose(np.asarray(relu), np.maximum(pre, 0), rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(np.asarray(tripled), pre * 3, rtol=1e-5, atol=1e-5)
  np.testing.assert_array_equal(np.asarray(carry), np.full(4, 8.0))


@pytest.mark.parametrize("reader", ["cumsum", "neighbours"])
def test_reduction_read_shifted_and_in_place_is_computed_once(reader, on_cpu):
  """A reduction read both in place and shifted (a cumsum's first step `x + shifted(x)` of a matmul x; a difference
  of neighbours) is a buffer of its own: fused into its reader, each place recomputed the whole reduction, in a plain
  loop nest (a 256x2048x512 matmul's cumsum: 658 ms, JAX's whole training step 8). Every kernel has at most one
  REDUCE; values and the gradient against numpy in float64."""
  from tinyjax.lower.schedule import kernels_of
  rng = np.random.default_rng(7)
  a, b = rng.standard_normal((64, 128)).astype(np.float32), rng.standard_normal((128, 96)).astype(np.float32)

  def f(u, v):
    x = u @ v
    return tnp.cumsum(x, axis=-1) if reader == "cumsum" else x[:, 1:] - x[:, :-1]
  loss = lambda u, v: (f(u, v) ** 2).sum()
  for fun in (f, tj.grad(loss)):
    for kernel in kernels_of(tj.jit(fun).lower(a, b)._compiled.schedule.schedule.kernels):
      assert sum(node.op is Ops.REDUCE for node in kernel.ast.toposort) <= 1
  x = a.astype(np.float64) @ b.astype(np.float64)
  want = np.cumsum(x, axis=-1) if reader == "cumsum" else x[:, 1:] - x[:, :-1]
  np.testing.assert_allclose(np.asarray(tj.jit(f)(a, b)), want, rtol=1e-4, atol=1e-3)
  # d loss / d u = (d loss / d x) @ v.T, with d loss / d x the transpose of the reader applied to 2 * want
  if reader == "cumsum": dx = np.cumsum((2 * want)[:, ::-1], axis=-1)[:, ::-1]
  else: dx = np.pad(-2 * want, ((0, 0), (0, 1))) + np.pad(2 * want, ((0, 0), (1, 0)))
  expected = dx @ b.T.astype(np.float64)
  assert np.abs(np.asarray(tj.jit(tj.grad(loss))(a, b)) - expected).max() <= 1e-5 * np.abs(expected).max()


def _reduce_work(jitted, *args) -> int:
  """The loop iterations of a program's kernels that reduce (the sums it does)."""
  kernels = schedule_module.kernels_of(jitted.lower(*args)._compiled.schedule.schedule.kernels)
  return sum(k.work for k in kernels if any(n.op is Ops.REDUCE for n in k.ast.toposort))


def test_reduction_of_an_operand_constant_along_a_kept_axis_is_done_once_and_broadcast():
  """`grad` of `f(x).sum()` sends back ones: `ones @ w2.T` is one row repeated, and `gelu(h).T @ ones` one column;
  each is reduced once along the axis its operand is constant on (`schedule.reduce_invariant_axes`), not as a
  contraction. Gradients against float64 numpy and a central difference; composed with vmap and jit."""
  rng = np.random.default_rng(3)
  batch, width, hidden, out = 96, 32, 64, 48
  x = rng.standard_normal((batch, width)).astype(np.float32)
  w1 = (rng.standard_normal((width, hidden)) / 6).astype(np.float32)
  w2 = (rng.standard_normal((hidden, out)) / 8).astype(np.float32)

  def loss(w1, w2, x): return (tnp.tanh(x @ w1) @ w2).sum()
  grads = tj.jit(tj.grad(loss, argnums=(0, 1)))
  g1, g2 = (np.asarray(g, np.float64) for g in grads(w1, w2, x))
  x64, w164, w264 = (a.astype(np.float64) for a in (x, w1, w2))
  h = np.tanh(x64 @ w164)
  dh = np.ones((batch, out)) @ w264.T
  np.testing.assert_allclose(g2, h.T @ np.ones((batch, out)), rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(g1, x64.T @ (dh * (1 - h * h)), rtol=1e-4, atol=1e-4)
  # the products that remain: x @ w1, tanh(h) @ w2 (the loss) and the weight gradient of w1; not ones @ w2.T nor
  # tanh(h).T @ ones, whose work would be batch * hidden * out each
  assert _reduce_work(grads, w1, w2, x) < 3 * batch * width * hidden + batch * hidden * out
  direction = rng.standard_normal(w2.shape)
  eps = 1e-4
  numeric = ((h @ (w264 + eps * direction)).sum() - (h @ (w264 - eps * direction)).sum()) / (2 * eps)
  np.testing.assert_allclose((g2 * direction).sum(), numeric, rtol=1e-4)
  per_example = tj.jit(tj.vmap(tj.grad(lambda w2, row: (tnp.tanh(row @ w1) @ w2).sum()), in_axes=(None, 0)))(w2, x)
  np.testing.assert_allclose(np.asarray(per_example, np.float64).sum(0), g2, rtol=1e-4, atol=1e-4)


def test_reductions_along_broadcast_axes_through_moves_match_numpy():
  """Max and sum reductions of operands broadcast along kept axes, through permutes and reshapes of length-1 axes,
  and a pad (along which an operand is not constant), against numpy."""
  rng = np.random.default_rng(4)
  a = rng.standard_normal((5, 7)).astype(np.float32)
  b = rng.standard_normal((6,)).astype(np.float32)

  def f(a, b):
    wide = tnp.broadcast_to(a[:, None, :], (5, 6, 7)) * 2.0  # constant along axis 1
    tall = tnp.broadcast_to(b[None, :, None], (5, 6, 7))  # constant along axes 0 and 2
    return (wide.max(axis=2), (wide + 1.0).transpose(1, 0, 2).sum(axis=2), tall.sum(axis=(0, 2)),
            tnp.pad(wide, ((0, 0), (1, 1), (0, 0))).sum(axis=2), (wide * tall).reshape(5, 6, 1, 7).sum(axis=3))
  wide64 = np.broadcast_to(a[:, None, :].astype(np.float64), (5, 6, 7)) * 2.0
  tall64 = np.broadcast_to(b[None, :, None].astype(np.float64), (5, 6, 7))
  expected = (wide64.max(axis=2), (wide64 + 1.0).transpose(1, 0, 2).sum(axis=2), tall64.sum(axis=(0, 2)),
              np.pad(wide64, ((0, 0), (1, 1), (0, 0))).sum(axis=2), (wide64 * tall64).reshape(5, 6, 1, 7).sum(axis=3))
  for got, want in zip(tj.jit(f)(a, b), expected):
    np.testing.assert_allclose(np.asarray(got, np.float64), want, rtol=1e-5, atol=1e-5)
  for got, want in zip(f(a, b), expected):
    np.testing.assert_allclose(np.asarray(got, np.float64), want, rtol=1e-5, atol=1e-5)


def test_reduction_over_a_long_elementwise_chain_lowers():
  """A sum over 3000 chained elementwise operations: the invariance walk above the sum (`_invariant_axes`) goes by a
  stack, not Python recursion."""
  x = np.linspace(-1, 1, 24, dtype=np.float32).reshape(4, 6)

  def f(x):
    for _ in range(3000): x = x * 1.0001 + 0.0001
    return x.sum(axis=1)
  expected = x.astype(np.float64)
  for _ in range(3000): expected = expected * 1.0001 + 0.0001
  # (3000 float32 roundings of each element: ~2e-4 relative apart from float64)
  np.testing.assert_allclose(np.asarray(tj.jit(f)(x), np.float64), expected.sum(axis=1), rtol=1e-3, atol=2e-3)
