"""Compiled kernels for batches of small real matrices: LU with partial pivoting, triangular solves and Cholesky,
called by the host steps of lax/linalg.py (through lax/_lapack.py) on the whole batch at once.

A batch of small matrices (a `vmap` of `solve`: 256 systems of 16 x 16) is too many LAPACK calls for a Python loop
(a few microseconds each) and too little work per matrix for numpy steps over the batch (a dozen numpy calls per
column). These kernels loop over the batch in compiled code instead: LLVM IR written here, one kernel per routine
and dtype for every matrix size (the sizes are arguments, so a new size costs no compile), compiled by the CPU
device and kept in its disk cache like any kernel. `DEBUG=4` prints their IR when they are compiled.

The algorithms are LAPACK's unblocked ones, row-major:
- getrf (sgetf2 / dgetf2, in Crout's order, which does the same operations in the same order): pivot j is the first
  row at or below j with the largest |a[i, j]| (a NaN is never chosen over an earlier value, as LAPACK's isamax);
  rows j and the pivot are swapped whole; a nonzero pivot scales the column below it by its reciprocal; the trailing
  block takes the rank-1 update. A zero pivot is kept (a singular matrix factors without error, as JAX). Kernels run
  with subnormals flushed to zero (devices/runtime.py), as JAX's CPU programs do, so a subnormal pivot is a zero one
  here as there (and LAPACK's division by a pivot whose reciprocal would overflow is not needed).
- trsm: op(a) x = b for a triangular op(a) (a or its transpose, read through strides), the rows of x solved in
  order (forward for lower, backward for upper), each by the rows already known and then its diagonal (unless unit).
- potrf (potf2): the lower Cholesky factor, column by column, the column below a pivot times its reciprocal; a
  matrix that is not positive-definite (a pivot not > 0, NaN included) gives a factor of NaN (zeros above the
  diagonal), as JAX.

Each kernel has the CPU kernel ABI `void fn(ptr args, i64 start, i64 end)` over groups [start, end) of LANES matrices
(the batch padded to whole groups), launched across the CPU runtime's threads; args holds the arrays' addresses and a
small int64 array of sizes and flags. 256 systems of 16 x 16 (`vmap(jnp.linalg.solve)`, 2 cores): 2.2-3.0 ms with
the numpy steps these replace, 0.4-0.8 ms now (JAX 0.10.2: 0.9).
"""
from __future__ import annotations

import functools
import struct

import numpy as np

LANES = 4  # matrices factored at once, in lockstep: their sums are independent chains that overlap
WIDE_RHS = 8  # right-hand sides from which a triangular solve runs along the rows of x (vectors), not by columns
_TYPES = {np.dtype(np.float32): ("float", "f32"), np.dtype(np.float64): ("double", "f64")}


# every loop as written: LLVM's vectoriser and unroller find nothing to gain in these short scalar loops (the sums
# are ordered chains), and trying took most of their compile time
# (a loop along a row's contiguous values is written with vectors, `_Builder.row_loop`: left to LLVM, a row of 24
# values fell short of its interleaved vector loop's first step, and an upper triangle's solve ran 3.5x slower)
_LOOP_METADATA = ['!0 = distinct !{!0, !1, !2}', '!1 = !{!"llvm.loop.vectorize.enable", i1 false}',
                  '!2 = !{!"llvm.loop.unroll.disable"}']
VECTOR_BYTES = 32  # the vectors of `_Builder.row_loop` (LLVM splits them where the target's are narrower)


def _align(kind: str) -> str:
  """A vector's loads and stores are aligned as its elements (a row of x starts anywhere)."""
  return f", align {4 if 'float' in kind else 8}" if kind.startswith("<") else ""


def _float(value: float) -> str:
  """An LLVM IR float constant: the hex of its double (exact for a float32 value too)."""
  return "0x%016X" % struct.unpack("<Q", struct.pack("<d", value))[0]


class _Builder:
  """LLVM IR text of one function, its loop counters in allocas (LLVM's SROA turns them into registers)."""

  def __init__(self, name: str, ctype: str, params: list[str]):
    self.ctype, self.count = ctype, 0
    self.allocas: list[str] = []
    self.lines = ["entry:"]
    self.header = f"define void @{name}(ptr noalias %args, i64 %start, i64 %end) nounwind {{"
    self.params = [self.load("ptr", self.gep("ptr", "%args", str(i))) for i in range(len(params))]

  def value(self, text: str) -> str:
    self.count += 1
    name = f"%v{self.count}"
    self.lines.append(f"  {name} = {text}")
    return name

  def emit(self, text: str) -> None: self.lines.append(f"  {text}")

  def label(self) -> str:
    self.count += 1
    return f"l{self.count}"

  def block(self, label: str) -> None: self.lines.append(f"{label}:")

  def var(self, kind: str = "i64") -> str:
    self.count += 1
    name = f"%var{self.count}"
    self.allocas.append(f"  {name} = alloca {kind}")
    return name

  def load(self, kind: str, pointer: str) -> str: return self.value(f"load {kind}, ptr {pointer}{_align(kind)}")

  def store(self, kind: str, value: str, pointer: str) -> None:
    self.emit(f"store {kind} {value}, ptr {pointer}{_align(kind)}")

  def gep(self, kind: str, pointer: str, index: str) -> str:
    return self.value(f"getelementptr inbounds {kind}, ptr {pointer}, i64 {index}")

  def op(self, name: str, a: str, b: str, kind: str = "i64") -> str: return self.value(f"{name} {kind} {a}, {b}")

  def element(self, base: str, index: str) -> str:
    """The address of element `index` of a float array."""
    return self.gep(self.ctype, base, index)

  def loop(self, low: str, high: str, body, step: int = 1) -> None:
    """for i in [low, high) by `step`: body(i)."""
    counter = self.var()
    head, inside, done = self.label(), self.label(), self.label()
    self.store("i64", low, counter)
    self.emit(f"br label %{head}")
    self.block(head)
    i = self.load("i64", counter)
    self.emit(f"br i1 {self.op('icmp slt', i, high)}, label %{inside}, label %{done}")
    self.block(inside)
    body(i)
    self.store("i64", self.op("add", i, str(step)), counter)
    self.emit(f"br label %{head}, !llvm.loop !0")
    self.block(done)

  def row_loop(self, count: str, body) -> None:
    """for c in [0, count): body(c, kind) over a row, whole vectors first (kind: the vector type, c its first
    element), then one element at a time (kind: the scalar type)."""
    lanes = VECTOR_BYTES // (4 if self.ctype == "float" else 8)
    whole = self.op("and", count, str(-lanes))
    self.loop("0", whole, lambda c: body(c, f"<{lanes} x {self.ctype}>"), step=lanes)
    self.loop(whole, count, lambda c: body(c, self.ctype))

  def when(self, condition: str, then, otherwise=None) -> None:
    yes, no, done = self.label(), self.label(), self.label()
    self.emit(f"br i1 {condition}, label %{yes}, label %{no}")
    self.block(yes)
    then()
    self.emit(f"br label %{done}")
    self.block(no)
    if otherwise is not None: otherwise()
    self.emit(f"br label %{done}")
    self.block(done)

  def text(self, declarations: list[str]) -> str:
    self.emit("ret void")
    return "\n".join([*declarations, self.header, self.lines[0], *self.allocas, *self.lines[1:], "}", *_LOOP_METADATA,
                      ""])


def _dots(ir: _Builder, starts: list[str], count: str, left, right) -> list[str]:
  """start - sum_(p < count) left(lane, p) right(lane, p) for each lane's start, the products subtracted in order (a
  fused multiply-add each), the lanes' sums in one loop (independent chains, so their latencies overlap)."""
  ctype, suffix = ir.ctype, "f32" if ir.ctype == "float" else "f64"
  totals = [ir.var(ctype) for _ in starts]
  for start, total in zip(starts, totals): ir.store(ctype, start, total)

  def step(p: str) -> None:
    for lane, total in enumerate(totals):
      product = ir.value(f"call {ctype} @llvm.fmuladd.{suffix}({ctype} "
                         f"{ir.value(f'fneg {ctype} {left(lane, p)}')}, {ctype} {right(lane, p)}, {ctype} "
                         f"{ir.load(ctype, total)})")
      ir.store(ctype, product, total)
  ir.loop("0", count, step)
  return [ir.load(ctype, total) for total in totals]


def _lanes(ir: _Builder, group: str, base: str, kind: str, size: str) -> list[str]:
  """The addresses of the LANES arrays of `size` elements that matrix group `group` takes from `base`."""
  first = ir.op("mul", group, str(LANES))
  return [ir.gep(kind, base, ir.op("mul", ir.op("add", first, str(lane)), size)) for lane in range(LANES)]


def _getrf_ir(name: str, dtype: np.dtype) -> str:
  """args: factors (batch, m, n) in place, pivots (batch, min(m, n)) int32 out, permutation (batch, m) int32 out,
  sizes [m, n]. Crout's order (column j of L and U from dot products over the finished columns, then its pivot):
  each element takes the same operations, in the same order, as in the right-looking getf2, without its trailing
  updates' stores and reloads."""
  ctype, suffix = _TYPES[dtype]
  ir = _Builder(name, ctype, ["a", "pivots", "permutation", "sizes"])
  a0, pivots0, permutation0, sizes = ir.params
  m, n = ir.load("i64", sizes), ir.load("i64", ir.gep("i64", sizes, "1"))
  k = ir.value(f"call i64 @llvm.smin.i64(i64 {m}, i64 {n})")

  def group(g: str) -> None:
    size = ir.op("mul", m, n)
    matrices = _lanes(ir, g, a0, ctype, size)
    first = ir.op("mul", g, str(LANES))

    def at(matrix: str, row: str, column: str) -> str:
      return ir.element(matrix, ir.op("add", ir.op("mul", row, n), column))

    def column(j: str) -> None:
      def update(i: str) -> None:
        count = ir.value(f"call i64 @llvm.smin.i64(i64 {i}, i64 {j})")
        starts = [ir.load(ctype, at(matrix, i, j)) for matrix in matrices]
        totals = _dots(ir, starts, count, lambda lane, p: ir.load(ctype, at(matrices[lane], i, p)),
                       lambda lane, p: ir.load(ctype, at(matrices[lane], p, j)))
        for matrix, total in zip(matrices, totals): ir.store(ctype, total, at(matrix, i, j))
      ir.loop("0", m, update)
      ir.when(ir.op("icmp slt", j, k), lambda: ir.loop("0", str(LANES), lambda lane: pivot(lane, j)))

    def pivot(lane: str, j: str) -> None:  # (a loop over the lanes: this part is O(n^2))
      b = ir.op("add", first, lane)
      matrix, permutation = ir.element(a0, ir.op("mul", b, size)), ir.gep("i32", permutation0, ir.op("mul", b, m))
      best, largest = ir.var(), ir.var(ctype)
      ir.store("i64", j, best)
      ir.store(ctype, ir.value(f"call {ctype} @llvm.fabs.{suffix}({ctype} {ir.load(ctype, at(matrix, j, j))})"),
               largest)

      def search(i: str) -> None:
        magnitude = ir.value(f"call {ctype} @llvm.fabs.{suffix}({ctype} {ir.load(ctype, at(matrix, i, j))})")
        larger = ir.value(f"fcmp ogt {ctype} {magnitude}, {ir.load(ctype, largest)}")
        ir.store("i64", ir.value(f"select i1 {larger}, i64 {i}, i64 {ir.load('i64', best)}"), best)
        ir.store(ctype, ir.value(f"select i1 {larger}, {ctype} {magnitude}, {ctype} {ir.load(ctype, largest)}"),
                 largest)
      below = ir.op("add", j, "1")
      ir.loop(below, m, search)
      p = ir.load("i64", best)
      ir.store("i32", ir.value(f"trunc i64 {p} to i32"), ir.gep("i32", pivots0, ir.op("add", ir.op("mul", b, k), j)))

      def swap(kind: str, here: str, there: str) -> None:
        x, y = ir.load(kind, here), ir.load(kind, there)
        ir.store(kind, y, here)
        ir.store(kind, x, there)

      def scale() -> None:
        def rows() -> None:
          ir.loop("0", n, lambda c: swap(ctype, at(matrix, j, c), at(matrix, p, c)))
          swap("i32", ir.gep("i32", permutation, j), ir.gep("i32", permutation, p))
        ir.when(ir.op("icmp ne", p, j), rows)
        reciprocal = ir.value(f"fdiv {ctype} 1.0, {ir.load(ctype, at(matrix, j, j))}")

        def multiply(i: str) -> None:
          address = at(matrix, i, j)
          ir.store(ctype, ir.value(f"fmul {ctype} {ir.load(ctype, address)}, {reciprocal}"), address)
        ir.loop(below, m, multiply)
      ir.when(ir.value(f"fcmp une {ctype} {ir.load(ctype, at(matrix, p, j))}, 0.0"), scale)

    def identity(lane: str) -> None:
      permutation = ir.gep("i32", permutation0, ir.op("mul", ir.op("add", first, lane), m))
      ir.loop("0", m, lambda i: ir.store("i32", ir.value(f"trunc i64 {i} to i32"), ir.gep("i32", permutation, i)))
    ir.loop("0", str(LANES), identity)
    ir.loop("0", n, column)
  ir.loop("%start", "%end", group)
  return ir.text(["declare i64 @llvm.smin.i64(i64, i64)", f"declare {ctype} @llvm.fabs.{suffix}({ctype})",
                  f"declare {ctype} @llvm.fmuladd.{suffix}({ctype}, {ctype}, {ctype})"])


def _trsm_ir(name: str, dtype: np.dtype) -> str:
  """args: triangles (batch, k, k), x (batch, k, nrhs) in place (b in, x out), sizes [k, nrhs, row stride, column
  stride (of op(a): a's own or swapped for its transpose), lower, unit diagonal]. Each column of x by substitution,
  a row at a time from the rows already known (forward for lower, backward for upper), then its diagonal."""
  ctype, suffix = _TYPES[dtype]
  ir = _Builder(name, ctype, ["triangles", "x", "sizes"])
  t0, x0, sizes = ir.params
  k, nrhs, row_stride, column_stride, lower, unit = (ir.load("i64", ir.gep("i64", sizes, str(i))) for i in range(6))
  is_lower, is_unit = ir.op("icmp ne", lower, "0"), ir.op("icmp ne", unit, "0")
  last = ir.op("sub", k, "1")

  def group(g: str) -> None:
    triangles, xs = _lanes(ir, g, t0, ctype, ir.op("mul", k, k)), _lanes(ir, g, x0, ctype, ir.op("mul", k, nrhs))

    def ordered(s: str) -> str: return ir.value(f"select i1 {is_lower}, i64 {s}, i64 {ir.op('sub', last, s)}")

    def entry(lane: int, i: str, j: str) -> str:
      index = ir.op("add", ir.op("mul", i, row_stride), ir.op("mul", j, column_stride))
      return ir.load(ctype, ir.element(triangles[lane], index))

    def x_at(lane: int, i: str, c: str) -> str: return ir.element(xs[lane], ir.op("add", ir.op("mul", i, nrhs), c))

    def solve(c: str, s: str) -> None:
      i = ordered(s)
      starts = [ir.load(ctype, x_at(lane, i, c)) for lane in range(LANES)]
      totals = _dots(ir, starts, s, lambda lane, u: entry(lane, i, ordered(u)),
                     lambda lane, u: ir.load(ctype, x_at(lane, ordered(u), c)))
      for lane, total in enumerate(totals):
        quotient = ir.value(f"fdiv {ctype} {total}, {entry(lane, i, i)}")
        ir.store(ctype, ir.value(f"select i1 {is_unit}, {ctype} {total}, {ctype} {quotient}"), x_at(lane, i, c))

    def rows(lane: str) -> None:
      """A lane's rows a vector at a time: x[i] -= a[i, j] x[j] for each row j known, then x[i] /= a[i, i] (the
      same operations on each element, in the same order, as a column's substitution)."""
      b = ir.op("add", ir.op("mul", g, str(LANES)), lane)
      triangle = ir.element(t0, ir.op("mul", b, ir.op("mul", k, k)))
      x = ir.element(x0, ir.op("mul", b, ir.op("mul", k, nrhs)))

      def at(i: str, j: str) -> str:
        index = ir.op("add", ir.op("mul", i, row_stride), ir.op("mul", j, column_stride))
        return ir.load(ctype, ir.element(triangle, index))

      def row(s: str) -> None:
        i = ordered(s)
        target = ir.element(x, ir.op("mul", i, nrhs))

        def known(u: str) -> None:
          j = ordered(u)
          factor, source = ir.value(f"fneg {ctype} {at(i, j)}"), ir.element(x, ir.op("mul", j, nrhs))

          def axpy(c: str, kind: str) -> None:
            address = ir.element(target, c)
            vector = kind != ctype
            scale = ir.value(f"insertelement {kind} poison, {ctype} {factor}, i64 0") if vector else factor
            if vector: scale = ir.value(f"shufflevector {kind} {scale}, {kind} poison, <{kind[1:].split()[0]} x i32> "
                                        "zeroinitializer")
            name = f"v{kind[1:].split()[0]}{suffix}" if vector else suffix
            ir.store(kind, ir.value(f"call {kind} @llvm.fmuladd.{name}({kind} {scale}, {kind} "
                                    f"{ir.load(kind, ir.element(source, c))}, {kind} {ir.load(kind, address)})"),
                     address)
          ir.row_loop(nrhs, axpy)
        ir.loop("0", s, known)

        def divide() -> None:
          diagonal = at(i, i)

          def each(c: str, kind: str) -> None:
            address = ir.element(target, c)
            vector = kind != ctype
            divisor = ir.value(f"insertelement {kind} poison, {ctype} {diagonal}, i64 0") if vector else diagonal
            if vector: divisor = ir.value(f"shufflevector {kind} {divisor}, {kind} poison, <{kind[1:].split()[0]} "
                                          "x i32> zeroinitializer")
            ir.store(kind, ir.value(f"fdiv {kind} {ir.load(kind, address)}, {divisor}"), address)
          ir.row_loop(nrhs, each)
        ir.when(is_unit, lambda: None, divide)
      ir.loop("0", k, row)

    # columns one by one, the lanes in lockstep, where they are few; rows of whole vectors where they are many
    ir.when(ir.op("icmp slt", nrhs, str(WIDE_RHS)),
            lambda: ir.loop("0", nrhs, lambda c: ir.loop("0", k, lambda s: solve(c, s))),
            lambda: ir.loop("0", str(LANES), rows))
  ir.loop("%start", "%end", group)
  lanes = VECTOR_BYTES // (4 if ctype == "float" else 8)
  vector = f"<{lanes} x {ctype}>"
  return ir.text([f"declare {ctype} @llvm.fmuladd.{suffix}({ctype}, {ctype}, {ctype})",
                  f"declare {vector} @llvm.fmuladd.v{lanes}{suffix}({vector}, {vector}, {vector})"])


def _potrf_ir(name: str, dtype: np.dtype) -> str:
  """args: a (batch, n, n) in place (its lower triangle in, the lower factor out, zeros above; NaN on and below the
  diagonal where not positive-definite), sizes [n]."""
  ctype, suffix = _TYPES[dtype]
  ir = _Builder(name, ctype, ["a", "sizes"])
  a0, sizes = ir.params
  n = ir.load("i64", sizes)
  size = ir.op("mul", n, n)
  nan = _float(float("nan"))

  def group(g: str) -> None:
    matrices = _lanes(ir, g, a0, ctype, size)
    failed = [ir.var("i1") for _ in range(LANES)]
    for flag in failed: ir.store("i1", "false", flag)

    def at(lane: int, row: str, column: str) -> str:
      return ir.element(matrices[lane], ir.op("add", ir.op("mul", row, n), column))

    def dots(i: str, j: str) -> list[str]:
      """a[i, j] - sum_(c < j) a[i, c] a[j, c], each lane's"""
      return _dots(ir, [ir.load(ctype, at(lane, i, j)) for lane in range(LANES)], j,
                   lambda lane, c: ir.load(ctype, at(lane, i, c)), lambda lane, c: ir.load(ctype, at(lane, j, c)))

    def column(j: str) -> None:
      roots = []
      for lane, pivot in enumerate(dots(j, j)):
        positive = ir.value(f"fcmp ogt {ctype} {pivot}, 0.0")
        ir.store("i1", ir.op("or", ir.load("i1", failed[lane]), ir.value(f"xor i1 {positive}, true"), "i1"),
                 failed[lane])
        root = ir.value(f"call {ctype} @llvm.sqrt.{suffix}({ctype} {pivot})")
        ir.store(ctype, root, at(lane, j, j))
        roots.append(ir.value(f"fdiv {ctype} 1.0, {root}"))  # (the column below times its reciprocal, as potf2)

      def below(i: str) -> None:
        for lane, total in enumerate(dots(i, j)):
          ir.store(ctype, ir.value(f"fmul {ctype} {total}, {roots[lane]}"), at(lane, i, j))
      ir.loop(ir.op("add", j, "1"), n, below)

      def above(c: str) -> None:
        for lane in range(LANES): ir.store(ctype, "0.0", at(lane, j, c))
      ir.loop(ir.op("add", j, "1"), n, above)
    ir.loop("0", n, column)
    for lane in range(LANES):  # (not positive-definite: NaN on and below the diagonal, as JAX)
      ir.when(ir.load("i1", failed[lane]), lambda: ir.loop("0", n, lambda i: ir.loop(
          "0", ir.op("add", i, "1"), lambda c: ir.store(ctype, nan, at(lane, i, c)))))
  ir.loop("%start", "%end", group)
  return ir.text([f"declare {ctype} @llvm.fmuladd.{suffix}({ctype}, {ctype}, {ctype})",
                  f"declare {ctype} @llvm.sqrt.{suffix}({ctype})"])


_BUILDERS = {"getrf": _getrf_ir, "trsm": _trsm_ir, "potrf": _potrf_ir}


@functools.cache
def _kernel(routine: str, dtype: np.dtype):
  """The CPU program of `routine` for `dtype` (compiled, or loaded from the disk cache, on first use)."""
  from tinyjax.devices import cpu
  name = f"tj_{routine}_{_TYPES[dtype][1]}"
  return cpu.compile_cpu(name, _BUILDERS[routine](name, dtype))


def _run(routine: str, batch: int, *arrays: np.ndarray) -> None:
  """Run `routine` over the groups of LANES matrices of `arrays` (C-contiguous, padded to whole groups; the last one
  its int64 sizes), the groups split across the CPU runtime's threads (a host step runs while they are idle)."""
  _kernel(routine, arrays[0].dtype)([array.ctypes.data for array in arrays], -(-batch // LANES))


def _padded(stack: np.ndarray, fill: np.ndarray | None = None, copy: bool = True) -> np.ndarray:
  """A C-contiguous copy of a (batch, ...) stack with whole groups of LANES (the padding `fill`, else zeros); not
  copied unless `copy` where it is that already (an operand the kernel only reads)."""
  batch = stack.shape[0]
  if not copy and batch % LANES == 0 and stack.flags.c_contiguous: return stack
  out = np.empty((-(-batch // LANES) * LANES, *stack.shape[1:]), stack.dtype)
  out[:batch] = stack
  out[batch:] = 0 if fill is None else fill
  return out


def getrf(stack: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
  """LU of a (batch, m, n) stack: packed factors, 0-based int32 pivots (batch, min(m, n)) and the int32 row
  permutation (batch, m) their swaps make."""
  batch, m, n = stack.shape
  factors = _padded(stack)
  pivots, permutation = np.empty((len(factors), min(m, n)), np.int32), np.empty((len(factors), m), np.int32)
  _run("getrf", batch, factors, pivots, permutation, np.array([m, n], np.int64))
  return factors[:batch], pivots[:batch], permutation[:batch]


def trsm(triangles: np.ndarray, rhs: np.ndarray, *, lower: bool, transpose: bool, unit_diagonal: bool) -> np.ndarray:
  """x with op(t) x = rhs for stacks (batch, k, k) and (batch, k, nrhs); op(t) = t.T if `transpose`, else t; `lower`:
  op(t) is lower-triangular."""
  batch, k, nrhs = rhs.shape
  x = _padded(rhs)
  strides = (1, k) if transpose else (k, 1)
  _run("trsm", batch, _padded(triangles, np.eye(k, dtype=triangles.dtype), copy=False), x,
       np.array([k, nrhs, *strides, lower, unit_diagonal], np.int64))
  return x[:batch]


def potrf(stack: np.ndarray) -> np.ndarray:
  """Lower Cholesky factors of the lower triangles of a (batch, n, n) stack; NaN where not positive-definite."""
  factors = _padded(stack, np.eye(stack.shape[-1], dtype=stack.dtype))
  _run("potrf", stack.shape[0], factors, np.array([stack.shape[-1]], np.int64))
  return factors[:stack.shape[0]]
