"""Structured control flow: the `scan` and `while` primitives, which hold their bodies as programs and stay single
nodes (SCAN / WHILE) in a staged program, so that lower/ runs the whole loop inside one compiled call.

A body is traced once into a program (a SINK over PARAMs) by a `BodyTrace`: its inputs are PARAMs, and any other
array it meets (a concrete array, or a value of an enclosing transformation) becomes one more input, a const of the
loop (closure conversion), so the loop's operands are everything it reads.

Differentiation, as JAX does it:
- `scan`'s JVP linearizes its body once: a primal body that also returns the residuals the tangents need, and a
  linear body from tangents (and residuals) to tangents. The primal scan stacks the per-iteration residuals as extra
  ys; the tangent scan reads them as xs (loop-invariant residuals are passed as consts, not stacked). Under `grad`
  the tangent scan is what the linear program holds, and its transpose is a scan in the other direction whose body is
  the transposed linear body, accumulating the consts' cotangents in its carry.
- `while`'s JVP is a while loop over primal and tangent carries (forward mode); reverse mode raises JAX's ValueError.

Batching: a body is vmapped as a program (the batched inputs get a leading batch axis; carries that become batched
are found by iterating to a fixed point). A batched `while` condition runs the loop until every example is done,
each example's carries frozen once its own condition is false.
"""
from __future__ import annotations

from typing import Any, Callable, Sequence

import numpy as np

from tinyjax import tree_util
from tinyjax.array import Array
from tinyjax.trace import ad, batching
from tinyjax.trace.core import (Primitive, PrimitiveCall, StagingTrace, StagingTracer, Tracer, bind, current_trace,
                                new_trace, trace_impl)
from tinyjax.uop import BOOL, MOVEMENT, Ops, ScanArg, UOp, WhileArg

Aval = tuple  # (shape, dtype, weak_type)


def aval_of(x: Any) -> Aval: return (tuple(x.shape), np.dtype(x.dtype), bool(x.weak_type))


class BodyTrace(StagingTrace):
  """Traces a loop body into a program: inputs are PARAMs 0..n_inputs-1; every other array an operation reads
  becomes a further PARAM, recorded in `consts` (kept by reference: they may be tracers of enclosing traces)."""

  def __init__(self, parent: Any, n_inputs: int, fun_name: str):
    super().__init__(parent, [], fun_name)
    self.n_inputs, self.consts, self.const_params = n_inputs, [], {}

  def is_mine(self, x: Any) -> bool: return isinstance(x, StagingTracer) and x.trace is self

  def const_param(self, value: Any) -> UOp:
    if isinstance(value, Tracer): value.check_alive()
    if id(value) not in self.const_params:
      self.const_params[id(value)] = UOp(Ops.PARAM, value.dtype, (), (self.n_inputs + len(self.consts), value.shape))
      self.consts.append(value)
    return self.const_params[id(value)]

  def process(self, op: Ops, operands: tuple[Any, ...], arg: Any, dtype: np.dtype, weak_type: bool) -> Any:
    uops = tuple(x.uop if self.is_mine(x) else self.const_param(x) for x in operands)
    return StagingTracer(UOp(op, dtype, uops, arg), weak_type, self)

  def process_primitive(self, prim: Primitive, operands: tuple[Any, ...], params: dict) -> Any:
    """Record the call as one PRIMITIVE node (so the body's derivative and batching use the primitive's rules); the
    output avals come from running its impl on a scratch trace."""
    try:
      items = tuple(sorted(params.items()))
      hash(items)
    except TypeError:  # params that cannot key a node: record the decomposition instead
      return prim.impl(*operands, **params)
    arrays = [x if isinstance(x, Array) else ad._to_array(x) for x in operands]
    fingerprint, outs = "", []
    if prim in ad.abstract_eval_rules:  # (a collective: its impl needs the named axis, which the body is inside of)
      out_avals = (ad.abstract_eval_rules[prim](*arrays, **params),)
    else:
      outs = [o if isinstance(o, Array) else ad._to_array(o) for o in trace_impl(self, prim, arrays, params)[0]]
      out_avals = tuple(aval_of(o) for o in outs)
    if not prim.fixed:  # what the impl computes, for the persistent caches' keys
      from tinyjax.lower.schedule import structure_key
      fingerprint = structure_key(UOp(Ops.SINK, BOOL, tuple(o.uop for o in outs)))[:16]
    call = PrimitiveCall(prim, items, out_avals, fingerprint, in_weak=tuple(bool(a.weak_type) for a in arrays))
    uops = tuple(a.uop if self.is_mine(a) else self.const_param(a) for a in arrays)
    if not prim.multiple_results:
      shape, dtype, weak = out_avals[0]
      return StagingTracer(UOp(Ops.PRIMITIVE, dtype, uops, call), weak, self)
    node = UOp(Ops.PRIMITIVE, BOOL, uops, call)
    return [StagingTracer(UOp(Ops.PROJECT, dtype, (node,), (i, shape)), weak, self)
            for i, (shape, dtype, weak) in enumerate(out_avals)]

  def output(self, x: Any) -> UOp:
    """The program node of an output value (another trace's value or host data becomes a const)."""
    if not isinstance(x, Array): x = ad._to_array(x)
    return x.uop if self.is_mine(x) else self.const_param(x)


def trace_program(fun: Callable, in_avals: Sequence[Aval], fun_name: str) -> tuple[UOp, list[Aval], list, Any]:
  """Trace `fun(*inputs)` (inputs of `in_avals`) into a program. Returns the SINK over its output leaves, their
  avals, the consts it closed over (inputs n_inputs.. of the program), and the output tree."""
  trace = BodyTrace(current_trace.get(), len(in_avals), fun_name)
  with new_trace(trace):
    args = [trace.new_arg(i, shape, dtype, weak) for i, (shape, dtype, weak) in enumerate(in_avals)]
    leaves, tree = tree_util.tree_flatten(fun(*args))
    arrays = [leaf if isinstance(leaf, Array) else ad._to_array(leaf) for leaf in leaves]
    uops = tuple(trace.output(a) for a in arrays)
  return UOp(Ops.SINK, BOOL, uops), [aval_of(a) for a in arrays], trace.consts, tree


def evaluate_into_program(program: UOp, in_avals: Sequence[Aval], transform: Callable[[list[Any]], list[Any]],
                          fun_name: str) -> tuple[UOp, list[Aval], list]:
  """A new program from `transform(inputs)`, which computes on the PARAMs of a fresh BodyTrace (e.g. evaluates
  `program` under a JVP or batching trace). Returns the SINK, output avals and consts."""
  del program
  trace = BodyTrace(current_trace.get(), len(in_avals), fun_name)
  with new_trace(trace):
    args = [trace.new_arg(i, shape, dtype, weak) for i, (shape, dtype, weak) in enumerate(in_avals)]
    outs = transform(args)
    uops = tuple(trace.output(o) for o in outs)
    avals = [aval_of(o) for o in outs]
  return UOp(Ops.SINK, BOOL, uops), avals, trace.consts


def renumber(program: UOp, mapping: dict[int, UOp]) -> UOp:
  """`program` with PARAM i replaced by the node mapping[i] (a PARAM of another index, or any expression)."""
  done: dict[UOp, UOp] = {}
  for node in program.toposort:
    if node.op is Ops.PARAM: done[node] = mapping[node.arg[0]]
    elif node.src: done[node] = node.replace(src=tuple(done[s] for s in node.src))
    else: done[node] = node
  return done[program]


def param(index: int, aval: Aval) -> UOp: return UOp(Ops.PARAM, aval[1], (), (index, tuple(aval[0])))


def _project_all(node: Any, avals: Sequence[Aval]) -> list[Any]:
  return [bind(Ops.PROJECT, node, arg=(i, tuple(shape)), dtype=dtype, weak_type=weak)
          for i, (shape, dtype, weak) in enumerate(avals)]


# ------------------------------------------------------------------------------------------------------------ scan

def _scan_impl(*operands: Any, body: UOp, length: int, reverse: bool, n_carry: int, n_xs: int,
               out_avals: tuple[Aval, ...]) -> list[Any]:
  node = bind(Ops.SCAN, *operands, arg=ScanArg(body, length, reverse, n_carry, n_xs), dtype=BOOL)
  return _project_all(node, out_avals)


scan_p = Primitive("scan", _scan_impl, multiple_results=True)


def scan_out_avals(carry_avals: Sequence[Aval], y_avals: Sequence[Aval], length: int) -> tuple[Aval, ...]:
  return tuple(carry_avals) + tuple(((length, *shape), dtype, weak) for shape, dtype, weak in y_avals)


def bind_scan(carries: Sequence[Any], xs: Sequence[Any], consts: Sequence[Any], body: UOp, body_out_avals: list[Aval],
              length: int, reverse: bool) -> list[Any]:
  """Bind the scan primitive; `body_out_avals` are the body's outputs (new carries, then y slices)."""
  n_carry = len(carries)
  out_avals = scan_out_avals(body_out_avals[:n_carry], body_out_avals[n_carry:], length)
  return scan_p.bind(*carries, *xs, *consts, body=body, length=length, reverse=reverse, n_carry=n_carry,
                     n_xs=len(xs), out_avals=out_avals)


def _slice_aval(aval: Aval) -> Aval: return (tuple(aval[0][1:]), aval[1], aval[2])


def _zeros(aval: Aval) -> Any:
  shape, dtype, _ = aval
  return ad.full_like(_Shape(shape, dtype), 0)


class _Shape:
  """Shape and dtype, for ad.full_like."""

  def __init__(self, shape: tuple[int, ...], dtype: np.dtype):
    self.shape, self.dtype = tuple(shape), np.dtype(dtype)


def _linearize_body(body: UOp, in_avals: list[Aval], nonzero: list[bool]):
  """Linearize a body program at symbolic primal inputs: returns (primal outputs, tangent outputs (None: zero),
  residuals (values of the primal trace), the primal trace, the linear program, its input count)."""
  primal_trace = BodyTrace(current_trace.get(), len(in_avals), "scan body (primal)")
  n_linear = sum(nonzero)
  with new_trace(primal_trace):
    args = [primal_trace.new_arg(i, shape, dtype, weak) for i, (shape, dtype, weak) in enumerate(in_avals)]
    linear = ad.LinearTrace(primal_trace, n_linear)
    jvp_trace = ad.JVPTrace(primal_trace, linear)
    with new_trace(jvp_trace):
      inputs, index = [], 0
      for arg, differentiated in zip(args, nonzero):
        if differentiated:
          inputs.append(ad.JVPTracer(jvp_trace, arg, linear.new_arg(index, arg.shape, arg.dtype, arg.weak_type)))
          index += 1
        else:
          inputs.append(arg)
      outs = ad.evaluate(body, inputs)
    linear.active = False
    primals, tangents = [], []
    for out in outs:
      is_jvp = isinstance(out, ad.JVPTracer) and out.trace is jvp_trace
      primals.append(out.primal if is_jvp else out)
      tangent = out.tangent if is_jvp else None
      tangents.append(tangent if tangent is not None and linear.is_mine(tangent) else None)
    primal_uops = [primal_trace.output(p) for p in primals]
  return primals, primal_uops, tangents, linear, primal_trace


def _scan_jvp(primals, tangents, *, body, length, reverse, n_carry, n_xs, out_avals):
  n_in = len(primals)
  in_avals = [aval_of(p) for p in primals[:n_carry]]
  in_avals += [_slice_aval(aval_of(x)) for x in primals[n_carry:n_carry + n_xs]]
  in_avals += [aval_of(c) for c in primals[n_carry + n_xs:]]
  floating = [ad.is_float(p) for p in primals]
  nonzero = [t is not None and f for t, f in zip(tangents, floating)]
  while True:  # carries whose tangent the body makes non-zero get one: iterate to a fixed point
    primal_outs, primal_uops, tangent_outs, linear, primal_trace = _linearize_body(body, in_avals, nonzero)
    grown = [nonzero[i] or (tangent_outs[i] is not None and floating[i]) for i in range(n_carry)]
    if grown == nonzero[:n_carry]: break
    nonzero[:n_carry] = grown
  # residuals: each is stored as the value under its movement ops (a broadcast operand of a matmul costs its source,
  # not the broadcast). A const input is passed as a const, an x input as that x, a value that depends on no input
  # is inlined into the linear body, anything else is stacked by the primal scan as an extra y
  sources: list[tuple] = []  # ("xs", k) | ("const", k) | ("stacked", node)
  residuals: list[tuple[UOp, UOp | None, tuple | None]] = []  # (expression, its base, the base's source)
  for value in linear.consts:
    uop = primal_trace.output(value)
    if not any(n.op is Ops.PARAM for n in uop.toposort):
      residuals.append((uop, None, None))
      continue
    base = uop
    while base.op in MOVEMENT: base = base.src[0]
    if base.op is Ops.PARAM and n_carry <= base.arg[0] < n_in:
      index = base.arg[0] - n_carry
      source = ("xs", index) if index < n_xs else ("const", index - n_xs)
    else:
      source = ("stacked", base)
    if source not in sources: sources.append(source)
    residuals.append((uop, base, source))
  stacked_uops = [source[1] for source in sources if source[0] == "stacked"]
  # the primal scan, with the stacked residuals as extra ys (and the body's own consts, if linearizing added any)
  primal_body = UOp(Ops.SINK, BOOL, tuple(primal_uops) + tuple(stacked_uops))
  body_avals = [aval_of(p) for p in primal_outs] + [_uop_aval(u) for u in stacked_uops]
  carries, xs, consts = primals[:n_carry], primals[n_carry:n_carry + n_xs], primals[n_carry + n_xs:]
  outs = bind_scan(carries, xs, list(consts) + list(primal_trace.consts), primal_body, body_avals, length, reverse)
  n_out = len(out_avals)
  primal_results, stacked = outs[:n_out], outs[n_out:]
  # the tangent scan: carries = nonzero carry tangents; xs = nonzero x tangents, then the residuals that change per
  # iteration (stacked, or xs); consts = nonzero const tangents, then the const residuals
  tangent_inputs = [i for i in range(n_in) if nonzero[i]]
  lin_carries = [i for i in tangent_inputs if i < n_carry]
  lin_xs = [i for i in tangent_inputs if n_carry <= i < n_carry + n_xs]
  lin_consts = [i for i in tangent_inputs if i >= n_carry + n_xs]
  xs_sources = [source for source in sources if source[0] != "const"]
  const_sources = [source for source in sources if source[0] == "const"]
  t_xs_count = len(lin_xs) + len(xs_sources)
  mapping: dict[int, UOp] = {}
  for position, i in enumerate(tangent_inputs):
    if i < n_carry: new_index = lin_carries.index(i)
    elif i < n_carry + n_xs: new_index = len(lin_carries) + lin_xs.index(i)
    else: new_index = len(lin_carries) + t_xs_count + lin_consts.index(i)
    mapping[position] = param(new_index, in_avals[i])
  for r, (expression, base, source) in enumerate(residuals):
    index = len(tangent_inputs) + r
    if base is None:
      mapping[index] = expression
      continue
    if source[0] == "const":
      new_index = len(lin_carries) + t_xs_count + len(lin_consts) + const_sources.index(source)
      aval = in_avals[n_carry + n_xs + source[1]]
    else:
      new_index = len(lin_carries) + len(lin_xs) + xs_sources.index(source)
      aval = _uop_aval(base) if source[0] == "stacked" else in_avals[n_carry + source[1]]
    mapping[index] = _substitute(expression, base, param(new_index, aval))
  tangent_uops = []
  for i, t in enumerate(tangent_outs):
    if i < n_carry and not nonzero[i]: continue
    tangent_uops.append(t.uop if t is not None else ad._zeros_uop(primal_outs[i].shape, primal_outs[i].dtype))
  linear_body = renumber(UOp(Ops.SINK, BOOL, tuple(tangent_uops)), mapping)
  t_carries = [ad.instantiate(tangents[i], primals[i]) for i in lin_carries]
  t_xs = [ad.instantiate(tangents[i], primals[i]) for i in lin_xs]
  t_xs += [stacked[stacked_uops.index(source[1])] if source[0] == "stacked" else xs[source[1]]
           for source in xs_sources]
  t_consts = [ad.instantiate(tangents[i], primals[i]) for i in lin_consts] + [consts[s[1]] for s in const_sources]
  t_avals = [aval_of(primal_outs[i]) for i in range(n_carry) if nonzero[i]] + \
    [aval_of(p) for p in primal_outs[n_carry:]]
  t_outs = bind_scan(t_carries, t_xs, t_consts, linear_body, t_avals, length, reverse)
  out_tangents, position = [], 0
  for i in range(n_carry):
    if nonzero[i]:
      out_tangents.append(t_outs[position])
      position += 1
    else:
      out_tangents.append(None)
  out_tangents += t_outs[position:]
  return primal_results, out_tangents


def _uop_aval(uop: UOp) -> Aval: return (tuple(uop.shape), uop.dtype, False)


def _substitute(expression: UOp, old: UOp, new: UOp) -> UOp:
  """`expression` with node `old` replaced by `new`."""
  done: dict[UOp, UOp] = {}
  for node in expression.toposort:
    if node is old: done[node] = new
    elif node.src: done[node] = node.replace(src=tuple(done[s] for s in node.src))
    else: done[node] = node
  return done[expression]


def _scan_transpose(cts: dict[int, Any], node: UOp, known: list[Any]):
  body, length, reverse, n_carry, n_xs = node.arg
  operands = node.src
  n_in = len(operands)
  # a known carry is a tangent that started as zeros (a carry made non-zero by the body): transposed as linear, its
  # cotangent is dropped by the caller
  linear = [i < n_carry or k is None for i, k in enumerate(known)]
  lin_xs = [i for i in range(n_carry, n_carry + n_xs) if linear[i]]
  known_xs = [i for i in range(n_carry, n_carry + n_xs) if not linear[i]]
  lin_consts = [i for i in range(n_carry + n_xs, n_in) if linear[i]]
  known_consts = [i for i in range(n_carry + n_xs, n_in) if not linear[i]]
  in_avals = [_uop_aval(operands[i]) for i in range(n_carry)]
  in_avals += [_slice_aval(_uop_aval(operands[i])) for i in range(n_carry, n_carry + n_xs)]
  in_avals += [_uop_aval(operands[i]) for i in range(n_carry + n_xs, n_in)]
  n_y = len(body.src) - n_carry
  y_avals = [_uop_aval(y) for y in body.src[n_carry:]]
  # the linear body with its linear inputs first (carries, linear xs, linear consts), then the known ones
  order = list(range(n_carry)) + lin_xs + lin_consts + known_xs + known_consts
  n_linear = n_carry + len(lin_xs) + len(lin_consts)
  linear_body = renumber(body, {old: param(new, in_avals[old]) for new, old in enumerate(order)})
  # the transposed body: carries (ct of the carries, ct accumulators of the linear consts), xs (ct of the ys, known
  # xs), consts (known consts)
  t_in_avals = in_avals[:n_carry] + [in_avals[i] for i in lin_consts] + y_avals + [in_avals[i] for i in known_xs] + \
    [in_avals[i] for i in known_consts]

  def transposed(args: list[Any]) -> list[Any]:
    ct_carry, acc = args[:n_carry], args[n_carry:n_carry + len(lin_consts)]
    rest = args[n_carry + len(lin_consts):]
    ct_y, known_values = rest[:n_y], rest[n_y:]
    cts_in = ad.transpose(linear_body, n_linear, known_values, list(ct_carry) + list(ct_y))
    new_carry = [ad.zeros_like(_Shape(*in_avals[i][:2])) if c is None else c for i, c in enumerate(cts_in[:n_carry])]
    ct_xs = cts_in[n_carry:n_carry + len(lin_xs)]
    ct_consts = cts_in[n_carry + len(lin_xs):]
    new_acc = [a if c is None else ad.add(a, c) for a, c in zip(acc, ct_consts)]
    ys = [ad.zeros_like(_Shape(*in_avals[i][:2])) if c is None else c for i, c in zip(lin_xs, ct_xs)]
    return new_carry + new_acc + ys

  t_body, t_avals, t_consts = evaluate_into_program(body, t_in_avals, transposed, "transpose of scan")
  def ct_of(index: int, aval: Aval) -> Any:
    return cts[index] if cts.get(index) is not None else _zeros(aval)
  init = [ct_of(i, _uop_aval(operands[i])) for i in range(n_carry)]
  init += [_zeros(_uop_aval(operands[i])) for i in lin_consts]
  ct_ys = [ct_of(n_carry + j, ((length, *y_avals[j][0]), y_avals[j][1], False)) for j in range(n_y)]
  t_xs = ct_ys + [known[i] for i in known_xs]
  outs = bind_scan(init, t_xs, [known[i] for i in known_consts] + list(t_consts), t_body, t_avals, length,
                   not reverse)
  result: list[Any] = [None] * n_in
  for i in range(n_carry): result[i] = outs[i]
  for j, i in enumerate(lin_consts): result[i] = outs[n_carry + j]
  for j, i in enumerate(lin_xs): result[i] = outs[n_carry + len(lin_consts) + j]
  return result


def _batch_body(program: UOp, in_avals: list[Aval], batched: list[bool], out_batched: list[bool] | None,
                outer: batching.BatchTrace):
  """Vmap a body program over the axis of BatchTrace `outer` (its size, name and spmd typing, so that collectives in
  the body find it): inputs marked `batched` get a leading batch axis. Returns the program, the output avals, its
  consts and which outputs are batched (those in `out_batched` made batched by broadcasting)."""
  result_batched: list[bool] = []
  size = outer.axis_size

  def transform(args: list[Any]) -> list[Any]:
    trace = batching.BatchTrace(current_trace.get(), size, outer.axis_name, outer.spmd)
    with new_trace(trace):
      inputs = [batching.BatchTracer(trace, a, 0) if b else a for a, b in zip(args, batched)]
      outs = ad.evaluate(program, inputs)
    vals = []
    for i, out in enumerate(outs):
      is_batched = isinstance(out, batching.BatchTracer) and out.trace is trace
      if is_batched: vals.append(batching.move_axis(out.val, out.batch_dim, 0))
      elif out_batched is not None and out_batched[i]:
        vals.append(batching.broadcast_axis(out if isinstance(out, Array) else ad._to_array(out), 0, size))
        is_batched = True
      else: vals.append(out)
      result_batched.append(is_batched)
    return vals

  batched_avals = [((size, *shape), dtype, weak) if b else (shape, dtype, weak)
                   for (shape, dtype, weak), b in zip(in_avals, batched)]
  new_program, avals, consts = evaluate_into_program(program, batched_avals, transform, "vmap of a loop body")
  return new_program, avals, consts, result_batched


def _scan_batch(trace, vals, dims, *, body, length, reverse, n_carry, n_xs, out_avals):
  size = trace.axis_size
  batched = [d is not None for d in dims]
  plain_avals = []
  for i, (v, d) in enumerate(zip(vals, dims)):
    shape = tuple(v.shape) if d is None else tuple(v.shape[:d]) + tuple(v.shape[d + 1:])
    aval = (shape, np.dtype(v.dtype), bool(v.weak_type))
    plain_avals.append(_slice_aval(aval) if n_carry <= i < n_carry + n_xs else aval)
  while True:
    carry_batched = batched[:n_carry]
    program, avals, consts, out_batched = _batch_body(body, plain_avals, batched, carry_batched + [False] * (
      len(body.src) - n_carry), trace)
    grown = [a or b for a, b in zip(carry_batched, out_batched[:n_carry])]
    if grown == carry_batched: break
    batched[:n_carry] = grown
  operands = []
  for i, (v, d) in enumerate(zip(vals, dims)):
    if not batched[i]: operands.append(v)
    elif n_carry <= i < n_carry + n_xs: operands.append(batching.match_axis(v, d, 1, size))  # time stays axis 0
    else: operands.append(batching.match_axis(v, d, 0, size))
  outs = bind_scan(operands[:n_carry], operands[n_carry:n_carry + n_xs], operands[n_carry + n_xs:] + list(consts),
                   program, avals, length, reverse)
  out_dims = [0 if b else None for b in out_batched[:n_carry]] + [1 if b else None for b in out_batched[n_carry:]]
  return outs, out_dims


ad.jvp_rules[scan_p] = _scan_jvp
ad.transpose_rules[Ops.SCAN] = _scan_transpose
batching.batch_rules[scan_p] = _scan_batch


# ------------------------------------------------------------------------------------------------------------ while

def _while_impl(*operands: Any, cond: UOp, body: UOp, n_carry: int, out_avals: tuple[Aval, ...]) -> list[Any]:
  node = bind(Ops.WHILE, *operands, arg=WhileArg(cond, body, n_carry), dtype=BOOL)
  return _project_all(node, out_avals)


while_p = Primitive("while", _while_impl, multiple_results=True)


def bind_while(carries: Sequence[Any], consts: Sequence[Any], cond: UOp, cond_consts: Sequence[Any], body: UOp,
               body_consts: Sequence[Any], out_avals: Sequence[Aval]) -> list[Any]:
  """Bind the while primitive for a condition and a body traced over the inputs (carries, consts), each with its own
  consts after those: the loop's consts are `consts`, then the condition's, then the body's (renumbered to follow)."""
  n_shared = len(carries) + len(consts)
  shift = {i: param(i if i < n_shared else i + len(cond_consts), aval) for i, aval in _param_avals(body).items()}
  return while_p.bind(*carries, *consts, *cond_consts, *body_consts, cond=cond, body=renumber(body, shift),
                      n_carry=len(carries), out_avals=tuple(out_avals))


def _param_avals(program: UOp) -> dict[int, Aval]:
  return {node.arg[0]: (tuple(node.arg[1]), node.dtype, False) for node in program.toposort if node.op is Ops.PARAM}


def _while_jvp(primals, tangents, *, cond, body, n_carry, out_avals):
  if isinstance(current_trace.get(), ad.LinearTrace):
    raise ValueError("Reverse-mode differentiation does not work for lax.while_loop or lax.fori_loop with dynamic "
                     "start/stop values. Try using lax.scan, or using fori_loop with static start/stop.")
  carries, consts = list(primals[:n_carry]), list(primals[n_carry:])
  floating = [ad.is_float(p) for p in primals]
  nonzero = [t is not None and f for t, f in zip(tangents, floating)]
  const_tangents = [i for i in range(n_carry, len(primals)) if nonzero[i]]
  while True:  # carries whose tangent the body makes non-zero get one: iterate to a fixed point
    carry_tangents = [i for i in range(n_carry) if nonzero[i]]
    layout = [aval_of(c) for c in carries] + [aval_of(primals[i]) for i in carry_tangents + const_tangents] + \
      [aval_of(c) for c in consts]
    n_t = len(carry_tangents) + len(const_tangents)
    made_nonzero: list[int] = []

    def jvp_body(args: list[Any], carry_tangents=carry_tangents, made_nonzero=made_nonzero) -> list[Any]:
      primal_args = args[:n_carry] + args[n_carry + n_t:]
      trace = ad.JVPTrace(current_trace.get(), current_trace.get())
      with new_trace(trace):
        inputs = list(primal_args)
        for t, i in zip(args[n_carry:n_carry + n_t], carry_tangents + const_tangents):
          inputs[i] = ad.JVPTracer(trace, primal_args[i], t)
        outs = ad.evaluate(body, inputs)
      primal_outs = [o.primal if isinstance(o, ad.JVPTracer) and o.trace is trace else o for o in outs]
      tangent_outs = [o.tangent if isinstance(o, ad.JVPTracer) and o.trace is trace else None for o in outs]
      made_nonzero.extend(i for i, t in enumerate(tangent_outs) if t is not None and floating[i])
      return primal_outs + [ad.instantiate(tangent_outs[i], primal_outs[i]) for i in carry_tangents] + \
        args[n_carry + len(carry_tangents):n_carry + n_t]  # const tangents pass through

    new_body, body_avals, body_consts = evaluate_into_program(body, layout, jvp_body, "jvp of while body")
    grown = [nonzero[i] or i in made_nonzero for i in range(n_carry)]
    if grown == nonzero[:n_carry]: break
    nonzero[:n_carry] = grown

  def primal_cond(args: list[Any]) -> list[Any]: return ad.evaluate(cond, args[:n_carry] + args[n_carry + n_t:])
  new_cond, _, cond_consts = evaluate_into_program(cond, layout, primal_cond, "jvp of while condition")
  loop_carries = carries + [ad.instantiate(tangents[i], primals[i]) for i in carry_tangents] + \
    [ad.instantiate(tangents[i], primals[i]) for i in const_tangents]
  outs = bind_while(loop_carries, consts, new_cond, cond_consts, new_body, body_consts, body_avals)
  out_tangents: list[Any] = [None] * n_carry
  for j, i in enumerate(carry_tangents): out_tangents[i] = outs[n_carry + j]
  return outs[:n_carry], out_tangents


def _while_batch(trace, vals, dims, *, cond, body, n_carry, out_avals):
  size = trace.axis_size
  plain_avals = []
  for v, d in zip(vals, dims):
    shape = tuple(v.shape) if d is None else tuple(v.shape[:d]) + tuple(v.shape[d + 1:])
    plain_avals.append((shape, np.dtype(v.dtype), bool(v.weak_type)))
  batched = [d is not None for d in dims]
  while True:  # carries that become batched (or all of them, with a batched condition): a fixed point
    _, _, _, cond_batched = _batch_body(cond, plain_avals, batched, None, trace)
    if cond_batched[0]: batched[:n_carry] = [True] * n_carry  # examples finish at different passes
    _, _, _, out_batched = _batch_body(body, plain_avals, batched, batched[:n_carry], trace)
    grown = [a or b for a, b in zip(batched[:n_carry], out_batched)]
    if grown == batched[:n_carry]: break
    batched[:n_carry] = grown
  cond_program, _, cond_consts, cond_batched = _batch_body(cond, plain_avals, batched, None, trace)
  body_program, body_avals, body_consts, _ = _batch_body(body, plain_avals, batched, batched[:n_carry], trace)
  operands = [batching.match_axis(v, d, 0, size) if b else v for v, d, b in zip(vals, dims, batched)]
  carries, consts = operands[:n_carry], operands[n_carry:]
  if not cond_batched[0]:
    outs = bind_while(carries, consts, cond_program, cond_consts, body_program, body_consts, body_avals)
    return outs, [0 if b else None for b in batched[:n_carry]]
  # the loop runs while some example's condition holds; the body keeps finished examples' carries as they are
  layout = [aval_of(o) for o in operands]

  def any_example(args: list[Any]) -> list[Any]:
    flags = ad.evaluate(cond_program, args + list(cond_consts))[0]
    return [bind(Ops.RESHAPE, bind(Ops.REDUCE_AXIS, flags, arg=(Ops.MAX, (0,))), arg=())]

  def masked_body(args: list[Any]) -> list[Any]:
    flags = ad.evaluate(cond_program, args + list(cond_consts))[0]
    new = ad.evaluate(body_program, args + list(body_consts))
    out = []
    for old, value in zip(args[:n_carry], new):
      mask = bind(Ops.EXPAND, bind(Ops.RESHAPE, flags, arg=(size,) + (1,) * (len(old.shape) - 1)),
                  arg=tuple(old.shape))
      out.append(ad.where(mask, value, old))
    return out

  new_cond, _, new_cond_consts = evaluate_into_program(cond, layout, any_example, "vmap of while condition")
  new_body, new_avals, new_body_consts = evaluate_into_program(body, layout, masked_body, "vmap of while body")
  outs = bind_while(carries, consts, new_cond, new_cond_consts, new_body, new_body_consts, new_avals)
  return outs, [0] * n_carry


ad.jvp_rules[while_p] = _while_jvp
batching.batch_rules[while_p] = _while_batch


# ------------------------------------------------------------------------------------------------------------ cond

def _cond_impl(index: Any, *operands: Any, branches: tuple[UOp, ...], out_avals: tuple[Aval, ...]) -> list[Any]:
  node = bind(Ops.COND, index, *operands, arg=tuple(branches), dtype=BOOL)
  return _project_all(node, out_avals)


cond_p = Primitive("cond", _cond_impl, multiple_results=True)


def bind_cond(index: Any, operands: Sequence[Any], branches: Sequence[tuple[UOp, Sequence[Any]]],
              out_avals: Sequence[Aval]) -> list[Any]:
  """Bind the cond primitive: `branches` are (program over the operands then its own consts, those consts); the
  consts of all branches become further operands, each branch's renumbered to where its own are."""
  n = len(operands)
  programs, consts = [], []
  for program, own in branches:
    offset = n + len(consts)
    shift = {i: param(i if i < n else offset + i - n, aval) for i, aval in _param_avals(program).items()}
    programs.append(renumber(program, shift))
    consts += list(own)
  return cond_p.bind(index, *operands, *consts, branches=tuple(programs), out_avals=tuple(out_avals))


def _residual_sources(linear, primal_trace, n_operands: int) -> list[tuple[UOp, UOp | None, tuple | None]]:
  """Each residual of a linearized branch as (expression, base under its movement ops, source): an operand
  ("operand", k), a value the branch outputs ("out", base), or None for an expression of constants."""
  out = []
  for value in linear.consts:
    uop = primal_trace.output(value)
    if not any(n.op is Ops.PARAM for n in uop.toposort):
      out.append((uop, None, None))
      continue
    base = uop
    while base.op in MOVEMENT: base = base.src[0]
    is_operand = base.op is Ops.PARAM and base.arg[0] < n_operands
    out.append((uop, base, ("operand", base.arg[0]) if is_operand else ("out", base)))
  return out


def _cond_jvp(primals, tangents, *, branches, out_avals):
  index, operands, op_tangents = primals[0], list(primals[1:]), list(tangents[1:])
  n = len(operands)
  in_avals = [aval_of(o) for o in operands]
  nonzero = [t is not None and ad.is_float(o) for t, o in zip(op_tangents, operands)]
  linearized = [_linearize_body(branch, in_avals, nonzero) for branch in branches]
  n_out = len(out_avals)
  out_nonzero = [any(lin[2][k] is not None for lin in linearized) and np.dtype(out_avals[k][1]).kind == "f"
                 for k in range(n_out)]
  residuals = [_residual_sources(lin[3], lin[4], n) for lin in linearized]
  bases: list[UOp] = []  # every branch's per-call residual values, outputs of the primal cond
  for branch_residuals in residuals:
    for _, base, source in branch_residuals:
      if source is not None and source[0] == "out" and base not in bases: bases.append(base)
  # the primal cond: each branch outputs its results and its own residuals (zeros for the other branches')
  primal_branches = []
  for b, (lin, branch_residuals) in enumerate(zip(linearized, residuals)):
    own = {base for _, base, source in branch_residuals if source is not None and source[0] == "out"}
    extra = [base if base in own else ad._zeros_uop(base.shape, base.dtype) for base in bases]
    primal_branches.append((UOp(Ops.SINK, BOOL, tuple(lin[1]) + tuple(extra)), lin[4].consts))
  residual_avals = [_uop_aval(base) for base in bases]
  outs = bind_cond(index, operands, primal_branches, list(out_avals) + residual_avals)
  primal_outs, residual_values = outs[:n_out], outs[n_out:]
  # the tangent cond over (nonzero tangents, operands, residual values)
  tangent_inputs = [i for i in range(n) if nonzero[i]]
  n_t = len(tangent_inputs)
  t_avals = [aval_of(primal_outs[k]) for k in range(n_out) if out_nonzero[k]]
  linear_branches = []
  for lin, branch_residuals in zip(linearized, residuals):
    mapping = {p: param(p, in_avals[i]) for p, i in enumerate(tangent_inputs)}
    for r, (expression, base, source) in enumerate(branch_residuals):
      if source is None: mapping[n_t + r] = expression
      elif source[0] == "operand":
        mapping[n_t + r] = _substitute(expression, base, param(n_t + source[1], in_avals[source[1]]))
      else: mapping[n_t + r] = _substitute(expression, base, param(n_t + n + bases.index(base), _uop_aval(base)))
    tangent_uops = [lin[2][k].uop if lin[2][k] is not None else ad._zeros_uop(out_avals[k][0], out_avals[k][1])
                    for k in range(n_out) if out_nonzero[k]]
    linear_branches.append((renumber(UOp(Ops.SINK, BOOL, tuple(tangent_uops)), mapping), []))
  t_operands = [ad.instantiate(op_tangents[i], operands[i]) for i in tangent_inputs] + operands + residual_values
  t_outs = bind_cond(index, t_operands, linear_branches, t_avals) if t_avals else []
  out_tangents, position = [], 0
  for k in range(n_out):
    if out_nonzero[k]:
      out_tangents.append(t_outs[position])
      position += 1
    else:
      out_tangents.append(None)
  return primal_outs, out_tangents


def _cond_transpose(cts: dict[int, Any], node: UOp, known: list[Any]):
  index, operands, branches = known[0], node.src[1:], node.arg
  linear = [k is None for k in known[1:]]
  lin_ops = [i for i in range(len(operands)) if linear[i]]
  if not lin_ops: return [None] * (1 + len(operands))
  known_ops = [i for i in range(len(operands)) if not linear[i]]
  in_avals = [_uop_aval(o) for o in operands]
  out_avals = [_uop_aval(out) for out in branches[0].src]
  order = lin_ops + known_ops
  t_in_avals = out_avals + [in_avals[i] for i in known_ops]
  transposed = []
  for branch in branches:
    linear_branch = renumber(branch, {old: param(new, in_avals[old]) for new, old in enumerate(order)})

    def transpose_branch(args: list[Any], linear_branch=linear_branch) -> list[Any]:
      cts_in = ad.transpose(linear_branch, len(lin_ops), args[len(out_avals):], args[:len(out_avals)])
      return [ad.zeros_like(_Shape(*in_avals[i][:2])) if c is None else c for i, c in zip(lin_ops, cts_in)]
    program, _, consts = evaluate_into_program(branch, t_in_avals, transpose_branch, "transpose of cond")
    transposed.append((program, consts))
  ct_outs = [cts[k] if cts.get(k) is not None else _zeros(out_avals[k]) for k in range(len(out_avals))]
  results = bind_cond(index, ct_outs + [known[1 + i] for i in known_ops], transposed, [in_avals[i] for i in lin_ops])
  contributions: list[Any] = [None] * (1 + len(operands))
  for i, value in zip(lin_ops, results): contributions[1 + i] = value
  return contributions


def _cond_batch(trace, vals, dims, *, branches, out_avals):
  size = trace.axis_size
  index, operands, op_dims = vals[0], list(vals[1:]), list(dims[1:])
  plain_avals = []
  for v, d in zip(operands, op_dims):
    shape = tuple(v.shape) if d is None else tuple(v.shape[:d]) + tuple(v.shape[d + 1:])
    plain_avals.append((shape, np.dtype(v.dtype), bool(v.weak_type)))
  batched = [d is not None for d in op_dims]
  n_out = len(out_avals)
  if dims[0] is not None:  # a batched index: every branch runs, each example selects its own branch's results
    results = []
    for branch in branches:
      program, _, consts, _ = _batch_body(branch, plain_avals, batched, [True] * n_out, trace)
      args = [batching.move_axis(v, d, 0) if d is not None else v for v, d in zip(operands, op_dims)]
      results.append(ad.evaluate(program, args + list(consts)))
    which = batching.move_axis(index, dims[0], 0)
    outs = []
    for k in range(n_out):
      out = results[0][k]
      for b in range(1, len(branches)):
        chosen = bind(Ops.CMPLT, ad.full_like(which, b - 1), which, dtype=BOOL)  # index >= b
        mask = bind(Ops.EXPAND, bind(Ops.RESHAPE, chosen, arg=(size,) + (1,) * (len(out.shape) - 1)),
                    arg=tuple(out.shape))
        out = ad.where(mask, results[b][k], out)
      outs.append(out)
    return outs, [0] * n_out
  out_batched = [False] * n_out
  for branch in branches:
    _, _, _, branch_batched = _batch_body(branch, plain_avals, batched, None, trace)
    out_batched = [a or b for a, b in zip(out_batched, branch_batched)]
  programs, avals = [], None
  for branch in branches:
    program, branch_avals, consts, _ = _batch_body(branch, plain_avals, batched, out_batched, trace)
    programs.append((program, consts))
    avals = branch_avals
  args = [batching.move_axis(v, d, 0) if d is not None else v for v, d in zip(operands, op_dims)]
  avals = [(shape, dtype, weak and out_avals[k][2]) for k, (shape, dtype, weak) in enumerate(avals)]
  return bind_cond(index, args, programs, avals), [0 if b else None for b in out_batched]


ad.jvp_rules[cond_p] = _cond_jvp
ad.transpose_rules[Ops.COND] = _cond_transpose
batching.batch_rules[cond_p] = _cond_batch
