"""tinyjax against JAX and numpy: each library in fresh processes, interleaved, the median of repeats (never asserted).

    python benchmarks/suite.py                                    # every workload, tinyjax and numpy
    python benchmarks/suite.py --jax-python jaxvenv/bin/python    # and JAX, from a virtualenv that has it
    python benchmarks/suite.py matmul1024 softmax --repeats 5 --json out.json
    python benchmarks/suite.py --quick dispatch elementwise       # shorter timing loops, one repeat: while developing

Each workload is written once against a module pair `(jax, jnp)`: in a child process that is `(tinyjax,
tinyjax.numpy)`, `(jax, jax.numpy)`, or for the workloads numpy can run, `numpy` behind a shim whose `jit` is the
identity. The parent spawns `suite.py --child LIBRARY WORKLOAD` for each library in turn, `--repeats` times (tinyjax,
JAX, numpy, tinyjax, JAX, numpy, ...), so that the machine's noise hits all alike; a child warms up (compiles), times
rounds of `time.perf_counter` loops that block on every result, and prints one JSON line: the median seconds per call,
the rounds, a checksum of its first results and its library's version. The parent prints a table (the median over the
repeats of each child's median; ratios are JAX time / tinyjax time and numpy time / tinyjax time, above 1 when tinyjax
is faster; compute-bound rows give the fraction of the machine's float32 FMA peak, the training steps counting their
layers' multiply-adds, bandwidth-bound ones the fraction of its copy bandwidth counting input + output bytes, both
from `tinyjax.machine_limits()`, and above 100% where a kernel streams faster than the copy probe did), warns where a
checksum differs from JAX's or numpy's (rtol 1e-3), and with `--json` writes everything: limits, versions, samples.

tinyjax children share one compile cache (`TINYJAX_CACHE_DIR`, a temporary directory of the run) except the cold-start
workloads: `cold_first_call` gets an empty cache each time (JAX: its persistent cache off), `warm_first_call` a cache
filled by one earlier process (JAX: its persistent compilation cache in a temporary directory). `import` times the
import of the library alone in a fresh process. A workload that fails prints `error: ...` in its cell.
"""
from __future__ import annotations

# Only the standard library at the top: a child times `import tinyjax` / `import jax` before anything else is imported.
import argparse
import json
import math
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
import types
from dataclasses import dataclass
from typing import Any, Callable

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LIBRARIES = ("tinyjax", "jax", "numpy")
CHILD_TIMEOUT_S = 900

# sizes
ELEMENTWISE_SIZE = 16 * 1024 * 1024
ROWS, COLUMNS = 8192, 1024  # sums, softmax, layernorm
MLP_SIZES, MLP_BATCH = (784, 512, 512, 10), 512
CNN_BATCH = 128
# transformer_step: batch, sequence, width, heads, layers (a pre-norm causal decoder, 10 classes per position)
TRANSFORMER = {"batch": 8, "steps": 128, "width": 256, "heads": 4, "layers": 2}
LM = {"vocab": 2000, "batch": 32, "steps": 64, "width": 128, "heads": 4, "layers": 1}
VMAP_SIZES, VMAP_BATCH = (784, 256, 10), 128
SCAN_STEPS, SCAN_WIDTH = 1000, 64
ADAM = {"b1": 0.9, "b2": 0.999, "eps": 1e-8, "learning_rate": 1e-3}


# ---- the workloads, each written once against (jax, jnp)

@dataclass
class Bench:
  """One workload in one library: `call()` runs it once and returns its result (the harness blocks on it);
  `checksum(first, second)` turns the first two results into a few floats to compare across libraries."""
  call: Callable[[], Any]
  checksum: Callable[[Any, Any], list[float]]


def _rng(seed: int = 0):
  import numpy as np
  return np.random.default_rng(seed)


def _normal(shape, scale: float = 1.0, seed: int = 0):
  import numpy as np
  return (_rng(seed).standard_normal(shape) * scale).astype(np.float32)


def _sums(tree) -> list[float]:
  """The float64 sums of |x| and of x**2 over the leaves of a tree of arrays (lists, tuples and dicts)."""
  import numpy as np

  def leaves(tree):
    if isinstance(tree, dict): return [leaf for key in sorted(tree) for leaf in leaves(tree[key])]
    if isinstance(tree, (list, tuple)): return [leaf for item in tree for leaf in leaves(item)]
    array = np.asarray(tree)  # (a complex array: its parts)
    return [array.astype(np.complex128).view(np.float64) if np.iscomplexobj(array) else array.astype(np.float64)]
  arrays = leaves(tree)
  return [float(sum(np.abs(leaf).sum() for leaf in arrays)), float(sum((leaf ** 2).sum() for leaf in arrays))]


def _jitted(jax, jnp, fn, *host_inputs) -> Bench:
  """A pure function of arrays made from numpy inputs, under jit; the checksum sums |result| and result**2."""
  step, inputs = jax.jit(fn), [jnp.asarray(h) for h in host_inputs]
  return Bench(lambda: step(*inputs), lambda first, second: _sums(first))


def bench_dispatch(jax, jnp):
  import numpy as np
  step, x = jax.jit(lambda x: x + 1), jnp.asarray(np.ones(8, np.float32))
  return Bench(lambda: step(x), lambda first, second: _sums(first))


EAGER_CHAIN = 100  # steps of `x * 1.0001 + 0.5`: 2 eager ops each


def bench_eager_chain(jax, jnp):
  """Eager mode: a chain of small operations, read back (per op: the time / (2 * EAGER_CHAIN))."""
  import numpy as np
  x = jnp.asarray(np.ones(8, np.float32))

  def call():
    y = x
    for _ in range(EAGER_CHAIN): y = y * 1.0001 + 0.5
    return np.asarray(y)
  return Bench(call, lambda first, second: _sums(first))


def bench_eager_read(jax, jnp):
  """Eager mode: a few small operations read back at once as a Python float (a loss printed every step)."""
  import numpy as np
  x = jnp.asarray(np.linspace(0.125, 1, 8, dtype=np.float32))  # (a sum away from 0: the checksums compare relatively)
  return Bench(lambda: float(jnp.sum(jnp.sin(x) * 2.0 + x)), lambda first, second: [first])


def bench_eager_program(jax, jnp):
  """Eager mode: one program of big operations, read back as a Python float."""
  a = jnp.asarray(_normal((512, 512), scale=0.05))
  return Bench(lambda: float(jnp.tanh(a @ a).sum()), lambda first, second: [first])


def bench_elementwise(jax, jnp):
  return _jitted(jax, jnp, lambda x: ((x * 2 + 1) * x - 3) * 0.5, _normal(ELEMENTWISE_SIZE))


def bench_sum_rows(jax, jnp):
  return _jitted(jax, jnp, lambda x: x.sum(axis=1), _normal((ROWS, COLUMNS)))


def bench_sum_cols(jax, jnp):
  return _jitted(jax, jnp, lambda x: x.sum(axis=0), _normal((ROWS, COLUMNS)))


def bench_softmax(jax, jnp):
  return _jitted(jax, jnp, lambda x: jax.nn.softmax(x, axis=-1), _normal((ROWS, COLUMNS)))


def bench_layernorm(jax, jnp):
  def layernorm(x, g, b):
    mean = x.mean(axis=-1, keepdims=True)
    variance = ((x - mean) ** 2).mean(axis=-1, keepdims=True)
    return (x - mean) / jnp.sqrt(variance + 1e-5) * g + b
  return _jitted(jax, jnp, layernorm, _normal((ROWS, COLUMNS)), _normal(COLUMNS, seed=1), _normal(COLUMNS, seed=2))


def bench_matmul(n: int):
  def bench(jax, jnp): return _jitted(jax, jnp, lambda a, b: a @ b, _normal((n, n)), _normal((n, n), seed=1))
  return bench


def bench_matmul_bf16(jax, jnp):
  """bfloat16 operands, float32 sums and result (mixed-precision training's products)."""
  import ml_dtypes
  a, b = (_normal((1024, 1024), seed=seed).astype(ml_dtypes.bfloat16) for seed in (0, 1))
  return _jitted(jax, jnp, lambda a, b: jnp.matmul(a, b, preferred_element_type=jnp.float32), a, b)


DECODE_ROWS, DECODE_WIDTH = 8, 4096


def bench_matmul_decode(jax, jnp):
  """A small-batch decode step's product: a few activations through a weight matrix too big for the caches (64 MB),
  which every call reads from memory."""
  return _jitted(jax, jnp, lambda x, w: x @ w, _normal((DECODE_ROWS, DECODE_WIDTH)),
                 _normal((DECODE_WIDTH, DECODE_WIDTH), seed=1))


def adam_update(jax, jnp, params, grads, m, v, count):
  """Adam by hand: `count` is the step number (1, 2, ...) as a float32 array, threaded through the training loop."""
  b1, b2, eps, learning_rate = ADAM["b1"], ADAM["b2"], ADAM["eps"], ADAM["learning_rate"]
  m = jax.tree.map(lambda m, g: b1 * m + (1 - b1) * g, m, grads)
  v = jax.tree.map(lambda v, g: b2 * v + (1 - b2) * g * g, v, grads)
  m_scale, v_scale = 1 / (1 - b1 ** count), 1 / (1 - b2 ** count)
  params = jax.tree.map(lambda p, m, v: p - learning_rate * (m * m_scale) / (jnp.sqrt(v * v_scale) + eps), params, m, v)
  return params, m, v


def _dense(n_in: int, n_out: int, seed: int):
  import numpy as np
  return {"w": _normal((n_in, n_out), 1 / math.sqrt(n_in), seed), "b": np.zeros(n_out, np.float32)}


def _mlp_apply(jax, params, x):
  for layer in params[:-1]: x = jax.nn.relu(x @ layer["w"] + layer["b"])
  return x @ params[-1]["w"] + params[-1]["b"]


def _cnn_apply(jax, params, x):
  for layer in params[:2]:
    x = jax.lax.conv_general_dilated(x, layer["w"], (1, 1), "SAME", dimension_numbers=("NHWC", "HWIO", "NHWC"))
    x = jax.nn.relu(x + layer["b"])
    x = jax.lax.reduce_window(x, -float("inf"), jax.lax.max, (1, 2, 2, 1), (1, 2, 2, 1), "VALID")
  x = jax.nn.relu(x.reshape(x.shape[0], -1) @ params[2]["w"] + params[2]["b"])
  return x @ params[3]["w"] + params[3]["b"]


def _layer_norm(jax, x, gain, bias):
  mean = x.mean(axis=-1, keepdims=True)
  variance = ((x - mean) ** 2).mean(axis=-1, keepdims=True)
  return (x - mean) * jax.lax.rsqrt(variance + 1e-5) * gain + bias


def _transformer_apply(jax, params, x):
  """Pre-norm decoder blocks: causal multi-head attention with the heads split from and merged back into the
  width, then a GELU MLP; a linear head."""
  return _blocks(jax, params[:-1], x, TRANSFORMER["heads"]) @ params[-1]["w"] + params[-1]["b"]


def _blocks(jax, layers, x, heads: int):
  """The decoder blocks of `_transformer_apply` over x of (batch, steps, width)."""
  import numpy as np
  jnp = jax.numpy
  batch, steps, width = x.shape
  size = width // heads
  causal = np.tril(np.ones((steps, steps), bool))
  for layer in layers:
    h = _layer_norm(jax, x, layer["ln1"], layer["ln1_b"])
    q, k, v = (part.reshape(batch, steps, heads, size).transpose(0, 2, 1, 3)
               for part in jnp.split(h @ layer["qkv"]["w"] + layer["qkv"]["b"], 3, axis=-1))
    scores = jnp.where(causal, q @ k.transpose(0, 1, 3, 2) / math.sqrt(size), -1e9)
    attended = (jax.nn.softmax(scores, axis=-1) @ v).transpose(0, 2, 1, 3).reshape(batch, steps, width)
    x = x + attended @ layer["out"]["w"] + layer["out"]["b"]
    h = _layer_norm(jax, x, layer["ln2"], layer["ln2_b"])
    x = x + jax.nn.gelu(h @ layer["up"]["w"] + layer["up"]["b"]) @ layer["down"]["w"] + layer["down"]["b"]
  return x


def _lm_apply(jax, params, tokens):
  """A language model: token and position embeddings (the tokens gathered from the table), the decoder blocks, a
  final layer norm and logits over the vocabulary by the token table itself (tied)."""
  x = params["tokens"][tokens] + params["positions"]
  x = _blocks(jax, params["blocks"], x, LM["heads"])
  return _layer_norm(jax, x, params["ln"], params["ln_b"]) @ params["tokens"].T


def _block_params(width: int, layers: int) -> list[dict]:
  """The parameters of `layers` decoder blocks of `width` (`_blocks`), as numpy arrays."""
  import numpy as np
  ones, zeros = np.ones(width, np.float32), np.zeros(width, np.float32)
  return [{"ln1": ones, "ln1_b": zeros, "ln2": ones, "ln2_b": zeros, "qkv": _dense(width, 3 * width, 4 * i),
           "out": _dense(width, width, 4 * i + 1), "up": _dense(width, 4 * width, 4 * i + 2),
           "down": _dense(4 * width, width, 4 * i + 3)} for i in range(layers)]


def transformer_problem():
  width, shape = TRANSFORMER["width"], (TRANSFORMER["batch"], TRANSFORMER["steps"])
  params = _block_params(width, TRANSFORMER["layers"]) + [_dense(width, 10, 99)]
  return _transformer_apply, params, _normal((*shape, width), seed=10), _rng(11).integers(0, 10, shape)


def lm_problem():
  import numpy as np
  width, shape = LM["width"], (LM["batch"], LM["steps"])
  params = {"tokens": _normal((LM["vocab"], width), 0.02, 20), "positions": _normal((LM["steps"], width), 0.02, 21),
            "blocks": _block_params(width, LM["layers"]), "ln": np.ones(width, np.float32),
            "ln_b": np.zeros(width, np.float32)}
  tokens = _rng(22).integers(0, LM["vocab"], (shape[0], shape[1] + 1)).astype(np.int32)
  return _lm_apply, params, tokens[:, :-1], tokens[:, 1:]


def mlp_problem():
  """Parameters, a batch of inputs and labels for MLP_SIZES, as numpy arrays."""
  params = [_dense(m, n, seed) for seed, (m, n) in enumerate(zip(MLP_SIZES[:-1], MLP_SIZES[1:]))]
  return _mlp_apply, params, _normal((MLP_BATCH, MLP_SIZES[0]), seed=10), _rng(11).integers(0, 10, MLP_BATCH)


def cnn_problem():
  import numpy as np
  conv = [{"w": _normal((3, 3, c_in, c_out), 1 / math.sqrt(9 * c_in), seed), "b": np.zeros(c_out, np.float32)}
          for seed, (c_in, c_out) in enumerate(((1, 32), (32, 64)))]
  params = conv + [_dense(7 * 7 * 64, 128, 2), _dense(128, 10, 3)]
  return _cnn_apply, params, _normal((CNN_BATCH, 28, 28, 1), seed=10), _rng(11).integers(0, 10, CNN_BATCH)


def train_step(jax, jnp, problem, devices: int = 0):
  """A jitted step (params, m, v, count, x, y) -> (params, m, v, count + 1, loss) of softmax cross-entropy and
  Adam, and its first state and batch on the device. With `devices`, data-parallel: the gradient is computed per
  shard of the batch over a mesh of that many devices (`shard_map`) and averaged (`pmean`)."""
  import numpy as np
  apply, params, x, y = problem()

  def loss_fn(params, x, y):
    logits = apply(jax, params, x)
    return -(jax.nn.log_softmax(logits) * jax.nn.one_hot(y, logits.shape[-1])).sum(axis=-1).mean()

  grads_of = jax.value_and_grad(loss_fn)
  if devices:
    Mesh, PartitionSpec = jax.sharding.Mesh, jax.sharding.PartitionSpec
    mesh = Mesh(np.array(jax.devices()[:devices]), ("data",))

    def local(params, x, y):  # the pmean'ed loss's gradient: the whole batch's, on every device (check_vma)
      return jax.value_and_grad(lambda p: jax.lax.pmean(loss_fn(p, x, y), "data"))(params)
    grads_of = jax.shard_map(local, mesh=mesh, in_specs=(PartitionSpec(), PartitionSpec("data"),
                                                         PartitionSpec("data")), out_specs=PartitionSpec())

  @jax.jit
  def step(params, m, v, count, x, y):
    loss, grads = grads_of(params, x, y)
    params, m, v = adam_update(jax, jnp, params, grads, m, v, count)
    return params, m, v, count + 1, loss
  params = jax.tree.map(jnp.asarray, params)
  zeros = jax.tree.map(jnp.zeros_like, params)
  state = (params, zeros, jax.tree.map(jnp.zeros_like, params), jnp.asarray(np.float32(1)))
  return step, state, (jnp.asarray(x), jnp.asarray(y.astype(np.int32)))


def _training(problem, devices: int = 0):
  def bench(jax, jnp):
    step, state, batch = train_step(jax, jnp, problem, devices)

    def call():
      nonlocal state
      *state, loss = step(*state, *batch)
      return loss
    return Bench(call, lambda first, second: [float(first), float(second)])  # the loss before steps 1 and 2
  return bench


PSUM_BYTES = 64 << 20


def bench_psum(devices: int):
  """psum over a mesh axis of `devices` CPU devices, each holding 64 MB of float32: the replicated sum comes back."""
  def bench(jax, jnp):
    import numpy as np
    Mesh, NamedSharding, PartitionSpec = jax.sharding.Mesh, jax.sharding.NamedSharding, jax.sharding.PartitionSpec
    mesh = Mesh(np.array(jax.devices()[:devices]), ("i",))
    shard = PSUM_BYTES // 4
    x = jax.device_put(_normal((devices * shard,)), NamedSharding(mesh, PartitionSpec("i")))
    total = jax.jit(jax.shard_map(lambda v: jax.lax.psum(v, "i"), mesh=mesh, in_specs=PartitionSpec("i"),
                                  out_specs=PartitionSpec()))
    return Bench(lambda: total(x), lambda first, second: [float(np.abs(np.asarray(first, np.float64)).sum())])
  return bench


def bench_vmap_grad(jax, jnp):
  import numpy as np
  params = [jax.tree.map(jnp.asarray, _dense(m, n, seed)) for seed, (m, n) in enumerate(zip(VMAP_SIZES[:-1],
                                                                                            VMAP_SIZES[1:]))]

  def loss(params, x, y):  # one example: x float32[784], y an int32 label
    return -(jax.nn.log_softmax(_mlp_apply(jax, params, x)) * jax.nn.one_hot(y, 10)).sum()
  per_example = jax.jit(jax.vmap(jax.grad(loss), in_axes=(None, 0, 0)))
  x = jnp.asarray(_normal((VMAP_BATCH, VMAP_SIZES[0]), seed=10))
  y = jnp.asarray(_rng(11).integers(0, 10, VMAP_BATCH).astype(np.int32))
  return Bench(lambda: per_example(params, x, y), lambda first, second: _sums(first))


def bench_scan(jax, jnp):
  def rnn(w, h, xs): return jax.lax.scan(lambda h, x: (jnp.tanh(h @ w + x), None), h, xs)[0]
  return _jitted(jax, jnp, rnn, _normal((SCAN_WIDTH, SCAN_WIDTH), 0.1), _normal(SCAN_WIDTH, seed=1),
                 _normal((SCAN_STEPS, SCAN_WIDTH), seed=2))


SOLVE_BATCH, SOLVE_SIZE = 256, 16


def bench_vmap_solve(jax, jnp):
  """Batched small linear systems: `vmap(jnp.linalg.solve)` of 256 16x16 systems (diagonally dominant)."""
  import numpy as np
  a = _normal((SOLVE_BATCH, SOLVE_SIZE, SOLVE_SIZE)) + 4 * np.eye(SOLVE_SIZE, dtype=np.float32)
  return _jitted(jax, jnp, jax.vmap(jnp.linalg.solve), a, _normal((SOLVE_BATCH, SOLVE_SIZE), seed=1))


FFT_ROWS, FFT_LENGTH = 256, 1024
FFT_MIXED_LENGTH = 1000  # (2^3 5^3: the mixed-radix kernel)
SPECTRAL_POINTS, SPECTRAL_STEPS = 256, 500


def bench_rfft(jax, jnp):
  """`jnp.fft.rfft` of FFT_ROWS real signals of FFT_LENGTH."""
  return _jitted(jax, jnp, jnp.fft.rfft, _normal((FFT_ROWS, FFT_LENGTH)))


def bench_rfft_mixed(jax, jnp):
  """`jnp.fft.rfft` of FFT_ROWS real signals of FFT_MIXED_LENGTH, a length that is not a power of two."""
  return _jitted(jax, jnp, jnp.fft.rfft, _normal((FFT_ROWS, FFT_MIXED_LENGTH)))


def bench_spectral_scan(jax, jnp):
  """FFTs in a loop body: Burgers' equation u_t = -u u_x + nu u_xx, pseudo-spectral (derivatives by rfft / irfft),
  SPECTRAL_STEPS midpoint steps of `scan` on SPECTRAL_POINTS points."""
  import numpy as np
  n, dt, nu = SPECTRAL_POINTS, 2e-4, 0.05
  k = np.fft.rfftfreq(n, d=1.0 / n).astype(np.float32)

  def rhs(u):
    spectrum = jnp.fft.rfft(u)
    return -u * jnp.fft.irfft(1j * k * spectrum, n=n) + nu * jnp.fft.irfft(-(k ** 2) * spectrum, n=n)

  def solve(u0):
    def step(u, _):
      return u + dt * rhs(u + 0.5 * dt * rhs(u)), None
    return jax.lax.scan(step, u0, None, length=SPECTRAL_STEPS)[0]
  return _jitted(jax, jnp, solve, np.sin(np.linspace(0, 2 * np.pi, n, endpoint=False)).astype(np.float32))


def bench_kalman(jax, jnp):
  """Small linear algebra in a loop body: a Kalman filter's log-likelihood over SCAN_STEPS steps of `scan` (state 4,
  observation 2: a 2x2 solve and log-determinant per step)."""
  import numpy as np
  dt = 0.1
  f = np.array([[1, 0, dt, 0], [0, 1, 0, dt], [0, 0, 1, 0], [0, 0, 0, 1]], np.float32)
  h = np.array([[1, 0, 0, 0], [0, 1, 0, 0]], np.float32)

  def loglik(fm, hm, ys):
    def step(carry, y):
      m, p = carry
      m, p = fm @ m, fm @ p @ fm.T + 0.01 * jnp.eye(4)
      s = hm @ p @ hm.T + 0.1 * jnp.eye(2)
      gain = jnp.linalg.solve(s, hm @ p).T
      v = y - hm @ m
      ll = -0.5 * (v @ jnp.linalg.solve(s, v) + jnp.linalg.slogdet(s)[1])
      return (m + gain @ v, p - gain @ s @ gain.T), ll
    return jax.lax.scan(step, (jnp.zeros(4), jnp.eye(4)), ys)[1].sum()
  return _jitted(jax, jnp, loglik, f, h, _normal((SCAN_STEPS, 2)))


def numpy_as_jax():
  """numpy behind the little of JAX's API the numpy-capable workloads use: `jit` is the identity, `nn.softmax` the
  stable formula."""
  import numpy as np

  def softmax(x, axis=-1):
    exp = np.exp(x - x.max(axis=axis, keepdims=True))
    return exp / exp.sum(axis=axis, keepdims=True)
  return types.SimpleNamespace(jit=lambda f: f, nn=types.SimpleNamespace(softmax=softmax),
                               block_until_ready=lambda x: x)


@dataclass(frozen=True)
class Workload:
  name: str
  bench: Callable | None  # (jax, jnp) -> Bench; None for the fresh-process workloads (import, first calls)
  unit: str  # how the table shows a time: "us", "ms", "s", "GFLOP/s" (from flops) or "steps/s"
  numpy: bool = False  # whether numpy runs it too
  flops: float = 0.0  # floating-point operations per call: the row's fraction of the FMA peak
  bytes: float = 0.0  # bytes read and written per call: the row's fraction of the copy bandwidth
  note: str = ""
  devices: int = 1  # CPU devices the child asks for (XLA_FLAGS' forced host device count, which both libraries read)


def _training_flops(layers: list[int]) -> float:
  """A training step's floating-point operations from its layers' forward multiply-adds: the forward, the weight
  gradients (as much again) and the input gradients of every layer but the first (whose input needs none)."""
  return 2 * (3 * sum(layers) - layers[0])


MLP_FLOPS = _training_flops([MLP_BATCH * m * n for m, n in zip(MLP_SIZES[:-1], MLP_SIZES[1:])])
CNN_FLOPS = _training_flops([CNN_BATCH * 28 * 28 * 9 * 1 * 32, CNN_BATCH * 14 * 14 * 9 * 32 * 64,
                             CNN_BATCH * 3136 * 128, CNN_BATCH * 128 * 10])
_TOKENS, _WIDTH = TRANSFORMER["batch"] * TRANSFORMER["steps"], TRANSFORMER["width"]
# multiply-adds per layer: the qkv (3 w^2 per token), output (w^2) and MLP (8 w^2) products and attention's two
# (scores and weighted values, every position against every other, the masked ones too); then the head. Two flops
# each, three times over: the forward, the weight gradients and the input gradients.
TRANSFORMER_FLOPS = 6 * (TRANSFORMER["layers"] * (_TOKENS * _WIDTH * _WIDTH * (3 + 1 + 8) +
                                                  2 * _TOKENS * TRANSFORMER["steps"] * _WIDTH) + _TOKENS * _WIDTH * 10)
# the same for the language model, its head the tied vocabulary
_LM_TOKENS = LM["batch"] * LM["steps"]
LM_FLOPS = 6 * (LM["layers"] * (_LM_TOKENS * LM["width"] ** 2 * (3 + 1 + 8) +
                                2 * _LM_TOKENS * LM["steps"] * LM["width"]) + _LM_TOKENS * LM["width"] * LM["vocab"])
WORKLOADS = {w.name: w for w in [
  Workload("dispatch", bench_dispatch, "us", note="jit(x + 1), float32[8], cache hit"),
  Workload("eager_chain", bench_eager_chain, "us", note=f"eager: {2 * EAGER_CHAIN} ops x * 1.0001 + 0.5, float32[8]"),
  Workload("eager_read", bench_eager_read, "us", note="eager: float(sum(sin(x) * 2 + x)), float32[8]"),
  Workload("eager_program", bench_eager_program, "ms", note="eager: float(tanh(a @ a).sum()), 512x512"),
  Workload("elementwise", bench_elementwise, "ms", numpy=True, bytes=2 * 4 * ELEMENTWISE_SIZE,
           note="((x*2+1)*x-3)*0.5, 16M"),
  Workload("sum_rows", bench_sum_rows, "ms", numpy=True, bytes=4 * (ROWS * COLUMNS + ROWS), note="8192x1024 axis=1"),
  Workload("sum_cols", bench_sum_cols, "ms", numpy=True, bytes=4 * (ROWS * COLUMNS + COLUMNS), note="8192x1024 axis=0"),
  Workload("softmax", bench_softmax, "ms", numpy=True, bytes=2 * 4 * ROWS * COLUMNS, note="8192x1024 last axis"),
  Workload("layernorm", bench_layernorm, "ms", numpy=True, bytes=2 * 4 * ROWS * COLUMNS, note="8192x1024 last axis"),
  *[Workload(f"matmul{n}", bench_matmul(n), "GFLOP/s", numpy=True, flops=2 * n ** 3, note=f"{n}x{n} @ {n}x{n}")
    for n in (512, 1024, 2048)],
  Workload("matmul1024_bf16", bench_matmul_bf16, "GFLOP/s", flops=2 * 1024 ** 3,
           note="bfloat16 1024x1024 @ 1024x1024, float32 sums and result"),
  Workload("matmul_decode", bench_matmul_decode, "ms", numpy=True,
           bytes=4 * (DECODE_WIDTH ** 2 + 2 * DECODE_ROWS * DECODE_WIDTH),
           note=f"{DECODE_ROWS}x{DECODE_WIDTH} @ {DECODE_WIDTH}x{DECODE_WIDTH}, the weights from memory"),
  Workload("mlp_adam", _training(mlp_problem), "steps/s", flops=MLP_FLOPS,
           note="784-512-512-10, batch 512"),
  *[Workload(f"mlp_adam_dp{n}", _training(mlp_problem, n), "steps/s", flops=MLP_FLOPS, devices=n,
             note=f"mlp_adam, shard_map + pmean over {n} CPU device{'s' if n > 1 else ''}") for n in (1, 2)],
  *[Workload(f"psum_{n}dev", bench_psum(n), "ms", bytes=(n + 1) * PSUM_BYTES, devices=n,
             note=f"psum of 64 MB per device over {n} CPU devices") for n in (4, 8)],
  Workload("cnn_step", _training(cnn_problem), "steps/s", flops=CNN_FLOPS, note="examples/cnn.py model, batch 128"),
  Workload("transformer_step", _training(transformer_problem), "steps/s", flops=TRANSFORMER_FLOPS,
           note="2 causal attention + GELU MLP blocks, 8x128 tokens, width 256, 4 heads"),
  Workload("lm_step", _training(lm_problem), "steps/s", flops=LM_FLOPS,
           note="a language model: 2000-token embedding gathered and tied to the logits, 1 block, 32x64 tokens"),
  Workload("vmap_grad", bench_vmap_grad, "ms", note="784-256-10, 128 examples"),
  Workload("scan", bench_scan, "ms", note="1000 steps tanh(h@W+x), 64 wide"),
  Workload("vmap_solve", bench_vmap_solve, "ms", note="vmap(jnp.linalg.solve), 256 16x16 systems"),
  Workload("kalman_scan", bench_kalman, "ms", note="1000 scan steps of a Kalman filter: 2x2 solves, slogdet"),
  Workload("rfft", bench_rfft, "ms", numpy=True, note=f"jnp.fft.rfft, {FFT_ROWS}x{FFT_LENGTH} float32"),
  Workload("rfft_mixed", bench_rfft_mixed, "ms", numpy=True,
           note=f"jnp.fft.rfft, {FFT_ROWS}x{FFT_MIXED_LENGTH} float32 (not a power of two)"),
  Workload("spectral_scan", bench_spectral_scan, "ms",
           note=f"{SPECTRAL_STEPS} scan steps of Burgers' equation by rfft/irfft, {SPECTRAL_POINTS} points"),
  Workload("cold_first_call", None, "s", note="mlp_adam's step, empty cache"),
  Workload("warm_first_call", None, "s", note="mlp_adam's step, cache filled"),
  Workload("import", None, "s", note="import in a fresh process"),
]}


# ---- the child: one library, one workload, one JSON line

def measure(bench: Bench, block: Callable, rounds: int, min_time: float, settle: Callable[[], None] = lambda: None
            ) -> dict:
  """Warm up (compile) with two calls and `settle()` (tinyjax: its background compiles, the optimised builds that
  replace a new program's first tiers after its second run; JAX compiles all before its first call), then `rounds`
  rounds, each looping for at least `min_time` seconds: the median and the rounds' seconds per call. What a program
  costs before its optimised builds are in is the first-call rows' business (`first_call`)."""
  first = block(bench.call())
  second = block(bench.call())
  settle()
  checksum = bench.checksum(first, second)
  per_call = []
  for _ in range(rounds):
    count, start = 0, time.perf_counter()
    while True:
      block(bench.call())
      count += 1
      elapsed = time.perf_counter() - start
      if elapsed >= min_time: break
    per_call.append(elapsed / count)
  return {"seconds": statistics.median(per_call), "rounds": per_call, "checksum": checksum}


def first_call(jax, jnp, library: str, jax_cache_dir: str | None) -> dict:
  """The first call of mlp_adam's jitted training step in this process: trace, lower, compile (or load from a cache)
  and run, up to its loss being ready."""
  if library == "jax":
    if jax_cache_dir:
      jax.config.update("jax_compilation_cache_dir", jax_cache_dir)
      jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)
      jax.config.update("jax_persistent_cache_min_entry_size_bytes", -1)
    else:
      jax.config.update("jax_enable_compilation_cache", False)
  step, state, batch = train_step(jax, jnp, mlp_problem)
  jax.block_until_ready((state, batch))
  start = time.perf_counter()
  *state, loss = step(*state, *batch)
  loss.block_until_ready()
  seconds = time.perf_counter() - start
  return {"seconds": seconds, "checksum": [float(loss)]}


def child(library: str, name: str, quick: bool, jax_cache_dir: str | None) -> dict:
  start = time.perf_counter()
  if library == "tinyjax":
    import tinyjax as jax
    import tinyjax.numpy as jnp
  elif library == "jax":
    import jax
    import jax.numpy as jnp
  else:
    import numpy as jnp
    jax = numpy_as_jax()
  imported = time.perf_counter() - start
  version = getattr(jax, "__version__", None) or jnp.__version__
  if name == "import": return {"seconds": imported, "version": version}
  if name in ("cold_first_call", "warm_first_call"):
    return first_call(jax, jnp, library, jax_cache_dir) | {"import_seconds": imported, "version": version}
  rounds, min_time = (3, 0.05) if quick else (7, 0.2)
  settle = lambda: None  # noqa: E731
  if library == "tinyjax":
    from tinyjax.devices.cpu import wait_for_upgrades as settle
  return measure(WORKLOADS[name].bench(jax, jnp), jax.block_until_ready, rounds, min_time, settle) | \
      {"version": version}


# ---- the parent: spawn, interleave, summarise

def run_child(library: str, name: str, args, cache_dir: str | None) -> dict:
  """One child process: its JSON line, or {"error": ...} when it failed."""
  command = [args.jax_python if library == "jax" else sys.executable, os.path.abspath(__file__), "--child", library,
             name]
  env = dict(os.environ)
  # bytecode caches on for every library: installed packages (JAX, numpy) have theirs from pip, and without its own a
  # source checkout of tinyjax would compile every module on each import
  env.pop("PYTHONDONTWRITEBYTECODE", None)
  if args.quick: command.append("--quick")
  if WORKLOADS[name].devices > 1:
    env["XLA_FLAGS"] = f"{env.get('XLA_FLAGS', '')} --xla_force_host_platform_device_count={WORKLOADS[name].devices}"
  if library == "tinyjax":
    env["PYTHONPATH"] = os.pathsep.join(p for p in (ROOT, env.get("PYTHONPATH")) if p)
    env["TINYJAX_CACHE_DIR"] = cache_dir
  elif library == "jax":
    env["JAX_PLATFORMS"] = "cpu"
    env.pop("PYTHONPATH", None)  # the JAX child imports nothing of tinyjax
    if cache_dir: command += ["--jax-cache-dir", cache_dir]
  try:
    done = subprocess.run(command, capture_output=True, text=True, env=env, timeout=CHILD_TIMEOUT_S)
  except subprocess.TimeoutExpired:
    return {"error": f"timed out after {CHILD_TIMEOUT_S} s"}
  lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
  if done.returncode != 0 or not lines:
    message = (done.stderr.strip().splitlines() or [f"exit status {done.returncode}"])[-1]
    return {"error": message[:300]}
  return json.loads(lines[-1])


def format_time(seconds: float | None, workload: Workload) -> str:
  if seconds is None: return "-"
  if workload.unit == "us": return f"{seconds * 1e6:.2f} us"
  if workload.unit == "ms": return f"{seconds * 1e3:.2f} ms"
  if workload.unit == "GFLOP/s": return f"{workload.flops / seconds / 1e9:.1f} GFLOP/s"
  if workload.unit == "steps/s": return f"{1 / seconds:.1f} steps/s"
  return f"{seconds:.3f} s"


def summarise(workload: Workload, samples: dict[str, list[dict]], limits) -> dict:
  """The row of one workload: per library its median, samples and errors; the ratios; the fraction of the limit."""
  row: dict[str, Any] = {"unit": workload.unit, "note": workload.note, "flops": workload.flops or None,
                         "bytes": workload.bytes or None}
  for library, results in samples.items():
    good = [r for r in results if "error" not in r]
    entry: dict[str, Any] = {"samples": [r["seconds"] for r in good], "errors": [r["error"] for r in results
                                                                                 if "error" in r]}
    if good:
      entry["median"] = statistics.median(entry["samples"])
      entry["checksum"] = good[0].get("checksum")
      entry["version"] = good[0].get("version")
      entry["rounds"] = [r.get("rounds") for r in good]
      if "import_seconds" in good[0]: entry["import_seconds"] = statistics.median(r["import_seconds"] for r in good)
    row[library] = entry
  ours = row.get("tinyjax", {}).get("median")
  for library in ("jax", "numpy"):
    theirs = row.get(library, {}).get("median")
    row[f"ratio_{library}"] = theirs / ours if ours and theirs else None
  row["limit_fraction"] = None
  if ours and workload.flops:  # (a peak this run beats by 5% was measured while the cores were busy: measured again)
    from tinyjax.profiler import limits_for
    row["limit_fraction"] = workload.flops / ours / limits_for(workload.flops / ours).flops
  elif ours and workload.bytes: row["limit_fraction"] = workload.bytes / ours / limits.bandwidth
  return row


def checksum_warnings(name: str, row: dict, rtol: float = 1e-3) -> list[str]:
  ours = row.get("tinyjax", {}).get("checksum")
  warnings = []
  for library in ("jax", "numpy"):
    theirs = row.get(library, {}).get("checksum")
    if ours is None or theirs is None: continue
    if len(ours) != len(theirs) or any(abs(a - b) > rtol * max(abs(a), abs(b), 1e-6) for a, b in zip(ours, theirs)):
      warnings.append(f"warning: {name}: tinyjax's checksum {ours} differs from {library}'s {theirs}")
  return warnings


COLUMNS_FORMAT = "{:16s} {:>22s} {:>22s} {:>22s} {:>8s} {:>9s} {:>10s}  {}"


def print_row(name: str, workload: Workload, row: dict) -> None:
  def cell(library):
    entry = row.get(library)
    if entry is None: return "-"
    if "median" not in entry: return ("error: " + (entry["errors"] or ["?"])[0])[:22]  # in full below the row
    return format_time(entry["median"], workload)

  def ratio(value): return f"{value:.2f}x" if value else "-"
  fraction = row["limit_fraction"]
  limit = f"{fraction * 100:.0f}% {'FMA' if workload.flops else 'BW'}" if fraction else ""
  note = workload.note
  imports = [f"{library} {row[library]['import_seconds']:.2f}" for library in ("tinyjax", "jax")
             if "import_seconds" in row.get(library, {})]
  if imports: note += f" (import s: {', '.join(imports)})"
  print(COLUMNS_FORMAT.format(name, cell("tinyjax"), cell("jax"), cell("numpy"), ratio(row["ratio_jax"]),
                              ratio(row["ratio_numpy"]), limit, note), flush=True)
  for entry_library in LIBRARIES:
    for error in row.get(entry_library, {}).get("errors", []):
      print(f"  {entry_library} error: {error}", flush=True)
  for warning in checksum_warnings(name, row): print("  " + warning, flush=True)


def parent(args) -> None:
  import numpy as np
  sys.path.insert(0, ROOT)  # this checkout's tinyjax, as in the children
  import tinyjax
  names = args.workloads or list(WORKLOADS)
  unknown = [n for n in names if n not in WORKLOADS]
  if unknown: sys.exit(f"unknown workloads {unknown}; choose from {list(WORKLOADS)}")
  repeats = args.repeats or (1 if args.quick else 3)
  limits = tinyjax.machine_limits()
  print(f"machine: {limits}; {platform.processor() or platform.machine()}, {os.cpu_count()} cores", flush=True)
  print(f"medians of {repeats} fresh processes per library; ratio = other library's time / tinyjax's time "
        "(higher: tinyjax faster)", flush=True)
  print(COLUMNS_FORMAT.format("workload", "tinyjax", "JAX", "numpy", "vs JAX", "vs numpy", "% limit", "what"))
  report: dict[str, Any] = {
    "machine": {**limits.__dict__, "cpu_count": os.cpu_count(), "platform": platform.platform()},
    "versions": {"python": platform.python_version(), "tinyjax": getattr(tinyjax, "__version__", None),
                 "numpy": np.__version__},
    "repeats": repeats, "quick": args.quick, "workloads": {}}
  with tempfile.TemporaryDirectory(prefix="tinyjax-suite-") as scratch:
    shared = os.path.join(scratch, "shared")
    libraries = ["tinyjax"] + (["jax"] if args.jax_python else [])
    for name in names:
      workload = WORKLOADS[name]
      run_with = libraries + (["numpy"] if workload.numpy else [])
      warm_dirs = {library: os.path.join(scratch, f"warm-{library}") for library in run_with}
      if name == "warm_first_call":  # one process fills each cache
        for library in run_with: run_child(library, name, args, warm_dirs[library])
      samples: dict[str, list[dict]] = {library: [] for library in run_with}
      for repeat in range(repeats):
        for library in run_with:
          if name == "cold_first_call": cache_dir = tempfile.mkdtemp(prefix=f"cold-{library}-{repeat}-", dir=scratch)
          elif name == "warm_first_call": cache_dir = warm_dirs[library]
          else: cache_dir = shared if library == "tinyjax" else None
          if library == "jax" and name == "cold_first_call": cache_dir = None  # JAX: persistent cache off
          samples[library].append(run_child(library, name, args, cache_dir))
      row = summarise(workload, samples, limits)
      for library in run_with:
        version = row[library].get("version")
        if version: report["versions"][library] = version
      report["workloads"][name] = row
      print_row(name, workload, row)
  if args.json:
    with open(args.json, "w") as file: json.dump(report, file, indent=1)
    print(f"wrote {args.json}")


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("workloads", nargs="*", help=f"any of {', '.join(WORKLOADS)} (default: all)")
  parser.add_argument("--jax-python", help="a Python interpreter that can import jax: adds the JAX column")
  parser.add_argument("--repeats", type=int, help="fresh processes per library and workload (default 3, --quick 1)")
  parser.add_argument("--json", help="write every figure to this file")
  parser.add_argument("--quick", action="store_true", help="shorter timing loops and one repeat: while developing")
  parser.add_argument("--child", nargs=2, metavar=("LIBRARY", "WORKLOAD"), help=argparse.SUPPRESS)
  parser.add_argument("--jax-cache-dir", help=argparse.SUPPRESS)
  args = parser.parse_args()
  if not args.child: return parent(args)
  library, name = args.child
  try:
    result = child(library, name, args.quick, args.jax_cache_dir)
  except Exception as error:  # the parent prints it in the workload's cell
    result = {"error": f"{type(error).__name__}: {error}".replace("\n", " ")[:300]}
  print(json.dumps(result), flush=True)


if __name__ == "__main__":
  main()
