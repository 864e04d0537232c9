"""The discrete Fourier transform of a power-of-two length as one compiled kernel: the primitive `fft_p` that
numpy/fft.py's transforms use for those lengths (rfft and irfft by a complex transform of half the length).

Its operands are a float32 / float64 array (..., n, 2) of (real, imaginary) pairs, the memory of a complex array,
and the transform's tables (`tables`: constants of the program, made where it is called); its result is the
unnormalised transform of each row, sum_j x_j exp(sign 2 pi i j k / n), as pairs again. It is a host step of the
program, as lax.linalg's primitives are, whose `native` kernel a CPU program launches among its own over the rows
(HostCallback, lower/realize.py); eager calls, DEBUG and profiled runs call the same kernel on numpy arrays, so every
path gives the same bits.

The kernel is LLVM IR written here, one per dtype for every length and both directions (the length, the bit
reversal and the twiddle factors are its operands), compiled by the CPU device and kept in its disk cache. Each row
is a radix-2 decimation in time:
- the row is read in bit-reversed order, VL complex values (one vector) at a time, and the stages of half-size
  h < VL are done inside that vector (two shuffles pick each butterfly's two values; the twiddle factors carry the
  sign of the butterfly's second output);
- each later stage h = VL, 2 VL, ..., n / 2 runs its butterflies a vector of VL at a time, in place in the output.
A complex product (a + ib)(c + id) is (a, b) (c, c) + (b, a) (-d, d): the twiddles are stored in those two forms,
computed in float64 on the host and rounded once. 2 cores, complex64 256 x 1024: 0.32-0.35 ms for the kernel alone
(JAX 0.10.2's whole `fft`: 0.55-1.0 ms; the contractions this replaced: 3.7-4.7 ms).

The transform is linear; as a real map of the pairs its matrix is that of the complex DFT matrix W, and since W is
symmetric, the transpose of the real map is the map of conj(W): the transform of the other sign.
"""
from __future__ import annotations

import functools
import math

import numpy as np

from tinyjax.array import Array
from tinyjax.lax._small_linalg import VECTOR_BYTES, _Builder
from tinyjax.trace import ad, batching
from tinyjax.trace.callback import HostCallback, host_call
from tinyjax.trace.core import Primitive

_TYPES = {np.dtype(np.float32): "float", np.dtype(np.float64): "double"}
SMALLEST = 16  # shorter power-of-two transforms stay one contraction with the DFT matrix (numpy/fft.py)


def supported(n: int, dtype) -> bool:
  """Whether transforms of length n of pairs of `dtype` take the compiled kernel."""
  return np.dtype(dtype) in _TYPES and SMALLEST <= n < 2 ** 31 and n & (n - 1) == 0


def _lanes(dtype: np.dtype) -> int:
  """VL: the complex values in one vector."""
  return VECTOR_BYTES // (2 * dtype.itemsize)


@functools.lru_cache(maxsize=64)
def tables(n: int, sign: int, dtype: np.dtype) -> tuple[np.ndarray, np.ndarray]:
  """(twiddles, plan) of the transform of length n: the plan is int32 [n, bit reversal of 0..n-1]; the twiddles are,
  for each stage h (1, 2, ..., n / 2), the factors w^j = exp(sign 2 pi i j / 2h) in blocks of VL as two vectors, the
  real parts (c, c) and the imaginary ones (-d, d). A stage h < VL has one block, of each position p's factor for its
  butterfly (w^(p mod h)), negated where p is the butterfly's second output."""
  lanes = _lanes(dtype)
  bits = n.bit_length() - 1
  index = np.arange(n)
  reversed_ = np.zeros(n, np.int64)
  for bit in range(bits): reversed_ |= ((index >> bit) & 1) << (bits - 1 - bit)
  plan = np.concatenate([[n], reversed_]).astype(np.int32)
  blocks = []
  for h in (1 << s for s in range(bits)):
    if h < lanes:
      p = np.arange(lanes)
      w = np.exp(sign * 1j * np.pi * (p % h) / h) * np.where(p % (2 * h) < h, 1, -1)
    else: w = np.exp(sign * 1j * np.pi * np.arange(h) / h)
    w = w.reshape(-1, lanes)
    blocks.append(np.stack([np.repeat(w.real, 2, axis=-1), np.stack([-w.imag, w.imag], -1).reshape(len(w), -1)],
                           axis=1).reshape(-1))
  return np.concatenate(blocks).astype(dtype), plan


def _kernel_ir(name: str, dtype: np.dtype) -> str:
  """args: x (rows, n, 2), twiddles, plan (see `tables`), out (rows, n, 2); the rows [start, end)."""
  ctype, lanes = _TYPES[dtype], _lanes(dtype)
  suffix = "f32" if ctype == "float" else "f64"
  vector = f"<{2 * lanes} x {ctype}>"
  ir = _Builder(name, ctype, 4)
  x0, twiddles, plan, out0 = ir.params
  n = ir.value(f"sext i32 {ir.load('i32', plan)} to i64")
  first_stages = lanes.bit_length() - 1  # the stages done inside a vector

  def indices(positions) -> str:  # a shuffle's mask
    positions = list(positions)
    return f"<{len(positions)} x i32> <" + ", ".join(f"i32 {p}" for p in positions) + ">"
  swap = indices(q ^ 1 for q in range(2 * lanes))

  def butterfly_product(b: str, block: str) -> str:
    """b times the twiddles of the block at T element `block`: (a, b) (c, c) + (b, a) (-d, d)."""
    same = ir.load(vector, ir.element(twiddles, block))
    crossed = ir.load(vector, ir.element(twiddles, ir.op("add", block, str(2 * lanes))))
    swapped = ir.value(f"shufflevector {vector} {b}, {vector} poison, {swap}")
    return ir.value(f"call {vector} @llvm.fmuladd.v{2 * lanes}{suffix}({vector} {swapped}, {vector} {crossed}, "
                    f"{vector} {ir.value(f'fmul {vector} {b}, {same}')})")

  def row(r: str) -> None:
    x, out = (ir.element(base, ir.op("mul", r, ir.op("mul", n, "2"))) for base in (x0, out0))

    def gathered(block: str) -> None:  # VL values read in bit-reversed order, their first stages in the vector
      pieces, size = [], 2
      for q in range(lanes):
        at = ir.gep("i32", plan, ir.op("add", block, str(q + 1)))
        j = ir.value(f"sext i32 {ir.load('i32', at)} to i64")
        pieces.append(ir.load(f"<2 x {ctype}>", ir.element(x, ir.op("mul", j, "2"))))
      while len(pieces) > 1:  # (concatenated pairwise)
        pieces = [ir.value(f"shufflevector <{size} x {ctype}> {a}, <{size} x {ctype}> {b}, {indices(range(2 * size))}")
                  for a, b in zip(pieces[0::2], pieces[1::2])]
        size *= 2
      v = pieces[0]
      for s in range(first_stages):
        h = 1 << s
        low = [p if p % (2 * h) < h else p - h for p in range(lanes)]
        a = ir.value(f"shufflevector {vector} {v}, {vector} poison, {indices(2 * p + c for p in low for c in (0, 1))}")
        b = ir.value(f"shufflevector {vector} {v}, {vector} poison, "
                     f"{indices(2 * (p + h) + c for p in low for c in (0, 1))}")
        v = ir.value(f"fadd {vector} {a}, {butterfly_product(b, str(s * 4 * lanes))}")
      ir.store(vector, v, ir.element(out, ir.op("mul", block, "2")))
    ir.loop("0", n, gathered, step=lanes)

    # the stages h = VL, 2 VL, ..., n / 2, each in place
    h_var = ir.var()
    ir.store("i64", str(lanes), h_var)
    head, inside, done = ir.label(), ir.label(), ir.label()
    ir.emit(f"br label %{head}")
    ir.block(head)
    h = ir.load("i64", h_var)
    ir.emit(f"br i1 {ir.op('icmp slt', h, n)}, label %{inside}, label %{done}")
    ir.block(inside)
    stage = ir.op("add", str(first_stages * 4 * lanes), ir.op("mul", ir.op("sub", h, str(lanes)), "4"))
    span = ir.op("mul", h, "2")

    def group(g: str) -> None:
      def butterflies(j: str) -> None:
        at_a = ir.element(out, ir.op("mul", ir.op("add", g, j), "2"))
        at_b = ir.element(out, ir.op("mul", ir.op("add", ir.op("add", g, j), h), "2"))
        a, b = ir.load(vector, at_a), ir.load(vector, at_b)
        product = butterfly_product(b, ir.op("add", stage, ir.op("mul", j, "4")))
        ir.store(vector, ir.value(f"fadd {vector} {a}, {product}"), at_a)
        ir.store(vector, ir.value(f"fsub {vector} {a}, {product}"), at_b)
      ir.loop("0", h, butterflies, step=lanes)
    ir.loop("0", n, group, step=span)
    ir.store("i64", span, h_var)
    ir.emit(f"br label %{head}, !llvm.loop !0")
    ir.block(done)

  ir.loop("%start", "%end", row)
  return ir.text([f"declare {vector} @llvm.fmuladd.v{2 * lanes}{suffix}({vector}, {vector}, {vector})"])



@functools.cache
def program(dtype: np.dtype):
  """The CPU program of the transform over pairs of `dtype` (compiled, or loaded from the disk cache, on first use)."""
  from tinyjax.devices import cpu
  name = f"tj_fft_{'f32' if dtype == np.float32 else 'f64'}"
  return cpu.compile_cpu(name, _kernel_ir(name, np.dtype(dtype)))


def _run(x: np.ndarray, twiddles: np.ndarray, plan: np.ndarray) -> list[np.ndarray]:
  """The host step's function: the kernel over the rows of pairs `x`, across the CPU runtime's threads."""
  x = np.ascontiguousarray(x)
  out = np.empty_like(x)
  if x.size: program(x.dtype)([a.ctypes.data for a in (x, twiddles, plan, out)], math.prod(x.shape[:-2]))
  return [out]


def _fft_impl(x: Array, twiddles: Array, plan: Array, *, sign: int) -> Array:
  dtype, rows = np.dtype(x.dtype), math.prod(x.shape[:-2])
  callback = HostCallback(_run, ((tuple(x.shape), dtype),), "fft", checked=False,
                          native=lambda: (program(dtype), rows, 1))
  return host_call(callback, x, twiddles, plan)[0]


# (the tables are operands, made where the transform is called: constants of the program, or of a loop body that
# calls it, where an impl's own constants would have no slot)
fft_p = Primitive("fft", _fft_impl)


def _batch(trace, vals, dims, *, sign):
  """The vmapped axis becomes a leading one where it was one of the transform's (the last two)."""
  (x, twiddles, plan), (d, *tables_batched) = vals, dims
  assert not any(b is not None for b in tables_batched), "an FFT's tables are constants"
  if d is not None and d >= x.ndim - 2: x, d = batching.move_axis(x, d, 0), 0
  return fft_p.bind(x, twiddles, plan, sign=sign), d


ad.defjvp(fft_p, lambda tangent, out, x, twiddles, plan, *, sign: fft_p.bind(tangent, twiddles, plan, sign=sign),
          None, None)
ad.transpose_rules[fft_p] = lambda ct, node, known: (fft(ct, -dict(node.arg.params)["sign"]), None, None)
ad.abstract_eval_rules[fft_p] = lambda x, twiddles, plan, *, sign: (tuple(x.shape), x.dtype, x.weak_type)
batching.batch_rules[fft_p] = _batch


def fft(x: Array, sign: int) -> Array:
  """The unnormalised DFT sum_j x_j exp(sign 2 pi i j k / n) of each row of (real, imaginary) pairs (..., n, 2), a
  float array, as pairs; n a power of two (`supported`)."""
  from tinyjax import numpy as jnp
  twiddles, plan = tables(x.shape[-2], sign, np.dtype(x.dtype))
  return fft_p.bind(x, jnp.asarray(twiddles), jnp.asarray(plan), sign=sign)
