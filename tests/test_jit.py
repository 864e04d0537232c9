"""jit and make_jaxpr: pytrees in and out, static arguments, retracing only on new signatures, closures over arrays,
concretization and escaped-tracer errors, nested jit, and the kernels `lower().as_text()` prints."""
import numpy as np
import pytest

import tinyjax as tj
import tinyjax.numpy as tnp
from tinyjax.lower.realize import counters
from tinyjax.trace.core import ConcretizationTypeError, UnexpectedTracerError


def test_jit_matches_numpy_and_fuses():
  @tj.jit
  def f(x, y):
    return (x * 2 + y).sum(axis=1)
  x = np.random.default_rng(0).standard_normal((7, 13)).astype(np.float32)
  y = np.random.default_rng(1).standard_normal((7, 13)).astype(np.float32)
  np.testing.assert_allclose(np.asarray(f(x, y)), (x.astype(np.float64) * 2 + y).sum(1), rtol=1e-5)
  counters.reset()
  f(tnp.asarray(x), tnp.asarray(y))
  assert counters.kernels_launched == 1


def test_pytrees_in_and_out():
  @tj.jit
  def f(params, x):
    hidden = tnp.tanh(x @ params["w"] + params["b"])
    return {"out": hidden, "norm": (hidden * hidden).sum()}, [params["b"] * 0 + 1]
  rng = np.random.default_rng(0)
  params = {"w": rng.standard_normal((4, 3)).astype(np.float32), "b": rng.standard_normal(3).astype(np.float32)}
  x = rng.standard_normal((5, 4)).astype(np.float32)
  result, ones = f(params, x)
  expected = np.tanh(x.astype(np.float64) @ params["w"] + params["b"])
  np.testing.assert_allclose(np.asarray(result["out"]), expected, rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(float(result["norm"]), (expected ** 2).sum(), rtol=1e-5)
  np.testing.assert_array_equal(np.asarray(ones[0]), np.ones(3, np.float32))


def test_retraces_only_on_new_signature():
  traces = []

  @tj.jit
  def f(x):
    traces.append(x.shape)
    return x + 1
  f(np.ones(3, np.float32))
  f(np.zeros(3, np.float32))
  f(tnp.ones(3))
  assert len(traces) == 1
  f(np.ones(4, np.float32))            # new shape
  f(np.ones(3, np.int32))              # new dtype
  f(1.0)                               # weak scalar
  f(np.float32(1.0))                   # strong scalar: another signature
  assert len(traces) == 5
  f(2.0)
  assert len(traces) == 5


def test_static_argnums_and_argnames_retrace_per_value():
  traces = []

  def power(x, n, *, scale):
    traces.append((n, scale))
    out = x
    for _ in range(n - 1): out = out * x
    return out * scale
  f = tj.jit(power, static_argnums=1, static_argnames="scale")
  x = np.array([1.5, 2.0], np.float32)
  np.testing.assert_allclose(np.asarray(f(x, 3, scale=2.0)), x.astype(np.float64) ** 3 * 2, rtol=1e-6)
  f(x, 3, scale=2.0)
  f(x, 2, scale=2.0)
  assert traces == [(3, 2.0), (2, 2.0)]
  with pytest.raises(ValueError, match="hashable"):
    tj.jit(lambda x, shape: x, static_argnums=1)(x, [1, 2])


def test_closure_over_array_is_an_input_not_a_retrace():
  traces = []
  table = tnp.asarray(np.arange(4, dtype=np.float32))

  @tj.jit
  def f(x):
    traces.append(1)
    return x * table
  np.testing.assert_array_equal(np.asarray(f(np.ones(4, np.float32))), np.arange(4))
  np.testing.assert_array_equal(np.asarray(f(np.full(4, 2, np.float32))), np.arange(4) * 2)
  assert len(traces) == 1


def test_concretization_error_names_the_argument_and_suggests_static():
  @tj.jit
  def f(x, flag):
    return x + 1 if flag > 0 else x - 1
  with pytest.raises(ConcretizationTypeError, match="argument 'flag'.*static_argnums") as info:
    f(np.ones(2, np.float32), 1.0)
  assert isinstance(info.value, TypeError)
  g = tj.jit(lambda x: float(x.sum()))
  with pytest.raises(ConcretizationTypeError): g(np.ones(2, np.float32))
  # marked static, the same Python control flow works
  f_static = tj.jit(f.__wrapped__, static_argnums=1)
  np.testing.assert_array_equal(np.asarray(f_static(np.ones(2, np.float32), 1.0)), [2.0, 2.0])


def test_escaped_tracer_raises_when_used():
  leaked = []

  @tj.jit
  def f(x):
    leaked.append(x * 2)
    return x
  f(np.ones(2, np.float32))
  with pytest.raises(UnexpectedTracerError):
    leaked[0] + 1
  with pytest.raises(UnexpectedTracerError):
    np.asarray(leaked[0])


def test_nested_jit_and_jit_of_method():
  inner = tj.jit(lambda x: x * 3)

  @tj.jit
  def outer(x):
    return inner(x) + inner(x + 1)
  x = np.arange(5, dtype=np.float32)
  np.testing.assert_array_equal(np.asarray(outer(x)), x * 3 + (x + 1) * 3)

  class Model:
    def __init__(self, scale): self.scale = scale

    @tj.jit(static_argnums=0)
    def apply(self, x): return x * self.scale
  np.testing.assert_array_equal(np.asarray(Model(2.0).apply(x)), x * 2)
  np.testing.assert_array_equal(np.asarray(Model(3.0).apply(x)), x * 3)


def test_make_jaxpr_prints_inputs_equations_outputs():
  jaxpr = tj.make_jaxpr(lambda x, y: tnp.exp(x * y).sum())(np.ones((2, 3), np.float32), np.ones((2, 3), np.float32))
  text = str(jaxpr)
  assert text.startswith("{ lambda ; a:f32[2,3] b:f32[2,3]. let")
  assert "mul a b" in text and "reduce_sum[axes=(0, 1) keepdims=False]" in text and text.rstrip().endswith("}")


def test_make_jaxpr_prints_the_primitives_by_name_as_jax():
  """The program holds the primitives' decompositions into Ops; the printed jaxpr names the primitives the function
  bound, with their parameters, and shows Python scalars as literals, as JAX's jaxprs read."""
  x, w = np.ones((2, 3), np.float32), np.ones((3, 4), np.float32)
  text = str(tj.make_jaxpr(lambda x, w: tnp.tanh(x @ w).sum() + tnp.exp(x).mean())(x, w))
  assert "c:f32[2,4] = dot_general[dimension_numbers=(((1,), (0,)), ((), ())) preferred_element_type=float32] a b" \
      in text
  assert "d:f32[2,4] = tanh c" in text and "= exp a" in text and "div" in text and "6.0:f32[]" in text
  assert "exp2" not in text and "bitcast" not in text  # (tanh's and exp's decompositions are not shown)
  text = str(tj.make_jaxpr(tj.grad(lambda v: tnp.sin(v).sum()))(np.ones(3, np.float32)))
  assert "b:f32[3] = cos a" in text and "mul 1.0:f32[] b" in text
  text = str(tj.make_jaxpr(tj.vmap(lambda u, v: tnp.sin(u) + v * 2))(x, x))
  assert text.splitlines()[1:4] == ["    c:f32[2,3] = sin a", "    d:f32[2,3] = mul b 2.0:f32[]",
                                    "    e:f32[2,3] = add c d"]
  # numpy indexing by integer arrays is one gather
  text = str(tj.make_jaxpr(lambda v, i: v[i])(x, np.array([1, 0], np.int32)))
  want = "    c:f32[2,3] = gather[advanced_axes=(0,) kept_axes=(1,) mode=None fill_value=None] a b"
  assert text.splitlines()[1] == want
  # an indexed update is one scatter named by its mode, its index printed as it reads (a new axis's bool kept apart
  # from the integer 1: each is its own program)
  text = str(tj.make_jaxpr(lambda v: v.at[1].set(2.0))(x))
  assert text.splitlines()[1:3] == ["    b:f32[2,3] = scatter[index=[1, :] out_of_bounds=None unique_indices=False] a "
                                    "2.0:f32[]", "  in (b,) }"]
  text = str(tj.make_jaxpr(lambda v, i: v.at[None, i, ::-2].add(v[0, :2]))(x, np.array([1, 0], np.int32)))
  assert "scatter-add[index=[None, array, ::-2] out_of_bounds=None unique_indices=False] a " in text
  for update in ("multiply", "min", "max"):
    text = str(tj.make_jaxpr(lambda v: getattr(v.at[0, 1:], update)(5.0))(x))
    assert f"scatter-{update.replace('multiply', 'mul')}[index=[0, 1:]" in text
  y, want = np.arange(6.0, dtype=np.float32).reshape(2, 3), np.array([[0, 1, 2], [-1, -1, -1]], np.float32)
  np.testing.assert_array_equal(np.asarray(tnp.asarray(y).at[True].set(-1.0)), np.full((2, 3), -1.0))
  np.testing.assert_array_equal(np.asarray(tnp.asarray(y).at[1].set(-1.0)), want)
  np.testing.assert_array_equal(np.asarray(tnp.asarray(y).at[True, 0, 1].set(-1.0)), [[0, -1, 2], [3, 4, 5]])
  # the remaining Ops under JAX's names and parameters; several outputs listed as JAX lists them
  text = str(tj.make_jaxpr(lambda v: (tnp.pad(v, 1)[::-1].T.astype(tnp.int32), v[1:, :2].reshape(-1)))(x))
  assert text.splitlines()[1:] == [
    "    b:f32[4,5] = pad[padding_config=((1, 1, 0), (1, 1, 0))] a", "    c:f32[4,5] = rev[dimensions=(0,)] b",
    "    d:f32[5,4] = transpose[permutation=(1, 0)] c", "    e:i32[5,4] = convert_element_type[new_dtype=int32] d",
    "    f:f32[1,2] = slice[limit_indices=(2, 2) start_indices=(1, 0) strides=None] a",
    "    g:f32[2] = reshape[dimensions=None new_sizes=(2,)] f", "  in (e, g) }"]
  # subtraction as JAX's `sub` (computed as x + -y)
  text = str(tj.make_jaxpr(lambda v, w: (v - w, v - 1.0, 2.0 - v))(x, x))
  assert [line.split(" = ")[1] for line in text.splitlines()[1:4]] == ["sub a b", "sub a 1.0:f32[]", "sub 2.0:f32[] a"]
  # comparisons as JAX's single equations (x >= 0 is computed from lt, eq and or)
  text = str(tj.make_jaxpr(lambda v: (v >= 0, v > 1, v <= 2, v == 3, v < 4, v != 5))(x))
  assert [line.split(" = ")[1] for line in text.splitlines()[1:7]] == [
    "ge a 0.0:f32[]", "gt a 1.0:f32[]", "le a 2.0:f32[]", "eq a 3.0:f32[]", "lt a 4.0:f32[]", "ne a 5.0:f32[]"]
  # a nested jit is one equation with its own program (JAX's); one closing over traced values prints inline
  inner = tj.jit(lambda u, v: tnp.tanh(u) * v)
  text = str(tj.make_jaxpr(lambda v: inner(v, 2.0 * v) + 1)(x))
  assert "    c:f32[2,3] = jit[name=<lambda> jaxpr={ lambda ; a:f32[2,3] b:f32[2,3]. let" in text
  assert "          c:f32[2,3] = tanh a" in text and "        in (d,) }] a b" in text and "add c 1.0:f32[]" in text
  def closing(v):
    return tj.jit(lambda u: u * v)(v + 1)
  assert "jit[" not in str(tj.make_jaxpr(closing)(x)) and "mul" in str(tj.make_jaxpr(closing)(x))
  np.testing.assert_allclose(np.asarray(tj.jit(lambda v: inner(v, 2.0 * v) + 1)(x)), np.tanh(x) * 2 * x + 1, rtol=1e-6)
  # a multiple-result primitive names its results together; one the program drops is `_`
  text = str(tj.make_jaxpr(lambda m: tj.lax.linalg.lu(m)[0])(np.eye(3, dtype=np.float32)))
  assert "b:f32[3,3] _:i32[3] _:i32[3] = lu a" in text
  # thousands of equations print without recursion
  def chain(v):
    for _ in range(3000): v = tnp.sin(v)
    return v
  assert str(tj.make_jaxpr(chain)(1.0)).count(" = sin ") == 3000


def test_lower_as_text_prints_kernels(on_cpu):
  text = tj.jit(lambda x: (x * 2 + 1).sum(axis=1)).lower(np.ones((4, 5), np.float32)).as_text()
  assert "# 1 kernels" in text and "define void" in text


def test_outputs_keep_weak_types_and_python_scalars_become_arrays():
  """Python scalars returned by a traced function are literals of its jaxpr, as JAX's (not arrays it closes over),
  and arrays of their values, weakly typed but a bool (JAX's bool has no weak type, as an argument too)."""
  f = tj.jit(lambda x: (x * 2, 3))
  doubled, three = f(1.0)
  assert doubled.weak_type and doubled.dtype == np.float32
  assert int(three) == 3 and isinstance(three, tj.Array)
  assert str(tj.make_jaxpr(lambda: 1)()) == "{ lambda ; . let  in (1:i32[],) }"
  assert str(tj.make_jaxpr(lambda x: (x, 2.0))(1.0)) == "{ lambda ; a:f32[]. let  in (a, 2.0:f32[]) }"
  outs = tj.jit(lambda x: (x, 2.5, True, 1j, -7))(1.0)
  assert [(o.dtype, o.weak_type) for o in outs] == [(np.float32, True), (np.float32, True), (np.bool_, False),
                                                   (np.complex64, True), (np.int32, True)]
  assert [o.item() for o in outs] == [1.0, 2.5, True, 1j, -7]
  flag = tj.jit(lambda p: p)(True)
  assert flag.dtype == np.bool_ and not flag.weak_type and str(tj.make_jaxpr(lambda p: p)(True)).startswith(
    "{ lambda ; a:bool[].")
  np.testing.assert_array_equal(np.asarray(tj.jit(tj.vmap(lambda x: (x, 2)))(tnp.arange(3.0))[1]), [2, 2, 2])
  with pytest.raises(OverflowError):
    tj.jit(lambda: 2 ** 40)()


def test_unused_argument_and_input_returned_as_is():
  f = tj.jit(lambda x, unused: x)
  np.testing.assert_array_equal(np.asarray(f(np.arange(3, dtype=np.float32), np.ones(5, np.float32))), [0, 1, 2])
  g = tj.jit(lambda unused, x: x + 1)
  np.testing.assert_array_equal(np.asarray(g(np.ones(5, np.float32), np.arange(3, dtype=np.float32))), [1, 2, 3])


def test_bad_argument_type_is_a_type_error():
  with pytest.raises(TypeError, match="not a valid tinyjax type"):
    tj.jit(lambda x: x)("a string")


def test_cache_hit_takes_the_fast_path():
  """A call with a cached signature flattens, looks up and runs: no retrace, no lowering, one runtime call."""
  traces = []

  @tj.jit
  def f(x, pair):
    traces.append(1)
    return x + 1, pair[0] * pair[1]

  x = tnp.asarray(np.arange(8, dtype=np.float32))
  pair = (tnp.asarray(np.float32(2)), tnp.asarray(np.ones(8, np.float32)))
  f(x, pair)
  assert len(traces) == 1 and f._fast_calls == 0
  counters.reset()
  for step in range(5):
    out, product = f(x, pair)
    np.testing.assert_array_equal(np.asarray(out), np.arange(8) + 1)
    np.testing.assert_array_equal(np.asarray(product), np.full(8, 2, np.float32))
  assert len(traces) == 1 and f._fast_calls == 5 and counters.schedules_lowered == 0
  assert counters.kernels_launched == 5 * 1  # x + 1 and the product: one elementwise kernel with two outputs
  np.testing.assert_array_equal(np.asarray(f(x * 3, pair)[0]), np.arange(8) * 3 + 1)  # a lazy argument is realised
  assert len(traces) == 1 and f._fast_calls == 6
  f(x.astype(np.int32), pair)  # a new signature retraces (and is then fast too)
  f(x.astype(np.int32), pair)
  assert len(traces) == 2 and f._fast_calls == 7
  f(np.arange(8, dtype=np.float32), pair)  # a numpy leaf: the general path, same signature, no retrace
  assert len(traces) == 2 and f._fast_calls == 7


def test_python_scalar_arguments_take_the_fast_path():
  """`step(i, state)` with a Python int, float or bool argument (weakly typed, as JAX's) runs through the hot path:
  one trace for every value, the values against numpy, a donated state beside it, an int out of int32's range an
  OverflowError, and a new scalar type (float after int) a new program."""
  traces = []

  def step(i, state, scale, flag):
    traces.append(1)
    return {"w": state["w"] * scale + i, "n": state["n"] + 1}, (i * 2, flag)

  f = tj.jit(step, donate_argnums=1)
  w = np.arange(6, dtype=np.float32)
  state = {"w": tnp.asarray(w), "n": tnp.asarray(np.int32(0))}
  expected = w.astype(np.float64)
  for i in range(5):
    state, (twice, flag) = f(i, state, 0.5, i % 2 == 0)
    expected = expected * 0.5 + i
    assert int(twice) == 2 * i and bool(flag) == (i % 2 == 0) and twice.weak_type and twice.dtype == np.int32
  np.testing.assert_allclose(np.asarray(state["w"]), expected, rtol=1e-6)
  assert int(state["n"]) == 5 and len(traces) == 1 and f._fast_calls == 4
  with pytest.raises(OverflowError):
    f(2 ** 40, state, 0.5, True)
  f(1.5, state, 0.5, True)  # a float where an int was: another signature
  assert len(traces) == 2


def test_static_arguments_take_the_fast_path():
  """Calls with static positional arguments (`jit(f, static_argnums=...)`, as tinyjax.random's samplers are) run
  through the hot path, keyed by the static values: one trace per value, the right program for each, a negative
  index, a static argument passed by name (the general path), and an unhashable static value's ValueError."""
  traces = []

  def f(x, n, scale):
    traces.append(n)
    return x * n + scale

  g = tj.jit(f, static_argnums=(1, -1))
  x = tnp.asarray(np.arange(4, dtype=np.float32))
  for n in (2, 3, 2, 3, 2):
    np.testing.assert_array_equal(np.asarray(g(x, n, 0.5)), np.arange(4) * n + 0.5)
  assert traces == [2, 3] and g._fast_calls == 3
  np.testing.assert_array_equal(np.asarray(g(x, 2, 1.5)), np.arange(4) * 2 + 1.5)  # (a new static value: traced)
  assert traces == [2, 3, 2]
  h = tj.jit(f, static_argnames=("n", "scale"))
  np.testing.assert_array_equal(np.asarray(h(x, n=4, scale=1.0)), np.arange(4) * 4 + 1.0)
  np.testing.assert_array_equal(np.asarray(h(x, 4, 1.0)), np.arange(4) * 4 + 1.0)
  np.testing.assert_array_equal(np.asarray(h(x, 4, 1.0)), np.arange(4) * 4 + 1.0)
  assert h._fast_calls == 1
  with pytest.raises(ValueError, match="hashable"):
    g(x, [2], 0.5)


def test_one_output_programs_run_directly(on_cpu):
  """A program with one new output and no intermediates (`jit(x + 1)`, with or without closed-over constants) runs
  through its direct runner on a cache hit: the same values and launch count as `run_schedule`'s path, which a
  call made inside a profile takes. A program with two outputs has no direct runner."""
  from tinyjax.trace.jit import _Compiled
  constant = tnp.asarray(np.arange(8, dtype=np.float32) * 10)
  f = tj.jit(lambda x, y: x * y + constant)
  x, y = (tnp.asarray(np.arange(8, dtype=np.float32) + i) for i in (1, 2))
  want = (np.arange(8) + 1.0) * (np.arange(8) + 2.0) + np.arange(8) * 10
  np.testing.assert_array_equal(np.asarray(f(x, y)), want)
  (compiled,) = f._fast_cache.values()
  assert isinstance(compiled, _Compiled) and compiled.direct is not None
  counters.reset()
  direct = f(x, y)
  assert counters.kernels_launched == 1 and not direct.weak_type
  with tj.profile():
    profiled = f(x, y)  # (run_schedule: each kernel timed on its own)
  assert counters.kernels_launched == 2
  np.testing.assert_array_equal(np.asarray(direct), np.asarray(profiled))
  assert direct.uop.arg is not profiled.uop.arg and direct.uop.arg is not f(x, y).uop.arg  # a new buffer each call
  two = tj.jit(lambda x: (x + 1, x * 2))
  two(x)
  assert next(iter(two._fast_cache.values())).direct is None


def test_flat_and_nested_calls_with_the_same_leaves_are_different_programs():
  """The hot path keys a flat call (every argument an Array) by its argument count, a nested one by its tree: the
  leaves of f(a, b) and f((a, b)) are alike, their programs are not."""
  f = tj.jit(lambda *args: tj.tree_util.tree_leaves(args)[0] * 2 + len(args))
  a, b = tnp.asarray(np.ones(4, np.float32)), tnp.asarray(np.zeros(4, np.float32))
  for _ in range(2):
    np.testing.assert_array_equal(np.asarray(f(a, b)), np.full(4, 4.0))
    np.testing.assert_array_equal(np.asarray(f((a, b))), np.full(4, 3.0))
  assert f._fast_calls >= 2


def test_fast_path_outputs_are_fresh_or_shared_as_traced():
  """Outputs that are inputs, or the same value twice, stay the same buffer; new outputs are new each call."""
  f = tj.jit(lambda x: (x, x * 2, x * 2))
  x = tnp.asarray(np.arange(4, dtype=np.float32))
  first = f(x)
  second = f(x)
  assert second[0].uop is x.uop and second[1].uop is second[2].uop and second[1].uop is not first[1].uop
  np.testing.assert_array_equal(np.asarray(first[1]), np.asarray(second[2]))


def test_debug_prints_each_kernel_on_the_fast_path(tmp_path):
  import subprocess
  import sys
  script = ("import numpy as np, tinyjax as tj, tinyjax.numpy as tnp\n"
            "f = tj.jit(lambda x: (x + 1).sum())\n"
            "x = tnp.asarray(np.ones(8, np.float32))\n"
            "f(x); print('--- hit'); f(x)\n")
  result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60,
                          env={**__import__("os").environ, "DEBUG": "1", "TINYJAX_CACHE_DIR": str(tmp_path),
                               "TINYJAX_PLATFORMS": "cpu"})  # the CPU's fast path
  assert result.returncode == 0, result.stderr
  after_hit = result.stdout.split("--- hit", 1)[1]
  assert "*** CPU" in after_hit and " us " in after_hit


def test_same_program_from_several_threads():
  """Concurrent calls of one jitted program each get correct results (a busy launch table is not shared)."""
  import threading
  f = tj.jit(lambda x: (x * 2 + 1).sum(axis=1))
  errors = []

  def call_many(seed):
    host = np.random.default_rng(seed).standard_normal((64, 1024)).astype(np.float32)
    x = tnp.asarray(host)
    for _ in range(50):
      if not np.allclose(np.asarray(f(x)), (host.astype(np.float64) * 2 + 1).sum(1), rtol=1e-4, atol=1e-3):
        errors.append(seed)

  threads = [threading.Thread(target=call_many, args=(seed,)) for seed in range(3)]
  for thread in threads: thread.start()
  for thread in threads: thread.join(timeout=60)
  assert not errors


def test_make_jaxpr_lists_arguments_in_order_then_constants():
  table = tnp.asarray(np.arange(3, dtype=np.float32))
  text = str(tj.make_jaxpr(lambda w, x, unused: (x @ w) * table[0])(np.ones((4, 3), np.float32),
                                                                  np.ones((2, 4), np.float32), 1))
  assert text.startswith("{ lambda d:f32[3] ; a:f32[4,3] b:f32[2,4] c:i32[]. let"), text


def test_fresh_wrappers_of_one_function_share_its_programs():
  """`jit(f)(x)` in a loop traces f once, as JAX (programs are cached per function and jit options, held weakly)."""
  traces = []

  def f(x, n=1):
    traces.append(1)
    return x * n

  x = tnp.ones(3)
  for _ in range(3): tj.jit(f)(x)
  assert len(traces) == 1
  tj.jit(f, static_argnums=1)(x, 2)  # other options: programs of their own
  assert len(traces) == 2
  tj.jit(lambda x: f(x))(x)  # another function object
  assert len(traces) == 3


def test_static_argnums_passed_by_keyword_are_static():
  def f(x, n):
    for _ in range(n): x = x * 2  # Python control flow on n: it must be a concrete value
    return x
  for call in (lambda: tj.jit(f, static_argnums=1)(tnp.ones(2), n=3), lambda: tj.jit(f, static_argnames="n")(
      tnp.ones(2), 3)):
    np.testing.assert_array_equal(call(), [8.0, 8.0])


def test_block_until_ready_of_a_pytree_and_transformations_of_non_callables():
  tree = {"a": tnp.ones(2) * 2, "b": [tnp.zeros(1) + 1, 3]}
  assert tj.block_until_ready(tree) is tree and all(leaf.is_realized for leaf in (tree["a"], tree["b"][0]))
  for transform in (tj.jit, tj.grad, tj.value_and_grad, tj.vmap, tj.jacfwd, tj.jacrev):
    with pytest.raises(TypeError, match="Expected a callable value, got 3"):
      transform(3)
  with pytest.raises(TypeError, match="callable"):
    tj.jvp(3, (1.0,), (1.0,))


@pytest.mark.parametrize("with_static", [False, True])
def test_lazy_arguments_are_computed_together(with_static):
  """The lazy arguments of a jitted call are computed in one schedule, so the work they share is done once: parameters
  drawn from a chain of split keys (stax's init) run each split once, not once per parameter drawn after it (here 12
  splits, not 78). Values against numpy."""
  from tinyjax import random
  key, params = random.PRNGKey(0), []
  for _ in range(12):
    key, sub = random.split(key)
    params.append(random.normal(sub, (3,)))
  before = tj.runtime_stats()["kernels_launched"]
  f = tj.jit(lambda ps, scale: scale * sum(p.sum() for p in ps), static_argnums=(1,) if with_static else ())
  out = f(params, 2.0)
  assert tj.runtime_stats()["kernels_launched"] - before <= 2 * 12 + 2
  np.testing.assert_allclose(float(out), 2 * sum(np.asarray(p, np.float64).sum() for p in params), rtol=1e-5)


def test_concretization_errors_have_jaxs_classes():
  """bool / int / np.asarray of a traced value raise JAX's subclasses of ConcretizationTypeError (tinyjax.errors,
  as jax.errors), so code catching either kind works."""
  import tinyjax.errors as errors

  def branch(x):
    if x > 0: return x
    return -x
  with pytest.raises(errors.TracerBoolConversionError, match="bool"):
    tj.jit(branch)(1.0)
  with pytest.raises(errors.ConcretizationTypeError):
    tj.jit(branch)(1.0)
  with pytest.raises(errors.TracerIntegerConversionError):
    tj.jit(lambda n: tnp.zeros(int(n)))(3)
  with pytest.raises(errors.TracerArrayConversionError):
    tj.jit(lambda x: np.asarray(x) + 1)(np.ones(2))
  with pytest.raises(errors.TracerBoolConversionError):
    tj.vmap(branch)(np.ones(3))
  assert issubclass(errors.TracerBoolConversionError, TypeError) and tj.errors.ShardingTypeError


def test_tracers_print_and_format_as_jax_0_10(capsys):
  """print() and str.format of a traced value show the tracer, as JAX 0.10's (the JAX docs' external-callbacks page
  formats one with "{}".format(y) inside jit)."""
  @tj.jit
  def f(x):
    y = x + 1
    print("intermediate value: {}".format(y), f"{y}", repr(y * 2.0))
    return y * 2
  assert int(f(2)) == 6
  printed = capsys.readouterr().out
  assert printed == "intermediate value: JitTracer(~int32[]) JitTracer(~int32[]) JitTracer(~float32[])\n"
  tj.jit(lambda v: print(v) or v)(np.ones((2, 3), np.float32))
  assert capsys.readouterr().out == "JitTracer(float32[2,3])\n"


def test_shape_dtype_struct_like_as_jax():
  """ShapeDtypeStruct.like(x): x's shape, dtype and weak type (JAX 0.10's; checked against it), as pure_callback's
  result spec in the JAX docs' external-callbacks page."""
  cases = [(tnp.arange(3.0), (3,), np.float32, False), (2.0, (), np.float32, True), (3, (), np.int32, True),
           (np.ones((2, 2)), (2, 2), np.float32, False), (np.int8(1), (), np.int8, False)]
  for value, shape, dtype, weak in cases:
    spec = tj.ShapeDtypeStruct.like(value)
    assert (spec.shape, spec.dtype, spec.weak_type) == (shape, np.dtype(dtype), weak), value
  x = tnp.arange(4.0)
  got = tj.jit(lambda v: tj.pure_callback(np.sin, tj.ShapeDtypeStruct.like(v), v))(x)
  np.testing.assert_allclose(np.asarray(got), np.sin(np.arange(4.0)), rtol=1e-6)


def test_garbage_collector_paused_while_tracing_and_lowering():
  """The cyclic garbage collector is off while jit traces, lowers and compiles (helpers.gc_paused: the nodes of a
  lowering triggered full collections, ResNet-50's first step 10 of them), and on again after, also when tracing
  raises; a collector the user turned off stays off. Values as without the pause."""
  import gc
  from tinyjax.helpers import gc_paused
  seen = []

  def f(x):
    seen.append(gc.isenabled())
    return tnp.tanh(x) * 2

  x = np.linspace(-1, 1, 7).astype(np.float32)
  assert gc.isenabled()
  np.testing.assert_allclose(np.asarray(tj.jit(f)(x)), np.tanh(x) * 2, rtol=1e-6)
  assert seen == [False] and gc.isenabled()

  def bad(x): raise ValueError("no")
  with pytest.raises(ValueError, match="no"): tj.jit(bad)(x)
  assert gc.isenabled()
  gc.disable()
  try:
    with gc_paused(): pass
    assert not gc.isenabled()
  finally: gc.enable()
  with gc_paused():
    with gc_paused(): assert not gc.isenabled()
    assert not gc.isenabled()
  assert gc.isenabled()
