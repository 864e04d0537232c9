"""Discrete Fourier transforms as compiled kernels: the primitive `fft_p` that numpy/fft.py's transforms use for
power-of-two lengths, for the others whose prime factors are at most LARGEST_RADIX, and (fft) for any other up to
LONGEST_BLUESTEIN, from SMALLEST on. The power-of-two kernels are described first; the mixed-radix one
(`_mixed_ir`, Bluestein's algorithm included) at the end.

Three kinds (`transform`): "fft" of complex rows (or of (real, imaginary) pairs in a float array (..., n, 2), the
memory of a complex array, as the other lengths' factorisation uses), or of complex values down an axis before the
last; "rfft" of real signals of length 2n to their n + 1 non-negative frequencies; "irfft" back. Unnormalised, times a
`scale` (a norm) folded into the kernel. The transform's tables (`tables`, `column_tables`) are operands, constants of
the program made where it is called. Each is a host step of the program, as lax.linalg's primitives are, whose
`native` kernel a CPU program launches among its own (HostCallback, lower/realize.py), reading a complex input and
writing a complex result in place (lower/complex.py hands their memory on); eager calls, DEBUG and profiled runs call
the same kernel on numpy arrays, so every path gives the same bits.

The kernels are LLVM IR written here, one per kind and dtype for every length and both directions (the length, the
bit reversal, the twiddle factors and the scale are operands), compiled by the CPU device and kept in its disk cache.
Each row is a decimation in time:
- the row is read in bit-reversed order, VL complex values (one vector) at a time, and the stages of half-size
  h < VL are done inside that vector (two shuffles pick each butterfly's two values; the twiddle factors carry the
  sign of the butterfly's second output);
- the later stages h = VL, 2 VL, ..., n / 2 run in place in the output, two at a time (radix 4: each value loaded and
  stored once for both; 1.2-1.4x over one at a time), after a single one where their count is odd, VL butterflies a
  vector.
A complex product (a + ib)(c + id) is (a, b) (c, c) + (b, a) (-d, d): the twiddles are stored in those two forms,
computed in float64 on the host and rounded once. rfft reads its real signal as the n pairs (even sample, odd
sample), transforms them and splits the result into the transforms of the even and odd samples in place, each
frequency with its mirror image (`_half_length_factors`); irfft merges them before its transform, writing the merged
spectrum in bit-reversed order. Down an axis (`_columns_ir`), a vector holds VL adjacent columns, gathered into a
scratch on the stack, and every butterfly of a stage takes one twiddle. 2 cores against JAX 0.10.2 (its ducc FFT),
medians of two runs, 256 x 1024: `fft` 0.52-0.55 ms against 0.49-0.50, `rfft` 0.21-0.32 against 0.29-0.46, `irfft`
0.24-0.32 against 0.52-0.63 (the DFT contractions these replaced: 3.7-4.7, 2.5-2.9, 4.3-5.0 ms).

Each kind is linear. fft's DFT matrix W is symmetric, so the transpose of a complex fft is itself; as a real map of
pairs, its transpose is the map of conj(W), the transform of the other sign. rfft's and irfft's transposes are each
other with the inner frequencies halved or doubled (`_transpose`).
"""
from __future__ import annotations

import functools
import math

import numpy as np

from tinyjax import dtypes
from tinyjax.dtypes import real_dtype
from tinyjax.array import Array
from tinyjax.lax._small_linalg import _SUFFIXES, _TYPES, VECTOR_BYTES, _Builder, _float, _name, _splat
from tinyjax.trace import ad, batching
from tinyjax.trace.callback import HostCallback, NativeKernel, host_call
from tinyjax.trace.core import Primitive

SMALLEST = 16  # shorter power-of-two transforms stay one contraction with the DFT matrix (numpy/fft.py)


def supported(n: int, dtype, rows: bool = True, kind: str = "fft") -> bool:
  """Whether transforms of `kind` over `dtype` (the float dtype of their values) take a compiled kernel: "fft" of
  length n along rows, or (not `rows`) down an axis before the last; "rfft" / "irfft" of real signals of length n
  (irfft of an odd n: kind irfft_odd in `transform`). A power of two from SMALLEST on (rfft / irfft: 2 SMALLEST;
  down an axis: up to LONGEST_COLUMN, `_columns_ir`), or any other length from SMALLEST on whose prime factors are at
  most LARGEST_RADIX, or any other (rfft / irfft: whose complex transform, of half the length where it is even) up
  to LONGEST_BLUESTEIN (`_mixed_ir`, by Bluestein's algorithm)."""
  if np.dtype(dtype) not in _TYPES or n < SMALLEST: return False
  if kind != "fft":  # (by a complex transform of half the length, or of the length where it is odd)
    points = n if n % 2 else n // 2
    return points & (points - 1) == 0 and points >= SMALLEST or radices(points) is not None or \
        points <= LONGEST_BLUESTEIN
  if n & (n - 1): return radices(n) is not None or n <= LONGEST_BLUESTEIN
  return n <= (2 ** 30 if rows else LONGEST_COLUMN)


def _mixed_length(kind: str, x, axis: int = -1) -> int | None:
  """The length of the transforms of `kind` of x (as `transform` takes it) that the mixed-radix kernel does, or None
  where a power-of-two kernel does them: fft's n where it is not a power of two; rfft's and irfft's real length where
  it is not twice one from SMALLEST on."""
  if kind == "fft":
    n = shapes(kind, x, axis)[0]
    return n if n & (n - 1) else None
  if kind == "irfft_odd": return shapes(kind, x)[0]
  n = x.shape[-1] if kind == "rfft" else 2 * (x.shape[-1] - 1)
  return n if n % 2 or n // 2 & (n // 2 - 1) or n // 2 < SMALLEST else None


def _lanes(dtype: np.dtype) -> int:
  """VL: the complex values in one vector."""
  return VECTOR_BYTES // (2 * dtype.itemsize)


def _bit_reversal(n: int) -> np.ndarray:
  """j with its log2(n) bits reversed, for j in 0..n-1 (n a power of two)."""
  bits, index = n.bit_length() - 1, np.arange(n)
  reversed_ = np.zeros(n, np.int64)
  for bit in range(bits): reversed_ |= ((index >> bit) & 1) << (bits - 1 - bit)
  return reversed_


def _fmuladd(kind: str) -> str:
  """The fused multiply-add intrinsic of the vector type `kind` ("<n x float>" or "<n x double>")."""
  return f"@llvm.fmuladd.{_name(kind, _SUFFIXES[kind.split()[-1].rstrip('>')])}"


def _floats(kind: str) -> int:
  """The floats in the vector type `kind` (twice the complex values)."""
  return int(kind[1:].split()[0])


def _declarations(*kinds: str) -> list[str]:
  """The intrinsics the kernels call: fused multiply-adds of the vector types `kinds`, and cttz."""
  return [f"declare {kind} {_fmuladd(kind)}({kind}, {kind}, {kind})" for kind in kinds] + \
      ["declare i64 @llvm.cttz.i64(i64, i1)"]


def _mask(positions) -> str:
  """A shuffle's mask of `positions`."""
  positions = list(positions)
  return f"<{len(positions)} x i32> <" + ", ".join(f"i32 {p}" for p in positions) + ">"


def _product(ir: _Builder, z: str, kind: str, same: str, crossed: str) -> str:
  """z (a vector type `kind` of complex values) times the complex factors whose two forms, (c, c) and (-d, d), are
  at `same` and `crossed`: z (c, c) + swap(z) (-d, d), a multiply and a fused multiply-add."""
  swapped = ir.value(f"shufflevector {kind} {z}, {kind} poison, {_mask(q ^ 1 for q in range(_floats(kind)))}")
  return ir.value(f"call {kind} {_fmuladd(kind)}({kind} {swapped}, {kind} {ir.load(kind, crossed)}, "
                  f"{kind} {ir.value(f'fmul {kind} {z}, {ir.load(kind, same)}')})")


@functools.lru_cache(maxsize=64)
def tables(kind: str, n: int, sign: int, dtype: np.dtype, scale: float = 1.0) -> tuple[np.ndarray, np.ndarray]:
  """(twiddles, plan) of a transform of `kind` whose complex transform has length n, its result times `scale`.

  The plan is int32 [n, bit reversal of 0..n-1]. The twiddles are, for each stage h (1, 2, ..., n / 2), the factors
  w^j = exp(sign 2 pi i j / 2h) in blocks of VL as two vectors, the real parts (c, c) and the imaginary ones
  (-d, d); a stage h < VL has one block, of each position p's factor for its butterfly (w^(p mod h)), negated where p
  is the butterfly's second output. The transform is linear, so a norm's `scale` costs no pass of its own: fft adds a
  vector of it, which the first pass multiplies by; rfft and irfft add the weights of `_half_length_factors` for
  k = 0..n times it: a's (c, c) and (-d, d) and b's (c, -c) and (d, d), each over k."""
  lanes = _lanes(dtype)
  bits = n.bit_length() - 1
  plan = np.concatenate([[n], _bit_reversal(n)]).astype(np.int32)
  blocks = []
  for h in (1 << s for s in range(bits)):
    if h < lanes:
      p = np.arange(lanes)
      w = np.exp(sign * 1j * np.pi * (p % h) / h) * np.where(p % (2 * h) < h, 1, -1)
    else: w = np.exp(sign * 1j * np.pi * np.arange(h) / h)
    w = w.reshape(-1, lanes)
    blocks.append(np.stack([np.repeat(w.real, 2, axis=-1), np.stack([-w.imag, w.imag], -1).reshape(len(w), -1)],
                           axis=1).reshape(-1))
  if kind == "fft": blocks.append(np.full(2 * lanes, scale))  # (the first pass multiplies by it)
  else:
    a, b = (factor * scale for factor in _half_length_factors(2 * n, sign))
    blocks += [np.repeat(a.real, 2), np.stack([-a.imag, a.imag], -1).reshape(-1),
               np.stack([b.real, -b.real], -1).reshape(-1), np.repeat(b.imag, 2)]
  return np.concatenate(blocks).astype(dtype), plan


def _half_length_factors(n: int, sign: int) -> tuple[np.ndarray, np.ndarray]:
  """(a, b) = (1 + i sign w^k, 1 - i sign w^k) / (2 if sign < 0 else 1) for k = 0..n/2, w = exp(sign 2 pi i / n),
  in float64: rfft's spectrum is X_k = a_k Z_k + b_k conj(Z_(m-k)) of the transform Z of its signal's pairs (m =
  n / 2, Z_m = Z_0: the transforms of the even and odd samples are (Z_k + conj Z_(m-k)) / 2 and (Z_k - conj
  Z_(m-k)) / 2i, and X_k = E_k + w^k O_k); irfft transforms Z_k = a_k X_k + b_k conj(X_(m-k)) = 2 (E_k + i O_k) (with
  X_0's and X_m's imaginary parts taken as zero), whose inverse has the even samples as its real parts and the odd
  ones as its imaginary parts."""
  w = np.exp(sign * 2j * np.pi * np.arange(n // 2 + 1) / n)
  scale = 0.5 if sign < 0 else 1.0
  return (1 + sign * 1j * w) * scale, (1 - sign * 1j * w) * scale


def shapes(kind: str, x, axis: int = -1) -> tuple[int, tuple[int, ...], np.dtype]:
  """(the complex transform's length, the result's shape and dtype) of a transform of `kind` of the array (or aval)
  `x`: fft of complex x (..., n) (or along `axis`) -> the same, or of pairs (..., n, 2) -> pairs; rfft of a real
  signal (..., 2n) -> complex (..., n + 1); irfft of complex (..., n + 1) -> a real signal (..., 2n); irfft_odd of
  complex (..., m) -> a real signal of the odd length (..., 2m - 1), by a complex transform of that length."""
  shape, dtype = tuple(x.shape), np.dtype(x.dtype)
  if kind == "fft": return (shape[axis] if dtype.kind == "c" else shape[-2]), shape, dtype
  if kind == "rfft": return shape[-1] // 2, (*shape[:-1], shape[-1] // 2 + 1), np.dtype(dtypes.complex_dtype(dtype))
  if kind == "irfft_odd": return 2 * shape[-1] - 1, (*shape[:-1], 2 * shape[-1] - 1), real_dtype(dtype)
  return shape[-1] - 1, (*shape[:-1], 2 * (shape[-1] - 1)), real_dtype(dtype)


def _kernel_ir(name: str, dtype: np.dtype, kind: str) -> str:
  """args: x, twiddles, plan (see `tables`), out; the rows [start, end) (see `shapes` for x's and out's rows)."""
  ctype, lanes = _TYPES[dtype][0], _lanes(dtype)
  vector, pair = f"<{2 * lanes} x {ctype}>", f"<2 x {ctype}>"
  ir = _Builder(name, ctype, 4)
  x0, twiddles, plan, out0 = ir.params
  n = ir.value(f"sext i32 {ir.load('i32', plan)} to i64")
  first_stages = lanes.bit_length() - 1  # the stages done inside a vector
  # rfft's and irfft's weights after the stages' twiddles: a's (c, c) and (-d, d), b's (c, -c) and (d, d), each over k
  after_stages = ir.op("add", str(first_stages * 4 * lanes), ir.op("mul", ir.op("sub", n, str(lanes)), "4"))
  weights = [ir.element(twiddles, ir.op("add", after_stages, ir.op("mul", ir.op("add", n, "1"), str(2 * w))))
             for w in range(4)] if kind != "fft" else []

  def shuffle(value: str, kind_: str, positions) -> str:
    return ir.value(f"shufflevector {kind_} {value}, {kind_} poison, {_mask(positions)}")

  def width(kind_: str) -> int: return _floats(kind_) // 2  # complex values in a vector type

  def reversed_(value: str, kind_: str) -> str:
    return shuffle(value, kind_, (2 * (width(kind_) - 1 - q) + c for q in range(width(kind_)) for c in (0, 1)))

  def product(z: str, kind_: str, same: str, crossed: str) -> str: return _product(ir, z, kind_, same, crossed)

  def weighted(z: str, mirror: str, k: str, kind_: str) -> str:
    """a_k z + b_k conj(mirror) for the values from k on (their weights' two forms each)."""
    at = [ir.element(w, ir.op("mul", k, "2")) for w in weights]
    return ir.value(f"fadd {kind_} {product(z, kind_, at[0], at[1])}, {product(mirror, kind_, at[2], at[3])}")

  def first_pass(out: str, read) -> None:
    """Each block of VL values (read(block): a vector of them in bit-reversed order), its first stages done inside
    the vector, stored in order."""
    def block(b: str) -> None:
      v = read(b)
      if kind == "fft": v = ir.value(f"fmul {vector} {v}, {ir.load(vector, ir.element(twiddles, after_stages))}")
      for s in range(first_stages):
        h = 1 << s
        low = [p if p % (2 * h) < h else p - h for p in range(lanes)]
        a = shuffle(v, vector, (2 * p + c for p in low for c in (0, 1)))
        b_ = shuffle(v, vector, (2 * (p + h) + c for p in low for c in (0, 1)))
        stage = ir.element(twiddles, str(s * 4 * lanes))
        v = ir.value(f"fadd {vector} {a}, {product(b_, vector, stage, ir.gep(vector, stage, '1'))}")
      ir.store(vector, v, ir.element(out, ir.op("mul", b, "2")))
    ir.loop("0", n, block, step=lanes)

  def gathered(x: str):
    def read(b: str) -> str:
      pieces, size = [], 2
      for q in range(lanes):
        j = ir.value(f"sext i32 {ir.load('i32', ir.gep('i32', plan, ir.op('add', b, str(q + 1))))} to i64")
        pieces.append(ir.load(pair, ir.element(x, ir.op("mul", j, "2"))))
      while len(pieces) > 1:  # (concatenated pairwise)
        pieces = [ir.value(f"shufflevector <{size} x {ctype}> {a}, <{size} x {ctype}> {b}, {_mask(range(2 * size))}")
                  for a, b in zip(pieces[0::2], pieces[1::2])]
        size *= 2
      return pieces[0]
    return read

  def stages(out: str) -> None:
    """The stages h = VL, 2 VL, ..., n / 2 in place, two at a time (radix 4: each value loaded and stored once for
    both), after a single one where their count is odd."""
    def factors(h: str, j: str) -> str:  # (stage h's twiddles of the butterflies from j on: two vectors)
      stage = ir.op("add", str(first_stages * 4 * lanes), ir.op("mul", ir.op("sub", h, str(lanes)), "4"))
      return ir.element(twiddles, ir.op("add", stage, ir.op("mul", j, "4")))

    def twiddled(b: str, at_factors: str) -> str: return product(b, vector, at_factors, ir.gep(vector, at_factors, "1"))

    def at(g: str, offset: str) -> str: return ir.element(out, ir.op("mul", ir.op("add", g, offset), "2"))

    def radix2(h: str) -> None:
      def group(g: str) -> None:
        def butterflies(j: str) -> None:
          at_a, at_b = at(g, j), at(g, ir.op("add", j, h))
          a, b = ir.load(vector, at_a), ir.load(vector, at_b)
          t = twiddled(b, factors(h, j))
          ir.store(vector, ir.value(f"fadd {vector} {a}, {t}"), at_a)
          ir.store(vector, ir.value(f"fsub {vector} {a}, {t}"), at_b)
        ir.loop("0", h, butterflies, step=lanes)
      ir.loop("0", n, group, step=ir.op("mul", h, "2"))

    def radix4(h: str) -> None:
      twice, thrice = ir.op("mul", h, "2"), ir.op("mul", h, "3")

      def group(g: str) -> None:
        def butterflies(j: str) -> None:
          ats = [at(g, j), at(g, ir.op("add", j, h)), at(g, ir.op("add", j, twice)), at(g, ir.op("add", j, thrice))]
          x0, x1, x2, x3 = (ir.load(vector, a) for a in ats)
          first = factors(h, j)
          t1, t3 = twiddled(x1, first), twiddled(x3, first)
          y0, y1 = ir.value(f"fadd {vector} {x0}, {t1}"), ir.value(f"fsub {vector} {x0}, {t1}")
          y2, y3 = ir.value(f"fadd {vector} {x2}, {t3}"), ir.value(f"fsub {vector} {x2}, {t3}")
          u2, u3 = twiddled(y2, factors(twice, j)), twiddled(y3, factors(twice, ir.op("add", j, h)))
          for a, value in ((ats[0], f"fadd {vector} {y0}, {u2}"), (ats[2], f"fsub {vector} {y0}, {u2}"),
                           (ats[1], f"fadd {vector} {y1}, {u3}"), (ats[3], f"fsub {vector} {y1}, {u3}")):
            ir.store(vector, ir.value(value), a)
        ir.loop("0", h, butterflies, step=lanes)
      ir.loop("0", n, group, step=ir.op("mul", h, "4"))
    odd = _odd_stage_count(ir, n, first_stages)
    ir.when(ir.op("icmp ne", odd, "0"), lambda: radix2(str(lanes)))
    ir.loop(ir.op("shl", str(lanes), odd), n, radix4, step=4, by="mul")

  def pairs_of(k: str, count: int, mirror_of, body) -> None:
    """body(k, kind, mirror) for k in [k, count): vectors of VL values and then one at a time, where the values
    mirror_of(k, kind) gives (the mirror images m - k, read as a vector ending there) stay clear of later ones."""
    next_k = ir.var()
    ir.store("i64", k, next_k)

    def block(k: str) -> None:
      body(k, vector)
      ir.store("i64", ir.op("add", k, str(lanes)), next_k)
    ir.loop(k, count, block, step=lanes)
    ir.loop(ir.load("i64", next_k), mirror_of, lambda k: body(k, pair))

  def row(r: str) -> None:
    two_n = ir.op("mul", n, "2")
    wide = ir.op("add", two_n, "2")  # (a row of n + 1 pairs)
    x = ir.element(x0, ir.op("mul", r, wide if kind == "irfft" else two_n))
    out = ir.element(out0, ir.op("mul", r, wide if kind == "rfft" else two_n))
    if kind == "irfft":  # Z_k = a_k X_k + b_k conj(X_(n-k)) for k < n, stored in bit-reversed order
      def real_part(at: str) -> str:
        return ir.value(f"insertelement {pair} zeroinitializer, {ctype} {ir.load(ctype, at)}, i64 0")
      z0 = weighted(real_part(x), real_part(ir.element(x, two_n)), "0", pair)
      ir.store(pair, z0, out)

      def spectrum(k: str, kind_: str) -> None:
        count = width(kind_)
        mirror = ir.op("sub", n, ir.op("add", k, str(count - 1)))
        values = ir.load(kind_, ir.element(x, ir.op("mul", k, "2")))
        mirrored = reversed_(ir.load(kind_, ir.element(x, ir.op("mul", mirror, "2"))), kind_)
        z = weighted(values, mirrored, k, kind_)
        for q in range(count):
          j = ir.value(f"sext i32 {ir.load('i32', ir.gep('i32', plan, ir.op('add', k, str(q + 1))))} to i64")
          ir.store(pair, z if count == 1 else shuffle(z, kind_, (2 * q, 2 * q + 1)), ir.element(out, ir.op("mul", j,
                                                                                                          "2")))
      pairs_of("1", ir.op("sub", n, str(lanes - 1)), n, spectrum)
      first_pass(out, lambda b: ir.load(vector, ir.element(out, ir.op("mul", b, "2"))))
    else: first_pass(out, gathered(x))
    stages(out)
    if kind == "rfft":  # X_k = a_k Z_k + b_k conj(Z_(n-k)), in place: each k with its mirror image n - k
      z0 = ir.load(pair, out)
      ir.store(pair, weighted(z0, z0, n, pair), ir.element(out, two_n))
      ir.store(pair, weighted(z0, z0, "0", pair), out)

      def spectrum(k: str, kind_: str) -> None:
        count = width(kind_)
        mirror = ir.op("sub", n, ir.op("add", k, str(count - 1)))
        at_k, at_mirror = ir.element(out, ir.op("mul", k, "2")), ir.element(out, ir.op("mul", mirror, "2"))
        values, mirrored = ir.load(kind_, at_k), ir.load(kind_, at_mirror)
        x_k = weighted(values, reversed_(mirrored, kind_), k, kind_)
        x_mirror = weighted(mirrored, reversed_(values, kind_), mirror, kind_)
        ir.store(kind_, x_k, at_k)
        ir.store(kind_, x_mirror, at_mirror)
      # (vectors while k's block ends before its mirror's begins: 2 (k + VL - 1) < n; then single values to n / 2)
      pairs_of("1", ir.op("add", ir.op("sdiv", ir.op("sub", n, str(2 * lanes - 1)), "2"), "1"),
               ir.op("add", ir.op("sdiv", n, "2"), "1"), spectrum)

  ir.loop("%start", "%end", row)
  return ir.text(_declarations(vector, pair))


@functools.lru_cache(maxsize=64)
def column_tables(n: int, inner: int, sign: int, dtype: np.dtype, scale: float = 1.0) -> tuple[np.ndarray, np.ndarray]:
  """(twiddles, plan) of the transform of length n along an axis followed by `inner` values (`_columns_ir`): the plan
  is int32 [n, inner, bit reversal of 0..n-1]; the twiddles are, for each stage h and j < h, w^j = exp(sign 2 pi i j /
  2h) as two vectors of VL copies, (c, c, ...) and (-d, d, ...), then a vector of `scale`."""
  lanes = _lanes(dtype)
  bits = n.bit_length() - 1
  plan = np.concatenate([[n, inner], _bit_reversal(n)]).astype(np.int32)
  w = np.concatenate([np.exp(sign * 1j * np.pi * np.arange(h) / h) for h in (1 << s for s in range(bits))])
  same = np.repeat(w.real[:, None], 2 * lanes, axis=1)
  crossed = np.tile(np.stack([-w.imag, w.imag], -1), (1, lanes))
  return np.concatenate([np.stack([same, crossed], 1).reshape(-1), np.full(2 * lanes, scale)]).astype(dtype), plan


LONGEST_COLUMN = 2048  # (the kernel's scratch: 64 KB of its thread's stack)


def _columns_ir(name: str, dtype: np.dtype) -> str:
  """args: x (outer, n, inner) complex, twiddles, plan (`column_tables`), out; each launch index one block of VL
  adjacent columns (then the columns left over one at a time) of one of the outer arrays: the transform of length n
  down the columns, a vector of VL columns at a time (every butterfly of a stage takes one twiddle factor, the same
  for the VL columns): read in bit-reversed order, then the stages h = 1, 2, ..., n / 2 in place. (An FFT along a
  leading axis without copying the array to rows and back.)"""
  ctype, lanes = _TYPES[dtype][0], _lanes(dtype)
  vector, pair = f"<{2 * lanes} x {ctype}>", f"<2 x {ctype}>"
  ir = _Builder(name, ctype, 4)
  x0, twiddles, plan, out0 = ir.params
  n = ir.value(f"sext i32 {ir.load('i32', plan)} to i64")
  inner = ir.value(f"sext i32 {ir.load('i32', ir.gep('i32', plan, '1'))} to i64")
  blocks = ir.op("sdiv", inner, str(lanes))
  per_outer = ir.op("add", blocks, ir.op("srem", inner, str(lanes)))
  scale = ir.element(twiddles, ir.op("mul", ir.op("sub", n, "1"), str(4 * lanes)))

  def product(z: str, kind: str, same: str, crossed: str) -> str: return _product(ir, z, kind, same, crossed)

  # the columns' values while they are transformed, a row of VL values after another: their rows in the array lie a
  # power of two apart, as far as the cache's associativity goes (4 x 256 x 256 took 3.8-5.8 ms in place, 0.3 in here)
  scratch = ir.var(f"[{LONGEST_COLUMN} x {vector}]")

  def columns(base: str, kind: str) -> None:
    """The transform of the columns from complex element `base` on (VL of them, or one)."""
    def at(array: str, row: str) -> str:
      return ir.element(array, ir.op("mul", ir.op("add", base, ir.op("mul", row, inner)), "2"))

    def row(j: str) -> str: return ir.gep(vector, scratch, j)

    def gather(j: str) -> None:
      r = ir.value(f"sext i32 {ir.load('i32', ir.gep('i32', plan, ir.op('add', j, '2')))} to i64")
      ir.store(kind, ir.value(f"fmul {kind} {ir.load(kind, at(x0, r))}, {ir.load(kind, scale)}"), row(j))
    ir.loop("0", n, gather)

    def factors(h: str, j: str) -> tuple[str, str]:  # (stage h's twiddle j: its two vectors)
      same = ir.element(twiddles, ir.op("mul", ir.op("add", ir.op("sub", h, "1"), j), str(4 * lanes)))
      return same, ir.element(same, str(2 * lanes))

    def radix2(h: str) -> None:
      def twiddle(j: str) -> None:  # (each factor once, down every group of the stage)
        same, crossed = factors(h, j)

        def butterfly(g: str) -> None:
          at_a, at_b = row(ir.op("add", g, j)), row(ir.op("add", ir.op("add", g, j), h))
          a, b = ir.load(kind, at_a), ir.load(kind, at_b)
          t = product(b, kind, same, crossed)
          ir.store(kind, ir.value(f"fadd {kind} {a}, {t}"), at_a)
          ir.store(kind, ir.value(f"fsub {kind} {a}, {t}"), at_b)
        ir.loop("0", n, butterfly, step=ir.op("mul", h, "2"))
      ir.loop("0", h, twiddle)

    def radix4(h: str) -> None:  # (stages h and 2h at once, as the rows' kernel does)
      twice = ir.op("mul", h, "2")

      def twiddle(j: str) -> None:
        first, second, third = factors(h, j), factors(twice, j), factors(twice, ir.op("add", j, h))

        def butterfly(g: str) -> None:
          top = ir.op("add", g, j)
          rows = [row(top), row(ir.op("add", top, h)), row(ir.op("add", top, twice)),
                  row(ir.op("add", ir.op("add", top, twice), h))]
          x0, x1, x2, x3 = (ir.load(kind, r) for r in rows)
          t1, t3 = product(x1, kind, *first), product(x3, kind, *first)
          y0, y1 = ir.value(f"fadd {kind} {x0}, {t1}"), ir.value(f"fsub {kind} {x0}, {t1}")
          y2, y3 = ir.value(f"fadd {kind} {x2}, {t3}"), ir.value(f"fsub {kind} {x2}, {t3}")
          u2, u3 = product(y2, kind, *second), product(y3, kind, *third)
          for r, value in ((rows[0], f"fadd {kind} {y0}, {u2}"), (rows[2], f"fsub {kind} {y0}, {u2}"),
                           (rows[1], f"fadd {kind} {y1}, {u3}"), (rows[3], f"fsub {kind} {y1}, {u3}")):
            ir.store(kind, ir.value(value), r)
        ir.loop("0", n, butterfly, step=ir.op("mul", h, "4"))
      ir.loop("0", h, twiddle)
    odd = _odd_stage_count(ir, n, 0)
    ir.when(ir.op("icmp ne", odd, "0"), lambda: radix2("1"))
    ir.loop(ir.op("shl", "1", odd), n, radix4, step=4, by="mul")
    ir.loop("0", n, lambda j: ir.store(kind, ir.load(kind, row(j)), at(out0, j)))

  def item(i: str) -> None:
    outer, c = ir.op("sdiv", i, per_outer), ir.op("srem", i, per_outer)
    base = ir.op("mul", outer, ir.op("mul", n, inner))
    ir.when(ir.op("icmp slt", c, blocks), lambda: columns(ir.op("add", base, ir.op("mul", c, str(lanes))), vector),
            lambda: columns(ir.op("add", base, ir.op("add", ir.op("mul", blocks, str(lanes)), ir.op("sub", c, blocks))),
                            pair))
  ir.loop("%start", "%end", item)
  return ir.text(_declarations(vector, pair))


def _odd_stage_count(ir: _Builder, n: str, done: int) -> str:
  """1 where the stages of a transform of length n (a power of two) left after the first `done` are odd in number,
  else 0."""
  bits = ir.value(f"call i64 @llvm.cttz.i64(i64 {n}, i1 true)")
  return ir.op("and", ir.op("sub", bits, str(done)), "1")


# ---- any other length: mixed radix (Stockham), VL transforms at once
#
# A row of the power-of-two kernels is vectorised along itself; a mixed-radix stage's butterflies would need
# shuffles of every radix there, so this kernel's vectors hold VL transforms (lines) instead, the same butterfly in
# every lane. fft and ifft of any such length, along rows or down an axis, and rfft and irfft of even ones (a complex
# transform of half the length, as the power-of-two kernel's, its split or merge done by the gather and scatter) or
# rfft of odd ones (the complex transform of the real signal) are this one kernel per kind and dtype; so are those
# whose complex transform has a larger prime factor, by Bluestein's algorithm (kinds "..._bluestein").
# 2 cores, float32, against JAX 0.10.2 (ducc), ms:
# - 262 x 1000: fft 0.42-0.46 against 1.09; rfft 0.20-0.25 against 0.64 (0.48-0.53 as a complex transform of the
#   whole length);
# - 87 x 3000: fft 0.51-0.57 against 0.55-1.02;
# - rows of the prime 1031: fft 1.6-2.7 against 2.0-2.7 (9.2 before, by Bluestein's algorithm as array operations);
# - rows of 2018 = 2 x 1009: rfft 0.85-1.05 against 0.97-1.01 (5.4 before).
# The rows' gather and scatter (VL lines' values at a time, strided) are about half of the kernel's time.

# (a length with a prime factor above LARGEST_RADIX is factored or Bluestein's; up to it, a prime's direct sum costs
# about r / 2 fused multiply-adds per value and stage: rows of 32 x 37 1.1 ms, JAX 1.0, by Bluestein's 2.2)
LARGEST_RADIX = 61
# A longer length with a larger prime factor is not the kernel's: its scratch holds M >= 2n - 1 positions
LONGEST_BLUESTEIN = 16384
_SPECIAL = (4, 2, 3, 5)  # radices with butterflies written out; other (odd prime) radices take the direct sum


def radices(n: int) -> tuple[int, ...] | None:
  """The stages of the mixed-radix kernel for length n (4s first, then 2, 3, 5, then the other primes in order), or
  None where n has a prime factor above LARGEST_RADIX."""
  stages = []
  for r in (*_SPECIAL, *range(7, LARGEST_RADIX + 1, 2)):
    while n % r == 0:
      stages.append(r)
      n //= r
  return tuple(stages) if n == 1 else None


def mixed_lanes(dtype) -> int:
  """The transforms the mixed-radix kernel does at once: a vector's lanes of `dtype`."""
  return VECTOR_BYTES // np.dtype(dtype).itemsize


_HEADER = 8  # the mixed tables' constants before the stages: see `mixed_tables`


@functools.lru_cache(maxsize=64)
def mixed_tables(n: int, inner: int, sign: int, dtype: np.dtype, scale: float = 1.0,
                 halves: bool = False) -> tuple[np.ndarray, np.ndarray]:
  """(twiddles, plan) of the mixed-radix kernel's complex transform of length n along an axis followed by `inner`
  values (1: rows). The plan is int32 [the stages' length, inner, stages, their radices (, n)]. The twiddles: the
  constants [scale, the stages' sign, and the butterflies' sign sqrt(3) / 2, cos(2 pi / 5), cos(4 pi / 5),
  sign sin(2 pi / 5), sign sin(4 pi / 5), 0]; with `halves` (rfft and irfft of real signals of 2n by a complex
  transform of n), the weights a_k and b_k of `_half_length_factors` for k = 0..n (a's pairs, then b's); where n has
  a prime factor above LARGEST_RADIX (Bluestein's algorithm: the stages are those of the forward transform of M =
  `smooth_length(2n - 1)`, and the plan ends with n), the chirp (n values) and the kernel's spectrum divided by M (M
  values) of `bluestein_constants`; then for each stage (radix r, of a transform of length l = r m) the r roots
  exp(sign 2 pi i k / r) and the m r twiddles exp(sign 2 pi i p u / l) for p < m, u < r. Complex values are
  (real, imaginary) pairs, all computed in float64 and rounded once."""
  extra = _half_length_factors(2 * n, sign) if halves else ()
  if radices(n) is not None: return _tables(n, inner, sign, dtype, scale, extra)
  size, chirp, spectrum = bluestein_constants(n, sign, np.dtype(np.complex128))
  return _tables(size, inner, -1, dtype, scale, (*extra, chirp, spectrum / size), (n,))


def _tables(n: int, inner: int, sign: int, dtype: np.dtype, scale: float, extra: tuple = (),
            tail: tuple = ()) -> tuple[np.ndarray, np.ndarray]:
  """`mixed_tables`' tables for stages of length n and `sign`: the complex arrays `extra` after the constants, and
  `tail` at the plan's end."""
  stages = radices(n)
  header = [scale, sign, sign * math.sqrt(3) / 2, math.cos(2 * math.pi / 5), math.cos(4 * math.pi / 5),
            sign * math.sin(2 * math.pi / 5), sign * math.sin(4 * math.pi / 5), 0.0]
  blocks, length = [np.array(header)], n
  blocks += [np.stack([w.real, w.imag], -1).reshape(-1) for w in extra]
  for r in stages:
    m = length // r
    roots = np.exp(sign * 2j * np.pi * np.arange(r) / r)
    twiddles = np.exp(sign * 2j * np.pi * np.outer(np.arange(m), np.arange(r)) / length).reshape(-1)
    blocks += [np.stack([roots.real, roots.imag], -1).reshape(-1), np.stack([twiddles.real, twiddles.imag],
                                                                            -1).reshape(-1)]
    length = m
  plan = np.array([n, inner, len(stages), *stages, *tail], np.int32)
  return np.concatenate(blocks).astype(dtype), plan


def smooth_length(n: int) -> int:
  """The smallest length >= n whose prime factors are 2, 3 and 5 (the mixed-radix kernel's fastest radices): a
  convolution's transforms need not be a power of two long (2 x 1031 - 1 -> 2160, not 4096)."""
  m = n
  while True:
    rest = m
    for p in (2, 3, 5):
      while rest % p == 0: rest //= p
    if rest == 1: return m
    m += 1


@functools.lru_cache(maxsize=64)
def bluestein_constants(n: int, sign: int, dtype: np.dtype) -> tuple[int, np.ndarray, np.ndarray]:
  """(M, chirp c_m = exp(sign pi i m^2 / n) for m < n, the forward DFT of length M of conj(c) wrapped around) of
  Bluestein's algorithm, X_k = c_k sum_j (x_j c_j) conj(c_(k-j)), a convolution by transforms of length M =
  `smooth_length(2n - 1)`: float64 on the host (numpy's FFT of a constant), rounded once to `dtype`."""
  size = smooth_length(2 * n - 1)
  m = np.arange(n)
  chirp = np.exp(sign * 1j * np.pi * (m * m % (2 * n)) / n)
  kernel = np.zeros(size, np.complex128)
  kernel[:n] = np.conj(chirp)
  kernel[size - n + 1:] = np.conj(chirp[1:])[::-1]
  return size, chirp.astype(dtype), np.fft.fft(kernel).astype(dtype)


def _mixed_ir(name: str, dtype: np.dtype, kind: str) -> str:
  """args: x, twiddles, plan (`mixed_tables`), out: for `kind` "fft" complex (outer, n, inner) both; "rfft" real rows
  of 2n to rows of n + 1 complex values and "irfft" those back, by a complex transform of n (the tables' `halves`:
  the signal's (even, odd) samples are its values, split into the even and odd samples' transforms as the scatter
  writes the spectrum, or merged as the gather reads it; see `_half_length_factors`); "rfft_odd" real rows of an odd
  n to n // 2 + 1 complex values, by a complex transform of n; "irfft_odd" those back (the Hermitian spectrum
  extended in the gather, the real parts scattered). A kind ending "_bluestein" does its complex transform of n by
  Bluestein's algorithm: the gather multiplies by the chirp and pads to M, the forward transform of M, the product
  with the kernel's spectrum, the inverse as conj(forward(conj)), and the result's conj times the chirp is what the
  scatter reads.
  The launch's indices are the lines (transforms) in order (line l: outer l // inner, column l % inner), launched
  with grain VL (a vector's floats). Each VL lines are gathered into a scratch as vectors of their real and their
  imaginary parts, one per position (the lanes are the lines: every butterfly is the same for all of them, no
  shuffles), times the scale; then the stages of the self-sorting (Stockham) factorisation ping-pong between the
  scratch's two halves: a stage of radix r of a transform of length l = r m with s = n / l finished, for p < m and
  q < s, takes a_t = X[q + s (p + t m)] (t < r), and writes Y[q + s (r p + u)] = w^(p u) sum_t a_t
  exp(sign 2 pi i t u / r) (u < r; w = exp(sign 2 pi i / l)). The result is read back in order and scattered to the
  lines."""
  ctype, lanes = _TYPES[dtype][0], mixed_lanes(dtype)
  vector, pair = f"<{lanes} x {ctype}>", f"<2 x {ctype}>"
  fma = _fmuladd(vector)
  ir = _Builder(name, ctype, 4)
  x0, twiddles, plan, out0 = ir.params

  def plan_at(index: str) -> str:
    return ir.value(f"sext i32 {ir.load('i32', ir.gep('i32', plan, index))} to i64")
  kind, bluestein = kind.removesuffix("_bluestein"), kind.endswith("_bluestein")
  n, inner, count = plan_at("0"), plan_at("1"), plan_at("2")  # (n: the stages' length)
  points = plan_at(ir.op("add", count, "3")) if bluestein else n  # (the complex transform's length)
  half = ir.op("add", ir.op("sdiv", points, "2"), "1")  # (rfft_odd's and irfft_odd's frequencies)
  halves = kind in ("rfft", "irfft")
  # the tables' places: halves' weights, then Bluestein's chirp and the kernel's spectrum, then the stages
  chirps = ir.op("add", str(_HEADER), ir.op("mul", ir.op("add", points, "1"), "4")) if halves else str(_HEADER)
  first_stage = ir.op("add", chirps, ir.op("mul", ir.op("add", points, n), "2")) if bluestein else chirps

  def complex_at(table: str, i: str) -> tuple[str, str]:  # (value i of a complex table at `table`, splatted)
    at = ir.element(twiddles, ir.op("add", table, ir.op("mul", i, "2")))
    return splat(ir.load(ctype, at)), splat(ir.load(ctype, ir.element(at, "1")))

  def splat(value: str) -> str: return _splat(ir, vector, value)

  def constant(index: int) -> str: return splat(ir.load(ctype, ir.element(twiddles, str(index))))
  scale, sign, sqrt3, cos1, cos2, sin1, sin2 = (constant(i) for i in range(7))
  minus_sign = ir.value(f"fneg {vector} {sign}")
  minus_half = splat(_float(-0.5))

  def add(a: str, b: str) -> str: return ir.value(f"fadd {vector} {a}, {b}")
  def sub(a: str, b: str) -> str: return ir.value(f"fsub {vector} {a}, {b}")
  def mul(a: str, b: str) -> str: return ir.value(f"fmul {vector} {a}, {b}")
  def madd(a: str, b: str, c: str) -> str:
    return ir.value(f"call {vector} {fma}({vector} {a}, {vector} {b}, {vector} {c})")

  def cadd(a, b): return add(a[0], b[0]), add(a[1], b[1])
  def csub(a, b): return sub(a[0], b[0]), sub(a[1], b[1])
  def plus_i(a, f): return sub(a[0], f[1]), add(a[1], f[0])  # a + i f
  def minus_i(a, f): return add(a[0], f[1]), sub(a[1], f[0])  # a - i f

  def cmul(a, w):  # a w, w = (c, d) vectors
    return madd(a[0], w[0], ir.value(f"fneg {vector} {mul(a[1], w[1])}")), madd(a[0], w[1], mul(a[1], w[0]))

  def conj(a): return a[0], ir.value(f"fneg {vector} {a[1]}")

  # the scratch: two buffers of n positions of VL lines' (real parts, imaginary parts), from the heap (a long
  # transform's would not fit a thread's stack)
  size = ir.op("mul", n, str(4 * lanes * dtype.itemsize))
  scratch = ir.value(f"call ptr @malloc(i64 {size})")
  second = ir.element(scratch, ir.op("mul", n, str(2 * lanes)))

  def at(buffer: str, i: str) -> tuple[str, str]:  # (real, imaginary) vectors' addresses of position i
    real = ir.element(buffer, ir.op("mul", i, str(2 * lanes)))
    return real, ir.gep(vector, real, "1")

  def load(buffer: str, i: str) -> tuple[str, str]: return tuple(ir.load(vector, a) for a in at(buffer, i))

  def store(buffer: str, i: str, value) -> None:
    for v, a in zip(value, at(buffer, i)): ir.store(vector, v, a)

  bases = ir.var(f"[{lanes} x i64]")

  def block(b: str) -> None:
    valid = ir.op("sub", "%end", b)  # (lines left: the lanes from `valid` on repeat the last line and are not stored)
    for q in range(lanes):
      line = ir.value(f"select i1 {ir.op('icmp slt', str(q), valid)}, i64 {ir.op('add', b, str(q))}, i64 "
                      f"{ir.op('sub', '%end', '1')}")
      if kind == "fft":  # (its first value's place)
        outer, column = ir.op("sdiv", line, inner), ir.op("srem", line, inner)
        line = ir.op("add", ir.op("mul", outer, ir.op("mul", points, inner)), column)
      ir.store("i64", line, ir.gep("i64", bases, str(q)))
    base = [ir.load("i64", ir.gep("i64", bases, str(q))) for q in range(lanes)]
    def pairs_at(row: str, q: int, i: str) -> str:  # (pair i of a row of `row` pairs)
      return ir.op("mul", ir.op("add", ir.op("mul", base[q], row), i), "2")
    if kind == "fft":  # (pairs, at the same places in x and out)
      def position(q: int, i: str) -> str: return ir.op("mul", ir.op("add", base[q], ir.op("mul", i, inner)), "2")
      source_at = target_at = position
    elif kind in ("rfft_odd", "irfft_odd"):  # (rows: real signals of n, and their `half` pairs)
      def real_at(q: int, i: str) -> str: return ir.op("add", ir.op("mul", base[q], points), i)  # (base: the line)
      def half_at(q: int, i: str) -> str: return pairs_at(half, q, i)
      source_at, target_at = (real_at, half_at) if kind == "rfft_odd" else (half_at, real_at)
    else:  # (rows of n pairs, the signal's samples; of n + 1 pairs, the spectrum's)
      def signal_at(q: int, i: str) -> str: return pairs_at(points, q, i)
      def spectrum_at(q: int, i: str) -> str: return pairs_at(ir.op("add", points, "1"), q, i)
      source_at, target_at = (signal_at, spectrum_at) if kind == "rfft" else (spectrum_at, signal_at)

    def weighted(k: str, z, mirror):  # a_k z + b_k conj(mirror) (halves' weights)
      a, b_ = complex_at(str(_HEADER), k), complex_at(str(_HEADER), ir.op("add", k, ir.op("add", points, "1")))
      return cadd(cmul(z, a), cmul(conj(mirror), b_))

    def vector_of(values: list[str]) -> str:
      value = "poison"
      for q, v in enumerate(values): value = ir.value(f"insertelement {vector} {value}, {ctype} {v}, i64 {q}")
      return value

    def pairs_of(at) -> tuple[str, str]:  # (real parts, imaginary parts) of the lanes' pairs at(q)
      pieces = [ir.load(pair, ir.element(x0, at(q))) for q in range(lanes)]
      return tuple(vector_of([ir.value(f"extractelement {pair} {v}, i64 {c}") for v in pieces]) for c in (0, 1))

    def gather(i: str) -> None:
      if kind == "rfft_odd":
        parts = [vector_of([ir.load(ctype, ir.element(x0, source_at(q, i))) for q in range(lanes)]),
                 "zeroinitializer"]
      elif kind == "irfft":  # Z_i = a_i X_i + b_i conj(X_(n-i)), X_0's and X_n's imaginary parts taken as zero
        value, mirror = pairs_of(lambda q: source_at(q, i)), pairs_of(lambda q: source_at(q, ir.op("sub", points,
                                                                                                     i)))
        edge = ir.op("icmp eq", i, "0")
        value, mirror = ((v[0], ir.value(f"select i1 {edge}, {vector} zeroinitializer, {vector} {v[1]}"))
                         for v in (value, mirror))
        parts = weighted(i, value, mirror)
      elif kind == "irfft_odd":  # position i > n / 2 is conj(x[n - i]); x[0]'s imaginary part counts as zero
        upper = ir.op("icmp sgt", ir.op("mul", i, "2"), points)
        real, imaginary = pairs_of(lambda q: source_at(q, ir.value(f"select i1 {upper}, i64 "
                                                                  f"{ir.op('sub', points, i)}, i64 {i}")))
        factor = ir.value(f"select i1 {ir.op('icmp eq', i, '0')}, {ctype} 0.0, {ctype} "
                          f"{ir.value(f'select i1 {upper}, {ctype} -1.0, {ctype} 1.0')}")
        parts = (real, mul(imaginary, splat(factor)))
      else: parts = pairs_of(lambda q: source_at(q, i))
      if bluestein: parts = cmul(parts, complex_at(chirps, i))
      store(scratch, i, (mul(parts[0], scale), mul(parts[1], scale)))
    ir.loop("0", points, gather)
    if bluestein: ir.loop(points, n, lambda i: store(scratch, i, ("zeroinitializer", "zeroinitializer")))

    source, target, stride, length, offset = (ir.var("ptr"), ir.var("ptr"), ir.var(), ir.var(), ir.var())
    for var, value in ((source, scratch), (target, second)): ir.store("ptr", value, var)
    def stages() -> None:
      for var, value in ((stride, "1"), (length, n), (offset, first_stage)): ir.store("i64", value, var)
      ir.loop("0", count, stage)

    def stage(k: str) -> None:
      r = plan_at(ir.op("add", k, "3"))
      x, y, s, l = ir.load("ptr", source), ir.load("ptr", target), ir.load("i64", stride), ir.load("i64", length)
      m = ir.op("sdiv", l, r)
      roots = ir.element(twiddles, ir.load("i64", offset))
      factors = ir.element(roots, ir.op("mul", r, "2"))

      def butterflies(radix: int | None, butterfly) -> None:
        """For p < m: its twiddles; for q < s: butterfly(a_t loader, store of b_u)."""
        def twiddle(p: str) -> None:
          def w(u: str) -> tuple[str, str]:
            real = ir.element(factors, ir.op("mul", ir.op("add", ir.op("mul", p, r), u), "2"))
            return splat(ir.load(ctype, real)), splat(ir.load(ctype, ir.element(real, "1")))
          ws = [w(str(u)) for u in range(1, radix)] if radix else None

          def each(q: str) -> None:
            def a(t: str) -> tuple[str, str]:
              return load(x, ir.op("add", q, ir.op("mul", s, ir.op("add", p, ir.op("mul", t, m)))))

            def put(u: str, value, twiddled: bool = True) -> None:
              if twiddled: value = cmul(value, ws[int(u) - 1] if radix else w(u))
              store(y, ir.op("add", q, ir.op("mul", s, ir.op("add", ir.op("mul", r, p), u))), value)
            butterfly(a, put)
          ir.loop("0", s, each)
        ir.loop("0", m, twiddle)

      def radix2(a, put) -> None:
        a0, a1 = a("0"), a("1")
        put("0", cadd(a0, a1), False)
        put("1", csub(a0, a1))

      def radix4(a, put) -> None:
        a0, a1, a2, a3 = (a(str(t)) for t in range(4))
        t0, t1, t2, t3 = cadd(a0, a2), csub(a0, a2), cadd(a1, a3), csub(a1, a3)
        put("0", cadd(t0, t2), False)
        put("2", csub(t0, t2))
        # (w4 = sign i: w4 t3 = (-sign t3.imag, sign t3.real))
        put("1", (madd(minus_sign, t3[1], t1[0]), madd(sign, t3[0], t1[1])))
        put("3", (madd(sign, t3[1], t1[0]), madd(minus_sign, t3[0], t1[1])))

      def radix3(a, put) -> None:
        a0, a1, a2 = a("0"), a("1"), a("2")
        t1 = cadd(a1, a2)
        t2 = (madd(t1[0], minus_half, a0[0]), madd(t1[1], minus_half, a0[1]))
        d = csub(a1, a2)
        t3 = (mul(d[0], sqrt3), mul(d[1], sqrt3))
        put("0", cadd(a0, t1), False)
        put("1", plus_i(t2, t3))
        put("2", minus_i(t2, t3))

      def radix5(a, put) -> None:
        a0, a1, a2, a3, a4 = (a(str(t)) for t in range(5))
        t1, t2, t3, t4 = cadd(a1, a4), cadd(a2, a3), csub(a1, a4), csub(a2, a3)
        put("0", cadd(a0, cadd(t1, t2)), False)
        e1 = tuple(madd(t1[c], cos1, madd(t2[c], cos2, a0[c])) for c in (0, 1))
        e2 = tuple(madd(t1[c], cos2, madd(t2[c], cos1, a0[c])) for c in (0, 1))
        f1 = tuple(madd(t3[c], sin1, mul(t4[c], sin2)) for c in (0, 1))
        f2 = tuple(madd(t3[c], sin2, ir.value(f"fneg {vector} {mul(t4[c], sin1)}")) for c in (0, 1))
        put("1", plus_i(e1, f1))
        put("4", minus_i(e1, f1))
        put("2", plus_i(e2, f2))
        put("3", minus_i(e2, f2))

      def direct(a, put) -> None:
        """b_u = sum_t a_t w^(t u), w = exp(sign 2 pi i / r) (r odd), with t paired with r - t: for u, t <= h =
        (r - 1) / 2, E = sum_t c_tu (a_t + a_(r-t)) and G = sum_t s_tu (a_t - a_(r-t)) (w^(tu) = c_tu + i s_tu)
        give b_u = a_0 + E + i G and b_(r-u) = a_0 + E - i G; b_0 = a_0 + sum_t (a_t + a_(r-t)). tu mod r is kept
        as a running sum (no division)."""
        h = ir.op("sdiv", r, "2")
        a0 = a("0")
        sums = [ir.var(vector) for _ in range(4)]  # E's and G's (real, imaginary) parts
        k = ir.var()

        def pair(t: str) -> tuple[tuple[str, str], tuple[str, str]]:
          at, mirror = a(t), a(ir.op("sub", r, t))
          return cadd(at, mirror), csub(at, mirror)

        for var, value in zip(sums[:2], a0): ir.store(vector, value, var)
        ir.loop("1", ir.op("add", h, "1"), lambda t: [ir.store(vector, add(ir.load(vector, var), part), var)
                                                       for var, part in zip(sums[:2], pair(t)[0])])
        put("0", tuple(ir.load(vector, var) for var in sums[:2]), False)

        def output(u: str) -> None:
          for var in sums: ir.store(vector, "zeroinitializer", var)
          ir.store("i64", u, k)

          def term(t: str) -> None:
            total, difference = pair(t)
            root = ir.element(roots, ir.op("mul", ir.load("i64", k), "2"))
            c, s_ = splat(ir.load(ctype, root)), splat(ir.load(ctype, ir.element(root, "1")))
            for var, value, factor in zip(sums, (*total, *difference), (c, c, s_, s_)):
              ir.store(vector, madd(value, factor, ir.load(vector, var)), var)
            step = ir.op("add", ir.load("i64", k), u)
            ir.store("i64", ir.value(f"select i1 {ir.op('icmp sge', step, r)}, i64 {ir.op('sub', step, r)}, "
                                     f"i64 {step}"), k)
          ir.loop("1", ir.op("add", h, "1"), term)
          e_real, e_imaginary, g_real, g_imaginary = (ir.load(vector, var) for var in sums)
          e = (add(a0[0], e_real), add(a0[1], e_imaginary))
          put(u, (sub(e[0], g_imaginary), add(e[1], g_real)))
          put(ir.op("sub", r, u), (add(e[0], g_imaginary), sub(e[1], g_real)))
        ir.loop("1", ir.op("add", h, "1"), output)

      cases = [(4, radix4), (2, radix2), (3, radix3), (5, radix5)]

      def dispatch(index: int) -> None:
        if index == len(cases): return butterflies(None, direct)
        radix, butterfly = cases[index]
        ir.when(ir.op("icmp eq", r, str(radix)), lambda: butterflies(radix, butterfly), lambda: dispatch(index + 1))
      dispatch(0)
      ir.store("ptr", y, source)
      ir.store("ptr", x, target)
      ir.store("i64", ir.op("mul", s, r), stride)
      ir.store("i64", m, length)
      ir.store("i64", ir.op("add", ir.load("i64", offset), ir.op("mul", ir.op("add", r, ir.op("mul", m, r)), "2")),
               offset)
    stages()
    if bluestein:  # times the kernel's spectrum, then the inverse transform as conj(forward(conj))
      def convolve(i: str) -> None:
        buffer = ir.load("ptr", source)
        store(buffer, i, conj(cmul(load(buffer, i), complex_at(chirps, ir.op("add", points, i)))))
      ir.loop("0", n, convolve)
      stages()
    result = ir.load("ptr", source)

    def final(k: str) -> tuple[str, str]:  # (the complex transform's value k)
      return cmul(conj(load(result, k)), complex_at(chirps, k)) if bluestein else load(result, k)

    def scatter(i: str, lanes_stored: int | None) -> None:
      if kind == "rfft":  # X_i = a_i Z_i + b_i conj(Z_(n-i)), for i = 0..n (Z_n = Z_0)
        def wrapped(k: str) -> str: return ir.value(f"select i1 {ir.op('icmp eq', k, points)}, i64 0, i64 {k}")
        real, imaginary = weighted(i, final(wrapped(i)), final(wrapped(ir.op("sub", points, i))))
      else: real, imaginary = final(i)
      if kind == "irfft_odd":  # (the real parts alone)
        for q in range(lanes):
          value = ir.value(f"extractelement {vector} {real}, i64 {q}")

          def put_real(q: int = q, value: str = value) -> None:
            ir.store(ctype, value, ir.element(out0, target_at(q, i)))
          if lanes_stored is None: ir.when(ir.op("icmp slt", str(q), valid), put_real)
          else: put_real()
        return
      both = ir.value(f"shufflevector {vector} {real}, {vector} {imaginary}, "
                      f"{_mask(c * lanes + q for q in range(lanes) for c in (0, 1))}")
      for q in range(lanes):
        value = ir.value(f"shufflevector <{2 * lanes} x {ctype}> {both}, <{2 * lanes} x {ctype}> poison, "
                         f"{_mask((2 * q, 2 * q + 1))}")

        def put(q: int = q, value: str = value) -> None: ir.store(pair, value, ir.element(out0, target_at(q, i)))
        if lanes_stored is None: ir.when(ir.op("icmp slt", str(q), valid), put)
        else: put()
    stored = {"rfft": ir.op("add", points, "1"), "rfft_odd": half}.get(kind, points)
    ir.when(ir.op("icmp sge", valid, str(lanes)), lambda: ir.loop("0", stored, lambda i: scatter(i, lanes)),
            lambda: ir.loop("0", stored, lambda i: scatter(i, None)))

  ir.loop("%start", "%end", block, step=lanes)
  ir.emit(f"call void @free(ptr {scratch})")
  return ir.text([f"declare {vector} {fma}({vector}, {vector}, {vector})", "declare ptr @malloc(i64)",
                  "declare void @free(ptr)"])



@functools.cache
def source(kind: str, dtype: np.dtype) -> tuple[str, str]:
  """(name, LLVM IR) of the kernel of transforms of `kind` (or "fft_columns", `_columns_ir`, or "<kind>_mixed",
  `_mixed_ir`) over `dtype`."""
  name = f"tj_{kind}_{_TYPES[dtype][1]}"
  if kind == "fft_columns": return name, _columns_ir(name, dtype)
  return name, _mixed_ir(name, dtype, kind[:-6]) if kind.endswith("_mixed") else _kernel_ir(name, dtype, kind)


def program(kind: str, dtype: np.dtype):
  """The CPU program of `source(kind, dtype)` (compiled, or loaded from the disk cache, on first use)."""
  from tinyjax.devices import cpu
  return cpu.compile_cpu(*source(kind, np.dtype(dtype)))


def _variant(kind: str, axis: int, x) -> str:
  if (length := _mixed_length(kind, x, axis)) is not None:
    points = length if kind in ("fft", "irfft_odd") or length % 2 else length // 2  # (the complex transform's)
    variant = "rfft_odd" if kind == "rfft" and length % 2 else kind
    return f"{variant}{'_bluestein' if radices(points) is None else ''}_mixed"
  return kind if axis == -1 else "fft_columns"


def _launches(kind: str, axis: int, x) -> tuple[int, int]:
  """The kernel's (launch count, grain): rows; or (down an axis) blocks of VL columns and the columns left over, per
  outer array; or (the mixed-radix kernel) the lines (transforms), VL at a time."""
  part = real_dtype(x.dtype)
  pairs = kind == "fft" and np.dtype(x.dtype).kind != "c"
  if _mixed_length(kind, x, axis) is not None:
    return math.prod(x.shape) // x.shape[-2 if pairs else axis] // (2 if pairs else 1), mixed_lanes(part)
  if axis != -1:
    inner, lanes = math.prod(x.shape[axis + 1:]), _lanes(part)
    return math.prod(x.shape[:axis]) * (inner // lanes + inner % lanes), 1
  return math.prod(x.shape[:-2] if pairs else x.shape[:-1]), 1


def _run(kind: str, axis: int, x: np.ndarray, twiddles: np.ndarray, plan: np.ndarray) -> list[np.ndarray]:
  """The host step's function: the kernel over the rows (or columns) of x, across the CPU runtime's threads."""
  x = np.ascontiguousarray(x)
  _, shape, dtype = shapes(kind, x, axis)
  out = np.empty(shape, dtype)
  if x.size and out.size:
    count, grain = _launches(kind, axis, x)
    program(_variant(kind, axis, x), real_dtype(x.dtype))([a.ctypes.data for a in (x, twiddles, plan, out)], count,
                                                          grain=grain)
  return [out]


def _fft_impl(x: Array, twiddles: Array, plan: Array, *, kind: str, sign: int, scale: float, axis: int) -> Array:
  _, shape, dtype = shapes(kind, x, axis)
  part, (count, grain), variant = real_dtype(x.dtype), _launches(kind, axis, x), _variant(kind, axis, x)
  callback = HostCallback(lambda *arrays: _run(kind, axis, *arrays), ((shape, dtype),), kind, checked=False,
                          native=NativeKernel(lambda: source(variant, part), count, grain))
  return host_call(callback, x, twiddles, plan)[0]


# (the tables are operands, made where the transform is called: constants of the program, or of a loop body that
# calls it, where an impl's own constants would have no slot)
fft_p = Primitive("fft", _fft_impl)


def _batch(trace, vals, dims, **params):
  """The vmapped axis becomes a leading one where it was one of the transform's (the last, the last two of pairs, or
  the transform's axis and those after it)."""
  (x, twiddles, plan), (d, *tables_batched) = vals, dims
  if any(b is not None for b in tables_batched): raise NotImplementedError("vmap over an FFT's tables")
  axes = 2 if params["kind"] == "fft" and np.dtype(x.dtype).kind != "c" else -params["axis"]
  if d is not None and d >= x.ndim - axes: x, d = batching.move_axis(x, d, 0), 0
  return fft_p.bind(x, twiddles, plan, **params), d


def _transpose(ct, node, known):
  """The transpose of each kind, in JAX's convention for complex values (a real input's cotangent is the real part
  of M^T ct, a complex one's of a real output is conj of the parts' gradients): fft's is the transform of the same
  sign for complex values (the DFT matrix is symmetric) and of the other sign for pairs (the real map's transpose);
  rfft's is irfft of conj(ct) with its values k = 1..n-1 halved, and irfft's is conj of rfft(ct) with those values
  doubled (irfft adds each of them and its conjugate; irfft_odd's all but the first). The scale carries over."""
  from tinyjax import numpy as jnp
  params = dict(node.arg.params)
  kind, sign, scale, axis = params["kind"], params["sign"], params["scale"], params["axis"]
  x = node.src[0]
  if kind == "fft":
    return transform(ct, "fft", sign if np.dtype(x.dtype).kind == "c" else -sign, scale, axis), None, None
  if kind == "rfft" and (length := _mixed_length(kind, x)) is not None:  # (the real part of W^T ct, W symmetric)
    padded = jnp.pad(ct, [(0, 0)] * (ct.ndim - 1) + [(0, length - ct.shape[-1])])
    return jnp.real(transform(padded, "fft", -1, scale)), None, None
  if kind == "irfft_odd":  # (conj of rfft(ct), the values k >= 1 doubled: no Nyquist value)
    inner = np.full(x.shape[-1], 2.0, real_dtype(x.dtype))
    inner[0] = 1
    return jnp.conj(transform(ct, "rfft", -1, scale) * jnp.asarray(inner)), None, None
  n = shapes(kind, x)[0]
  inner = np.full(n + 1, 0.5 if kind == "rfft" else 2.0, real_dtype(x.dtype))
  inner[0] = inner[n] = 1
  if kind == "rfft": return transform(jnp.conj(ct) * jnp.asarray(inner), "irfft", 1, scale), None, None
  return jnp.conj(transform(ct, "rfft", -1, scale) * jnp.asarray(inner)), None, None


ad.defjvp(fft_p, lambda tangent, out, x, twiddles, plan, **params: fft_p.bind(tangent, twiddles, plan, **params),
          None, None)
ad.transpose_rules[fft_p] = _transpose
ad.abstract_eval_rules[fft_p] = lambda x, twiddles, plan, *, kind, axis, **params: (*shapes(kind, x, axis)[1:], False)
batching.batch_rules[fft_p] = _batch


def transform(x: Array, kind: str, sign: int, scale: float = 1.0, axis: int = -1) -> Array:
  """A transform of a length the kernels take (`supported`), unnormalised, times `scale`, over the last axis of `x`:
  - "fft": each row of complex values (..., n), or of (real, imaginary) pairs (..., n, 2) in a float array, to its
    DFT sum_j x_j exp(sign 2 pi i j k / n), of the same kind; for complex values, along any `axis` (negative; a power
    of two before the last: at most LONGEST_COLUMN, `_columns_ir`);
  - "rfft" (sign -1): each real signal (..., N) to its N // 2 + 1 non-negative frequencies (complex);
  - "irfft" (sign 1): the n + 1 non-negative frequencies of a Hermitian spectrum (the imaginary parts of the first
    and the last ignored) to its real signal (..., 2n), times 2n.
  A power-of-two length (rfft / irfft: twice one) takes the power-of-two kernels, any other the mixed-radix one."""
  from tinyjax import numpy as jnp
  n, part = shapes(kind, x, axis)[0], real_dtype(x.dtype)
  if (length := _mixed_length(kind, x, axis)) is not None:
    if kind == "fft":
      inner = math.prod(x.shape[x.ndim + axis + 1:]) if np.dtype(x.dtype).kind == "c" else 1
      twiddles, plan = mixed_tables(length, inner, sign, part, float(scale))
    elif length % 2: twiddles, plan = mixed_tables(length, 1, sign, part, float(scale))  # (rfft_odd, irfft_odd)
    else: twiddles, plan = mixed_tables(length // 2, 1, sign, part, float(scale), halves=True)
  elif axis == -1: twiddles, plan = tables(kind, n, sign, part, float(scale))
  else: twiddles, plan = column_tables(n, math.prod(x.shape[axis + 1:]), sign, part, float(scale))
  return fft_p.bind(x, jnp.asarray(twiddles), jnp.asarray(plan), kind=kind, sign=sign, scale=float(scale), axis=axis)
