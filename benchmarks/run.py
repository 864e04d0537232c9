"""tinyjax's speed suite: figures and ratios against numpy, taken in one process (never asserted anywhere).

    python benchmarks/run.py            # all
    python benchmarks/run.py matmul     # the ones whose name contains "matmul"
"""
from __future__ import annotations

import os
import sys
import tempfile
import time

import numpy as np

os.environ.setdefault("TINYJAX_CACHE_DIR", tempfile.mkdtemp(prefix="tinyjax-bench-"))  # cold cache for compile times
# this checkout's tinyjax, not an installed one (another worktree's editable install measured instead, unnoticed)
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import tinyjax.numpy as tnp  # noqa: E402
from tinyjax.devices import cache_stats  # noqa: E402


def best_of(fn, repeat: int = 7, min_time: float = 0.2) -> float:
  """Best time of `fn()` in seconds over `repeat` rounds, each looping for at least `min_time`/repeat."""
  fn()
  best = float("inf")
  for _ in range(repeat):
    count, start = 0, time.perf_counter()
    while True:
      fn()
      count += 1
      elapsed = time.perf_counter() - start
      if elapsed >= min_time / repeat: break
    best = min(best, elapsed / count)
  return best


def report(name: str, figure: str, ratio: float | None = None, goal: str = "") -> None:
  ratio_text = f"{ratio:6.2f}x" if ratio is not None else "       "
  print(f"{name:42s} {figure:>28s}  {ratio_text}  {goal}")


def bench_elementwise_chain():
  host = np.random.default_rng(0).standard_normal(16 * 1024 * 1024).astype(np.float32)
  x = tnp.asarray(host)
  def with_numpy(): return ((host * 2 + 1) * host - 3) * 0.5
  def with_tinyjax(): return (((x * 2 + 1) * x - 3) * 0.5).block_until_ready()
  np.testing.assert_allclose(np.asarray(with_tinyjax()), with_numpy(), rtol=1e-6)
  ours, theirs = best_of(with_tinyjax), best_of(with_numpy)
  report("fused 5-op chain, 16M float32", f"{ours * 1e3:.2f} ms vs numpy {theirs * 1e3:.2f} ms", theirs / ours,
         "goal >= 3x numpy")


def _bench_unary(names: tuple, dtype, n: int, rtol: float, goal: str) -> None:
  """Each function of `names` ((name, low, high): inputs uniform in [low, high)) over n values of `dtype`, jitted,
  against numpy's."""
  import tinyjax
  rng = np.random.default_rng(0)
  for name, low, high in names:
    host = rng.uniform(low, high, n).astype(dtype)
    x = tnp.asarray(host)
    numpy_fn, tinyjax_fn = getattr(np, name), tinyjax.jit(getattr(tnp, name))
    def with_numpy(): return numpy_fn(host)
    def with_tinyjax(): return tinyjax_fn(x).block_until_ready()
    np.testing.assert_allclose(np.asarray(with_tinyjax()), with_numpy(), rtol=rtol, atol=rtol)
    ours, theirs = best_of(with_tinyjax), best_of(with_numpy)
    report(f"{name}, {n // (1024 * 1024)}M {np.dtype(dtype).name}", f"{ours * 1e3:.2f} ms vs numpy "
           f"{theirs * 1e3:.2f} ms", theirs / ours, goal)


def bench_transcendental():
  _bench_unary((("exp", -20.0, 20.0), ("sin", -100.0, 100.0), ("log", 1e-3, 1e3)), np.float32, 16 * 1024 * 1024,
               1e-6, "goal >= 1x numpy")


def bench_transcendental_f64():
  import tinyjax
  with tinyjax.config.override("jax_enable_x64", True):
    _bench_unary((("exp", -20.0, 20.0), ("log", 1e-3, 1e3), ("sin", -100.0, 100.0), ("cos", -100.0, 100.0),
                  ("tanh", -5.0, 5.0)), np.float64, 4 * 1024 * 1024, 1e-15, "vectorised, no libm calls")


def bench_sum_axis():
  host = np.random.default_rng(0).standard_normal((4096, 4096)).astype(np.float32)
  x = tnp.asarray(host)
  for axis in (1, 0, None):  # rows, columns, everything (a reduction split into partial sums on the cores)
    def with_numpy(): return host.sum(axis=axis)
    def with_tinyjax(): return x.sum(axis=axis).block_until_ready()
    np.testing.assert_allclose(np.asarray(with_tinyjax()), with_numpy(), rtol=2e-4, atol=1e-3)
    ours, theirs = best_of(with_tinyjax), best_of(with_numpy)
    report(f"sum({'' if axis is None else f'axis={axis}'}) of 4096x4096 float32",
           f"{ours * 1e3:.2f} ms vs numpy {theirs * 1e3:.2f} ms", theirs / ours, "goal >= 1x numpy")


def bench_matmul():
  rng = np.random.default_rng(0)
  a_host, b_host = (rng.standard_normal((1024, 1024)).astype(np.float32) for _ in range(2))
  a, b = tnp.asarray(a_host), tnp.asarray(b_host)
  def with_numpy(): return a_host @ b_host
  def with_tinyjax(): return (a @ b).block_until_ready()
  np.testing.assert_allclose(np.asarray(with_tinyjax()), with_numpy(), rtol=1e-3, atol=1e-3)
  ours, theirs = best_of(with_tinyjax, repeat=3, min_time=1.0), best_of(with_numpy, repeat=3)
  flops = 2 * 1024 ** 3
  report("matmul 1024x1024 float32", f"{flops / ours / 1e9:.1f} vs numpy {flops / theirs / 1e9:.1f} GFLOP/s",
         theirs / ours, "goal >= 0.3x numpy")


def bench_first_call_compile():
  host = np.arange(1000, dtype=np.float32)
  x = tnp.asarray(host)
  (x + 1).block_until_ready()  # load the runtime module first: it is compiled once per machine, not per kernel
  before = cache_stats()
  start = time.perf_counter()
  (tnp.sin(x) * 3.25 + x * x - 0.75).block_until_ready()  # a new kernel: lowered, rendered, compiled
  first = time.perf_counter() - start
  after = cache_stats()
  steady = best_of(lambda: (tnp.sin(x) * 3.25 + x * x - 0.75).block_until_ready())
  report("first call of a new fused kernel", f"{first * 1e3:.1f} ms (then {steady * 1e6:.0f} us)", None,
         f"goal < 50 ms; compiles={after['misses'] - before['misses']}")


def bench_eager_dispatch():
  x = tnp.asarray(np.ones(8, np.float32))
  step = best_of(lambda: (x + 1).block_until_ready())
  report("eager x + 1 on float32[8], cached", f"{step * 1e6:.1f} us per op", None, "")


def bench_jit_dispatch():
  import tinyjax
  f = tinyjax.jit(lambda x: x + 1)
  x = tnp.asarray(np.ones(8, np.float32))
  f(x).block_until_ready()  # trace, lower and compile once: what follows are cache hits
  step = best_of(lambda: f(x), repeat=15, min_time=0.5)
  report("jit(x + 1) on float32[8], cache hit", f"{step * 1e6:.1f} us per call", None,
         "goal < 10 us (JAX 0.10.2: 4.9 us on this machine)")


def bench_embedding_gather():
  import tinyjax
  rng = np.random.default_rng(0)
  table_host = rng.standard_normal((50_000, 512)).astype(np.float32)
  ids_host = rng.integers(0, 50_000, 4096).astype(np.int32)
  updates_host = rng.standard_normal((4096, 512)).astype(np.float32)
  table, ids, updates = tnp.asarray(table_host), tnp.asarray(ids_host), tnp.asarray(updates_host)
  lookup = tinyjax.jit(lambda t, i: t[i])
  np.testing.assert_array_equal(np.asarray(lookup(table, ids)), table_host[ids_host])
  ours, theirs = best_of(lambda: lookup(table, ids).block_until_ready()), best_of(lambda: table_host[ids_host])
  report("embedding gather 4096 x 512 from 50k rows", f"{ours * 1e3:.3f} ms vs numpy {theirs * 1e3:.3f} ms",
         theirs / ours, "goal >= 1x numpy fancy indexing")
  accumulate = tinyjax.jit(lambda t, i, u: t.at[i].add(u))

  def with_numpy():
    result = table_host.copy()
    np.add.at(result, ids_host, updates_host)
    return result
  np.testing.assert_allclose(np.asarray(accumulate(table, ids, updates)), with_numpy(), rtol=1e-6, atol=1e-6)
  ours, theirs = best_of(lambda: accumulate(table, ids, updates).block_until_ready()), best_of(with_numpy)
  report("scatter-add 4096 x 512 rows into 50k", f"{ours * 1e3:.2f} ms vs numpy {theirs * 1e3:.2f} ms", theirs / ours,
         "numpy: copy + np.add.at")


def bench_scan_rnn():
  import tinyjax
  from tinyjax import lax
  rng = np.random.default_rng(0)
  w = tnp.asarray(rng.standard_normal((64, 64)).astype(np.float32) * 0.1)
  xs = tnp.asarray(rng.standard_normal((1000, 64)).astype(np.float32))
  h0 = tnp.zeros(64)

  def step(h, x): return tnp.tanh(h @ w + x)
  scanned = tinyjax.jit(lambda h, xs: lax.scan(lambda h, x: (step(h, x), None), h, xs)[0])
  jitted_step = tinyjax.jit(step)

  def python_loop():
    h = h0
    for t in range(1000): h = jitted_step(h, xs[t])
    return h.block_until_ready()
  np.testing.assert_allclose(np.asarray(scanned(h0, xs)), np.asarray(python_loop()), rtol=1e-4, atol=1e-5)
  ours, loop = best_of(lambda: scanned(h0, xs).block_until_ready(), repeat=5), best_of(python_loop, repeat=3)
  report("jit(scan) 1000 RNN steps, 64 wide", f"{ours * 1e3:.2f} ms vs Python loop {loop * 1e3:.1f} ms", loop / ours,
         "goal >= 20x a Python loop of jitted steps")


def bench_random_normal():
  import tinyjax
  n = 16 * 1024 * 1024
  key = tinyjax.random.PRNGKey(0)
  sample = tinyjax.jit(lambda k: tinyjax.random.normal(k, (n,)))
  generator = np.random.default_rng(0)
  ours = best_of(lambda: sample(key).block_until_ready(), repeat=5)
  theirs = best_of(lambda: generator.standard_normal(n, dtype=np.float32), repeat=5)
  report("random.normal 16M float32", f"{n * 4 / ours / 1e9:.2f} GB/s vs numpy {n * 4 / theirs / 1e9:.2f} GB/s",
         theirs / ours, "numpy: default_rng().standard_normal")


def bench_conv():
  import tinyjax
  from tinyjax import lax
  rng = np.random.default_rng(0)
  x_host = rng.standard_normal((32, 64, 56, 56)).astype(np.float32)
  w_host = (rng.standard_normal((64, 64, 3, 3)) * 0.1).astype(np.float32)
  x, w = tnp.asarray(x_host), tnp.asarray(w_host)
  # (the output gradient a random one, as in training: `.sum()`'s all-ones gradient lets dx skip its product)
  g = tnp.asarray(rng.standard_normal((32, 64, 56, 56)).astype(np.float32))
  flops = 2 * 32 * 64 * 56 * 56 * 64 * 9
  forward = tinyjax.jit(lambda x, w: lax.conv_general_dilated(x, w, (1, 1), "SAME"))
  backward = tinyjax.jit(tinyjax.grad(lambda x, w, g: (lax.conv_general_dilated(x, w, (1, 1), "SAME") * g).sum(),
                                      argnums=(0, 1)))

  def with_numpy():  # im2col + one contraction (BLAS)
    padded = np.pad(x_host, ((0, 0), (0, 0), (1, 1), (1, 1)))
    columns = np.lib.stride_tricks.sliding_window_view(padded, (3, 3), axis=(2, 3))
    return np.einsum("nchwij,ocij->nohw", columns, w_host, optimize=True)
  ours = best_of(lambda: forward(x, w).block_until_ready(), repeat=3)
  ours_backward = best_of(lambda: [gradient.block_until_ready() for gradient in backward(x, w, g)], repeat=3)
  theirs = best_of(with_numpy, repeat=3)
  report("conv 3x3 32x64x56x56 -> 64, SAME, forward", f"{flops / ours / 1e9:.1f} vs numpy {flops / theirs / 1e9:.1f} "
         "GFLOP/s", theirs / ours, "goal >= 1x numpy im2col + matmul")
  report("conv 3x3 backward (dx and dw)", f"{2 * flops / ours_backward / 1e9:.1f} GFLOP/s",
         2 * theirs / ours_backward, "ratio vs 2 numpy forward convs")


def bench_conv_layouts():
  """1x1 and 3x3 convolutions of 32x56x56x64 into 64 channels in both layouts, forward and backward (dx and dw, a
  random output gradient), as fractions of this machine's measured FMA peak (the issue's goal: >= 70%)."""
  import tinyjax
  from tinyjax import lax
  from tinyjax.profiler import limits_for
  rng = np.random.default_rng(0)
  for layout, size in (("NHWC", 3), ("NHWC", 1), ("NCHW", 3), ("NCHW", 1)):
    numbers = ("NHWC", "HWIO", "NHWC") if layout == "NHWC" else ("NCHW", "OIHW", "NCHW")
    shape = (32, 56, 56, 64) if layout == "NHWC" else (32, 64, 56, 56)
    kernel = (size, size, 64, 64) if layout == "NHWC" else (64, 64, size, size)
    x, g = (tnp.asarray(rng.standard_normal(shape).astype(np.float32)) for _ in range(2))
    w = tnp.asarray((rng.standard_normal(kernel) / (8 * size)).astype(np.float32))

    def conv(x, w): return lax.conv_general_dilated(x, w, (1, 1), "SAME", dimension_numbers=numbers)
    forward = tinyjax.jit(conv)
    backward = tinyjax.jit(tinyjax.grad(lambda x, w, g: (conv(x, w) * g).sum(), argnums=(0, 1)))
    flops = 2 * 32 * 56 * 56 * 64 * 64 * size * size
    # (best of 10: on a shared 2-core VM a run of 3 read anywhere from 42% to 65% for the same kernels)
    ours = best_of(lambda: forward(x, w).block_until_ready(), repeat=10)
    ours_backward = best_of(lambda: [d.block_until_ready() for d in backward(x, w, g)], repeat=10)
    # (this script's cache is a fresh directory, so the peak is measured in this process: measured again, and the
    # larger kept, where a convolution ran above it, as DEBUG's roofline does; one taken while another process used a
    # core read 270 GFLOP/s on a 523 GFLOP/s machine)
    peak = limits_for(max(flops / ours, 2 * flops / ours_backward)).flops
    report(f"conv {size}x{size} {layout} 32x56x56x64 -> 64", f"fwd {flops / ours / peak:.0%}, bwd "
           f"{2 * flops / ours_backward / peak:.0%} of peak", None,
           f"{flops / ours / 1e9:.0f} / {2 * flops / ours_backward / 1e9:.0f} GFLOP/s")


def bench_checkpoint():
  import tempfile

  import safetensors.numpy

  from tinyjax.nn import state
  rng = np.random.default_rng(0)
  host = {f"layer{i}": {"w": rng.standard_normal((1024, 1024)).astype(np.float32),
                        "b": rng.standard_normal(1024).astype(np.float32)} for i in range(24)}  # ~100 MB
  tree = {k: {n: tnp.asarray(v) for n, v in layer.items()} for k, layer in host.items()}
  flat = {f"{k}/{n}": v for k, layer in host.items() for n, v in layer.items()}
  megabytes = sum(v.nbytes for v in flat.values()) / 1e6
  with tempfile.TemporaryDirectory() as directory:
    ours, theirs = f"{directory}/ours.safetensors", f"{directory}/theirs.safetensors"
    save = best_of(lambda: state.save(ours, tree), repeat=3)
    save_ref = best_of(lambda: safetensors.numpy.save_file(flat, theirs), repeat=3)
    load = best_of(lambda: state.load(ours, like=tree), repeat=3)
    load_ref = best_of(lambda: safetensors.numpy.load_file(theirs), repeat=3)
  report("checkpoint save, 100 MB (fsync'd)", f"{megabytes / save:.0f} vs {megabytes / save_ref:.0f} MB/s",
         save_ref / save, "safetensors.numpy.save_file (no fsync)")
  report("checkpoint load, 100 MB (checked)", f"{megabytes / load:.0f} vs {megabytes / load_ref:.0f} MB/s",
         load_ref / load, "safetensors.numpy.load_file")


def bench_psum():
  """psum over N CPU devices (shard_map), each holding 64 MB of float32: read N x 64 MB, write 64 MB, against a numpy
  copy of the 64 MB (read + write)."""
  import tinyjax
  from tinyjax import lax
  from tinyjax.sharding import NamedSharding, PartitionSpec as P
  shard = 16 * 1024 * 1024
  host = np.random.default_rng(0).standard_normal(shard).astype(np.float32)
  copy = np.empty_like(host)
  theirs = best_of(lambda: np.copyto(copy, host), repeat=5)
  for devices in (4, 8):
    tinyjax.config.update("jax_num_cpu_devices", devices)
    mesh = tinyjax.make_mesh((devices,), ("i",))
    x = tinyjax.device_put(np.tile(host, devices), NamedSharding(mesh, P("i")))
    total = tinyjax.jit(tinyjax.shard_map(lambda v: lax.psum(v, "i"), mesh=mesh, in_specs=P("i"), out_specs=P()))
    np.testing.assert_allclose(np.asarray(total(x))[:4], host[:4] * devices, rtol=1e-6)
    ours = best_of(lambda: total(x).block_until_ready(), repeat=5)
    moved = (devices + 1) * shard * 4
    report(f"psum of 64 MB over {devices} CPU devices", f"{moved / ours / 1e9:.1f} GB/s vs numpy copy "
           f"{2 * shard * 4 / theirs / 1e9:.1f} GB/s", (moved / ours) / (2 * shard * 4 / theirs),
           "bytes read + written per second")
  tinyjax.config.update("jax_num_cpu_devices", -1)


def bench_linalg():
  """The LAPACK-backed linalg of a 512x512 float32 matrix (jitted: one host step each, plus the fused work around it)
  against numpy.linalg, which calls the same OpenBLAS; and the batched case, 4096 3x3 inverses in one call."""
  import tinyjax
  rng = np.random.default_rng(0)
  a_host = rng.standard_normal((512, 512)).astype(np.float32)
  spd_host = (a_host @ a_host.T / 512 + np.eye(512, dtype=np.float32)).astype(np.float32)
  b_host = rng.standard_normal((512, 8)).astype(np.float32)
  a, spd, b = tnp.asarray(a_host), tnp.asarray(spd_host), tnp.asarray(b_host)
  cases = [
    ("svd", lambda x: tnp.linalg.svd(x), lambda: np.linalg.svd(a_host), a),
    ("eigh", lambda x: tnp.linalg.eigh(x), lambda: np.linalg.eigh(spd_host), spd),
    ("cholesky", lambda x: tnp.linalg.cholesky(x), lambda: np.linalg.cholesky(spd_host), spd),
    ("solve (8 right-hand sides)", lambda x: tnp.linalg.solve(x, b), lambda: np.linalg.solve(a_host, b_host), a),
    ("inv", lambda x: tnp.linalg.inv(x), lambda: np.linalg.inv(a_host), a),
    ("det", lambda x: tnp.linalg.det(x), lambda: np.linalg.det(a_host), a),
  ]
  for name, ours_fn, numpy_fn, operand in cases:
    jitted = tinyjax.jit(ours_fn)
    def with_tinyjax(): return tinyjax.block_until_ready(jitted(operand))
    ours, theirs = best_of(with_tinyjax, repeat=3, min_time=0.6), best_of(numpy_fn, repeat=3, min_time=0.6)
    report(f"linalg.{name} 512x512 float32", f"{ours * 1e3:.2f} vs numpy {theirs * 1e3:.2f} ms", theirs / ours)
  small_host = rng.standard_normal((4096, 3, 3)).astype(np.float32)
  small = tnp.asarray(small_host)
  jitted = tinyjax.jit(tnp.linalg.inv)
  ours = best_of(lambda: jitted(small).block_until_ready(), repeat=3, min_time=0.6)
  theirs = best_of(lambda: np.linalg.inv(small_host), repeat=3, min_time=0.6)
  report("linalg.inv of 4096 3x3 float32", f"{ours * 1e3:.2f} vs numpy {theirs * 1e3:.2f} ms", theirs / ours)


def bench_fft():
  """jnp.fft.fft of 2^20 complex64 (jitted) against numpy.fft (pocketfft, which computes in complex128), and the
  relative error of each against a float64 transform."""
  import tinyjax
  rng = np.random.default_rng(0)
  n = 1 << 20
  host = (rng.standard_normal(n) + 1j * rng.standard_normal(n)).astype(np.complex64)
  exact = np.fft.fft(host.astype(np.complex128))
  signal = tnp.asarray(host)
  transform = tinyjax.jit(tnp.fft.fft)
  error = np.abs(np.asarray(transform(signal)) - exact).max() / np.abs(exact).max()
  ours = best_of(lambda: transform(signal).block_until_ready(), repeat=3, min_time=1.0)
  theirs = best_of(lambda: np.fft.fft(host), repeat=3, min_time=1.0)
  report("fft of 2^20 complex64", f"{ours * 1e3:.1f} vs numpy {theirs * 1e3:.1f} ms", theirs / ours,
         f"max relative error {error:.1e}")
  # rows of a power-of-two length (the compiled kernel, lax/_fft.py): rfft (a complex transform of half the length)
  rows = rng.standard_normal((256, 1024)).astype(np.float32)
  real = tinyjax.jit(tnp.fft.rfft)
  device_rows = tnp.asarray(rows)
  ours = best_of(lambda: real(device_rows).block_until_ready(), repeat=5, min_time=0.5)
  theirs = best_of(lambda: np.fft.rfft(rows), repeat=5, min_time=0.5)
  report("rfft of 256 x 1024 float32", f"{ours * 1e3:.2f} vs numpy {theirs * 1e3:.2f} ms", theirs / ours,
         "JAX 0.10.2: 0.26-0.35 ms on this machine")
  # other lengths (the mixed-radix kernel): fft and rfft of rows of 1000 = 2^3 5^3 and 3000 = 2^3 3 5^3
  for n in (1000, 3000):
    rows = rng.standard_normal((262144 // n, n)).astype(np.float32)
    signals = (rows + 1j * rng.standard_normal(rows.shape)).astype(np.complex64)
    for name, ours_fn, theirs_fn, host_in in (("fft", tnp.fft.fft, np.fft.fft, signals),
                                              ("rfft", tnp.fft.rfft, np.fft.rfft, rows)):
      transform, device_in = tinyjax.jit(ours_fn), tnp.asarray(host_in)
      error = _relative_error(transform(device_in), theirs_fn(host_in.astype(np.complex128 if name == "fft" else
                                                                              np.float64)))
      ours = best_of(lambda: transform(device_in).block_until_ready(), repeat=5, min_time=0.5)
      theirs = best_of(lambda: theirs_fn(host_in), repeat=5, min_time=0.5)
      report(f"{name} of {rows.shape[0]} x {n}", f"{ours * 1e3:.2f} vs numpy {theirs * 1e3:.2f} ms", theirs / ours,
             f"max relative error {error:.1e}")


def _relative_error(got, want) -> float:
  return float(np.abs(np.asarray(got) - want).max() / np.abs(want).max())


BENCHMARKS = [bench_first_call_compile, bench_elementwise_chain, bench_transcendental, bench_transcendental_f64,
              bench_sum_axis, bench_matmul,
              bench_eager_dispatch, bench_jit_dispatch, bench_embedding_gather, bench_scan_rnn,
              bench_random_normal, bench_conv, bench_conv_layouts, bench_checkpoint, bench_psum, bench_linalg,
              bench_fft]

if __name__ == "__main__":
  wanted = sys.argv[1:]
  print(f"tinyjax benchmarks on {os.cpu_count()} cores; ratio = numpy time / tinyjax time (higher is better)")
  for bench in BENCHMARKS:
    if not wanted or any(w in bench.__name__ for w in wanted): bench()
