"""The shape-generic float32 GEMM (codegen/gemm.py `tj_sgemm`, compiled with the CPU runtime) and the two tiers of a
contraction (devices/cpu.py `CompileStream`): a kernel that calls the library first, its own register-tiled loops
compiled in the background and swapped in. Values against numpy in float64."""
import ctypes

import numpy as np
import pytest

import tinyjax as tj
import tinyjax.numpy as tnp
from tinyjax.codegen import gemm
from tinyjax.devices import cpu
from tinyjax.lower import realize
from tests.tiering import run_in_tier

F32, F64 = np.float32, np.float64


def library_tier(first: bool = True, forced: list[str] | None = None):
  """A `CompileStream.tier` that runs a contraction as its first tier, the library call (built unoptimised where
  that computes the same bits, as `CompileStream.tier` builds it; or, without `first`, as its own loops), whatever the
  caches hold (the own loops may be in this machine's cache already: not looked at); other kernels as their own code
  at the stream's opt level. `forced` collects the names of the kernels it ran as library calls."""
  def tier(self, name, llvm_ir, quick):
    if not first or quick in (None, llvm_ir): return llvm_ir, self.opt_level
    if forced is not None: forced.append(name)
    return quick, cpu.BASELINE_OPT if cpu.same_bits_unoptimised(quick) else self.opt_level
  return tier


@pytest.fixture
def first_tier(monkeypatch, on_cpu):
  """Contractions run as their first tier, the library call, and stay so (no background compile of their loops)."""
  monkeypatch.setattr(cpu.CompileStream, "tier", library_tier())
  monkeypatch.setattr(cpu, "_upgrade_later", lambda jobs, opt_level: None)
  realize._memory_cache.clear()  # (programs lowered before keep the kernels they were compiled with)
  yield
  realize._memory_cache.clear()


def sources(f, *args) -> list[str]:
  """The LLVM IR of the kernels a jitted call runs."""
  return [program.src for program in f.lower(*args)._compiled.schedule.programs]


def calls_library(f, *args) -> bool:
  return any(f"call void @{gemm.SYMBOL}(" in source for source in sources(f, *args))


def both_tiers(monkeypatch, fun, *args) -> list[np.ndarray]:
  """`jit(fun)(*args)` run as its first tier (library calls) and with its own loops (each checked to be so)."""
  results = []
  for first in (True, False):
    def check(f, first=first) -> None:
      assert calls_library(f, *args) == first
      if first:  # (a library call's kernel, its epilogue, is built unoptimised: the same bits, `CompileStream.tier`)
        programs = f.lower(*args)._compiled.schedule.programs
        assert all(program.opt_level == cpu.BASELINE_OPT for program in programs if f"@{gemm.SYMBOL}(" in program.src)
    (result,) = run_in_tier(monkeypatch, library_tier(first), fun, *args, check=check)
    results.append(result)
  return results


def test_library_called_directly():
  """`tj_sgemm` itself, through ctypes, for every edge: one row or column or step, rows past the last whole tile,
  partial column panels, sums of one float32 block, several (added in float32) and many (in float64), transposed
  and negative strides, and a C wider than N."""
  cpu._load_gemm_library()
  address = cpu._engine().engine.get_function_address(gemm.SYMBOL)
  P, I = ctypes.c_void_p, ctypes.c_int64
  sgemm = ctypes.CFUNCTYPE(None, I, I, I, P, I, I, P, I, I, P, I)(address)
  rng = np.random.default_rng(0)
  for m, k, n in [(1, 1, 1), (5, 3, 7), (6, 256, 16), (7, 257, 17), (13, 600, 33), (20, 1025, 40), (3, 3000, 5)]:
    for order in ("nn", "tn", "nt", "flipped"):
      a = rng.standard_normal((k, m) if order == "tn" else (m, k)).astype(F32)
      b = rng.standard_normal((n, k) if order == "nt" else (k, n)).astype(F32)
      c = np.full((m, n + 3), np.nan, F32)
      a_ptr, am, ak = a.ctypes.data, k, 1
      b_ptr, bk, bn = b.ctypes.data, n, 1
      want_a, want_b = a.astype(F64), b.astype(F64)
      if order == "tn": am, ak, want_a = 1, m, a.T.astype(F64)
      if order == "nt": bk, bn, want_b = 1, k, b.T.astype(F64)
      if order == "flipped":  # rows of A last to first: a negative row stride from the last row
        a_ptr, am, want_a = a.ctypes.data + (m - 1) * k * 4, -k, a[::-1].astype(F64)
      sgemm(m, n, k, a_ptr, am, ak, b_ptr, bk, bn, c.ctypes.data, n + 3)
      np.testing.assert_allclose(c[:, :n], want_a @ want_b, rtol=2e-5, atol=2e-5 * np.sqrt(k))
      assert np.isnan(c[:, n:]).all()  # (nothing written past N)


def test_copy_library_called_directly():
  """`tj_copy32` through ctypes: transposes (a source read across its rows) and other strides, negative ones, blocks
  cut short at either edge, one row or column, float32 and int32 values; nothing written past C."""
  cpu._load_gemm_library()
  address = cpu._engine().engine.get_function_address(gemm.COPY_SYMBOL)
  P, I = ctypes.c_void_p, ctypes.c_int64
  copy = ctypes.CFUNCTYPE(None, I, I, P, I, I, P, I)(address)
  rng = np.random.default_rng(1)
  for r, c in [(1, 1), (1, 40), (40, 1), (5, 7), (32, 32), (33, 70), (64, 31), (100, 129)]:
    for dtype in (F32, np.int32):
      source = (rng.standard_normal((c, r)) * 1000).astype(dtype)  # read transposed: src[r, c] = source[c, r]
      for order in ("t", "n", "flipped"):
        out = np.full((r, c + 3), -7, dtype)
        if order == "t": ptr, sr, sc, want = source.ctypes.data, 1, r, source.T
        elif order == "n":
          plain = np.ascontiguousarray(source.T)
          ptr, sr, sc, want = plain.ctypes.data, c, 1, plain
        else:  # columns last to first
          ptr, sr, sc, want = source.ctypes.data + (c - 1) * r * 4, 1, -r, source[::-1].T
        copy(r, c, ptr, sr, sc, out.ctypes.data, c + 3)
        np.testing.assert_array_equal(out[:, :c], want)
        assert (out[:, c:] == -7).all()


def test_transposing_copies_tier_too(monkeypatch, on_cpu):
  """The copy that lays out a weight gradient's row operand (x.T in x.T @ g, lower/schedule.py `relayout`) runs the
  library's `tj_copy32` as its first tier: its results equal its own loops' bit for bit, and numpy's in float64."""
  rng = np.random.default_rng(7)
  x, w = rng.standard_normal((512, 512)).astype(F32), rng.standard_normal((512, 512)).astype(F32)

  def gradient(w, x): return tj.grad(lambda w: tnp.tanh(x @ w).sum())(w)
  with monkeypatch.context() as patch:
    patch.setattr(cpu.CompileStream, "tier", library_tier())
    patch.setattr(cpu, "_upgrade_later", lambda jobs, opt_level: None)
    realize._memory_cache.clear()
    assert any(f"call void @{gemm.COPY_SYMBOL}(" in source for source in sources(tj.jit(gradient), w, x))
  first, own = both_tiers(monkeypatch, gradient, w, x)
  np.testing.assert_array_equal(first, own)
  x64 = x.astype(F64)
  want = x64.T @ (1 - np.tanh(x64 @ w.astype(F64)) ** 2)
  np.testing.assert_allclose(first, want, rtol=1e-4, atol=1e-4)


# (m, k, n, whether the first tier is a library call): row-launched and column-tile-launched kernels, K over the
# float64 threshold, a column that is no whole panel, a short sum of a small product; a too-narrow output keeps its
# own loops (a dot tile), and so does a short sum of a big product (gemm.MIN_STEPS, SMALL_PRODUCT)
SHAPES = [(512, 784, 512, True), (100, 300, 64, True), (1000, 128, 512, True), (37, 1500, 48, True),
          (61, 170, 80, True), (512, 10, 512, True), (512, 512, 10, False), (1000, 64, 512, False)]


@pytest.mark.parametrize("m,k,n,library", SHAPES)
def test_first_tier_products_and_epilogues(first_tier, m, k, n, library):
  """The first tier of a plain product (written by the library where it is stored) and of a product with a fused
  epilogue (bias and ReLU, from the library's array of products), jitted, equals numpy's in float64."""
  rng = np.random.default_rng(m + k + n)
  a, b, c = rng.standard_normal((m, k)).astype(F32), rng.standard_normal((k, n)).astype(F32), \
      rng.standard_normal(n).astype(F32)
  plain, fused = tj.jit(lambda a, b: a @ b), tj.jit(lambda a, b, c: tnp.maximum(a @ b + c, 0))
  assert calls_library(plain, a, b) == library and calls_library(fused, a, b, c) == library
  want = a.astype(F64) @ b.astype(F64)
  tol = dict(rtol=1e-5, atol=1e-5 * np.sqrt(k))
  np.testing.assert_allclose(np.asarray(plain(a, b)), want, **tol)
  np.testing.assert_allclose(np.asarray(fused(a, b, c)), np.maximum(want + c, 0), **tol)


def test_first_tier_training_step(first_tier):
  """An MLP's loss gradient and an SGD update, on the first tier: x @ w, g @ w.T and x.T @ g products (transposed
  operands read in place by the library), the update fused after a weight gradient into donated weights (the
  library's products go to its array, the output being the weights the epilogue reads); against a float64 numpy
  gradient, and composed: jit(vmap(grad)) per-example gradients against the batched one."""
  rng = np.random.default_rng(1)
  x, y = rng.standard_normal((128, 96)).astype(F32), rng.standard_normal((128, 32)).astype(F32)
  w1, w2 = (rng.standard_normal(shape).astype(F32) / np.sqrt(shape[0]) for shape in ((96, 64), (64, 32)))

  def loss(params, x, y):
    w1, w2 = params
    return 0.5 * ((tnp.tanh(x @ w1) @ w2 - y) ** 2).sum()
  grads = tj.jit(tj.grad(loss))((w1, w2), x, y)
  x64, w164, w264 = x.astype(F64), w1.astype(F64), w2.astype(F64)
  h = np.tanh(x64 @ w164)
  r = h @ w264 - y
  g2, g1 = h.T @ r, x64.T @ ((r @ w264.T) * (1 - h ** 2))
  np.testing.assert_allclose(np.asarray(grads[0]), g1, rtol=1e-4, atol=1e-4)
  np.testing.assert_allclose(np.asarray(grads[1]), g2, rtol=1e-4, atol=1e-4)
  step = tj.jit(lambda w, x, g: w - 1e-3 * (x.T @ g), donate_argnums=0)
  g = rng.standard_normal((128, 64)).astype(F32)
  want = w1.astype(F64) - 1e-3 * (x64.T @ g.astype(F64))
  assert calls_library(step, tnp.asarray(w1), x, g)
  np.testing.assert_allclose(np.asarray(step(tnp.asarray(w1), x, g)), want, rtol=1e-6, atol=1e-6)
  per_example = tj.jit(tj.vmap(tj.grad(loss), in_axes=(None, 0, 0)))((w1, w2), x[:8, None], y[:8, None])
  whole = tj.grad(loss)((w1, w2), x[:8], y[:8])
  np.testing.assert_allclose(np.asarray(per_example[0]).sum(0), np.asarray(whole[0]), rtol=1e-4, atol=1e-5)


@pytest.fixture
def forced(monkeypatch, on_cpu) -> list[str]:
  """Contractions run as library calls first, whatever the caches hold, and upgrade in the background: the names of
  the kernels so run. (Skipped without a compile worker: one core compiles contractions in one tier.)"""
  if cpu.compile_worker() is None: pytest.skip("no compile worker (one core): contractions compile in one tier")
  names: list[str] = []
  monkeypatch.setattr(cpu.CompileStream, "tier", library_tier(forced=names))
  realize._memory_cache.clear()
  return names


def test_second_tier_replaces_the_first(forced):
  """A contraction whose own loops are at hand nowhere runs the library call first; its loops compile in the
  background and the program (and every launch list running it) switches to them; the values stay."""
  rng = np.random.default_rng(2)
  a, b = rng.standard_normal((200, 160)).astype(F32), rng.standard_normal((160, 96)).astype(F32)
  f = tj.jit(lambda a, b: tnp.tanh(a @ b))
  first = np.asarray(f(a, b))
  (program,) = [p for p in f.lower(a, b)._compiled.schedule.programs if p.name in forced]
  cpu.wait_for_upgrades([program])
  assert f"@{gemm.SYMBOL}(" not in program.src and program.watchers is None
  launches = f.lower(a, b)._compiled.schedule.launches
  fields = len(cpu.runtime.LAUNCH_FIELDS)
  assert program.fn_addr in [launches.records[i * fields] for i in range(launches.count)]
  np.testing.assert_array_equal(np.asarray(f(a, b)), first)
  np.testing.assert_allclose(first, np.tanh(a.astype(F64) @ b.astype(F64)), rtol=1e-5, atol=1e-5)
  realize._memory_cache.clear()


def test_own_loops_compile_after_the_second_run(forced):
  """A first tier's own loops start compiling once the program has run UPGRADE_AFTER_RUNS (2) times: its first run
  has both cores (the compile worker would take one), and a program run once costs no second compile. Lowered and
  not run, or run once, the upgrade waits; the second run starts it, and `wait_for_upgrades(programs)` does too.
  Values against numpy in float64."""
  rng = np.random.default_rng(4)
  a, b = rng.standard_normal((208, 176)).astype(F32), rng.standard_normal((176, 80)).astype(F32)
  f = tj.jit(lambda a, b: tnp.tanh(a @ b) + 1.0)
  (program,) = [p for p in f.lower(a, b)._compiled.schedule.programs if p.name in forced]
  pending = program.pending
  assert pending is not None and pending.thread is None and f"@{gemm.SYMBOL}(" in program.src
  first = np.asarray(f(a, b))
  assert pending.runs == 1 and pending.thread is None and f"@{gemm.SYMBOL}(" in program.src
  cpu.wait_for_upgrades()  # (nothing started: nothing to wait for)
  assert f"@{gemm.SYMBOL}(" in program.src
  np.testing.assert_array_equal(np.asarray(f(a, b)), first)
  assert pending.thread is not None
  cpu.wait_for_upgrades()
  assert f"@{gemm.SYMBOL}(" not in program.src and program.watchers is None and program.pending is None
  np.testing.assert_array_equal(np.asarray(f(a, b)), first)
  np.testing.assert_allclose(first, np.tanh(a.astype(F64) @ b.astype(F64)) + 1, rtol=1e-5, atol=1e-5)
  # lowered and never run: `wait_for_upgrades` of its programs starts the compile
  g = tj.jit(lambda a, b: tnp.tanh(a @ b) - 1.0)
  programs = g.lower(a, b)._compiled.schedule.programs
  (other,) = [p for p in programs if p.name in forced and p is not program]
  assert other.pending is not None and other.pending.thread is None
  cpu.wait_for_upgrades(programs)
  assert f"@{gemm.SYMBOL}(" not in other.src and other.watchers is None
  realize._memory_cache.clear()


@pytest.mark.parametrize("m,k,n", [(512, 784, 512), (12, 128, 40), (10, 512, 16), (37, 1500, 48), (24, 2000, 64),
                                   (500, 130, 24), (60, 5000, 16), (20000, 128, 64)])
def test_tiers_agree_bit_for_bit(monkeypatch, on_cpu, m, k, n):
  """The first tier sums in the order of the kernel's own loops (float32 blocks of the same length, added up in
  float32 or float64 by the same rule), so a program's results don't change when its own loops are swapped in: plain
  and packed tiles, launched over rows or column tiles, K-blocked row groups (K = 5000: two groups of 30 rows, which
  two threads share evenly, so the sum does not split, lower/split.py) and blocks of column tiles beside a big row
  operand (20000 x 128). Lowered for 2 threads."""
  monkeypatch.setattr(realize, "cpu_threads", lambda: 2)
  rng = np.random.default_rng(k)
  a, b, c = rng.standard_normal((m, k)).astype(F32), rng.standard_normal((k, n)).astype(F32), \
      rng.standard_normal(n).astype(F32)
  first, own = both_tiers(monkeypatch, lambda a, b, c: tnp.tanh(a @ b + c), a, b, c)
  np.testing.assert_array_equal(first, own)


@pytest.mark.parametrize("n", [40, 64])
def test_library_epilogue_runs_on_vectors(first_tier, n):
  """A library call's epilogue (a GELU after the product, from the library's array of products) computes and stores
  a vector register's columns at a time (llvm.py `library_epilogue_lanes`), the columns past the last whole vector
  one at a time, so that its unoptimised build is vector code; against numpy in float64."""
  from tinyjax.codegen.opt import tile_geometry
  rng = np.random.default_rng(n)
  a, b, c = rng.standard_normal((96, 128)).astype(F32), rng.standard_normal((128, n)).astype(F32) * 0.2, \
      rng.standard_normal(n).astype(F32)
  f = tj.jit(lambda a, b, c: tj.nn.gelu(a @ b + c))
  (library,) = [source for source in sources(f, a, b, c) if f"call void @{gemm.SYMBOL}(" in source]
  lanes = tile_geometry().vector_bytes // 4
  assert f"load <{lanes} x float>" in library and f"fmul <{lanes} x float>" in library
  assert ("load float, ptr" in library.split(f"@{gemm.SYMBOL}(")[-1]) == (n % lanes != 0)  # (the columns left over)
  x = a.astype(F64) @ b.astype(F64) + c
  want = 0.5 * x * (1 + np.tanh(np.sqrt(2 / np.pi) * (x + 0.044715 * x ** 3)))
  np.testing.assert_allclose(np.asarray(f(a, b, c)), want, rtol=1e-5, atol=1e-5)


def test_batched_products_tier_too(monkeypatch, on_cpu):
  """A batched product (ranges outside the row: batch and heads, attention's q @ k^T and its weights @ v) calls the
  library once per batch value and column tile; its values equal its own loops' bit for bit, and numpy's."""
  rng = np.random.default_rng(5)
  q, k, v = (rng.standard_normal((2, 2, 128, 128)).astype(F32) for _ in range(3))

  def attention(q, k, v):
    weights = tj.nn.softmax(tnp.einsum("bhtd,bhsd->bhts", q, k) / np.sqrt(128), axis=-1)
    return tnp.einsum("bhts,bhsd->bhtd", weights, v)
  results = both_tiers(monkeypatch, attention, q, k, v)
  np.testing.assert_array_equal(*results)
  scores = np.einsum("bhtd,bhsd->bhts", q.astype(F64), k.astype(F64)) / np.sqrt(128)
  weights = np.exp(scores - scores.max(-1, keepdims=True))
  weights /= weights.sum(-1, keepdims=True)
  np.testing.assert_allclose(results[0], np.einsum("bhts,bhsd->bhtd", weights, v.astype(F64)), rtol=1e-4, atol=1e-5)
