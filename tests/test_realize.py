"""Realisation end to end (lower -> codegen -> devices) on graphs built with `bind`, below tinyjax.numpy:
laziness, the schedule caches (in memory and across processes), DEBUG output and NOOPT."""
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from tinyjax.array import Array
from tinyjax.lower.realize import counters
from tinyjax.trace.core import bind
from tinyjax.uop import Ops

F32 = np.dtype(np.float32)


def scalar_like(x: Array, value: float) -> Array:
  const = bind(Ops.CONST, arg=float(value), dtype=x.dtype)
  return bind(Ops.EXPAND, bind(Ops.RESHAPE, const, arg=(1,) * x.ndim), arg=x.shape)


def affine(x: Array) -> Array:
  return bind(Ops.ADD, bind(Ops.MUL, x, scalar_like(x, 2.0)), scalar_like(x, 1.0))


def test_nothing_runs_until_a_value_is_needed():
  x = Array.from_numpy(np.arange(6, dtype=np.float32).reshape(2, 3))
  counters.reset()
  y = affine(x)
  assert counters.kernels_launched == 0 and not y.is_realized
  np.testing.assert_array_equal(np.asarray(y), np.arange(6, dtype=np.float32).reshape(2, 3) * 2 + 1)
  assert counters.kernels_launched == 1 and y.is_realized
  np.asarray(y)
  assert counters.kernels_launched == 1  # realised once, kept


def test_eager_loop_lowers_and_compiles_once():
  x = Array.from_numpy(np.ones((5, 7), np.float32))
  affine(x).realize()
  counters.reset()
  for step in range(20):
    x = affine(x).realize()
  assert counters.schedules_lowered == 0 and counters.kernels_launched == 20
  expected = np.ones((5, 7), np.float64)
  for _ in range(20): expected = expected * 2 + 1
  np.testing.assert_allclose(np.asarray(x), expected, rtol=1e-6)


def test_eager_constants_are_inputs_so_a_loop_over_values_compiles_once():
  """An eager program takes its constants as inputs, as JAX's eager operations take their Python scalars: `x * i`
  over 20 values of `i` is one program (it was one program per value, each lowered and compiled: ~12 ms a step).
  Values against numpy in float64, every dtype kind; the signed zero, NaN and infinities are values like others."""
  import tinyjax.numpy as jnp
  x = jnp.asarray(np.linspace(-2, 2, 7, dtype=np.float32))
  float((x * 0.5 + 0.25).sum())
  counters.reset()
  for step in range(20):
    value = step / 3 - 1
    got = float((x * value + step).sum())
    want = (np.linspace(-2, 2, 7).astype(np.float32).astype(np.float64) * np.float32(value) + step).sum()
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)
  assert counters.schedules_lowered == 0 and counters.kernels_launched == 20
  xs = np.asarray(x)
  for value in (-0.0, 0.0, float("inf"), float("-inf"), float("nan")):
    with np.errstate(divide="ignore", invalid="ignore"): want = 1 / (xs * np.float32(0) + np.float32(value))
    np.testing.assert_array_equal(np.asarray(1 / (x * 0 + value)), want)
  # (1 / (x * 0 + c): one more program, for all five values, lowered here or found in the disk cache)
  assert counters.schedules_lowered + counters.schedule_disk_hits == 1
  ints = jnp.arange(6, dtype=jnp.int8).block_until_ready()
  counters.reset()
  for factor in (2, 3, 5):
    want = (np.arange(6, dtype=np.int8) + np.int8(44)) * np.int8(factor)
    np.testing.assert_array_equal(np.asarray((ints + 300) * factor), want)
  assert counters.schedules_lowered + counters.schedule_disk_hits == 1  # (300 wraps to 44 in int8, as JAX's)
  flags = jnp.asarray([True, False, True])
  np.testing.assert_array_equal(np.asarray(flags & True), [True, False, True])
  np.testing.assert_array_equal(np.asarray(jnp.where(flags, x[:3], -1.5)), np.where([1, 0, 1], xs[:3], -1.5))
  halves = jnp.asarray(np.array([1, 2, 3], jnp.bfloat16))
  np.testing.assert_array_equal(np.asarray(halves * 1.5), np.array([1.5, 3, 4.5], jnp.bfloat16))
  z = jnp.asarray(np.array([1 + 2j, 3 - 1j], np.complex64))
  np.testing.assert_allclose(np.asarray(z * (0.5 - 1j)), np.array([1 + 2j, 3 - 1j]) * (0.5 - 1j), rtol=1e-6)


def test_eager_constants_that_make_code_stay_literals(monkeypatch):
  """A constant exponent of pow and a constant divisor (floor_divide's, remainder's) stay literals of an eager program,
  where LLVM makes code of them (x ** 2.0 an x * x, // 3 a multiply and shifts): a program per value there, as JAX's
  integer_pow; values against numpy, negative divisors and operands included, through the one-operation path too."""
  import tinyjax.numpy as jnp
  from tinyjax.lower.realize import program_key
  from tinyjax.trace import core, sharding_types
  for staged in (True, False):  # (once a NamedSharding was placed, primitives run op by op: a bare POW)
    monkeypatch.setattr(sharding_types, "_enabled", [not staged])
    monkeypatch.setattr(core, "_sharding_enabled", sharding_types._enabled)
    _check_literals(jnp, program_key)


def _check_literals(jnp, program_key):
  xs = np.linspace(-3, 3, 13).astype(np.float32)
  x = jnp.asarray(xs)
  assert sum(entry[0] is Ops.CONST and len(entry) == 3 for entry in program_key([(x ** 2.0).uop])[0]) == 1
  assert sum(entry[0] is Ops.CONST and len(entry) == 2 for entry in program_key([(x * 2.0).uop])[0]) == 1
  for exponent in (2.0, 0.5, 3.0, -1.0):
    with np.errstate(invalid="ignore", divide="ignore"): want = np.power(xs.astype(np.float64), exponent)
    np.testing.assert_allclose(np.asarray(x ** exponent), want, rtol=2e-7, equal_nan=True)
    with np.errstate(invalid="ignore", divide="ignore"):
      want = np.power((xs + np.float32(1)).astype(np.float64), exponent)
    np.testing.assert_allclose(np.asarray((x + 1.0) ** exponent), want, rtol=2e-7, equal_nan=True)
  ints = np.arange(-20, 20, dtype=np.int32)
  i = jnp.asarray(ints)
  for divisor in (3, -3, 7, 1, -1, 16):
    np.testing.assert_array_equal(np.asarray(i // divisor), ints // divisor)
    np.testing.assert_array_equal(np.asarray(i % divisor), ints % divisor)
    np.testing.assert_array_equal(np.asarray((i * 3) // divisor), (ints * 3) // divisor)


def test_eager_constants_stay_literals_in_jit_programs():
  """jit keeps a Python scalar as a literal of the program (JAX's jaxprs do): one input, and a new value is a new
  trace; the same function run eagerly reads its constant as an input."""
  import tinyjax as tj
  import tinyjax.numpy as jnp
  x = jnp.ones(4)
  sched = tj.jit(lambda v: v * 3.0 + 1.0).lower(x)._compiled.schedule.schedule
  assert sched.n_inputs == 1
  assert sum(node.op is Ops.CONST for kernel in sched.kernels for node in kernel.ast.toposort) >= 2
  np.testing.assert_array_equal(np.asarray(tj.jit(lambda v: v * 3.0 + 1.0)(x)), np.full(4, 4.0, np.float32))
  np.testing.assert_array_equal(np.asarray(x * 3.0 + 1.0), np.full(4, 4.0, np.float32))


def test_a_constant_s_buffer_is_never_handed_to_a_donation(on_cpu):  # (donation is the CPU's)
  """A program that is a constant alone hands out the constant's buffer as its result (an input passed through);
  donating that array must not write into the buffer the constant keeps for later programs."""
  import tinyjax as tj
  import tinyjax.numpy as jnp
  c = jnp.full((), 7.0).block_until_ready()  # (a constant alone: the program's input, passed through)
  bump = tj.jit(lambda v: v * 2.0, donate_argnums=0)
  np.testing.assert_array_equal(np.asarray(bump(c)), np.float32(14.0))
  assert c.is_deleted()
  np.testing.assert_array_equal(np.asarray(jnp.full((), 7.0)), np.float32(7.0))
  np.testing.assert_array_equal(np.asarray(jnp.zeros(()) + 7.0), np.float32(7.0))
  np.testing.assert_array_equal(np.asarray(jnp.ones(3) * 7.0), np.full(3, 7.0, np.float32))


def test_one_operation_over_buffers_runs_by_its_signature(monkeypatch, on_cpu):  # (the CPU's fast path)
  """Realising one operation over computed arrays, constants and views of them (`float(x[0])`, `x.sum()`,
  `x * x.T`, `a @ b`) runs its program found by the operation's signature (`run_one_op`), not through `realize`'s
  walks; values against numpy in float64, the same leaf read through two views, a pass-through reshape."""
  import tinyjax.numpy as jnp
  from tinyjax.lower import realize as realize_module
  rng = np.random.default_rng(0)
  a_host, b_host = rng.standard_normal((5, 5)).astype(np.float32), rng.standard_normal((5, 3)).astype(np.float32)
  a, b = jnp.asarray(a_host), jnp.asarray(b_host)
  from tinyjax.trace import sharding_types
  # (once a test placed a NamedSharding, primitives run op by op: a @ b is then several operations)
  monkeypatch.setattr(sharding_types, "_enabled", [False])
  from tinyjax.trace import core
  monkeypatch.setattr(core, "_sharding_enabled", sharding_types._enabled)
  calls = []
  original = realize_module.realize
  monkeypatch.setattr(realize_module, "realize", lambda *args: calls.append(args) or original(*args))
  a64, b64 = a_host.astype(np.float64), b_host.astype(np.float64)
  np.testing.assert_allclose(float(a[2, 3]), a64[2, 3])
  np.testing.assert_allclose(float(a.sum()), a64.sum(), rtol=1e-6)
  np.testing.assert_allclose(np.asarray(a * a.T), a64 * a64.T, rtol=1e-6)
  np.testing.assert_allclose(np.asarray(a @ b), a64 @ b64, rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(np.asarray(a * 2.5), a64 * 2.5, rtol=1e-6)
  np.testing.assert_array_equal(np.asarray(a.reshape(25)), a_host.reshape(25))
  np.testing.assert_array_equal(np.asarray(jnp.maximum(b, 0.0)), np.maximum(b_host, 0))
  assert not calls
  m = a * 3.0  # held by the program: a graph built on it before it is computed then reads its buffer
  later = m + 1.0
  np.testing.assert_allclose(np.asarray(m), a64 * 3, rtol=1e-6)
  assert m.is_realized and later.uop.src[0].op is Ops.BUFFER
  np.testing.assert_allclose(np.asarray(later), a64 * 3 + 1, rtol=1e-6)


def test_small_eager_program_runs_by_its_signature(monkeypatch, on_cpu):
  """A small eager graph read back (`float(jnp.sum(jnp.sin(x) * 2.0 + x))`) runs the program its signature numbers
  (`run_signed`: no walk, no `realize`), compiled once for a Python loop of it; values against numpy in float64, the
  same input read twice, an int and a bool result. Where an array of a lazy node below is alive, `realize`'s walk
  computes and keeps it too, unless it only views buffers or constants (`jnp.ones`, `x.T`); a graph built on a node
  computed since reads that node's buffer (its own input deleted); a graph past the signature's sizes, or a literal
  operand (`x ** 3.0`), is walked; the same structure with a shared node or over other buffers is another program."""
  import tinyjax.numpy as jnp
  from tinyjax.lower import realize as realize_module
  from tinyjax.trace import core, sharding_types
  monkeypatch.setattr(sharding_types, "_enabled", [False])
  monkeypatch.setattr(core, "_sharding_enabled", sharding_types._enabled)
  calls = []
  original = realize_module.realize
  monkeypatch.setattr(realize_module, "realize", lambda *args: calls.append(args) or original(*args))
  rng = np.random.default_rng(1)
  host = rng.standard_normal((4, 6)).astype(np.float32)
  x64 = host.astype(np.float64)
  x = jnp.asarray(host)
  before = realize_module.counters.schedules_lowered
  for scale in (2.0, 3.0, -0.5):  # (the scale is an input: one program)
    got = float(jnp.sum(jnp.sin(x) * scale + x))
    np.testing.assert_allclose(got, (np.sin(x64) * scale + x64).sum(), rtol=1e-5)
  assert not calls and realize_module.counters.schedules_lowered - before <= 1
  np.testing.assert_allclose(np.asarray(jnp.exp(x) * x - x.T.T), np.exp(x64) * x64 - x64, rtol=1e-5, atol=1e-6)
  count, nonnegative = int((x > 0).sum() + 1), bool(jnp.all(x * x >= 0))  # (not in an assert: pytest keeps its parts)
  assert count == (x64 > 0).sum() + 1 and nonnegative
  assert not calls
  # an alive array below: computed and kept by realize's walk
  held = jnp.cos(x) * 2.0
  total = float((held + 1.0).sum())
  assert len(calls) == 1 and held.is_realized
  np.testing.assert_allclose(total, (np.cos(x64) * 2 + 1).sum(), rtol=1e-5)
  np.testing.assert_allclose(np.asarray(held), np.cos(x64) * 2, rtol=1e-6)
  # a graph built on a node computed since reads its buffer, not its deleted input
  other = jnp.asarray(host + 1)
  first = other * 3.0
  second = first - 1.0
  later = jnp.tanh(second).sum()
  np.testing.assert_allclose(np.asarray(second), (x64 + 1) * 3 - 1, rtol=1e-6)
  other.delete()
  np.testing.assert_allclose(float(later), np.tanh((x64 + 1) * 3 - 1).sum(), rtol=1e-5)
  # past the sizes (a chain of 40 operations), and a literal operand: walked
  calls.clear()
  chain = x
  for _ in range(40): chain = chain * 1.01 + 0.01
  expected = x64
  for _ in range(40): expected = expected * 1.01 + 0.01
  np.testing.assert_allclose(float(chain.sum()), expected.sum(), rtol=1e-5)
  np.testing.assert_allclose(float((x ** 3.0).sum()), (x64 ** 3).sum(), rtol=1e-5)
  assert len(calls) == 2
  # a shared node, and two buffers where one was read twice: other structures, right values
  y = jnp.asarray(host * 2)
  shared = jnp.sin(x)
  np.testing.assert_allclose(float(jnp.sum(shared * shared)), (np.sin(x64) ** 2).sum(), rtol=1e-5)
  np.testing.assert_allclose(float(jnp.sum(jnp.sin(x) * jnp.sin(y))), (np.sin(x64) * np.sin(2 * x64)).sum(),
                             rtol=1e-5)
  np.testing.assert_allclose(float(jnp.sum(jnp.sin(x) * jnp.sin(x))), (np.sin(x64) ** 2).sum(), rtol=1e-5)
  # constants alone run on the CPU (the default device here) and stay constants: a cached `ones` never becomes a buffer
  calls.clear()
  np.testing.assert_array_equal(np.asarray(jnp.ones(3) + 1), [2.0, 2.0, 2.0])
  assert not calls and jnp.ones(3).uop.op is not Ops.BUFFER and float(jnp.ones(()) * 0.0) == 0.0
  # an alive array below that only views buffers or constants stays lazy: no walk for it (`jnp.exp(jnp.ones(n))`)
  ones, flipped = jnp.ones((4, 6)), x.T
  np.testing.assert_allclose(np.asarray(jnp.exp(ones) + x), np.e + x64, rtol=1e-6)
  np.testing.assert_allclose(np.asarray(jnp.sin(flipped) * 2.0), np.sin(x64.T) * 2, rtol=1e-6)
  assert not calls and ones.uop.op is not Ops.BUFFER and flipped.uop.op is not Ops.BUFFER
  # ... and once such a view has been computed, a graph built on it before reads its buffer (by the walk)
  pending = jnp.cos(flipped) + 1.0
  np.testing.assert_array_equal(np.asarray(flipped), host.T)
  assert flipped.uop.op is Ops.BUFFER
  np.testing.assert_allclose(np.asarray(pending), np.cos(x64.T) + 1, rtol=1e-6)


def test_eager_indexing_at_many_places_is_one_program():
  """Eager `x[i]`, `x[i, j]`, `x[a:b]` and `lax.dynamic_slice` at Python ints read at starts held in an input (JAX's
  eager indexing takes its indices as arguments): a loop over the places is one program per block shape (and one for
  the block at 0, a plain slice), not one per place; values against numpy, negative starts, clamping as JAX's. Under
  jit the same indices are static slices."""
  import tinyjax as tj
  import tinyjax.numpy as jnp
  from tinyjax import lax
  host = np.arange(120, dtype=np.float32).reshape(30, 4)
  x = jnp.asarray(host)
  float(x[1, 2]), float(x[0, 2]), np.asarray(x[3:6]), np.asarray(x[0:3])  # (each kind's programs, once)
  counters.reset()
  for i in range(1, 30):
    assert float(x[i, 2]) == host[i, 2] and float(x[-i, 1]) == host[-i, 1]
    np.testing.assert_array_equal(np.asarray(x[i]), host[i])
  for i in range(1, 10):
    np.testing.assert_array_equal(np.asarray(x[3 * i:3 * i + 3]), host[3 * i:3 * i + 3])
    np.testing.assert_array_equal(np.asarray(lax.dynamic_slice(x, (3 * i, 1), (3, 2))), host[3 * i:3 * i + 3, 1:3])
  assert counters.schedules_lowered + counters.schedule_disk_hits <= 3  # (x[i] and the dynamic slice: new shapes)
  counters.reset()
  for i in range(-32, 32):  # indexed updates too; out of range: dropped, as JAX's
    want = host.copy()
    if -30 <= i < 30: want[i, 1] = i
    np.testing.assert_array_equal(np.asarray(x.at[i, 1].set(float(i))), want)
  assert counters.schedules_lowered + counters.schedule_disk_hits == 1
  np.testing.assert_array_equal(np.asarray(lax.dynamic_slice(x, (28, 3), (5, 2))), host[25:30, 2:4])  # (clamped)
  np.testing.assert_array_equal(np.asarray(x[100]), host[29])  # (JAX clamps an out-of-range read)
  jaxpr = str(tj.make_jaxpr(lambda v: v[3, 1:3])(x))
  assert "slice" in jaxpr and "gather" not in jaxpr
  np.testing.assert_array_equal(np.asarray(tj.jit(lambda v: v[7])(x)), host[7])
  want = np.zeros((30, 4), np.float32)
  want[5, 1] = 2.0
  np.testing.assert_array_equal(np.asarray(tj.grad(lambda v: v[5, 1] * 2.0)(x)), want)


def test_values_the_program_holds_are_computed_once():
  """State updated eagerly across steps (an optimizer's moments) is kept when a value computed from it is realised,
  so each step computes one step's work: before, a momentum loop recomputed the moments' whole history each step
  (a graph growing with the step count: 400 steps took 27 s, 400 schedules)."""
  import tinyjax as tj
  import tinyjax.numpy as jnp
  params, momentum = jnp.zeros(3), jnp.zeros(3)
  gradient = tj.jit(lambda p: jnp.cos(p) + 1.0)
  for _ in range(3):  # warm up: the step's schedules are lowered once
    momentum = 0.9 * momentum + gradient(params)
    params = params - 0.1 * momentum
  counters.reset()
  want_params, want_momentum = np.asarray(params, np.float64), np.asarray(momentum, np.float64)
  for _ in range(50):
    momentum = 0.9 * momentum + gradient(params)  # realises params, and with it the momentum it was computed from
    params = params - 0.1 * momentum
    assert len(params.uop.toposort) < 30  # the graph is one step's, not the history's
    want_momentum = 0.9 * want_momentum + np.cos(want_params) + 1.0
    want_params = want_params - 0.1 * want_momentum
  assert counters.schedules_lowered == 0
  np.testing.assert_allclose(np.asarray(params), want_params, rtol=1e-5)
  x = Array.from_numpy(np.ones((4, 3), np.float32))
  held_view, held_sum = bind(Ops.PERMUTE, x, arg=(1, 0)), affine(x)
  total = bind(Ops.ADD, affine(held_view), scalar_like(held_view, 0.0))
  total.realize()
  assert not held_view.is_realized  # a view of a buffer stays lazy: recomputing it costs nothing
  assert not held_sum.is_realized  # not on the way to `total`


def test_reduction_fuses_with_its_elementwise_producer():
  data = np.random.default_rng(0).standard_normal((7, 13)).astype(np.float32)
  x = Array.from_numpy(data)
  total = bind(Ops.RESHAPE, bind(Ops.REDUCE_AXIS, affine(x), arg=(Ops.ADD, (1,))), arg=(7,))
  counters.reset()
  np.testing.assert_allclose(np.asarray(total), (data.astype(np.float64) * 2 + 1).sum(1), rtol=1e-5)
  assert counters.kernels_launched == 1


def _run(code: str, cache_dir: str, **env) -> str:
  """Run `code` in a fresh process on the CPU (these tests check the CPU runtime's caches and printing, whatever the
  default device of the suite's own process)."""
  result = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, timeout=120,
                          env=os.environ | {"TINYJAX_CACHE_DIR": cache_dir, "TINYJAX_PLATFORMS": "cpu"} | env)
  assert result.returncode == 0, result.stderr
  return result.stdout


PROGRAM = """
  import time; start = time.perf_counter()
  import numpy as np
  from tinyjax.array import Array
  from tinyjax.trace.core import bind
  from tinyjax.uop import Ops
  from tinyjax.lower.realize import counters
  from tinyjax.devices import cache_stats
  imported = time.perf_counter()
  x = Array.from_numpy(np.arange(12, dtype=np.float32).reshape(3, 4))
  two = bind(Ops.EXPAND, bind(Ops.RESHAPE, bind(Ops.CONST, arg=2.0, dtype=x.dtype), arg=(1, 1)), arg=(3, 4))
  y = bind(Ops.RESHAPE, bind(Ops.REDUCE_AXIS, bind(Ops.MUL, x, two), arg=(Ops.ADD, (1,))), arg=(3,))
  values = np.asarray(y).tolist()
  done = time.perf_counter()
  print(values, counters.schedules_lowered, cache_stats()["misses"], round((done - imported) * 1e3, 1))
"""


def test_second_process_neither_lowers_nor_compiles(tmp_path):
  cold = _run(PROGRAM, str(tmp_path)).split()
  warm = _run(PROGRAM, str(tmp_path)).split()
  assert cold[:3] == ["[12.0,", "44.0,", "76.0]"] and warm[:3] == cold[:3]
  assert cold[3] == "1" and int(cold[4]) >= 1   # lowered and compiled
  assert warm[3] == "0" and warm[4] == "0"      # neither lowered nor compiled
  print("warm first result after import:", warm[5], "ms")


@pytest.mark.parametrize("level, expected", [(1, "*** CPU"), (2, "*** schedule"), (3, "REDUCE"), (4, "define void")])
def test_debug_levels_print_what_runs(tmp_path, level, expected):
  out = _run(PROGRAM, str(tmp_path), DEBUG=str(level))
  assert expected in out
  if level == 1: assert "*** schedule" not in out


def test_noopt_gives_the_same_numbers(tmp_path):
  assert _run(PROGRAM, str(tmp_path), NOOPT="1").split()[:3] == ["[12.0,", "44.0,", "76.0]"]


def test_import_leaves_llvm_and_the_lowering_for_the_first_compile(tmp_path):
  """`import tinyjax` imports neither llvmlite (~35 ms) nor the lowering and code generation stack, nor the namespaces
  a program may never use (~0.1 s in all; `tinyjax.nn` and `tinyjax.random` too, which `import jax` loads: ~10 ms);
  the first kernel imports what it needs and computes, and the namespaces load when first named, by attribute or by
  `from ... import`."""
  import os
  import subprocess
  import sys
  lazy = ["llvmlite", "tinyjax.lower.realize", "tinyjax.lower.schedule", "tinyjax.codegen.llvm", "tinyjax.devices.cpu",
          "tinyjax.profiler", "tinyjax.nn.layers", "tinyjax.nn.optim", "tinyjax.nn.datasets", "tinyjax.scipy",
          "tinyjax.numpy.fft", "tinyjax.numpy.linalg", "tinyjax.lax.linalg", "tinyjax.nn", "tinyjax.random"]
  script = (f"import sys, tinyjax, tinyjax.numpy as jnp\nlazy = {lazy!r}\n"
            "print(*[name in sys.modules for name in lazy])\n"
            "print(float((jnp.arange(4.0) * 2).sum()), *[name in sys.modules for name in lazy[:5]])\n"
            "from tinyjax.nn import Linear\n"
            "print(float(tinyjax.nn.relu(-1.0)), float(jnp.fft.fft(jnp.ones(4))[0].real),\n"
            "      float(jnp.linalg.norm(jnp.ones(4))), tinyjax.random.PRNGKey(0).shape, Linear.__name__,\n"
            "      tinyjax.nn.optim.adam.__name__, tinyjax.lax.linalg.cholesky.__name__,\n"
            "      tinyjax.scipy.special.expit.__name__, 'misses' in tinyjax.compile_cache_stats(),\n"
            "      callable(tinyjax.profile))\n")
  out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120, check=True,
                       env={**os.environ, "TINYJAX_CACHE_DIR": str(tmp_path), "TINYJAX_PLATFORMS": "cpu"}).stdout
  assert out.split("\n")[:3] == [" ".join(["False"] * len(lazy)), "12.0 True True True True True",
                                  "0.0 4.0 2.0 (2,) Linear adam cholesky expit True True"]
  import tinyjax
  for namespace in (tinyjax, tinyjax.numpy, tinyjax.lax, tinyjax.nn):
    with pytest.raises(AttributeError, match="has no attribute 'not_a_name'"): namespace.not_a_name  # noqa: B018


def test_eager_primitive_calls_are_one_node_expanded_where_lowered(request):
  """An eager call of one of tinyjax's primitives is one PRIMITIVE node (its Ops appear only where the program is
  lowered), so a program seen before is found in the schedule cache from a graph of a few nodes; values as numpy's,
  for single- and multiple-result primitives, complex ones and ones whose impl embeds host data (run op by op).
  (Once a NamedSharding exists, eager calls run op by op, so that shardings propagate: reset here, as a fresh
  process without shardings.)"""
  import tinyjax as tj
  from tinyjax.trace import sharding_types
  saved = sharding_types._enabled[0]
  sharding_types._enabled[0] = False
  request.addfinalizer(lambda: sharding_types._enabled.__setitem__(0, saved))
  import tinyjax.numpy as tnp
  from tinyjax import lax
  rng = np.random.default_rng(11)
  host = rng.standard_normal((64, 64)).astype(np.float32)
  y = tnp.tanh(tnp.asarray(host) @ tnp.asarray(host))
  assert y.uop.op is Ops.PRIMITIVE and len(y.uop.toposort) < 10  # (tanh's decomposition is ~40 Ops)
  np.testing.assert_allclose(np.asarray(y), np.tanh(host.astype(np.float64) @ host), rtol=2e-5, atol=2e-6)
  lowered, from_disk = counters.schedules_lowered, counters.schedule_disk_hits
  other = rng.standard_normal((64, 64)).astype(np.float32)
  np.testing.assert_allclose(np.asarray(tnp.tanh(tnp.asarray(other) @ tnp.asarray(other))),
                             np.tanh(other.astype(np.float64) @ other), rtol=2e-5, atol=2e-6)
  assert (counters.schedules_lowered, counters.schedule_disk_hits) == (lowered, from_disk)  # (found in memory)
  factors, pivots, permutation = lax.linalg.lu(tnp.asarray(host))
  assert factors.uop.op is Ops.PROJECT and factors.uop.src[0].op is Ops.PRIMITIVE
  lower, upper = np.tril(np.asarray(factors), -1) + np.eye(64), np.triu(np.asarray(factors))
  np.testing.assert_allclose(lower @ upper, host[np.asarray(permutation)], rtol=1e-4, atol=1e-4)
  z = (rng.standard_normal(8) + 1j * rng.standard_normal(8)).astype(np.complex64)
  np.testing.assert_allclose(np.asarray(tnp.exp(tnp.asarray(z))), np.exp(z.astype(np.complex128)), rtol=2e-6)
  rounded = lax.reduce_precision(tnp.asarray(np.array([3.14159265], np.float32)), 8, 7)  # (host constants inside)
  assert (rounded.uop.op is not Ops.PRIMITIVE or rounded.uop.arg.prim.name != "reduce_precision") and \
      float(rounded[0]) == 3.140625
  # traced values are never staged so: jit and grad see the decompositions, as before
  np.testing.assert_allclose(float(tj.grad(lambda v: tnp.tanh(v).sum())(0.5)), 1 - np.tanh(0.5) ** 2, rtol=1e-6)


def test_eager_primitive_calls_tell_signed_zeros_apart_and_find_nan_params():
  """A staged call's float parameters key its program by their bits: fill_value=-0.0 is not the program of 0.0 (it
  was reused, giving +0.0), and a NaN fill_value finds its program again (NaN != NaN made every call a new one)."""
  import tinyjax.numpy as tnp
  x = tnp.arange(3.0)
  def filled(value): return np.asarray(x.at[tnp.array([5])].get(mode="fill", fill_value=value))
  assert not np.signbit(filled(0.0))[0] and np.signbit(filled(-0.0))[0] and not np.signbit(filled(0.0))[0]
  assert np.isnan(filled(float("nan")))[0]
  lowered, from_disk = counters.schedules_lowered, counters.schedule_disk_hits
  assert np.isnan(filled(float("nan")))[0] and np.isnan(filled(float("nan")))[0]
  assert (counters.schedules_lowered, counters.schedule_disk_hits) == (lowered, from_disk)  # (found in memory)


def test_eager_primitive_calls_expand_under_the_x64_setting_they_were_made_in(request):
  """A staged call's impl may read jax_enable_x64 (default dtypes): it is expanded under the setting of the call, not
  of the realisation, so the result's dtype and values are the call's."""
  import tinyjax as tj
  import tinyjax.numpy as tnp
  from tinyjax import dtypes
  from tinyjax.trace import sharding_types
  from tinyjax.trace.core import Primitive
  saved = sharding_types._enabled[0]
  sharding_types._enabled[0] = False
  request.addfinalizer(lambda: sharding_types._enabled.__setitem__(0, saved))
  probe = Primitive("probe", lambda x: x.astype(dtypes.default_int_dtype()) * 3)
  with tj.config.override("jax_enable_x64", True):
    wide = probe.bind(tnp.asarray(np.array([1.0, 2.0], np.float32)))
    assert wide.uop.op is Ops.PRIMITIVE and wide.dtype == np.int64
  narrow = probe.bind(tnp.asarray(np.array([1.0, 2.0], np.float32)))
  assert narrow.dtype == np.int32
  result = np.asarray(wide)  # (realised with x64 off)
  assert result.dtype == np.int64 and result.tolist() == [3, 6]
  with tj.config.override("jax_enable_x64", True):
    result = np.asarray(narrow)
  assert result.dtype == np.int32 and result.tolist() == [3, 6]


def test_big_blocks_are_line_aligned_and_their_views_keep_them(on_cpu):
  """A block larger than SMALL_BLOCK_BYTES starts at a 64-byte line (devices/buffer.py BLOCK_ALIGNMENT): a computed
  array's memory too. A numpy view handed out keeps its block out of the pool: the next arrays of that size get
  other memory, and the view still reads its values (a block taken from an aligned slice of a bigger allocation went
  back to the pool while its view was alive)."""
  import tinyjax.numpy as tnp
  from tinyjax.devices.buffer import BLOCK_ALIGNMENT, SMALL_BLOCK_BYTES, take_block
  for nbytes in (SMALL_BLOCK_BYTES + 1, 1 << 20, (3 << 20) + 4):
    raw, address = take_block(nbytes)
    assert raw.nbytes == nbytes and address % BLOCK_ALIGNMENT == 0 and raw.ctypes.data == address
  x = tnp.arange(1 << 16, dtype=tnp.float32)
  first = x * 2.0
  first.block_until_ready()
  assert first.uop.arg.address % BLOCK_ALIGNMENT == 0
  view = np.asarray(first)
  del first
  for scale in (3.0, 4.0, 5.0):  # (same size: from the pool, were the block given back)
    np.testing.assert_array_equal(np.asarray(x * scale), np.arange(1 << 16, dtype=np.float32) * scale)
  np.testing.assert_array_equal(view, np.arange(1 << 16, dtype=np.float32) * 2.0)


def test_sums_read_through_a_pad_get_kernels_of_their_own():
  """The gradient of scalars indexed from a parameter vector pads each one's sum into place: each long sum is a
  kernel of its own (vectorised, split across the cores), not a gated loop in the kernel of the padded vector
  (lower/schedule.py PADDED_REDUCE_MIN: a Gaussian-process fit's three gradients took 3.6 ms in one such kernel)."""
  import tinyjax as tj
  import tinyjax.numpy as jnp
  from tests.gradcheck import numeric_grad
  rng = np.random.default_rng(0)
  points = rng.uniform(-2, 2, (64, 16))
  weights = rng.standard_normal((16, 16))

  def loss(p, d2, w):
    k = jnp.exp(p[0]) * jnp.exp(-0.5 * d2 / jnp.exp(p[1]) ** 2) + jnp.exp(p[2])
    return jnp.sum(jnp.sum(k, axis=0) * w)
  d2 = (points[:, :, None] - points[:, None, :]) ** 2
  p = np.array([0.1, 0.2, -1.0])
  gradient = tj.jit(tj.grad(loss))
  args = [jnp.asarray(v.astype(np.float32)) for v in (p, d2, weights)]
  kernels = [block.split()[0] for block in gradient.lower(*args).as_text().split("# kernel ")[1:]]
  assert not any(name.startswith("r_3_") for name in kernels), kernels
  assert sum(name.startswith("r_1_") for name in kernels) == 3
  with tj.config.override("jax_enable_x64", True):
    want = numeric_grad(lambda v: float(loss(jnp.asarray(v), jnp.asarray(d2), jnp.asarray(weights))), p, 1e-6)
  np.testing.assert_allclose(np.asarray(gradient(*args)), want, rtol=2e-5)
