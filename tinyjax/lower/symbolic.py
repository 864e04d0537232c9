"""Symbolic simplification: index arithmetic (div/mod folding over loop ranges) and algebraic rules on kernel ALU.

Index expressions are int64 UOps built from RANGEs and constants. They are kept in a linear normal form
(sum of coefficient * atom, plus a constant), where an atom is a RANGE or an IDIV/MOD node that could not be folded.
Folding uses each expression's bounds (`UOp.vmin_vmax`): `x // c` with 0 <= x < c is 0, `(a*c + b) // c` is
`a + b // c` for non-negative terms, `(x // c) * c + x % c` is `x`, and so on. That is what turns the div/mod
chains of a reshape back into plain strides, which the vectoriser needs.
"""
from __future__ import annotations

import math
import operator

import numpy as np

from tinyjax.uop import BOOL, INDEX_DTYPE, Ops, PatternMatcher, UOp, UPat, graph_rewrite

Linear = tuple[dict[UOp, int], int]  # ({atom: coefficient}, constant)


def const(value: int) -> UOp: return UOp(Ops.CONST, INDEX_DTYPE, (), int(value))


def linear_form(node: UOp) -> Linear:
  """The linear normal form of an index expression: ({atom: coefficient}, constant)."""
  if node.op is Ops.CONST: return {}, node.arg
  if node.op is Ops.ADD:
    (terms_a, const_a), (terms_b, const_b) = linear_form(node.src[0]), linear_form(node.src[1])
    terms = dict(terms_a)
    for atom, coeff in terms_b.items(): terms[atom] = terms.get(atom, 0) + coeff
    return {a: c for a, c in terms.items() if c != 0}, const_a + const_b
  if node.op is Ops.MUL and node.src[1].op is Ops.CONST:
    terms, constant = linear_form(node.src[0])
    factor = node.src[1].arg
    return {a: c * factor for a, c in terms.items() if c * factor != 0}, constant * factor
  return {node: 1}, 0


def _build(terms: dict[UOp, int], constant: int) -> UOp:
  """Rebuild a UOp from a linear form (terms in insertion order, so the result is deterministic)."""
  result: UOp | None = None
  for atom, coeff in terms.items():
    term = atom if coeff == 1 else UOp(Ops.MUL, INDEX_DTYPE, (atom, const(coeff)))
    result = term if result is None else UOp(Ops.ADD, INDEX_DTYPE, (result, term))
  if result is None: return const(constant)
  return result if constant == 0 else UOp(Ops.ADD, INDEX_DTYPE, (result, const(constant)))


def _bounds_of(terms: dict[UOp, int], constant: int) -> tuple[float, float]:
  low = high = constant
  for atom, coeff in terms.items():
    atom_low, atom_high = atom.vmin_vmax
    low += min(atom_low * coeff, atom_high * coeff)
    high += max(atom_low * coeff, atom_high * coeff)
  return low, high


def _congruent(lhs: UOp, rhs: UOp, divisor: int) -> bool:
  """Whether two non-negative index expressions leave the same remainder by `divisor`: their linear forms differ by
  multiples of it (`mod` reduces its operand's coefficients, so y % c may read a different y than y // c)."""
  (terms_a, const_a), (terms_b, const_b) = linear_form(lhs), linear_form(rhs)
  if (const_a - const_b) % divisor or lhs.vmin_vmax[0] < 0 or rhs.vmin_vmax[0] < 0: return False
  return all((terms_a.get(atom, 0) - terms_b.get(atom, 0)) % divisor == 0 for atom in {*terms_a, *terms_b})


def _recombine(terms: dict[UOp, int]) -> Linear:
  """Fold `m*c*(y//c) + m*(y%c)` into `m*y` and `m*c*((y//c)%n) + m*(y%c)` into `m*(y%(c*n))`, the y of the
  remainder any expression congruent to the other's modulo c (`_congruent`: a flattened (7, 7, 64) axis cut into
  chunks of 392, (392*p + r) // 64 beside (8*p + r) % 64)."""
  constant = 0
  changed = True
  while changed:
    changed = False
    for atom, coeff in list(terms.items()):
      if atom.op is not Ops.MOD or atom.src[1].op is not Ops.CONST or atom not in terms: continue
      inner, divisor = atom.src[0], atom.src[1].arg
      for candidate, candidate_coeff in terms.items():
        if candidate_coeff != coeff * divisor: continue
        if candidate.op is Ops.IDIV and candidate.src[1].op is Ops.CONST and candidate.src[1].arg == divisor and \
            (candidate.src[0] is inner or _congruent(candidate.src[0], inner, divisor)):
          merged = candidate.src[0]  # c*(y//c) + y%c == y
        elif candidate.op is Ops.MOD and candidate.src[1].op is Ops.CONST and candidate.src[0].op is Ops.IDIV and \
            candidate.src[0].src[1].op is Ops.CONST and candidate.src[0].src[1].arg == divisor and \
            (candidate.src[0].src[0] is inner or _congruent(candidate.src[0].src[0], inner, divisor)):
          merged = mod(candidate.src[0].src[0], divisor * candidate.src[1].arg)  # c*((y//c)%n) + y%c == y%(c*n)
        else: continue
        del terms[atom], terms[candidate]
        merged_terms, merged_const = linear_form(merged)
        for sub_atom, sub_coeff in merged_terms.items(): terms[sub_atom] = terms.get(sub_atom, 0) + sub_coeff * coeff
        constant += merged_const * coeff
        changed = True
        break
      if changed: break
  return {a: c for a, c in terms.items() if c != 0}, constant


def _common_factor(terms: dict[UOp, int], constant: int, divisor: int) -> tuple[int, Linear, Linear] | None:
  """Write a non-negative index expression as g*X + s with g dividing `divisor`, X >= 0 and 0 <= s < g: then
  (g*X + s) // divisor == X // (divisor / g) and (g*X + s) % divisor == g * (X % (divisor / g)) + s. A window's
  position in a flattened row, (896*h + 32*w + c) // 1792 with 32*w + c < 896, is h // 2. Returns (g, X, s) as
  linear forms, the largest such g, or None."""
  for g in sorted({math.gcd(divisor, c) for c in terms.values()} - {1, divisor}, reverse=True):
    big = {a: c // g for a, c in terms.items() if c % g == 0}
    small = {a: c for a, c in terms.items() if c % g != 0}
    big_const, small_const = divmod(constant, g)
    small_low, small_high = _bounds_of(small, small_const)
    if 0 <= small_low and small_high < g and _bounds_of(big, big_const)[0] >= 0:
      return g, (big, big_const), (small, small_const)
  return None


def add(lhs: UOp, rhs: UOp) -> UOp:
  (terms_a, const_a), (terms_b, const_b) = linear_form(lhs), linear_form(rhs)
  terms = dict(terms_a)
  for atom, coeff in terms_b.items(): terms[atom] = terms.get(atom, 0) + coeff
  terms, extra = _recombine({a: c for a, c in terms.items() if c != 0})
  return _build(terms, const_a + const_b + extra)


def mul(node: UOp, factor: int) -> UOp:
  terms, constant = linear_form(node)
  return _build({a: c * factor for a, c in terms.items() if c * factor != 0}, constant * factor)


def idiv(node: UOp, divisor: int) -> UOp:
  """Floor division of a non-negative index expression by a positive constant (truncation = floor there)."""
  if divisor == 1: return node
  terms, constant = linear_form(node)
  low, high = _bounds_of(terms, constant)
  if 0 <= low and high < divisor: return const(0)
  if low < 0: return UOp(Ops.IDIV, INDEX_DTYPE, (node, const(divisor)))
  quotient = {a: c // divisor for a, c in terms.items() if c % divisor == 0}
  rest = {a: c for a, c in terms.items() if c % divisor != 0}
  quotient_const, rest_const = divmod(constant, divisor)
  rest_low, rest_high = _bounds_of(rest, rest_const)
  if rest_low < 0: return UOp(Ops.IDIV, INDEX_DTYPE, (node, const(divisor)))
  if rest_high < divisor: return _build(quotient, quotient_const)
  if len(rest) == 1 and rest_const == 0:
    (atom, coeff), = rest.items()
    if coeff == 1 and atom.op is Ops.IDIV and atom.src[1].op is Ops.CONST:  # (y // a) // b == y // (a*b)
      inner = idiv(atom.src[0], atom.src[1].arg * divisor)
      return add(_build(quotient, quotient_const), inner)
  if (factored := _common_factor(rest, rest_const, divisor)) is not None:
    g, big, _ = factored
    return add(_build(quotient, quotient_const), idiv(_build(*big), divisor // g))
  rest_node = UOp(Ops.IDIV, INDEX_DTYPE, (_build(rest, rest_const), const(divisor)))
  return add(_build(quotient, quotient_const), rest_node)


def mod(node: UOp, divisor: int) -> UOp:
  """Remainder of a non-negative index expression by a positive constant."""
  if divisor == 1: return const(0)
  terms, constant = linear_form(node)
  low, high = _bounds_of(terms, constant)
  if 0 <= low and high < divisor: return node
  if low < 0 or any(c < 0 for c in terms.values()): return UOp(Ops.MOD, INDEX_DTYPE, (node, const(divisor)))
  rest = {a: c % divisor for a, c in terms.items() if c % divisor != 0}
  rest_const = constant % divisor
  if len(rest) == 1 and rest_const == 0:
    (atom, coeff), = rest.items()
    if coeff == 1 and atom.op is Ops.MOD and atom.src[1].op is Ops.CONST and atom.src[1].arg % divisor == 0:
      return mod(atom.src[0], divisor)  # (y % (k*c)) % c == y % c
  rest_node = _build(rest, rest_const)
  rest_low, rest_high = rest_node.vmin_vmax
  if 0 <= rest_low and rest_high < divisor: return rest_node
  if (factored := _common_factor(rest, rest_const, divisor)) is not None:
    g, big, small = factored
    return add(mul(mod(_build(*big), divisor // g), g), _build(*small))
  return UOp(Ops.MOD, INDEX_DTYPE, (rest_node, const(divisor)))


def lt(node: UOp, bound: int) -> UOp:
  """`node < bound` as a bool UOp, folded to a constant when the bounds decide it."""
  low, high = node.vmin_vmax
  if high < bound: return UOp.const(BOOL, True)
  if low >= bound: return UOp.const(BOOL, False)
  return UOp(Ops.CMPLT, BOOL, (node, const(bound)))


def ge(node: UOp, bound: int) -> UOp:
  """`node >= bound` as a bool UOp, folded to a constant when the bounds decide it."""
  low, high = node.vmin_vmax
  if low >= bound: return UOp.const(BOOL, True)
  if high < bound: return UOp.const(BOOL, False)
  return UOp(Ops.CMPLT, BOOL, (const(bound - 1), node))


def clamp(node: UOp, low: int, high: int) -> UOp:
  """`node` clamped into [low, high] (high >= low), as `min(max(node, low), high)`; no ops where the bounds allow."""
  node_low, node_high = node.vmin_vmax
  if node_low < low: node = UOp(Ops.MAX, INDEX_DTYPE, (node, const(low)))
  if node_high > high:
    node = UOp(Ops.WHERE, INDEX_DTYPE, (UOp(Ops.CMPLT, BOOL, (node, const(high))), node, const(high)))
  return node


def logical_and(lhs: UOp | None, rhs: UOp | None) -> UOp | None:
  """Conjunction of optional validity conditions (None means always valid)."""
  if lhs is None or (lhs.op is Ops.CONST and lhs.arg is True): return rhs
  if rhs is None or (rhs.op is Ops.CONST and rhs.arg is True): return lhs
  return UOp(Ops.AND, BOOL, (lhs, rhs))


# ---------------------------------------------------------------------------------------------------------------------
# algebraic rules on kernel ALU, applied by graph_rewrite before codegen

_FOLD = {Ops.ADD: operator.add, Ops.MUL: operator.mul, Ops.MAX: max, Ops.CMPLT: operator.lt, Ops.CMPNE: operator.ne,
         Ops.AND: operator.and_, Ops.OR: operator.or_, Ops.XOR: operator.xor, Ops.NEG: operator.neg}


def _fold_constants(node: UOp) -> UOp | None:
  """Evaluate an ALU node whose sources are all constants, in the node's dtype (numpy scalars wrap as the kernel
  would). Float NaN/inf behaviour matches the kernel's IEEE arithmetic."""
  fn = _FOLD.get(node.op)
  if fn is None or any(src.dtype.kind == "V" for src in node.src): return None
  try:
    with np.errstate(all="ignore"):
      values = [np.array(src.arg, dtype=src.dtype)[()] for src in node.src]
      result = np.array(fn(*values)).astype(node.dtype)[()]
  except (TypeError, OverflowError):
    return None
  value = result.item()
  if isinstance(value, float) and node.dtype.itemsize < 4: return None  # keep low precision rounding in codegen
  return UOp.const(node.dtype, value)


def _is_int(node: UOp) -> bool: return node.dtype.kind in "iu"


algebraic_rules = PatternMatcher([
  (UPat((Ops.ADD, Ops.MUL, Ops.MAX, Ops.CMPLT, Ops.CMPNE, Ops.AND, Ops.OR, Ops.XOR, Ops.NEG), name="node",
        src=None), lambda node: _fold_constants(node) if all(s.op is Ops.CONST for s in node.src) else None),
  # x + 0 -> x and x * 0 -> 0 only for integers: for floats -0.0 + 0.0 and inf * 0 would change
  (UPat(Ops.ADD, src=(UPat.var("x"), UPat.cvar("zero"))), lambda x, zero: x if _is_int(x) and zero.arg == 0 else None),
  (UPat(Ops.MUL, src=(UPat.var("x"), UPat.cvar("one"))), lambda x, one: x if one.arg == 1 else None),
  (UPat(Ops.MUL, src=(UPat.var("x"), UPat.cvar("zero"))),
   lambda x, zero: zero if _is_int(x) and zero.arg == 0 else None),
  (UPat(Ops.WHERE, src=(UPat.cvar("cond"), UPat.var("a"), UPat.var("b"))), lambda cond, a, b: a if cond.arg else b),
  (UPat(Ops.WHERE, src=(UPat.var("cond"), UPat.var("a"), UPat.var("a"))), lambda cond, a: a),
  (UPat(Ops.AND, src=(UPat.var("x"), UPat.cvar("true", dtype=BOOL))), lambda x, true: x if true.arg else true),
  (UPat(Ops.CAST, name="node", src=(UPat.var("x"),)), lambda node, x: x if node.dtype == x.dtype else None),
  (UPat(Ops.LOAD, src=(UPat.var("buf"), UPat.var("idx"), UPat.cvar("gate"))),
   lambda buf, idx, gate: UOp(Ops.LOAD, buf.dtype, (buf, idx)) if gate.arg else UOp.const(buf.dtype, 0)),
])


def simplify(root: UOp) -> UOp:
  """Apply the algebraic rules to a kernel AST."""
  return graph_rewrite(root, algebraic_rules)

