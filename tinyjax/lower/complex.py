"""Complex numbers, lowered to pairs of floats before scheduling.

A complex64 / complex128 array is stored as numpy stores it: interleaved (real, imaginary) float32 / float64 pairs.
`split_complex` rewrites a normalised program whose nodes are complex into one over floats only, so the scheduler and
codegen never see a complex value (and keep fusing and vectorising the float work):

- an input (PARAM) of shape S is read as the float array (*S, 2) its memory is, and split into its two parts;
- every complex node becomes a (real, imaginary) pair of float nodes: movement ops apply to both, + and - part by
  part, * and / by the textbook formulas, a sum of products (a matmul, an einsum) as four real contractions, 2**z
  and sqrt by their closed forms over real functions (lax builds exp, sin, cos... of complex numbers from real
  functions of the parts); REAL, IMAG and COMPLEX pick or pair the parts;
- a complex output is written back interleaved, as the float array (*S, 2) that the runtime then views as complex
  (realize.py `typed_views`).

- a host call (pure_callback, lax.linalg's LAPACK steps) with complex operands or results exchanges them as float
  pairs and hands its function complex arrays.

- loops and branches (SCAN, WHILE, COND) carry complex values as float pairs: their sub-programs are rewritten the
  same way.

Complex numbers are ordered lexicographically, as JAX orders them (`<`, maximum, a reduction's maximum, sorting).
Operations that have no meaning on complex numbers (integer ops, products of reductions other than sums and maxima)
raise NotImplementedError naming them.
"""
from __future__ import annotations

import math

import numpy as np

from tinyjax.dtypes import real_dtype
from tinyjax.uop import BOOL, MOVEMENT, Ops, ScatterArg, UOp, rewrite_sub_programs, sub_programs

INDEX = np.dtype(np.int32)


def is_complex(dtype: np.dtype) -> bool:
  return dtype.kind == "c"


def has_complex(sink: UOp) -> bool:
  """Whether the program computes with complex values anywhere, its loop bodies' and branches' programs included."""
  return any(is_complex(node.dtype) or (node.op in (Ops.SCAN, Ops.WHILE, Ops.COND) and
                                        any(has_complex(p) for p in sub_programs(node))) for node in sink.toposort)


def _full(dtype: np.dtype, value: float, shape: tuple[int, ...]) -> UOp:
  const = UOp.const(dtype, value)
  if not shape: return const
  return UOp(Ops.EXPAND, dtype, (UOp(Ops.RESHAPE, dtype, (const,), (1,) * len(shape)),), tuple(shape))


def _bin(op: Ops, a: UOp, b: UOp) -> UOp: return UOp(op, BOOL if op in (Ops.CMPLT, Ops.CMPNE) else a.dtype, (a, b))
def _add(a: UOp, b: UOp) -> UOp: return _bin(Ops.ADD, a, b)
def _mul(a: UOp, b: UOp) -> UOp: return _bin(Ops.MUL, a, b)
def _neg(a: UOp) -> UOp: return UOp(Ops.NEG, a.dtype, (a,))
def _sub(a: UOp, b: UOp) -> UOp: return _add(a, _neg(b))
def _div(a: UOp, b: UOp) -> UOp: return _bin(Ops.FDIV, a, b)
def _scale(a: UOp, value: float) -> UOp: return _mul(a, _full(a.dtype, value, a.shape))
def _where(cond: UOp, a: UOp, b: UOp) -> UOp: return UOp(Ops.WHERE, a.dtype, (cond, a, b))
def _sqrt(a: UOp) -> UOp: return UOp(Ops.SQRT, a.dtype, (a,))
def _sin(a: UOp) -> UOp: return UOp(Ops.SIN, a.dtype, (a,))
def _not(a: UOp) -> UOp: return _bin(Ops.CMPNE, a, _full(BOOL, True, a.shape))
def _eq(a: UOp, value: float) -> UOp: return _not(_bin(Ops.CMPNE, a, _full(a.dtype, value, a.shape)))


def _cos(a: UOp) -> UOp: return UOp(Ops.COS, a.dtype, (a,))


def _abs(a: UOp) -> UOp: return _where(_signbit(a), _neg(a), a)  # (|-0| is +0)


def _modulus(a: UOp, b: UOp) -> UOp:
  """|a + ib| = m sqrt(1 + (s / m)^2), m = max(|a|, |b|), s the other: no overflow on the way (inf stays inf)."""
  abs_a, abs_b = _abs(a), _abs(b)
  larger = _bin(Ops.CMPLT, abs_a, abs_b)
  m, s = _where(larger, abs_b, abs_a), _where(larger, abs_a, abs_b)
  zero = _bin(Ops.CMPNE, m, _full(m.dtype, 0.0, m.shape))
  ratio = _div(s, _where(zero, m, _full(m.dtype, 1.0, m.shape)))
  scaled = _mul(m, _sqrt(_add(_full(m.dtype, 1.0, m.shape), _mul(ratio, ratio))))
  infinite = _not(_bin(Ops.CMPLT, m, _full(m.dtype, math.inf, m.shape)))  # (NaN included: it propagates)
  return _where(infinite, m, scaled)


def _signbit(a: UOp) -> UOp:
  """a < 0, or a == -0 (1 / -0 is -inf)."""
  zero = _full(a.dtype, 0.0, a.shape)
  negative_zero = _bin(Ops.AND, _eq(a, 0.0), _bin(Ops.CMPLT, UOp(Ops.RECIP, a.dtype, (a,)), zero))
  return _bin(Ops.OR, _bin(Ops.CMPLT, a, zero), negative_zero)


def _isnan(a: UOp) -> UOp: return _bin(Ops.CMPNE, a, a)


def _less(first: tuple[UOp, UOp], second: tuple[UOp, UOp]) -> UOp:
  """The lexicographic order of complex numbers (JAX's and numpy's): by real part, then by imaginary part."""
  (a, b), (c, d) = first, second
  return _bin(Ops.OR, _bin(Ops.CMPLT, a, c), _bin(Ops.AND, _not(_bin(Ops.CMPNE, a, c)), _bin(Ops.CMPLT, b, d)))


def _lexicographic_max(re: UOp, im: UOp, arg: tuple) -> tuple[UOp, UOp]:
  """The lexicographic maximum over a reduction's axes: the largest real part, then the largest imaginary part among
  the elements that have it (a NaN real part is the largest, as a NaN propagates through a float maximum)."""
  top = UOp(Ops.REDUCE_AXIS, re.dtype, (re,), arg)
  spread = UOp(Ops.EXPAND, re.dtype, (top,), re.shape)
  has_top = _bin(Ops.OR, _not(_bin(Ops.CMPNE, re, spread)), _bin(Ops.AND, _isnan(re), _isnan(spread)))
  candidates = _where(has_top, im, _full(im.dtype, -math.inf, im.shape))
  return top, UOp(Ops.REDUCE_AXIS, im.dtype, (candidates,), arg)


def _cast(a: UOp, dtype: np.dtype) -> UOp: return a if a.dtype == dtype else UOp(Ops.CAST, dtype, (a,))


def _unsupported(what: str) -> NotImplementedError:
  return NotImplementedError(f"{what} of complex numbers is not supported by tinyjax yet")


def split_complex(sink: UOp) -> UOp:
  """The program `sink` (a normalised SINK over PARAMs) with every complex value computed as a pair of floats (see the
  module docstring); its complex outputs become interleaved float outputs (*S, 2)."""
  pairs: dict[UOp, tuple[UOp, UOp]] = {}
  real: dict[UOp, UOp] = {}
  readers: dict[UOp, int] = {}
  for node in sink.toposort:
    for source in node.src: readers[source] = readers.get(source, 0) + 1

  def rebuilt(node: UOp) -> UOp:
    """A real node over rewritten sources."""
    src = tuple(real[s] for s in node.src)
    return node if src == node.src else node.replace(src=src)

  for node in sink.toposort:
    op = node.op
    if node is sink: break
    operand_complex = any(is_complex(s.dtype) for s in node.src)
    if op in (Ops.SCAN, Ops.WHILE, Ops.COND) and (operand_complex or any(has_complex(p) for p in sub_programs(node))):
      real[node] = UOp(op, node.dtype, tuple(_interleaved(*pairs[s]) if is_complex(s.dtype) else real[s]
                                             for s in node.src), _split_programs(node))
      continue
    if op is Ops.CALLBACK and (operand_complex or any(is_complex(dtype) for _, dtype in node.arg.out_avals)):
      real[node] = _host_call_on_pairs(node, [_interleaved(*pairs[s]) if is_complex(s.dtype) else real[s]
                                              for s in node.src])
      continue
    if not is_complex(node.dtype):
      if op is Ops.REAL: real[node] = pairs[node.src[0]][0]
      elif op is Ops.IMAG: real[node] = pairs[node.src[0]][1]
      elif not operand_complex: real[node] = rebuilt(node)
      elif op is Ops.CMPNE:
        (a, b), (c, d) = pairs[node.src[0]], pairs[node.src[1]]
        real[node] = _bin(Ops.OR, _bin(Ops.CMPNE, a, c), _bin(Ops.CMPNE, b, d))
      elif op is Ops.CMPLT:
        real[node] = _less(pairs[node.src[0]], pairs[node.src[1]])
      elif op is Ops.CAST:  # to a real dtype: the real part, as numpy and JAX (bool is `!= 0` via CMPNE)
        real[node] = _cast(pairs[node.src[0]][0], node.dtype)
      else: raise _unsupported(op.name)
      continue
    part = real_dtype(node.dtype)
    shape = node.shape
    if op is Ops.PARAM:
      index, param_shape = node.arg
      pairs[node] = _split_pairs(UOp(Ops.PARAM, part, (), (index, (*param_shape, 2))), param_shape)
    elif op is Ops.CONST:
      value = complex(node.arg)
      pairs[node] = (UOp.const(part, value.real), UOp.const(part, value.imag))
    elif op in MOVEMENT or op is Ops.CONTIGUOUS:
      pairs[node] = tuple(UOp(op, part, (p,), node.arg) for p in pairs[node.src[0]])
    elif op is Ops.PROJECT:  # a complex result of a host call: written as float pairs (`_host_call_on_pairs`)
      index, out_shape = node.arg
      pairs[node] = _split_pairs(UOp(Ops.PROJECT, part, (real[node.src[0]],), (index, (*out_shape, 2))), out_shape)
    elif op is Ops.COMPLEX:
      pairs[node] = (_cast(real[node.src[0]], part), _cast(real[node.src[1]], part))
    elif op is Ops.CAST:
      source = node.src[0]
      if is_complex(source.dtype): pairs[node] = tuple(_cast(p, part) for p in pairs[source])
      else: pairs[node] = (_cast(real[source], part), _full(part, 0.0, shape))
    elif op is Ops.NEG:
      pairs[node] = tuple(_neg(p) for p in pairs[node.src[0]])
    elif op is Ops.ADD:
      (a, b), (c, d) = pairs[node.src[0]], pairs[node.src[1]]
      pairs[node] = (_add(a, c), _add(b, d))
    elif op is Ops.MUL:
      (a, b), (c, d) = pairs[node.src[0]], pairs[node.src[1]]
      pairs[node] = (_sub(_mul(a, c), _mul(b, d)), _add(_mul(a, d), _mul(b, c)))
    elif op in (Ops.FDIV, Ops.RECIP):
      (a, b) = pairs[node.src[0]] if op is Ops.FDIV else (_full(part, 1.0, shape), _full(part, 0.0, shape))
      (c, d) = pairs[node.src[-1]]
      # Smith's algorithm: divide by the larger of |c|, |d| first, so c^2 + d^2 neither overflows nor underflows
      wide = _bin(Ops.CMPLT, _abs(d), _abs(c))
      ratio = _where(wide, _div(d, c), _div(c, d))
      denominator = _where(wide, _add(c, _mul(d, ratio)), _add(_mul(c, ratio), d))
      real_part = _where(wide, _add(a, _mul(b, ratio)), _add(_mul(a, ratio), b))
      imag_part = _where(wide, _sub(b, _mul(a, ratio)), _sub(_mul(b, ratio), a))
      # by zero: each part times inf (numpy's values: (1 + 2j) / 0 is inf + infj, -3 / 0j is -inf + nanj, 0 / 0j NaN)
      by_zero = _bin(Ops.AND, _eq(c, 0.0), _eq(d, 0.0))
      infinity = _full(part, math.inf, shape)
      pairs[node] = (_where(by_zero, _mul(a, infinity), _div(real_part, denominator)),
                     _where(by_zero, _mul(b, infinity), _div(imag_part, denominator)))
    elif op is Ops.MAX:  # the lexicographic maximum, as JAX's; an operand with a NaN part propagates
      first, second = pairs[node.src[0]], pairs[node.src[1]]
      take = _bin(Ops.OR, _less(first, second), _bin(Ops.OR, _isnan(second[0]), _isnan(second[1])))
      pairs[node] = (_where(take, second[0], first[0]), _where(take, second[1], first[1]))
    elif op is Ops.WHERE:
      cond = real[node.src[0]]
      (a, b), (c, d) = pairs[node.src[1]], pairs[node.src[2]]
      pairs[node] = (_where(cond, a, c), _where(cond, b, d))
    elif op is Ops.EXP2:  # 2^(a + ib) = 2^a (cos(b ln 2) + i sin(b ln 2))
      a, b = pairs[node.src[0]]
      magnitude, angle = UOp(Ops.EXP2, part, (a,)), _scale(b, math.log(2))
      real_axis = _eq(b, 0.0)
      # on the real axis the imaginary part is b itself (exp(inf + 0j) is inf + 0j, not inf * 0 = NaN)
      pairs[node] = (_mul(magnitude, _cos(angle)), _where(real_axis, b, _mul(magnitude, _sin(angle))))
    elif op is Ops.SQRT:  # the principal root: t = sqrt((|z| + |a|) / 2), then (t, b / 2t) or (|b| / 2t, sign(b) t)
      a, b = pairs[node.src[0]]
      modulus = _modulus(a, b)
      t = _sqrt(_scale(_add(modulus, _abs(a)), 0.5))
      nonzero = _bin(Ops.CMPNE, t, _full(part, 0.0, shape))
      other = _div(_abs(b), _scale(_where(nonzero, t, _full(part, 1.0, shape)), 2.0))
      other = _where(nonzero, other, _full(part, 0.0, shape))
      negative_a = _bin(Ops.CMPLT, a, _full(part, 0.0, shape))
      negative_b = _signbit(b)  # (-0 counts: sqrt(-4 - 0i) is -2i, the other side of the branch cut)
      pairs[node] = (_where(negative_a, other, t),
                     _where(negative_a, _where(negative_b, _neg(t), t), _where(negative_b, _neg(other), other)))
    elif op is Ops.REDUCE_AXIS:
      reduce_op, _ = node.arg
      source = node.src[0]
      if reduce_op is Ops.MAX:
        pairs[node] = _lexicographic_max(*pairs[source], node.arg)
        continue
      if reduce_op is not Ops.ADD: raise _unsupported(f"a reduction by {reduce_op.name}")

      def total(x: UOp) -> UOp: return UOp(Ops.REDUCE_AXIS, x.dtype, (x,), node.arg)
      if source.op is Ops.MUL and all(is_complex(s.dtype) for s in source.src) and readers[source] == 1:
        # a sum of products (a contraction) no other node reads the products of: four real contractions, each one
        # the scheduler can run as a GEMM
        (a, b), (c, d) = pairs[source.src[0]], pairs[source.src[1]]
        pairs[node] = (_sub(total(_mul(a, c)), total(_mul(b, d))), _add(total(_mul(a, d)), total(_mul(b, c))))
      else:
        pairs[node] = tuple(total(p) for p in pairs[source])
    elif op is Ops.GATHER:
      operand, indices = node.src
      pairs[node] = tuple(UOp(Ops.GATHER, part, (p, real[indices]), node.arg) for p in pairs[operand])
    elif op is Ops.SCATTER:
      operand, indices, updates = node.src
      arg: ScatterArg = node.arg
      if arg.mode not in ("set", "add"): raise _unsupported(f"scatter with mode {arg.mode!r}")
      pairs[node] = tuple(UOp(Ops.SCATTER, part, (p, real[indices], u), arg)
                          for p, u in zip(pairs[operand], pairs[updates]))
    else:
      raise _unsupported(op.name.lower())
  outputs = [_interleaved(*pairs[out]) if is_complex(out.dtype) else real[out] for out in sink.src]
  return UOp(Ops.SINK, sink.dtype, tuple(outputs), sink.arg)


def _split_programs(node: UOp):
  """The node's arg with its sub-programs rewritten as the program is: their complex parameters and results (the loop's
  carries, xs and ys, a branch's operands and results) become interleaved float pairs, as the node's operands do. (A
  body's named primitives, kept whole for its derivative and batching, are expanded into their Ops first, as the
  program's own were.)"""
  from tinyjax.lower.schedule import expand_primitives
  return rewrite_sub_programs(node, lambda p: split_complex(expand_primitives(p)) if has_complex(p) else p)


def _split_pairs(floats: UOp, shape: tuple[int, ...]) -> tuple[UOp, UOp]:
  """The (real, imaginary) parts of interleaved float pairs (*shape, 2): a complex array's memory seen as floats."""
  picked = []
  for k in range(2):
    bounds = tuple((0, size) for size in shape) + ((k, k + 1),)
    picked.append(UOp(Ops.RESHAPE, floats.dtype, (UOp(Ops.SHRINK, floats.dtype, (floats,), bounds),), tuple(shape)))
  return picked[0], picked[1]


def _pairs_of(re: UOp, im: UOp) -> UOp | None:
  """The float pairs that `re` and `im` are the two halves of (`_split_pairs`), if they are: a complex parameter or
  a host call's complex result, handed on unchanged."""
  halves = []
  for part, k in ((re, 0), (im, 1)):
    if part.op is not Ops.RESHAPE or part.src[0].op is not Ops.SHRINK: return None
    shrink = part.src[0]
    if shrink.arg != tuple((0, size) for size in part.shape) + ((k, k + 1),): return None
    halves.append(shrink.src[0])
  return halves[0] if halves[0] is halves[1] else None


def _interleaved(re: UOp, im: UOp) -> UOp:
  """The float array (*S, 2) of (real, imaginary) pairs: the memory of the complex array of shape S. (A select by
  position, not a sum of zero-padded parts: -0 + 0 would lose the sign of a zero.) The halves of one such array are
  that array (no copy: a complex input handed to a host call, a host call's complex result returned)."""
  if (pairs := _pairs_of(re, im)) is not None: return pairs
  shape = re.shape
  pairs_shape = (*shape, 2)
  spread = [UOp(Ops.EXPAND, p.dtype, (UOp(Ops.RESHAPE, p.dtype, (p,), (*shape, 1)),), pairs_shape) for p in (re, im)]
  position = UOp(Ops.IOTA, INDEX, (), 2)
  position = UOp(Ops.EXPAND, INDEX, (UOp(Ops.RESHAPE, INDEX, (position,), (1,) * len(shape) + (2,)),), pairs_shape)
  is_real = _bin(Ops.CMPLT, position, _full(INDEX, 1, pairs_shape))
  return _where(is_real, spread[0], spread[1])


def _host_call_on_pairs(node: UOp, operands: list[UOp]) -> UOp:
  """A host call whose operands or results are complex: its operands arrive as float pairs (*S, 2) and are handed to
  the function as complex arrays again; its complex results go back as float pairs."""
  callback = node.arg
  complex_in = [s.dtype if is_complex(s.dtype) else None for s in node.src]
  complex_out = [dtype if is_complex(dtype) else None for _, dtype in callback.out_avals]

  def on_pairs(*arrays):
    # (an operand that is a complex input of the program itself, read unchanged (`_interleaved`), arrives as that)
    values = [a if dtype is None or a.dtype == dtype else np.ascontiguousarray(a).view(dtype)[..., 0]
              for a, dtype in zip(arrays, complex_in)]
    results = callback.fn(*values)
    return [r if dtype is None else np.ascontiguousarray(np.asarray(r, dtype))[..., None].view(real_dtype(dtype))
            for r, dtype in zip(results, complex_out)]
  out_avals = tuple((shape, dtype) if not is_complex(dtype) else ((*shape, 2), real_dtype(dtype))
                    for shape, dtype in callback.out_avals)
  # (a compiled `native` kernel, lax/_fft.py's, reads and writes the slots' memory: the same as the pairs')
  return UOp(Ops.CALLBACK, node.dtype, tuple(operands), type(callback)(on_pairs, out_avals, callback.name,
                                                                        callback.checked, callback.native))

