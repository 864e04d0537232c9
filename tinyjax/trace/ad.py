"""Automatic differentiation: `jvp`, `linearize`, `vjp`, `grad`, `value_and_grad`, as in JAX.

Forward mode is a `JVPTrace`: each value carries a primal and a tangent (None is a symbolic zero), and `jvp_rules`
say how each operation maps them. Reverse mode is linearize + transpose, so both modes share the JVP rules:
`vjp` runs the JVP trace with tangents that are *staged* on a `LinearTrace` (primal work runs concretely on the
parent trace, as it happens, so Python control flow on concrete values works), which leaves a linear UOp program
from tangent inputs to tangent outputs; `transpose` then walks that program backwards with `transpose_rules`, one
per linear Op (about twenty) and per linear Primitive (the collectives, staged whole as PRIMITIVE nodes), to turn
output cotangents into input cotangents.

Rules are written with `bind` on Ops, so they run on whatever trace is current when they are applied; that is
what makes `grad(grad(f))`, `jit(grad(f))` and `grad` of a jitted function work.
"""
from __future__ import annotations

import math
from typing import Any, Callable, Sequence

import numpy as np

from tinyjax import dtypes, tree_util
from tinyjax.array import Array
from tinyjax.trace.core import (Primitive, PrimitiveCall, ShapedArray, StagingTrace, StagingTracer, Trace, Tracer,
                                bind, check_callable, current_trace, new_trace, set_current_trace)
from tinyjax.uop import BOOL, MOVEMENT, Ops, UOp

jvp_rules: dict[Ops | Primitive, Callable] = {}
# rule(ct, node, known) -> a cotangent per operand of `node` (None: zero or not linear); keyed by the node's Op, or by
# the Primitive of a PRIMITIVE node: a primitive with a transpose rule is linear (the collectives of trace/batching.py)
transpose_rules: dict[Ops | Primitive, Callable] = {}
# rule(*operands, **params) -> the (shape, dtype, weak_type) of a linear primitive's result, to stage it on a tangent
abstract_eval_rules: dict[Primitive, Callable] = {}

LN2 = math.log(2.0)


# ---------------------------------------------------------------------------------------------------------------------
# small Op-level helpers the rules are written with (the current trace decides what they do)

def full_like(x: Any, value: Any, dtype: np.dtype | None = None, weak_type: bool = False) -> Any:
  dtype = x.dtype if dtype is None else np.dtype(dtype)
  value = bool(value) if dtype == BOOL else (int(value) if dtype.kind in "iu" else float(value))
  const = bind(Ops.CONST, arg=value, dtype=dtype, weak_type=weak_type)
  if not x.shape: return const
  return bind(Ops.EXPAND, bind(Ops.RESHAPE, const, arg=(1,) * len(x.shape), weak_type=weak_type),
              arg=tuple(x.shape), weak_type=weak_type)


def zeros_like(x: Any) -> Any:
  """Zeros of `x`'s shape, dtype and weak type (the gradient of an unused Python float is a weak float32, as JAX's)."""
  return full_like(x, 0, weak_type=getattr(x, "weak_type", False))
def add(a: Any, b: Any) -> Any: return bind(Ops.ADD, a, b)
def mul(a: Any, b: Any) -> Any: return bind(Ops.MUL, a, b)
def neg(a: Any) -> Any: return bind(Ops.NEG, a)
def div(a: Any, b: Any) -> Any: return bind(Ops.FDIV, a, b)
def where(cond: Any, a: Any, b: Any) -> Any: return bind(Ops.WHERE, cond, a, b, dtype=a.dtype)
def lt(a: Any, b: Any) -> Any: return bind(Ops.CMPLT, a, b, dtype=BOOL)
def eq(a: Any, b: Any) -> Any: return bind(Ops.XOR, bind(Ops.CMPNE, a, b, dtype=BOOL), full_like(a, True, BOOL))
def cast(a: Any, dtype: np.dtype, weak_type: bool | None = None) -> Any:
  """`a` converted to `dtype` (strongly typed), or to the given weak type; no node when nothing changes."""
  if a.dtype == dtype and weak_type in (None, a.weak_type): return a
  return bind(Ops.CAST, a, dtype=dtype, weak_type=bool(weak_type))


def cos(x: Any) -> Any: return bind(Ops.COS, x)
def sin(x: Any) -> Any: return bind(Ops.SIN, x)


def is_float(x: Any) -> bool: return dtypes.is_inexact(x.dtype)  # (complex values carry tangents too)


def sum_tangents(*tangents: Any) -> Any:
  """The sum of the non-zero tangents (None if all are symbolic zeros)."""
  present = [t for t in tangents if t is not None]
  if not present: return None
  total = present[0]
  for t in present[1:]: total = add(total, t)
  return total


def instantiate(tangent: Any, primal: Any) -> Any:
  return zeros_like(primal) if tangent is None else tangent


def defjvp(prim: Primitive, *rules: Callable | None) -> None:
  """Register `prim`'s JVP from one rule per operand, as JAX's `defjvp2`: `rule(tangent, out, *primals, **params)`
  is that operand's contribution to the output tangent (linear in `tangent`); None marks an operand with none.
  Symbolic-zero tangents are skipped and the contributions summed."""
  def jvp_rule(primals, tangents, out, **params):
    return sum_tangents(*(None if t is None or rule is None else rule(t, out, *primals, **params)
                          for rule, t in zip(rules, tangents)))
  jvp_rules[prim] = jvp_rule


def defjvp_zero(prim: Primitive) -> None:
  """`prim` is piecewise constant (or integer valued): its output tangent is a symbolic zero."""
  jvp_rules[prim] = lambda primals, tangents, out, **params: None


# ---------------------------------------------------------------------------------------------------------------------
# forward mode

class JVPTracer(Tracer):
  """A value of a JVPTrace: `primal` (a value of the parent trace) and `tangent` (None: a symbolic zero)."""
  __slots__ = ("primal", "tangent")

  def __init__(self, trace: JVPTrace, primal: Any, tangent: Any):
    Array.__init__(self, None, primal.weak_type)
    self.trace, self.primal, self.tangent = trace, primal, tangent

  @property
  def shape(self) -> tuple[int, ...]: return self.primal.shape
  @property
  def dtype(self) -> np.dtype: return self.primal.dtype

  def concrete(self, what: str) -> Array:
    self.check_alive()
    return self.primal.concrete(what) if isinstance(self.primal, Tracer) else self.primal


class JVPTrace(Trace):
  """Forward-mode differentiation. Rules run with `tangent_trace` current: the parent itself for `jvp`, or a
  LinearTrace for `linearize`/`vjp` (which runs primal work on the parent and stages tangent work)."""
  fun_name = "jvp"

  def __init__(self, parent: Trace, tangent_trace: Trace):
    self.parent, self.tangent_trace, self.active = parent, tangent_trace, True

  def unpack(self, operands: tuple[Any, ...]) -> tuple[list[Any], list[Any]]:
    primals, tangents = [], []
    for x in operands:
      if isinstance(x, JVPTracer) and x.trace is self:
        primals.append(x.primal)
        tangents.append(x.tangent)
      else:
        if isinstance(x, Tracer): x.check_alive()
        primals.append(x)
        tangents.append(None)
    return primals, tangents

  def pack(self, primal: Any, tangent: Any) -> Any:
    return primal if tangent is None else JVPTracer(self, primal, tangent)

  def process(self, op: Ops, operands: tuple[Any, ...], arg: Any, dtype: np.dtype, weak_type: bool) -> Any:
    primals, tangents = self.unpack(operands)
    with set_current_trace(self.tangent_trace):
      out = bind(op, *primals, arg=arg, dtype=dtype, weak_type=weak_type)
      if all(t is None for t in tangents): return out
      rule = jvp_rules.get(op)
      if rule is None: raise NotImplementedError(f"differentiation rule for {op.name} is not implemented")
      tangent = rule(primals, tangents, out, arg)
    return self.pack(out, tangent)

  def process_primitive(self, prim: Primitive, operands: tuple[Any, ...], params: dict) -> Any:
    rule = jvp_rules.get(prim)
    if rule is None: return prim.impl(*operands, **params)  # differentiate its decomposition
    primals, tangents = self.unpack(operands)
    with set_current_trace(self.tangent_trace):
      if prim.multiple_results:  # its rule computes the outputs too: (outputs, their tangents)
        if all(t is None for t in tangents): return prim.bind(*primals, **params)
        outs, out_tangents = rule(primals, tangents, **params)
        return [self.pack(o, t) for o, t in zip(outs, out_tangents)]
      out = prim.bind(*primals, **params)
      if all(t is None for t in tangents): return out
      tangent = rule(primals, tangents, out, **params)
    return self.pack(out, tangent)


class LinearTrace(StagingTrace):
  """Partial evaluation for linearize: an operation whose operands are all known (values of the parent trace) runs
  on the parent; one that touches a tangent is staged into a UOp program, with PARAM 0..n_inputs-1 for the tangent
  inputs and PARAM n_inputs.. for the known values it reads (`consts`, kept by reference so they may themselves be
  tracers of an outer transformation)."""

  def __init__(self, parent: Trace, n_inputs: int):
    super().__init__(parent, [], "linearize")
    self.n_inputs, self.consts, self.const_params = n_inputs, [], {}

  def is_mine(self, x: Any) -> bool: return isinstance(x, StagingTracer) and x.trace is self

  def const_param(self, value: Any) -> UOp:
    if id(value) not in self.const_params:
      index = self.n_inputs + len(self.consts)
      self.consts.append(value)
      self.const_params[id(value)] = UOp(Ops.PARAM, value.dtype, (), (index, tuple(value.shape)))
    return self.const_params[id(value)]

  def process(self, op: Ops, operands: tuple[Any, ...], arg: Any, dtype: np.dtype, weak_type: bool) -> Any:
    if not any(self.is_mine(x) for x in operands): return self.parent.process(op, operands, arg, dtype, weak_type)
    uops = tuple(x.uop if self.is_mine(x) else self.const_param(x) for x in operands)
    # (a node of its own per operation, not hash-consed: two equal operations, such as x.astype(float8) twice, keep
    # their own cotangents, each summed in its uses' dtype after its own transposition, as JAX's two equations do)
    return StagingTracer(UOp.unshared(op, dtype, uops, arg), weak_type, self)

  def process_primitive(self, prim: Primitive, operands: tuple[Any, ...], params: dict) -> Any:
    """A linear primitive (one with a transpose rule) applied to a tangent is staged whole, as one PRIMITIVE node;
    any other primitive is staged as its decomposition into Ops."""
    if not any(self.is_mine(x) for x in operands): return self.parent.process_primitive(prim, operands, params)
    if prim not in transpose_rules: return prim.impl(*operands, **params)
    shape, dtype, weak_type = abstract_eval_rules[prim](*operands, **params)
    call = PrimitiveCall(prim, tuple(sorted(params.items())), ((shape, dtype, weak_type),),
                         in_weak=tuple(x.weak_type if isinstance(x, Array) else type(x) in (bool, int, float, complex)
                                       for x in operands))
    uops = tuple(x.uop if self.is_mine(x) else self.const_param(x) for x in operands)
    return StagingTracer(UOp(Ops.PRIMITIVE, dtype, uops, call), weak_type, self)


# ---------------------------------------------------------------------------------------------------------------------
# JVP rules: rule(primals, tangents, out, arg) -> tangent of out (None for a symbolic zero)

def _linear_rule(op: Ops) -> Callable:
  """The tangent of a linear op is the op applied to the tangents (zeros filled in for missing ones)."""
  def rule(primals, tangents, out, arg):
    filled = [instantiate(t, p) for t, p in zip(tangents, primals)]
    return bind(op, *filled, arg=arg, dtype=out.dtype)
  return rule


for _op in (*MOVEMENT, Ops.CONTIGUOUS, Ops.NEG, Ops.ADD, Ops.REAL, Ops.IMAG, Ops.COMPLEX):
  jvp_rules[_op] = _linear_rule(_op)


def _reduce_rule(primals, tangents, out, arg):
  (x,), (t,) = primals, tangents
  reduce_op, axes = arg
  if reduce_op is Ops.ADD: return bind(Ops.REDUCE_AXIS, t, arg=arg)
  expanded = bind(Ops.EXPAND, out, arg=tuple(x.shape))
  if reduce_op is Ops.MAX:  # ties share the tangent evenly, as JAX
    hits = cast(eq(x, expanded), x.dtype)
    count = bind(Ops.REDUCE_AXIS, hits, arg=(Ops.ADD, axes))
    return div(bind(Ops.REDUCE_AXIS, mul(t, hits), arg=(Ops.ADD, axes)), count)
  # product: d prod = sum(t * prod / x); exact where no element is 0
  return bind(Ops.REDUCE_AXIS, mul(t, div(expanded, x)), arg=(Ops.ADD, axes))


def balanced_eq(x: Any, y: Any, largest: bool = True) -> Any:
  """JAX's weight of operand x in max(x, y) (`largest`) or min(x, y): 1 where x alone is the result, 0.5 on ties, 0
  otherwise (and where either is NaN, whose result is NaN). JAX compares each operand with the result; comparing the
  operands with each other gives the same weights and does not depend on the result being the same bits as the
  operands it is compared with (a value recomputed in another kernel, rounded differently, made relu's derivative
  x == max(x, 0) zero)."""
  one, zero = full_like(x, 1.0), full_like(x, 0.0)
  wins = bind(Ops.CMPLT, y, x, dtype=BOOL) if largest else bind(Ops.CMPLT, x, y, dtype=BOOL)
  return where(wins, one, where(eq(x, y), full_like(x, 0.5), zero))


def _max_rule(primals, tangents, out, arg):
  (x, y), (tx, ty) = primals, tangents
  if not is_float(out): return None
  return sum_tangents(None if tx is None else mul(tx, balanced_eq(x, y)),
                      None if ty is None else mul(ty, balanced_eq(y, x)))


def _mul_rule(primals, tangents, out, arg):
  (x, y), (tx, ty) = primals, tangents
  return sum_tangents(None if tx is None else mul(tx, y), None if ty is None else mul(x, ty))


def _fdiv_rule(primals, tangents, out, arg):
  (_, y), (tx, ty) = primals, tangents
  return sum_tangents(None if tx is None else div(tx, y), None if ty is None else neg(mul(ty, div(out, y))))


def _mod_rule(primals, tangents, out, arg):
  (x, y), (tx, ty) = primals, tangents
  if not is_float(out): return None
  quotient = bind(Ops.TRUNC, div(x, y))
  return sum_tangents(tx, None if ty is None else neg(mul(ty, quotient)))


def _pow_rule(primals, tangents, out, arg):
  (x, y), (tx, ty) = primals, tangents
  zero = full_like(x, 0.0)
  d_x = None if tx is None else mul(tx, mul(y, bind(Ops.POW, x, add(y, full_like(y, -1.0)))))
  log_x = mul(bind(Ops.LOG2, x), full_like(x, LN2))
  d_y = None if ty is None else mul(ty, where(eq(x, zero), zero, mul(out, log_x)))  # JAX: 0 where x == 0
  return sum_tangents(d_x, d_y)


def _where_rule(primals, tangents, out, arg):
  (cond, a, b), (_, ta, tb) = primals, tangents
  if ta is None and tb is None: return None
  return where(cond, instantiate(ta, a), instantiate(tb, b))


def _cast_rule(primals, tangents, out, arg):
  (x,), (t,) = primals, tangents
  return cast(t, out.dtype) if is_float(x) and is_float(out) else None


jvp_rules.update({
  Ops.REDUCE_AXIS: _reduce_rule, Ops.MAX: _max_rule, Ops.MUL: _mul_rule, Ops.FDIV: _fdiv_rule, Ops.MOD: _mod_rule,
  Ops.POW: _pow_rule, Ops.WHERE: _where_rule, Ops.CAST: _cast_rule,
  Ops.RECIP: lambda p, t, out, arg: neg(mul(t[0], mul(out, out))),
  Ops.SQRT: lambda p, t, out, arg: div(t[0], mul(out, full_like(out, 2.0))),
  Ops.EXP2: lambda p, t, out, arg: mul(t[0], mul(out, full_like(out, LN2))),
  Ops.LOG2: lambda p, t, out, arg: div(t[0], mul(p[0], full_like(out, LN2))),
  Ops.SIN: lambda p, t, out, arg: mul(t[0], cos(p[0])),
  Ops.COS: lambda p, t, out, arg: neg(mul(t[0], sin(p[0]))),
})
# piecewise-constant, integer- or bool-valued ops have zero derivatives
for _op in (Ops.TRUNC, Ops.BITCAST, Ops.IDIV, Ops.CMPLT, Ops.CMPNE, Ops.AND, Ops.OR, Ops.XOR, Ops.SHL, Ops.SHR):
  jvp_rules[_op] = lambda primals, tangents, out, arg: None


# ---------------------------------------------------------------------------------------------------------------------
# reverse mode: transpose a linear program

def _unexpand(ct: Any, shape: tuple[int, ...]) -> Any:
  axes = tuple(i for i, (c, s) in enumerate(zip(ct.shape, shape)) if s == 1 and c != 1)
  return bind(Ops.REDUCE_AXIS, ct, arg=(Ops.ADD, axes)) if axes else ct


def _reduce_transpose(ct: Any, node: UOp) -> Any:
  if node.arg[0] is not Ops.ADD:
    raise NotImplementedError(f"transpose of REDUCE_AXIS({node.arg[0].name}): not linear in its operand")
  return bind(Ops.EXPAND, ct, arg=node.src[0].shape)


transpose_rules.update({
  Ops.ADD: lambda ct, node, known: (ct, ct),
  Ops.NEG: lambda ct, node, known: (neg(ct),),
  Ops.MUL: lambda ct, node, known: (mul(ct, known[1]), None) if known[1] is not None else (None, mul(ct, known[0])),
  Ops.FDIV: lambda ct, node, known: (div(ct, known[1]), None),
  Ops.CAST: lambda ct, node, known: (cast(ct, node.src[0].dtype),),
  Ops.WHERE: lambda ct, node, known: (None, where(known[0], ct, zeros_like(ct)), where(known[0], zeros_like(ct), ct)),
  Ops.CONTIGUOUS: lambda ct, node, known: (bind(Ops.CONTIGUOUS, ct, weak_type=ct.weak_type),),  # a buffer both ways
  Ops.REDUCE_AXIS: lambda ct, node, known: (_reduce_transpose(ct, node),),
  Ops.RESHAPE: lambda ct, node, known: (bind(Ops.RESHAPE, ct, arg=node.src[0].shape),),
  Ops.PERMUTE: lambda ct, node, known: (bind(Ops.PERMUTE, ct, arg=tuple(np.argsort(node.arg).tolist())),),
  Ops.EXPAND: lambda ct, node, known: (_unexpand(ct, node.src[0].shape),),
  Ops.PAD: lambda ct, node, known: (bind(Ops.SHRINK, ct, arg=tuple(
    (before, before + dim) for (before, _), dim in zip(node.arg, node.src[0].shape))),),
  Ops.SHRINK: lambda ct, node, known: (bind(Ops.PAD, ct, arg=tuple(
    (start, dim - end) for (start, end), dim in zip(node.arg, node.src[0].shape))),),
  Ops.FLIP: lambda ct, node, known: (bind(Ops.FLIP, ct, arg=node.arg),),
  # complex parts, with JAX's transposes (real: ct + 0i; imag: 0 - ct i; complex(x, y): (re ct, -im ct))
  Ops.REAL: lambda ct, node, known: (bind(Ops.COMPLEX, ct, zeros_like(ct), dtype=node.src[0].dtype),),
  Ops.IMAG: lambda ct, node, known: (bind(Ops.COMPLEX, zeros_like(ct), neg(ct), dtype=node.src[0].dtype),),
  Ops.COMPLEX: lambda ct, node, known: (bind(Ops.REAL, ct, dtype=node.src[0].dtype),
                                        neg(bind(Ops.IMAG, ct, dtype=node.src[1].dtype))),
})


def _spmd_axes(program: UOp, n_inputs: int, consts: list[Any], primals: list[Any] | None) -> list[tuple[Any, set]]:
  """The traces below the current one that type values as varying or not (shard_map's mesh axes under check_vma:
  BatchTrace `varying_nodes`), each with the nodes of `program` that vary over its axis."""
  axes, trace = [], current_trace.get()
  while trace is not None:
    find = getattr(trace, "varying_nodes", None)
    if find is not None and (varying := find(program, n_inputs, consts, primals)) is not None:
      axes.append((trace, varying))
    trace = trace.parent
  return axes


def transpose(program: UOp, n_inputs: int, consts: list[Any], cotangents: list[Any],
              primals: list[Any] | None = None) -> list[Any]:
  """Given a linear `program` (SINK over tangent outputs; PARAM i < n_inputs are tangent inputs, the other PARAMs
  index `consts`) and a cotangent per output (None for zero), return the cotangent of each input (None for zero).
  Runs on the current trace. `primals`: the values the tangent inputs are tangents of, where known.

  Under shard_map's check_vma (`_spmd_axes`), a node that does not vary over a mesh axis but receives a cotangent that
  does (it met varying values, where JAX inserts a pvary) must have that cotangent summed over the axis (pvary's
  transpose is psum). The sum commutes with the transposes of the nodes that don't vary (their known operands don't
  vary either), so it is kept `pending` through them and done where it must: at a tangent input or a collective. A
  weight gradient is then summed once over the shards, after its contraction, not as a product per example."""
  linear: set[UOp] = set()
  inputs: dict[int, UOp] = {}
  for node in program.toposort:
    if node.op is Ops.PARAM and node.arg[0] < n_inputs: inputs[node.arg[0]] = node
    if node.op is Ops.PARAM and node.arg[0] < n_inputs or any(s in linear for s in node.src): linear.add(node)

  known_values: dict[UOp, Any] = {}

  def known_value(node: UOp) -> Any:
    """The value of a node that does not depend on the tangent inputs (a const, or an expression of consts, as loop
    bodies have), computed on the current trace."""
    if node not in known_values:
      if node.op is Ops.PARAM: known_values[node] = consts[node.arg[0] - n_inputs]
      else: known_values[node] = evaluate(UOp(Ops.SINK, BOOL, (node,)), [consts[i - n_inputs] if i >= n_inputs else None
                                                                       for i in range(n_inputs + len(consts))])[0]
    return known_values[node]

  accumulated: dict[UOp, Any] = {}
  pending: dict[UOp, list[tuple[Any, tuple]]] = {}  # node -> [(cotangent, the spmd traces to sum it over)]
  spmd = _spmd_axes(program, n_inputs, consts, primals)

  def add_to(node: UOp, ct: Any) -> None:
    accumulated[node] = ct if node not in accumulated else add(accumulated[node], ct)

  def accumulate(node: UOp, ct: Any) -> None:
    over = tuple(trace for trace, varying in spmd if node not in varying and trace.varies(ct))
    if over: pending.setdefault(node, []).append((ct, over))
    else: add_to(node, ct)

  def settle(node: UOp) -> None:
    for ct, over in pending.pop(node, ()):
      for trace in over: ct = trace.psum(ct)
      add_to(node, ct)

  for out, ct in zip(program.src, cotangents):
    if ct is not None and out in linear: accumulate(out, cast(ct, out.dtype))
  for node in reversed(program.toposort):
    if node.op in (Ops.SINK, Ops.PARAM): continue
    if node.op in (Ops.PROJECT, Ops.PRIMITIVE): settle(node)  # (collectives and multi-output nodes: summed first)
    if node not in accumulated and node not in pending: continue
    if node.op is Ops.PROJECT:  # one output of a multi-output node: its rule gets {output index: cotangent}
      outputs = accumulated.setdefault(node.src[0], {})
      outputs[node.arg[0]] = accumulated.pop(node)
      continue
    known = [None if s in linear else known_value(s) for s in node.src]
    op = node.arg.prim if node.op is Ops.PRIMITIVE else node.op
    if op in (Ops.MUL, Ops.FDIV) and node.src[1] in linear and (op is Ops.FDIV or node.src[0] in linear):
      raise NotImplementedError(f"transpose of {op.name} with a linear {'divisor' if op is Ops.FDIV else 'operand on'}"
                                f"{'' if op is Ops.FDIV else ' both sides'}: the function is not linear")
    rule = transpose_rules.get(op)
    if rule is None: raise NotImplementedError(f"transpose rule for {op.name} (a non-linear op in a tangent)")
    if node in accumulated:
      for src, contribution in zip(node.src, rule(accumulated.pop(node), node, known)):
        if contribution is not None and src in linear: accumulate(src, contribution)
    for ct, over in pending.pop(node, ()):
      for src, contribution in zip(node.src, rule(ct, node, known)):
        if contribution is not None and src in linear: pending.setdefault(src, []).append((contribution, over))
  for node in inputs.values(): settle(node)
  return [accumulated.get(inputs[i]) if i in inputs else None for i in range(n_inputs)]


# ---------------------------------------------------------------------------------------------------------------------
# the user-facing transformations

def _to_array(x: Any) -> Any:
  if isinstance(x, Array): return x
  from tinyjax.trace.jit import _leaf_to_array  # host data -> Array, as jit converts arguments
  return _leaf_to_array(x)


def _strip_tangents(tree: Any, trace: JVPTrace) -> Any:
  """Auxiliary outputs (`has_aux`) are not differentiated: their leaves leave the trace as their primal values."""
  return tree_util.tree_map(lambda leaf: leaf.primal if isinstance(leaf, JVPTracer) and leaf.trace is trace else leaf,
                            tree)


def jvp(fun: Callable, primals: Sequence[Any], tangents: Sequence[Any], has_aux: bool = False) -> Any:
  """Forward-mode: `(fun(*primals), J(primals) @ tangents)`; primals and tangents are matching pytrees."""
  check_callable(fun)
  if not isinstance(primals, (tuple, list)) or not isinstance(tangents, (tuple, list)):
    raise TypeError("primal and tangent arguments to jvp must be tuples or lists; found "
                    f"{type(primals).__name__} and {type(tangents).__name__}")
  primal_leaves, in_tree = tree_util.tree_flatten(tuple(primals))
  tangent_leaves, tangent_tree = tree_util.tree_flatten(tuple(tangents))
  if in_tree != tangent_tree:
    raise TypeError(f"primal and tangent arguments to jvp must have the same tree structure; got {in_tree} and "
                    f"{tangent_tree}")
  parent = current_trace.get()
  trace = JVPTrace(parent, parent)
  with new_trace(trace):
    inputs = []
    for p, t in zip(primal_leaves, tangent_leaves):
      p, t = _to_array(p), _to_array(t)
      if p.shape != t.shape:
        raise ValueError(f"jvp called with different primal and tangent shapes: {p.shape} and {t.shape}")
      inputs.append(JVPTracer(trace, p, cast(t, p.dtype)) if is_float(p) else p)
    out = fun(*tree_util.tree_unflatten(in_tree, inputs))
  aux, out_tree, primals_out, tangents_out = _unzip_outputs(out, has_aux, trace)
  # each tangent has its primal's dtype and weak type, as JAX
  tangents_out = [zeros_like(p) if t is None else cast(t, p.dtype, p.weak_type)
                  for p, t in zip(primals_out, tangents_out)]
  result = (tree_util.tree_unflatten(out_tree, primals_out), tree_util.tree_unflatten(out_tree, tangents_out))
  return (*result, aux) if has_aux else result


def _unzip_outputs(out: Any, has_aux: bool, trace: JVPTrace) -> tuple[Any, Any, list[Any], list[Any]]:
  """Split what a function returned under `trace`: aux (tangents stripped), the output tree, and per output leaf its
  primal and its tangent (None: zero)."""
  out, aux = out if has_aux else (out, None)
  aux = _strip_tangents(aux, trace)
  out_leaves, out_tree = tree_util.tree_flatten(out)
  primals, tangents = [], []
  for leaf in out_leaves:
    leaf = _to_array(leaf)
    is_jvp = isinstance(leaf, JVPTracer) and leaf.trace is trace
    primals.append(leaf.primal if is_jvp else leaf)
    tangents.append(leaf.tangent if is_jvp else None)
  return aux, out_tree, primals, tangents


def _zeros_uop(shape: tuple[int, ...], dtype: np.dtype) -> UOp:
  """A zero tangent of `shape` as a program node (an output that does not depend on the inputs)."""
  const = UOp.const(dtype, 0)
  if not shape: return const
  return UOp(Ops.EXPAND, dtype, (UOp(Ops.RESHAPE, dtype, (const,), (1,) * len(shape)),), tuple(shape))


def _linearize(fun: Callable, primal_leaves: list[Any], in_tree: Any, has_aux: bool):
  """Run `fun` under JVP with staged tangents. Returns primal outputs, output tree, the linear program, its trace,
  and aux."""
  parent = current_trace.get()
  arrays = [_to_array(p) for p in primal_leaves]
  linear = LinearTrace(parent, len(arrays))
  trace = JVPTrace(parent, linear)
  with new_trace(trace):
    inputs = [JVPTracer(trace, a, linear.new_arg(i, a.shape, a.dtype, a.weak_type)) if is_float(a) else a
              for i, a in enumerate(arrays)]
    out = fun(*tree_util.tree_unflatten(in_tree, inputs))
  linear.active = False
  aux, out_tree, primals_out, tangents_out = _unzip_outputs(out, has_aux, trace)
  tangent_uops = tuple(t.uop if linear.is_mine(t) else _zeros_uop(p.shape, p.dtype)
                       for p, t in zip(primals_out, tangents_out))
  program = UOp(Ops.SINK, BOOL, tangent_uops)
  return arrays, primals_out, out_tree, program, linear, aux


def vjp(fun: Callable, *primals: Any, has_aux: bool = False) -> Any:
  """Reverse mode: `(fun(*primals), vjp_fn)` where `vjp_fn(cotangent)` returns the cotangent of each primal."""
  check_callable(fun)
  primal_leaves, in_tree = tree_util.tree_flatten(primals)
  arrays, primals_out, out_tree, program, linear, aux = _linearize(fun, primal_leaves, in_tree, has_aux)

  def vjp_fn(*cotangents: Any) -> tuple:
    cotangent = cotangents[0] if len(cotangents) == 1 else cotangents
    ct_leaves, ct_tree = tree_util.tree_flatten(cotangent)
    if ct_tree != out_tree:
      raise ValueError(f"unexpected tree structure of cotangent input to vjp function: got {ct_tree}, expected "
                       f"{out_tree}")
    ct_arrays = []
    for ct, primal in zip(ct_leaves, primals_out):
      ct = _to_array(ct)
      if ct.shape != primal.shape:
        raise ValueError(f"unexpected shape of cotangent: got {ct.shape}, expected {primal.shape} for an output")
      ct_arrays.append(ct)
    grads = transpose(program, len(arrays), linear.consts, ct_arrays, arrays)
    # each cotangent has its primal's dtype and weak type (grad of a Python float is a weak float32, as JAX)
    grads = [zeros_like(a) if g is None else cast(g, a.dtype, a.weak_type) for g, a in zip(grads, arrays)]
    return tree_util.tree_unflatten(in_tree, grads)

  result = (tree_util.tree_unflatten(out_tree, primals_out), vjp_fn)
  return (*result, aux) if has_aux else result


def linearize(fun: Callable, *primals: Any) -> tuple[Any, Callable]:
  """`(fun(*primals), f_jvp)` where `f_jvp(*tangents)` evaluates the linearised function (its JVP at primals)."""
  check_callable(fun)
  primal_leaves, in_tree = tree_util.tree_flatten(primals)
  arrays, primals_out, out_tree, program, linear, _ = _linearize(fun, primal_leaves, in_tree, False)

  def f_jvp(*tangents: Any) -> Any:
    tangent_leaves, tangent_tree = tree_util.tree_flatten(tangents)
    if tangent_tree != in_tree: raise ValueError(f"linearized function expects tangents of structure {in_tree}")
    env = [_to_array(t) for t in tangent_leaves] + list(linear.consts)
    return tree_util.tree_unflatten(out_tree, evaluate(program, env))
  return tree_util.tree_unflatten(out_tree, primals_out), f_jvp


def linear_transpose(fun: Callable, *primals: Any, reduce_axes: Sequence[Any] = ()) -> Callable:
  """The transpose of linear `fun`: a function from a cotangent of `fun`'s output to the tuple of cotangents of its
  inputs (`primals`: arrays, scalars or ShapeDtypeStructs, of which only shapes and dtypes matter). `fun` is traced
  once, here, into a program of the operations that touch its inputs, which is walked backwards by each call with
  the same transpose rules as `vjp` (no forward evaluation at a point); an operation that is not linear in the inputs
  raises NotImplementedError. Inputs and outputs are all inexact or all integer, as JAX requires."""
  check_callable(fun)
  primal_leaves, in_tree = tree_util.tree_flatten(primals)
  avals = []
  for leaf in primal_leaves:
    if not (hasattr(leaf, "shape") and hasattr(leaf, "dtype")): leaf = _to_array(leaf)  # (a Python scalar: weak)
    avals.append((tuple(leaf.shape), np.dtype(leaf.dtype), bool(getattr(leaf, "weak_type", False))))
  parent = current_trace.get()
  trace = LinearTrace(parent, len(avals))
  with new_trace(trace):
    out = fun(*tree_util.tree_unflatten(in_tree, [trace.new_arg(i, *aval) for i, aval in enumerate(avals)]))
  trace.active = False
  out_leaves, out_tree = tree_util.tree_flatten(out)
  out_leaves = [leaf if trace.is_mine(leaf) else _to_array(leaf) for leaf in out_leaves]
  in_dtypes, out_dtypes = [aval[1] for aval in avals], [leaf.dtype for leaf in out_leaves]
  if not (all(dtypes.is_inexact(d) for d in in_dtypes + out_dtypes) or
          all(np.issubdtype(d, np.integer) for d in in_dtypes + out_dtypes)):
    raise TypeError(f"linear_transpose only supports [float or complex] -> [float or complex], and integer -> "
                    f"integer functions, but got {in_dtypes} -> {out_dtypes}.")
  program = UOp(Ops.SINK, BOOL, tuple(leaf.uop if trace.is_mine(leaf) else _zeros_uop(leaf.shape, leaf.dtype)
                                      for leaf in out_leaves))
  consts = list(trace.consts)

  def transposed(cotangent: Any) -> tuple:
    ct_leaves, ct_tree = tree_util.tree_flatten(cotangent)
    ct_arrays = [_to_array(ct) for ct in ct_leaves]
    if ct_tree != out_tree or any(ct.shape != leaf.shape or ct.dtype != leaf.dtype
                                  for ct, leaf in zip(ct_arrays, out_leaves)):
      expected = ", ".join(f"{np.dtype(leaf.dtype).name}{list(leaf.shape)}" for leaf in out_leaves)
      got = ", ".join(f"{ct.dtype.name}{list(ct.shape)}" for ct in ct_arrays)
      raise TypeError(f"cotangent type does not match function output: expected {out_tree} of ({expected}), got "
                      f"{ct_tree} of ({got})")
    grads = transpose(program, len(avals), consts, ct_arrays)
    grads = [zeros_like(ShapedArray(shape, dtype, weak)) if g is None else cast(g, dtype, weak)
             for g, (shape, dtype, weak) in zip(grads, avals)]
    return tuple(tree_util.tree_unflatten(in_tree, grads))
  return transposed


def evaluate(program: UOp, params: list[Any]) -> list[Any]:
  """Interpret a UOp program (SINK over outputs, PARAM i = params[i]) with `bind` on the current trace."""
  values: dict[UOp, Any] = {}
  for node in program.toposort:
    if node.op is Ops.SINK: continue
    operands = [values[s] for s in node.src]
    if node.op is Ops.PARAM: values[node] = params[node.arg[0]]
    elif node.op is Ops.PRIMITIVE: values[node] = node.arg.prim.bind(*operands, **dict(node.arg.params))
    elif node.op is Ops.PROJECT and isinstance(operands[0], list): values[node] = operands[0][node.arg[0]]
    else: values[node] = bind(node.op, *operands, arg=node.arg, dtype=node.dtype)
  return [values[out] for out in program.src]


def _argnums_tuple(argnums: int | Sequence[int]) -> tuple[int, ...]:
  return (argnums,) if isinstance(argnums, int) else tuple(argnums)


def value_and_grad(fun: Callable, argnums: int | Sequence[int] = 0, has_aux: bool = False,
                   holomorphic: bool = False, allow_int: bool = False) -> Callable:
  """`(fun(*args), gradient of fun at args)` with respect to the arguments `argnums` (an int or a tuple).
  fun must return a real scalar (with `has_aux`, a pair `(scalar, aux)`); of complex arguments the gradient is JAX's
  (the conjugate of df/dz for a real f: grad(|z|^2) = 2 conj(z)). `holomorphic=True`: complex arguments and a complex
  output, the gradient df/dz."""
  check_callable(fun)
  positions = _argnums_tuple(argnums)

  def value_and_grad_f(*args: Any, **kwargs: Any) -> Any:
    for p in positions:
      if p >= len(args):
        raise TypeError(f"differentiating with respect to argnums={argnums} requires at least {p + 1} positional "
                        f"arguments to be passed by the caller, but got only {len(args)} positional arguments.")
    diff_args = [args[p] for p in positions]
    for leaf in tree_util.tree_leaves(diff_args):
      dtype = _to_array(leaf).dtype
      if holomorphic and not dtypes.is_complex(dtype):
        raise TypeError(f"grad with holomorphic=True requires inputs with complex dtype, but got {dtype.name}.")
      if not dtypes.is_inexact(dtype) and not allow_int:
        raise TypeError(f"grad requires real- or complex-valued inputs (input dtype that is a sub-dtype of "
                        f"np.inexact), but got {dtype.name}. If you want to use Boolean- or integer-valued inputs, "
                        "use vjp or set allow_int to True.")

    def partial_fun(*diff_values: Any) -> Any:
      call_args = list(args)
      for p, value in zip(positions, diff_values): call_args[p] = value
      return fun(*call_args, **kwargs)

    out = vjp(partial_fun, *diff_args, has_aux=has_aux)
    value, vjp_fn, aux = out if has_aux else (*out, None)
    value_array = _to_array(value) if not isinstance(value, (tuple, list, dict)) else None
    if value_array is None or value_array.shape != ():
      shape = value_array.shape if value_array is not None else type(value).__name__
      raise TypeError(f"Gradient only defined for scalar-output functions. Output had shape: {shape}.")
    if holomorphic and not dtypes.is_complex(value_array.dtype):
      raise TypeError(f"grad with holomorphic=True requires outputs with complex dtype, but got "
                      f"{value_array.dtype.name}.")
    if not holomorphic and not dtypes.is_floating(value_array.dtype):
      raise TypeError(f"grad requires real-valued outputs (output dtype that is a sub-dtype of np.floating), but got "
                      f"{value_array.dtype.name}. For holomorphic differentiation, pass holomorphic=True.")
    grads = vjp_fn(full_like(value_array, 1.0))
    grads = grads[0] if isinstance(argnums, int) else tuple(grads)
    return ((value, aux), grads) if has_aux else (value, grads)
  return value_and_grad_f


def grad(fun: Callable, argnums: int | Sequence[int] = 0, has_aux: bool = False, holomorphic: bool = False,
         allow_int: bool = False) -> Callable:
  """The gradient of scalar-valued `fun` with respect to the arguments `argnums`; with `has_aux`, `(grad, aux)`;
  `holomorphic`: see `value_and_grad`."""
  value_and_grad_f = value_and_grad(fun, argnums, has_aux, holomorphic, allow_int)

  def grad_f(*args: Any, **kwargs: Any) -> Any:
    value, grads = value_and_grad_f(*args, **kwargs)
    return (grads, value[1]) if has_aux else grads
  return grad_f


def _stop_gradient_impl(x: Any) -> Any: return x


stop_gradient_p = Primitive("stop_gradient", _stop_gradient_impl)
defjvp_zero(stop_gradient_p)
