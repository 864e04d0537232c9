"""The unoptimised first tier (devices/cpu.py `CompileStream`, lower/realize.py `first_tier`): a small kernel whose IR
has no fast-math flags runs its own IR compiled at -O0 first, and its -O3 build once the program has run twice. The
two builds must compute the same bits, so that a program's results never change when the second one is swapped in.
Values against numpy in float64."""
import numpy as np
import pytest

import tinyjax as tj
import tinyjax.numpy as tnp
from tinyjax import lax
from tinyjax.codegen.opt import choose_opts, tile_geometry
from tinyjax.devices import cpu
from tinyjax.lower import realize
from tests.tiering import run_in_tier

F32, F64 = np.float32, np.float64


def baseline_tier(unoptimised: bool):
  """A `CompileStream.tier` that runs every kernel offered an unoptimised first tier at -O0 (or, without
  `unoptimised`, at the stream's level), whatever the caches hold, and never upgrades it; the rest as their own
  code."""
  def tier(self, name, llvm_ir, quick):
    return llvm_ir, cpu.BASELINE_OPT if unoptimised and quick == llvm_ir else self.opt_level
  return tier


def both_builds(monkeypatch, fun, *args) -> tuple[list[np.ndarray], list[np.ndarray], int]:
  """`jit(fun)(*args)` with its small kernels at -O0 and at -O3: both results (flattened) and how many kernels ran
  unoptimised."""
  unoptimised = []

  def count(f) -> None:
    programs = f.lower(*args)._compiled.schedule.programs
    unoptimised.append(sum(program.opt_level == cpu.BASELINE_OPT for program in programs))
  first = run_in_tier(monkeypatch, baseline_tier(True), fun, *args, check=count)
  own = run_in_tier(monkeypatch, baseline_tier(False), fun, *args, check=count)
  assert unoptimised[1] == 0
  return first, own, unoptimised[0]


def assert_same_bits(first: list[np.ndarray], own: list[np.ndarray]) -> None:
  for a, b in zip(first, own, strict=True):
    assert a.dtype == b.dtype and a.shape == b.shape
    np.testing.assert_array_equal(a.reshape(-1).view(np.uint8), b.reshape(-1).view(np.uint8))  # (NaN, -0.0 too)


rng = np.random.default_rng(0)
X = (rng.standard_normal((48, 67)) * 3).astype(F32)
POSITIVE = np.abs(X) + np.float32(0.05)
CASES = {  # name: (function, arguments, its float64 reference)
  "exp_log_tanh": (lambda x, p: tnp.exp(x * 0.3) - tnp.log(p) + tnp.tanh(x), (X, POSITIVE),
                   lambda x, p: np.exp(x * 0.3) - np.log(p) + np.tanh(x)),
  "trigonometry": (lambda x: tnp.sin(x) * tnp.cos(x * 2.0) + tnp.arctan(x), (X,),
                   lambda x: np.sin(x) * np.cos(x * 2.0) + np.arctan(x)),
  "powers": (lambda p: p ** 1.7 + tnp.sqrt(p) / tnp.cbrt(p) + tnp.expm1(-p) + tnp.log1p(p), (POSITIVE,),
             lambda p: p ** 1.7 + np.sqrt(p) / np.cbrt(p) + np.expm1(-p) + np.log1p(p)),
  "division_and_remainders": (lambda x, p: (x / (x * x + 1.3), tnp.mod(x, 0.7), tnp.floor_divide(x, p)), (X, POSITIVE),
                              lambda x, p: (x / (x * x + 1.3), np.mod(x, 0.7), np.floor_divide(x, p))),
  "special_values": (lambda x: (tnp.where(x > 0, x / 0.0, -x / 0.0), tnp.log(x), tnp.maximum(x, tnp.nan)), (X,),
                     lambda x: (np.full_like(x, np.inf), np.log(np.where(x > 0, x, np.nan)), np.full_like(x, np.nan))),
  "integers_and_casts": (lambda x: ((x * 100).astype(tnp.int32) // 7 + (x > 0), (x * 1000).astype(tnp.int8),
                                    x.astype(tnp.bfloat16) * 3, x.astype(tnp.float16) - 1), (X,),
                         lambda x: ((x * 100).astype(np.int32) // 7 + (x > 0),
                                    np.clip(np.trunc(x * 1000), -128, 127).astype(np.int8), x * 3, x - 1)),
  "elementwise_gradient": (tj.grad(lambda x: (tnp.tanh(x) * tnp.sin(x)).sum()), (X,),
                           lambda x: (1 - np.tanh(x) ** 2) * np.sin(x) + np.tanh(x) * np.cos(x)),
  "erf_and_gelu": (lambda x: tj.scipy.special.erf(x) + tj.nn.gelu(x, approximate=False), (X,), None),
  "gather_and_cumulative": (lambda x: (x[::-2, 3:40] + x[jnp_index, :][:, ::3].sum(), lax.cummax(x, axis=0)), (X,),
                            None),
}
jnp_index = np.array([0, 5, 5, 47, 12])


@pytest.mark.parametrize("name", list(CASES))
def test_unoptimised_first_tier_computes_the_same_bits(monkeypatch, on_cpu, name):
  """The -O0 build of each kernel offered the unoptimised first tier gives exactly the -O3 build's values
  (transcendentals, division, remainders, infinities and NaN, integers, narrow floats, gradients, gathers), and
  both are right against float64."""
  fun, args, reference = CASES[name]
  first, own, unoptimised = both_builds(monkeypatch, fun, *args)
  assert unoptimised >= 1
  assert_same_bits(first, own)
  if reference is not None:
    want = reference(*(a.astype(F64) for a in args))
    for got, expected in zip(first, want if isinstance(want, tuple) else (want,), strict=True):
      if got.dtype.kind in "iub": np.testing.assert_array_equal(got, expected)
      else:  # (float32, and float16 / bfloat16 to their precision)
        tolerance = 2e-2 if got.dtype.itemsize < 4 else 1e-5
        np.testing.assert_allclose(got.astype(F64), expected, rtol=tolerance, atol=tolerance)


@pytest.mark.parametrize("shape", [(6, 1024), (7, 1000), (5003,)], ids=str)
def test_elementwise_kernels_are_vector_code_unoptimised(monkeypatch, on_cpu, shape):
  """An elementwise kernel whose values compute on vectors (an Adam update's three outputs, a GELU) runs its innermost
  loop a vector register at a time (llvm.py `vector_lanes`, `render_vectors`): its IR is vector code before LLVM
  optimises it, so the unoptimised first tier is too. Whole vectors only (1024 columns), a remainder one value at a
  time (1000), and a flat array cut into launch chunks (5003): the same bits at -O0 and -O3, and float64's values."""
  r = np.random.default_rng(len(shape))
  p, g, m = (r.standard_normal(shape).astype(F32) for _ in range(3))
  v = np.abs(r.standard_normal(shape)).astype(F32)

  def update(p, g, m, v):
    m, v = 0.9 * m + 0.1 * g, 0.999 * v + 0.001 * g * g
    return p - 1e-3 * m / (tnp.sqrt(v) + 1e-8), m, v, tj.nn.gelu(p)
  lanes = tile_geometry().vector_bytes // 4
  programs = tj.jit(update).lower(p, g, m, v)._compiled.schedule.programs
  assert programs and all(f"fmul <{lanes} x float>" in program.src for program in programs)
  first, own, unoptimised = both_builds(monkeypatch, update, p, g, m, v)
  assert unoptimised >= 1
  assert_same_bits(first, own)
  p64, g64, m64, v64 = (a.astype(F64) for a in (p, g, m, v))
  m64, v64 = 0.9 * m64 + 0.1 * g64, 0.999 * v64 + 0.001 * g64 * g64
  gelu = 0.5 * p64 * (1 + np.tanh(np.sqrt(2 / np.pi) * (p64 + 0.044715 * p64 ** 3)))
  for got, want in zip(first, (p64 - 1e-3 * m64 / (np.sqrt(v64) + 1e-8), m64, v64, gelu), strict=True):
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("columns", [64, 1000, 2048], ids=str)
def test_row_reductions_are_vector_code_in_an_order_of_their_own(monkeypatch, on_cpu, columns):
  """A float32 sum (up to a float32 block, SUM_BLOCK) or maximum over each row's contiguous values runs on vectors
  of running results in an order written into its IR (llvm.py `reduce_lanes`, `vector_reduce`: the steps past the
  last whole vector by masked loads), not left to LLVM's vectoriser by `reassoc`: the same bits at -O0 and -O3, so
  the kernel gets the unoptimised first tier. A softmax, a layer norm's mean and variance, bfloat16 values summed in
  float32, against float64."""
  from tinyjax.codegen import llvm
  r = np.random.default_rng(columns)
  x = (r.standard_normal((12, columns)) * 3).astype(F32)
  narrow = x.astype(tnp.bfloat16)

  def rows(x, narrow):
    mean = x.mean(axis=1, keepdims=True)
    variance = ((x - mean) ** 2).mean(axis=1)
    return tj.nn.softmax(x, axis=1), variance, x.max(axis=1), narrow.astype(F32).sum(axis=1)
  sources = [program.src for program in tj.jit(rows).lower(x, narrow)._compiled.schedule.programs]
  lanes = llvm.SUM_REGISTERS * tile_geometry().vector_bytes // 4
  assert any(f"fadd <{lanes} x float>" in source for source in sources)
  assert not any("fadd reassoc" in source for source in sources)
  first, own, unoptimised = both_builds(monkeypatch, rows, x, narrow)
  assert unoptimised >= 1
  assert_same_bits(first, own)
  x64 = x.astype(F64)
  e = np.exp(x64 - x64.max(axis=1, keepdims=True))
  want = (e / e.sum(axis=1, keepdims=True), x64.var(axis=1), x64.max(axis=1),
          narrow.astype(F64).sum(axis=1))
  for got, expected in zip(first, want, strict=True):
    np.testing.assert_allclose(got, expected, rtol=2e-6, atol=2e-6 * np.abs(expected).max())


@pytest.mark.parametrize("width", [32, 64], ids=["avx2", "avx512"])
def test_row_reductions_keep_special_values(monkeypatch, on_cpu, width):
  """A row's sum and maximum as vector code (`vector_reduce`), with AVX2's and AVX-512's vector widths (32 and 64
  lanes): NaN anywhere in a row, in a whole vector or in the masked last one, gives NaN; +inf and -inf in one row give
  NaN for the sum and +inf for the maximum; a row of -0.0 sums to +0.0 (from the identity, as JAX's) and its maximum
  is -0.0; +0.0 beats -0.0;
  values past the row's end (the masked lanes) are never read into the result. Against numpy."""
  from conftest import pinned_vectors
  columns = 100
  x = np.random.default_rng(7).standard_normal((8, columns + 28)).astype(F32)[:, :columns]
  x = np.ascontiguousarray(x)
  x[1, 5] = np.nan
  x[2, columns - 1] = np.nan  # (in the masked last vector)
  x[3, 10], x[3, 90] = np.inf, -np.inf
  x[4, :] = -0.0
  x[5, :] = -0.0
  x[5, 97] = 0.0
  x[6, :] = -np.inf
  with pinned_vectors(monkeypatch, width):
    f = tj.jit(lambda x: (x.sum(axis=1), x.max(axis=1)))
    (source,) = [program.src for program in f.lower(x)._compiled.schedule.programs if "fadd" in program.src]
    assert f"fadd <{width} x float>" in source and "fadd reassoc" not in source  # (4 registers of width // 4)
    total, largest = (np.asarray(a) for a in f(x))
  with np.errstate(invalid="ignore"): want = x.astype(F64).sum(axis=1)  # (inf - inf)
  np.testing.assert_allclose(total, want, rtol=1e-5, atol=1e-5)
  np.testing.assert_array_equal(largest, x.max(axis=1))
  assert not np.signbit(total[4]) and np.signbit(largest[4]) and not np.signbit(largest[5])


def test_paddings_and_concatenations_are_vector_code_unoptimised(monkeypatch, on_cpu):
  """Copies through gates are vector code before LLVM optimises them (llvm.py `vector_lanes`, `render_vector_steps`):
  a padding along another axis than the innermost (NHWC's H and W: each gated load a vector load branched around
  where its gate, the same for every lane, is false), and a padding or a concatenation along the innermost axis, in
  the parts between the gates' bounds (`gate_split`: a load outside its part's window is no load at all, one inside
  it a plain vector load, one whose gate also tests another axis a branched one). The same bits at -O0 and -O3, and
  numpy's values."""
  r = np.random.default_rng(9)
  x, y = r.standard_normal((4, 14, 14, 40)).astype(F32), r.standard_normal((4, 14, 14, 37)).astype(F32)
  lanes = tile_geometry().vector_bytes // 4
  around, last = ((0, 0), (1, 1), (1, 1), (0, 0)), ((0, 0), (1, 2), (0, 0), (3, 5))
  cases = [(lambda x, y: tnp.pad(x, around) * 2.0, np.pad(x, around) * 2),
           (lambda x, y: tnp.pad(x, last) + 1.0, np.pad(x, last) + 1),
           (lambda x, y: tnp.concatenate([x, tnp.tanh(y)], axis=-1),
            np.concatenate([x, np.tanh(y.astype(F64))], axis=-1))]
  for fun, want in cases:
    (source,) = [program.src for program in tj.jit(fun).lower(x, y)._compiled.schedule.programs]
    assert f"load <{lanes} x float>, ptr" in source
    first, own, unoptimised = both_builds(monkeypatch, fun, x, y)
    assert unoptimised == 1
    assert_same_bits(first, own)
    np.testing.assert_allclose(first[0], want, rtol=1e-6, atol=1e-6)


def test_training_step_is_the_same_in_both_builds(monkeypatch, on_cpu):
  """An MLP's Adam step (its elementwise updates and reductions at -O0, its products in the GEMM library or in their
  own loops): the same parameters and loss bit for bit, and the loss against float64."""
  w1, w2 = rng.standard_normal((20, 32)).astype(F32) * 0.3, rng.standard_normal((32, 5)).astype(F32) * 0.3
  x, y = rng.standard_normal((64, 20)).astype(F32), rng.integers(0, 5, 64)

  def loss(params, x, y):
    h = tnp.maximum(x @ params[0], 0.0)
    return -tj.nn.log_softmax(h @ params[1])[np.arange(64), y].mean()

  def step(params, m, v, x, y):
    value, grads = tj.value_and_grad(loss)(params, x, y)
    m = [0.9 * a + 0.1 * g for a, g in zip(m, grads)]
    v = [0.999 * a + 0.001 * g * g for a, g in zip(v, grads)]
    return [p - 1e-2 * a / (tnp.sqrt(b) + 1e-8) for p, a, b in zip(params, m, v)], m, v, value
  zeros = [np.zeros_like(w1), np.zeros_like(w2)]
  first, own, unoptimised = both_builds(monkeypatch, step, [w1, w2], zeros, zeros, x, y)
  assert unoptimised >= 3
  assert_same_bits(first, own)
  h = np.maximum(x.astype(F64) @ w1, 0) @ w2
  h -= h.max(axis=1, keepdims=True)
  want = -(h - np.log(np.exp(h).sum(axis=1, keepdims=True)))[np.arange(64), y].mean()
  np.testing.assert_allclose(first[-1], want, rtol=1e-5)


def test_which_kernels_get_the_unoptimised_tier():
  """A kernel is offered its own IR as first tier when that has no fast-math flags (but a max's or min's `reassoc`)
  and its loops run at most BASELINE_MAX_WORK iterations; not a float sum that LLVM may reassociate (vectorised; a
  small kernel's short sums run in order, a row's sum of contiguous values is vector code in an order of its own), a
  register tile that may fuse its products into FMAs, nor a big kernel; a contraction the GEMM library can do gets
  the library call."""
  assert cpu.same_bits_unoptimised("%1 = fadd float %0, 1.0\n"
                                   "%2 = call float @llvm.fma.f32(float %1, float %1, float %1)")
  for flagged in ("fadd reassoc float", "fmul contract <8 x float>", "fadd fast double", "fsub nsz float",
                  "call float @llvm.fmuladd.f32("):
    assert not cpu.same_bits_unoptimised(f"%1 = {flagged} %0, %0")

  def first_tiers(fun, *args):
    kernels = realize.kernels_of(tj.jit(fun).lower(*args)._compiled.schedule.schedule.kernels)
    return [(realize.first_tier(k, source)[1], source) for k, source in
            ((k, realize.render_llvm(k.name, k.ast)) for k in kernels)]
  small = np.ones((64, 64), F32)
  ((first, source),) = first_tiers(lambda x: tnp.exp(x) * 2.0 + 1.0, small)
  assert first == source
  ((first, source),) = first_tiers(lambda x: x.sum(axis=1), small)
  assert first == source and "reassoc" not in source  # (a row's sum: vector code in its own order, `reduce_lanes`)
  ((first, _),) = first_tiers(lambda x: x[:, ::2].sum(axis=1), small)
  assert first is None  # (reassoc: a sum of strided values, left to LLVM's vectoriser)
  ((first, _),) = first_tiers(lambda x: x.sum(axis=1), np.ones((8, 4096), F32))
  assert first is None  # (reassoc: a row longer than a float32 block)
  ((first, source),) = first_tiers(lambda x: x[:, :10].sum(axis=1), small)
  assert first == source  # (a small kernel's sums of at most SHORT_REDUCE steps run in order)
  ((first, source),) = first_tiers(lambda x: x.max(axis=1), small)
  assert first == source and "reassoc" in source  # (a max has the same value in any order)
  big = np.ones((1024, 1025), F32)  # (over BASELINE_MAX_WORK elements)
  ((first, _),) = first_tiers(lambda x: tnp.exp(x) * 2.0 + 1.0, big)
  assert first is None
  tiers = first_tiers(lambda a, b: a @ b, np.ones((256, 256), F32), np.ones((256, 256), F32))
  assert any(first is not None and first != source and "tj_sgemm" in first for first, source in tiers)


def test_unoptimised_first_tier_upgrades_after_the_second_run(on_cpu):
  """Without a cached build: the first call runs the kernels at -O0; the second starts their -O3 builds in the
  background, which replace them once loaded (same IR, same bits); a program called once is never rebuilt."""
  if cpu.compile_worker() is None: pytest.skip("no compile worker (one core): kernels compile in one tier")
  scale = float(np.random.default_rng().uniform(1, 2))  # (a literal of its own: this kernel is in no cache)
  x = tnp.asarray(X)
  f = tj.jit(lambda x: tnp.tanh(x * scale) + 1.0)
  programs = f.lower(x)._compiled.schedule.programs
  (program,) = programs
  source = program.src
  assert program.opt_level == cpu.BASELINE_OPT and program.pending is not None
  first = np.asarray(f(x))
  assert program.pending.thread is None and program.opt_level == cpu.BASELINE_OPT
  second = np.asarray(f(x))
  cpu.wait_for_upgrades()
  assert program.opt_level == cpu.default_opt_level() and program.src == source and program.pending is None
  assert_same_bits([first, second], [np.asarray(f(x))] * 2)
  np.testing.assert_allclose(first, np.tanh(X.astype(F64) * scale) + 1, rtol=1e-6, atol=1e-6)
  g = tj.jit(lambda x: tnp.tanh(x * (scale + 1.0)) - 1.0)
  g(x).block_until_ready()
  (once,) = g.lower(x)._compiled.schedule.programs
  cpu.wait_for_upgrades()
  assert once.opt_level == cpu.BASELINE_OPT and once.pending is not None and once.pending.thread is None


def test_timed_runs_count_towards_the_upgrade(on_cpu):
  """Runs timed by a profile (kernel by kernel from Python, not through the launch list) count too: the second one
  starts the -O3 builds, and the profile's rows name the kernels either way."""
  if cpu.compile_worker() is None: pytest.skip("no compile worker (one core): kernels compile in one tier")
  scale = float(np.random.default_rng().uniform(2, 3))  # (a literal of its own: this kernel is in no cache)
  x = tnp.asarray(X)
  f = tj.jit(lambda x: tnp.sin(x * scale) * 2.0)
  (program,) = f.lower(x)._compiled.schedule.programs
  pending = program.pending
  assert program.opt_level == cpu.BASELINE_OPT and pending is not None
  with tj.profile() as profile:
    first = np.asarray(f(x))
    assert pending.runs == 1 and pending.thread is None
    f(x).block_until_ready()
  assert pending.thread is not None and program.name in str(profile)
  cpu.wait_for_upgrades()
  assert program.opt_level == cpu.default_opt_level()
  assert_same_bits([first], [np.asarray(f(x))])
  product = (X * F32(scale)).astype(F64)  # (rounded to float32 as the kernel rounds it: sin of up to 20)
  np.testing.assert_allclose(first, np.sin(product) * 2, rtol=1e-6, atol=1e-6)


def test_register_tiles_run_unoptimised_first(monkeypatch, on_cpu):
  """A register tile that the GEMM library cannot do (a product whose operand is computed in it: a ReLU's output
  and its bias, as an MLP's last weight gradient reads them) writes its products and sums as `llvm.fma` calls where
  the host has FMA, so its IR has no fast-math flags; it runs at -O0 first, the same bits as at -O3, and both equal
  numpy's in float64."""
  if not tile_geometry().fma: pytest.skip("no FMA on this host: a tile's products are contracted multiplies and adds")
  h, b = rng.standard_normal((96, 64)).astype(F32), rng.standard_normal(64).astype(F32)
  g = rng.standard_normal((96, 10)).astype(F32)

  def gradient(h, b, g): return tnp.maximum(h + b, 0.0).T @ g
  tiles = []

  def tiled(f) -> None:
    kernels = realize.kernels_of(f.lower(h, b, g)._compiled.schedule.schedule.kernels)
    tiles.extend(k for k in kernels if (plan := choose_opts(k.ast)) is not None and plan.row is not None)
  first = run_in_tier(monkeypatch, baseline_tier(True), gradient, h, b, g, check=tiled)
  own = run_in_tier(monkeypatch, baseline_tier(False), gradient, h, b, g)
  (tile,) = set(tiles)
  source, first_tier = realize.first_tier(tile, realize.render_llvm(tile.name, tile.ast))
  assert first_tier == source and "@llvm.fma." in source and " contract " not in source
  assert_same_bits(first, own)
  want = np.maximum(h.astype(F64) + b, 0).T @ g.astype(F64)
  np.testing.assert_allclose(first[0], want, rtol=1e-5, atol=1e-5)
