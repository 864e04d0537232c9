"""The OpenCL C renderer: one kernel AST (a `SINK` of `STORE`s over `RANGE` loops, built by lower/) -> an OpenCL C
kernel, for the `opencl` device (devices/opencl.py).

It renders the GPU kernel model of codegen/gpu.py, as `codegen.llvm.render_gpu` does for NVPTX: the kernel

    __kernel void <name>(__global T0 *restrict buf0, ...)

runs as its `GpuLaunch`: one work-item per output element (`gid = get_global_id(0)`, work-items past the last do
nothing; the first `ordered` global ranges are loops inside every work-item; reductions are loops inside the
work-item, a float32 sum in blocks of GPU_SUM_BLOCK added up in float64), or a work-group per output element for a
group reduction (`gid = get_group_id(0)`, `lane = get_local_id(0)`; partial results combined in `__local` memory
between `barrier`s; work-item 0 stores). Nodes are placed as on the CPU: each at the innermost loop it depends on
(loop-invariant work is hoisted), one C variable per node.

Semantics are the CPU's (codegen/llvm.py), written in C where C leaves them open: integer ADD / MUL / NEG wrap (done
in the unsigned type, signed overflow being undefined in C), division by zero and INT_MIN / -1 give XLA's answers,
shifts by the bit width or more shift everything out, MAX propagates NaN and orders -0 below +0, float -> int
conversions saturate (NaN -> 0), float16 / bfloat16 compute in float32 and round once per op (float16 in memory is
read and written with `vload_half` / `vstore_half_rte`, which need no `cl_khr_fp16`; bfloat16 is its 16 bits in a
`ushort`). Programs are built with `-cl-fp32-correctly-rounded-divide-sqrt` (float32 division and sqrt correctly
rounded, as on the CPU) and `-cl-denorms-are-zero` (float32 subnormals flush to zero, as on the CPU and in XLA), and
with FP_CONTRACT off (no fused multiply-adds the CPU would not make). EXP2, LOG2, SIN and POW are OpenCL's built-in
functions (a few ulp in float32 by the OpenCL specification; PoCL's are within 1 ulp). float64 needs `cl_khr_fp64`.
"""
from __future__ import annotations

import contextlib
import math
import re
from typing import Callable, Iterator

import numpy as np

from tinyjax.codegen.gpu import GpuLaunch, global_size, gpu_launch, top_reduces
from tinyjax.codegen.linearize import IDENTITY, Linearizer, dtype_kind
from tinyjax.codegen.llvm import GPU_SUM_BLOCK
from tinyjax.codegen.opt import BF16, F16, F32, F64, accumulator_dtype, global_ranges_of
from tinyjax.uop import BOOL, Ops, UOp

# the options every program is built with (see the module docstring)
BUILD_OPTIONS = ("-cl-fp32-correctly-rounded-divide-sqrt", "-cl-denorms-are-zero")

_C_INT = {("i", 1): "char", ("i", 2): "short", ("i", 4): "int", ("i", 8): "long",
          ("u", 1): "uchar", ("u", 2): "ushort", ("u", 4): "uint", ("u", 8): "ulong"}
_UNSIGNED = {1: "uchar", 2: "ushort", 4: "uint", 8: "ulong"}

# helpers every kernel may call (unused ones cost nothing); tj_ names can't clash with the renderer's v/r/acc names
PRELUDE = r"""#pragma OPENCL EXTENSION cl_khr_fp64 : enable
#pragma OPENCL FP_CONTRACT OFF
inline float tj_round_f16(float v) {
  ushort h; vstore_half_rte(v, 0, (__private half *)&h); return vload_half(0, (__private half *)&h);
}
inline ushort tj_f16_bits(float v) { ushort h; vstore_half_rte(v, 0, (__private half *)&h); return h; }
inline float tj_f16_from_bits(ushort h) { return vload_half(0, (__private half *)&h); }
inline float tj_round_bf16(float v) {
  uint b = as_uint(v);
  if (isnan(v)) return as_float((b | 0x400000u) & 0xFFFF0000u);
  return as_float((b + 0x7FFFu + ((b >> 16) & 1u)) & 0xFFFF0000u);
}
inline float tj_max_f32(float a, float b) {
  if (isnan(a) || isnan(b)) return a + b;
  if (a == b) return signbit(a) ? b : a;
  return a > b ? a : b;
}
inline double tj_max_f64(double a, double b) {
  if (isnan(a) || isnan(b)) return a + b;
  if (a == b) return signbit(a) ? b : a;
  return a > b ? a : b;
}
inline float tj_round_to_odd(double v) {
  float nearest = (float)v;
  double back = (double)nearest;
  if (back == v || isnan(v) || (as_uint(nearest) & 1u)) return nearest;
  return as_float(as_uint(nearest) + (fabs(back) > fabs(v) ? -1 : 1));
}
"""


def c_type(dtype: np.dtype) -> str:
  """The C type a value of `dtype` is computed in (float16 / bfloat16: float, holding values exact in the dtype)."""
  kind = dtype_kind(dtype)
  if kind == "b": return "bool"
  if kind == "f": return "double" if dtype == F64 else "float"
  return _C_INT[(kind, dtype.itemsize)]


def memory_type(dtype: np.dtype) -> str:
  """The C element type of a buffer of `dtype`."""
  if dtype == BOOL: return "uchar"
  if dtype == F16: return "half"
  if dtype == BF16: return "ushort"
  return c_type(dtype)


def literal(value, dtype: np.dtype) -> str:
  """The C literal of a constant of `dtype` (floats rounded to the dtype first; exact, in hex)."""
  kind = dtype_kind(dtype)
  if kind == "b": return "true" if value else "false"
  if kind in "iu":
    bits = dtype.itemsize * 8
    wrapped = int(value) % (1 << bits)
    if kind == "i" and wrapped >= 1 << (bits - 1): wrapped -= 1 << bits
    ctype = c_type(dtype)
    if bits == 64:
      if wrapped == -(1 << 63): return "(-9223372036854775807L - 1L)"
      return f"{wrapped}{'UL' if kind == 'u' else 'L'}"
    if bits == 32:
      if wrapped == -(1 << 31): return "(-2147483647 - 1)"
      return f"{wrapped}{'u' if kind == 'u' else ''}"
    return f"(({ctype}){wrapped})"
  number = float(dtype.type(value))
  ctype = c_type(dtype)
  if math.isnan(number): return f"(({ctype})NAN)"
  if math.isinf(number): return f"(({ctype}){'-' if number < 0 else ''}INFINITY)"
  return f"{number.hex()}{'f' if ctype == 'float' else ''}"


def kernel_symbol(name: str) -> str:
  """The C name of kernel `name` (kernel names may hold characters C identifiers can't)."""
  return re.sub(r"\W", "_", name)


class _Renderer(Linearizer):
  """Emits the body of one OpenCL C kernel: statements in nested blocks, one variable per node."""

  def __init__(self, ast: UOp, ordered: int, launch: GpuLaunch):
    super().__init__(ast)
    self.ordered, self.launch = ordered, launch
    self.shared = set(top_reduces(ast)) if launch.group_reduction else set()  # REDUCEs done as group reductions
    self.locals: list[str] = []  # declarations of local-memory arrays (at kernel scope, as OpenCL C wants)
    self.lines: list[str] = []
    self.depth = 1

  # ---- low level

  def line(self, text: str) -> None: self.lines.append("  " * self.depth + text)

  def var(self, ctype: str, expression: str, hint: str = "v") -> str:
    """Declare `ctype <new name> = expression;` and return the name."""
    self.counter += 1
    name = f"{hint}{self.counter}"
    self.line(f"{ctype} {name} = {expression};")
    return name

  @contextlib.contextmanager
  def loop(self, start: str, end: str, binds: UOp | None) -> Iterator[str]:
    """`for (long i = start; i < end; i++) { ... }`; `binds`: the RANGE whose value the index is."""
    self.counter += 1
    index = f"r{self.counter}"
    self.line(f"for (long {index} = {start}; {index} < {end}; {index}++) {{")
    self.depth += 1
    self.scopes.append({})  # what the body computes is forgotten after it
    with self.bound(binds, index): yield index
    self.scopes.pop()
    self.depth -= 1
    self.line("}")

  @contextlib.contextmanager
  def when(self, condition: str) -> Iterator[None]:
    """Statements emitted inside the `with` run only if `condition` holds (what they compute is forgotten after)."""
    self.line(f"if ({condition}) {{")
    self.depth += 1
    self.scopes.append({})
    yield
    self.scopes.pop()
    self.depth -= 1
    self.line("}")

  # ---- the primitives of a tiled matrix product (Linearizer.render_gemm)

  def thread_ids(self) -> tuple[str, str]: return "gid", "lane"

  def index(self, op: str, left: str | int, right: str | int) -> str:
    """long index arithmetic on non-negative values: op is add, mul, div, rem or min (number operands as longs)."""
    left, right = (f"{v}L" if isinstance(v, int) else v for v in (left, right))
    if op == "min": return self.var("long", f"min((long){left}, (long){right})", "idx")
    return self.var("long", f"{left} {dict(add='+', mul='*', div='/', rem='%')[op]} {right}", "idx")

  def less(self, left: str | int, right: str | int) -> str: return self.var("bool", f"{left} < {right}")

  def both(self, first: str, second: str) -> str: return self.var("bool", f"{first} && {second}")

  def local_array(self, dtype: np.dtype, size: int) -> str:
    self.counter += 1
    self.locals.append(f"  __local {c_type(dtype)} shared{self.counter}[{size}];")
    return f"shared{self.counter}"

  def local_store(self, array: str, index: str, value: str, dtype: np.dtype) -> None:
    self.line(f"{array}[{index}] = {value};")

  def local_load(self, array: str, index: str, dtype: np.dtype) -> str:
    return self.var(c_type(dtype), f"{array}[{index}]")

  def load_lanes(self, load: UOp, lanes: int) -> list[str]:
    """The `lanes` float32 elements of a buffer from LOAD `load`'s index on, with one `vload`."""
    self.emit_needed(load.src[0])
    self.emit_needed(load.src[1])
    vector = self.var(f"float{lanes}", f"vload{lanes}(0, {self.value(load.src[0])} + {self.value(load.src[1])})")
    return [f"{vector}.s{index}" for index in range(lanes)]

  def local_store_lanes(self, array: str, index: str, values: list[str], dtype: np.dtype) -> None:
    """Store neighbouring float32 values into a local array with one `vstore`."""
    self.line(f"vstore{len(values)}((float{len(values)})({', '.join(values)}), 0, {array} + {index});")

  def barrier(self) -> None: self.line("barrier(CLK_LOCAL_MEM_FENCE);")

  def new_sum(self, dtype: np.dtype) -> str: return self.var(c_type(dtype), literal(0, dtype), "acc")

  def add_to_sum(self, accumulator: str, dtype: np.dtype, part: str) -> None:
    self.line(f"{accumulator} = {self.combine(Ops.ADD, dtype, accumulator, part)};")

  def sum_value(self, accumulator: str, dtype: np.dtype) -> str: return accumulator

  # ---- the kernel

  def render_kernel(self) -> None:
    ranges = global_ranges_of(self.ast)
    ordered, spread = ranges[:self.ordered], ranges[self.ordered:]
    if self.launch.group > 1:  # a work-group per output: no work-item may leave before the barriers
      self.line("long gid = get_group_id(0);")
      self.line("long lane = get_local_id(0);")
      if self.launch.tile is not None:
        self.render_gemm(ranges)
        self.check_stores()
        return
    else:
      self.line("long gid = get_global_id(0);")
      self.line(f"if (gid >= {self.launch.outputs}L) return;")
    self.bind_work_item(spread, "gid")

    def loops(depth: int) -> None:
      self.emit_ready(self.ast)
      if depth < len(ordered):
        with self.loop("0", f"{global_size(ordered[depth])}L", ordered[depth]): loops(depth + 1)
    loops(0)
    self.check_stores()

  # ---- nodes

  def constant(self, value, dtype: np.dtype) -> str: return literal(value, dtype)

  def buffer_value(self, index: int) -> str: return f"buf{index}"

  def select(self, cond: str, if_true: str, if_false: str, dtype: np.dtype) -> str:
    return self.var(c_type(dtype), f"{cond} ? {if_true} : {if_false}")

  def load_expression(self, buffer: UOp, index: UOp) -> str:
    pointer, position = self.value(buffer), self.value(index)
    if buffer.dtype == BOOL: return f"({pointer}[{position}] != 0)"
    if buffer.dtype == F16: return f"vload_half({position}, {pointer})"
    if buffer.dtype == BF16: return f"as_float((uint){pointer}[{position}] << 16)"
    return f"{pointer}[{position}]"

  def render_load(self, node: UOp) -> str:
    buffer, index, *gate = node.src
    loaded = self.load_expression(buffer, index)
    # gated: C's conditional evaluates only the chosen side, so a false gate reads no memory
    if gate: loaded = f"{self.value(gate[0])} ? {loaded} : {literal(0, node.dtype)}"
    return self.var(c_type(node.dtype), loaded)

  def render_store(self, node: UOp) -> str:
    buffer, index, value = node.src
    pointer, position, stored = self.value(buffer), self.value(index), self.value(value)
    if self.launch.group_reduction: self.line("if (lane == 0)")  # the group's work-items all hold it: one stores
    if buffer.dtype == F16: self.line(f"vstore_half_rte({stored}, {position}, {pointer});")
    elif buffer.dtype == BF16: self.line(f"{pointer}[{position}] = (ushort)(as_uint({stored}) >> 16);")
    else: self.line(f"{pointer}[{position}] = ({memory_type(buffer.dtype)}){stored};")
    self.stores_emitted.add(node)
    return "store"

  def wrapping(self, dtype: np.dtype, expression: Callable[[str], str]) -> str:
    """An integer operation done in the unsigned type of `dtype`'s size (wrapping, never undefined), cast back:
    `expression(unsigned type)` writes the operation with the operands cast to that type."""
    unsigned = _UNSIGNED[max(dtype.itemsize, 4)]
    return self.var(c_type(dtype), f"({c_type(dtype)})({expression(unsigned)})")

  def render_unary(self, node: UOp) -> str:
    (operand,) = node.src
    value, kind, ctype, op = self.value(operand), dtype_kind(node.dtype), c_type(node.dtype), node.op
    if op is Ops.NEG:
      if kind == "f": return self.var(ctype, f"-({value})")
      if kind == "b": return self.var(ctype, f"!{value}")
      return self.wrapping(node.dtype, lambda unsigned: f"-({unsigned}){value}")
    if kind != "f":
      if op is Ops.TRUNC: return value
      raise NotImplementedError(f"codegen: {op.name} on {node.dtype}")
    one = literal(1.0, F64 if ctype == "double" else F32)
    function = {Ops.SQRT: "sqrt", Ops.EXP2: "exp2", Ops.LOG2: "log2", Ops.SIN: "sin", Ops.COS: "cos",
                Ops.TRUNC: "trunc"}
    if op is Ops.RECIP: result = self.var(ctype, f"{one} / {value}")
    elif op in function: result = self.var(ctype, f"{function[op]}({value})")
    else: raise NotImplementedError(f"codegen: {op.name} on {node.dtype}")
    return result if op is Ops.TRUNC else self.round(result, node.dtype)

  def render_binary(self, node: UOp) -> str:
    lhs, rhs = node.src
    op, dtype = node.op, lhs.dtype
    kind, ctype = dtype_kind(dtype), c_type(dtype)
    left, right = self.value(lhs), self.value(rhs)
    if op is Ops.CMPLT: return self.var("bool", f"{left} < {right}")
    if op is Ops.CMPNE: return self.var("bool", f"{left} != {right}")  # NaN != NaN
    if kind == "b":
      operator = {Ops.ADD: "|", Ops.MUL: "&", Ops.MAX: "|", Ops.AND: "&", Ops.OR: "|", Ops.XOR: "^"}.get(op)
      if operator is None: raise NotImplementedError(f"codegen: {op.name} on bool")
      return self.var("bool", f"{left} {operator} {right}")
    if kind == "f":
      if op is Ops.MAX: result = self.var(ctype, f"tj_max_f{'64' if ctype == 'double' else '32'}({left}, {right})")
      elif op is Ops.POW: result = self.var(ctype, f"pow({left}, {right})")
      elif op is Ops.MOD: result = self.var(ctype, f"fmod({left}, {right})")
      elif op in (Ops.ADD, Ops.MUL, Ops.FDIV):
        result = self.var(ctype, f"{left} {dict([(Ops.ADD, '+'), (Ops.MUL, '*'), (Ops.FDIV, '/')])[op]} {right}")
      else: raise NotImplementedError(f"codegen: {op.name} on {dtype}")
      return self.round(result, node.dtype)
    if op in (Ops.ADD, Ops.MUL):
      operator = "+" if op is Ops.ADD else "*"
      return self.wrapping(dtype, lambda unsigned: f"({unsigned}){left} {operator} ({unsigned}){right}")
    if op in (Ops.AND, Ops.OR, Ops.XOR):
      return self.var(ctype, f"({ctype})({left} {dict([(Ops.AND, '&'), (Ops.OR, '|'), (Ops.XOR, '^')])[op]} {right})")
    if op is Ops.MAX: return self.var(ctype, f"max({left}, {right})")
    if op in (Ops.IDIV, Ops.MOD): return self.int_division(op, lhs, rhs)
    if op in (Ops.SHL, Ops.SHR): return self.shift(op, lhs, rhs)
    raise NotImplementedError(f"codegen: {op.name} on {dtype}")

  def int_division(self, op: Ops, lhs: UOp, rhs: UOp) -> str:
    """IDIV / MOD truncating toward zero, with XLA's answers where C has none: x / 0 = -1, x % 0 = x,
    INT_MIN / -1 = INT_MIN, INT_MIN % -1 = 0."""
    dtype, ctype = lhs.dtype, c_type(lhs.dtype)
    signed = dtype_kind(dtype) == "i"
    left, right = self.value(lhs), self.value(rhs)
    operator = "/" if op is Ops.IDIV else "%"
    if rhs.op is Ops.CONST:  # index arithmetic: a constant divisor needs no guards
      divisor = int(rhs.arg)
      if divisor == 0: return literal(-1, dtype) if op is Ops.IDIV else left
      if signed and divisor == -1:
        return self.wrapping(dtype, lambda unsigned: f"-({unsigned}){left}") if op is Ops.IDIV else literal(0, dtype)
      return self.var(ctype, f"({ctype})({left} {operator} {right})")
    unsafe = f"{right} == 0"
    if signed: unsafe += f" || ({left} == {literal(np.iinfo(dtype).min, dtype)} && {right} == -1)"
    safe_divisor = self.var(ctype, f"({unsafe}) ? ({ctype})1 : {right}")
    result = self.var(ctype, f"({ctype})({left} {operator} {safe_divisor})")
    by_zero = literal(-1, dtype) if op is Ops.IDIV else left
    return self.var(ctype, f"{right} == 0 ? {by_zero} : {result}")

  def shift(self, op: Ops, lhs: UOp, rhs: UOp) -> str:
    """SHL / SHR (arithmetic for signed, logical for unsigned); amounts >= the bit width (or negative) shift
    everything out: 0, or -1 for a negative signed SHR."""
    dtype, ctype = lhs.dtype, c_type(lhs.dtype)
    bits = dtype.itemsize * 8
    left, amount = self.value(lhs), self.value(rhs)
    if rhs.op is Ops.CONST and 0 <= int(rhs.arg) < bits: too_far = None
    else: too_far = self.var("bool", f"({_UNSIGNED[rhs.dtype.itemsize]}){amount} >= {bits}u")
    if too_far is not None: amount = self.var("uint", f"{too_far} ? {bits - 1}u : (uint){amount}")
    if op is Ops.SHL: shifted = self.wrapping(dtype, lambda unsigned: f"({unsigned}){left} << {amount}")
    else: shifted = self.var(ctype, f"({ctype})({left} >> {amount})")  # arithmetic for signed types in OpenCL C
    if too_far is None or (op is Ops.SHR and dtype_kind(dtype) == "i"): return shifted
    return self.var(ctype, f"{too_far} ? {literal(0, dtype)} : {shifted}")

  # ---- reductions

  def render_reduce(self, node: UOp) -> str:
    """Accumulate the REDUCE's value over its loops (emitted here, its value is available after them). A float32
    sum runs in blocks of GPU_SUM_BLOCK steps, each summed in float32 and added into a float64 accumulator (the
    blocking of codegen/llvm.py's `reduce_loops`); float16 / bfloat16 accumulate in float32."""
    value, *ranges = node.src
    if not ranges: return self.value(value)
    if node in self.shared: return self.group_reduce(node)
    inner_dtype = accumulator_dtype(node)

    def innermost(_: list[str]) -> tuple[str, np.dtype]:
      self.emit_ready(value)
      return self.cast(self.value(value), value.dtype, inner_dtype), inner_dtype

    def loops(over: list[UOp]) -> list[tuple[str, str, UOp | None]]:
      return [("0", self.value(rng.src[0]), rng) for rng in over]

    split, product = len(ranges), 1
    if node.arg is Ops.ADD and inner_dtype == F32:
      while split and ranges[split - 1].src[0].op is Ops.CONST and product * ranges[split - 1].src[0].arg <= \
          GPU_SUM_BLOCK:
        split -= 1
        product *= ranges[split].src[0].arg
    if node.arg is not Ops.ADD or inner_dtype != F32 or split == 0 or ranges[split - 1].src[0].op is not Ops.CONST:
      return self.cast(self.accumulate(node, inner_dtype, loops(ranges), innermost), inner_dtype, node.dtype)
    outer, chunked, inner = ranges[:split - 1], ranges[split - 1], ranges[split:]
    chunk, size = GPU_SUM_BLOCK // product, chunked.src[0].arg

    def block_sum(indices: list[str]) -> tuple[str, np.dtype]:
      start = self.var("long", f"{indices[-1]} * {chunk}L")
      end = self.var("long", f"min({start} + {chunk}L, {size}L)")
      return self.accumulate(node, inner_dtype, [(start, end, chunked), *loops(inner)], innermost), inner_dtype

    total = self.accumulate(node, F64, [*loops(outer), ("0", f"{-(-size // chunk)}L", None)], block_sum)
    return self.cast(total, F64, node.dtype)

  def group_reduce(self, node: UOp) -> str:
    """A REDUCE shared by the work-group (codegen/gpu.py): work-item `lane` folds steps lane, lane + group, ... of
    the first range (with the other ranges whole) into a partial result, the partials are combined in a tree in
    local memory. A float32 sum's partials are float64 (few terms each, no blocks needed)."""
    value, first, *inner = node.src
    group, size = self.launch.group, int(first.src[0].arg)
    inner_dtype = accumulator_dtype(node)
    acc_dtype = F64 if node.arg is Ops.ADD and inner_dtype == F32 else inner_dtype
    accumulator = self.var(c_type(acc_dtype), literal(IDENTITY[node.arg](acc_dtype), acc_dtype), "acc")
    with self.loop("0", f"{-(-size // group)}L", None) as step:
      position = self.var("long", f"{step} * {group}L + lane")
      if size % group: self.line(f"if ({position} < {size}L) {{")

      def level(depth: int) -> None:
        if depth == len(inner):
          self.emit_ready(value)
          part = self.cast(self.cast(self.value(value), value.dtype, inner_dtype), inner_dtype, acc_dtype)
          self.line(f"{accumulator} = {self.combine(node.arg, acc_dtype, accumulator, part)};")
          return
        with self.loop("0", self.value(inner[depth].src[0]), inner[depth]): level(depth + 1)

      with self.bound(first, position): level(0)
      if size % group: self.line("}")
    local_type = "uchar" if acc_dtype == BOOL else c_type(acc_dtype)
    self.counter += 1
    shared = f"shared{self.counter}"
    self.locals.append(f"  __local {local_type} {shared}[{group}];")
    self.line(f"{shared}[lane] = {accumulator};")
    self.line("barrier(CLK_LOCAL_MEM_FENCE);")
    half = group // 2
    while half:
      combined = self.combine(node.arg, acc_dtype, f"{shared}[lane]", f"{shared}[lane + {half}]")
      self.line(f"if (lane < {half}) {shared}[lane] = {combined};")
      self.line("barrier(CLK_LOCAL_MEM_FENCE);")
      half //= 2
    total = self.var(c_type(acc_dtype), f"{shared}[0]" if acc_dtype != BOOL else f"{shared}[0] != 0")
    return self.cast(total, acc_dtype, node.dtype)

  def accumulate(self, node: UOp, acc_dtype: np.dtype, nest: list[tuple[str, str, UOp | None]],
                 body: Callable[[list[str]], tuple[str, np.dtype]]) -> str:
    """One accumulator of `acc_dtype`, starting at the identity, folding in `body(indices)` in the innermost of the
    loops `nest` ((start, end, RANGE or None) each); returns the accumulator's name (its value after the loops)."""
    accumulator = self.var(c_type(acc_dtype), literal(IDENTITY[node.arg](acc_dtype), acc_dtype), "acc")

    def level(depth: int, indices: list[str]) -> None:
      if depth == len(nest):
        part, part_dtype = body(indices)
        part = self.cast(part, part_dtype, acc_dtype)
        self.line(f"{accumulator} = {self.combine(node.arg, acc_dtype, accumulator, part)};")
        return
      start, end, binds = nest[depth]
      with self.loop(start, end, binds) as index: level(depth + 1, [*indices, index])

    level(0, [])
    return accumulator

  def combine(self, op: Ops, dtype: np.dtype, acc: str, part: str) -> str:
    """The expression folding `part` into accumulator `acc`."""
    kind, ctype = dtype_kind(dtype), c_type(dtype)
    if kind == "b": return f"{acc} {'&' if op is Ops.MUL else '|'} {part}"
    if op is Ops.MAX:
      if kind == "f": return f"tj_max_f{'64' if ctype == 'double' else '32'}({acc}, {part})"
      return f"max({acc}, {part})"
    operator = "+" if op is Ops.ADD else "*"
    if kind == "f": return f"{acc} {operator} {part}"
    unsigned = _UNSIGNED[max(dtype.itemsize, 4)]
    return f"({ctype})(({unsigned}){acc} {operator} ({unsigned}){part})"

  # ---- conversions

  def round(self, value: str, dtype: np.dtype) -> str:
    """Round a float32 value to `dtype` (float16 / bfloat16, nearest even); the identity otherwise."""
    if dtype == F16: return self.var("float", f"tj_round_f16({value})")
    if dtype == BF16: return self.var("float", f"tj_round_bf16({value})")
    return value

  def cast(self, value: str, src: np.dtype, dst: np.dtype) -> str:
    """Value conversion with numpy / JAX semantics, as codegen/llvm.py's `cast`."""
    if src == dst: return value
    src_kind, dst_kind, dst_type = dtype_kind(src), dtype_kind(dst), c_type(dst)
    if dst_kind == "b": return self.var("bool", f"{value} != 0")
    if src_kind == "b": return self.var(dst_type, f"({dst_type}){value}")
    if src_kind in "iu" and dst_kind in "iu": return self.var(dst_type, f"({dst_type}){value}")
    if dst_kind in "iu": return self.var(dst_type, f"convert_{dst_type}_sat({value})")  # toward zero, NaN -> 0
    if src_kind in "iu":
      if dst in (F32, F64): return self.var(dst_type, f"convert_{dst_type}({value})")  # nearest even
      if dst == F16: return self.round(self.var("float", f"convert_float({value})"), F16)  # exact below 2^24
      return self.cast(self.var("double", f"convert_double({value})"), F64, dst)  # bfloat16: one rounding
    if dst == F64: return self.var("double", f"(double){value}")
    if src == F64:
      if dst == F32: return self.var("float", f"(float){value}")
      value = self.var("float", f"tj_round_to_odd({value})")  # then rounding to 16 bits is correct
    return self.round(value, dst)

  def bits(self, value: str, dtype: np.dtype) -> str:
    """The bits of a value as it is in memory, as the unsigned integer of its size."""
    unsigned = _UNSIGNED[dtype.itemsize]
    if dtype == F16: return self.var(unsigned, f"tj_f16_bits({value})")
    if dtype == BF16: return self.var(unsigned, f"(ushort)(as_uint({value}) >> 16)")
    if dtype_kind(dtype) == "f": return self.var(unsigned, f"as_{unsigned}({value})")
    return self.var(unsigned, f"({unsigned}){value}")

  def bitcast(self, value: str, src: np.dtype, dst: np.dtype) -> str:
    """Reinterpret the bits (itemsizes must match)."""
    if src.itemsize != dst.itemsize: raise ValueError(f"codegen: BITCAST {src} -> {dst} changes the itemsize")
    raw = self.bits(value, src)
    if dst == BOOL: return self.var("bool", f"{raw} != 0")
    if dst == F16: return self.var("float", f"tj_f16_from_bits({raw})")
    if dst == BF16: return self.var("float", f"as_float((uint){raw} << 16)")
    if dtype_kind(dst) == "f": return self.var(c_type(dst), f"as_{c_type(dst)}({raw})")
    return self.var(c_type(dst), f"({c_type(dst)}){raw}")


def render_opencl(name: str, ast: UOp, ordered: int = 0, launch: GpuLaunch | None = None) -> str:
  """Render kernel `ast` as an OpenCL C program defining `__kernel void <kernel_symbol(name)>(buffers...)`, run as
  `launch` (default `gpu_launch(ast, ordered)`; a group reduction needs work-groups of exactly `launch.group`)."""
  if ast.op is not Ops.SINK: raise ValueError(f"codegen: a kernel AST is rooted at a SINK, got {ast.op.name}")
  launch = gpu_launch(ast, ordered) if launch is None else launch
  buffers = sorted((n for n in ast.toposort if n.op is Ops.DEFINE_GLOBAL), key=lambda buffer: buffer.arg)
  renderer = _Renderer(ast, ordered, launch)
  renderer.render_kernel()
  params = ", ".join(f"__global {memory_type(buffer.dtype)} *restrict buf{buffer.arg}" for buffer in buffers)
  attribute = f"__attribute__((reqd_work_group_size({launch.group}, 1, 1))) " if launch.group > 1 else ""
  return "\n".join([PRELUDE, f"{attribute}__kernel void {kernel_symbol(name)}({params}) {{", *renderer.locals,
                    *renderer.lines, "}", ""])
