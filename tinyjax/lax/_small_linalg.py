"""Compiled kernels for small real matrices: LU with partial pivoting, triangular solves and Cholesky, for the linear
algebra primitives of lax/linalg.py over matrices of at most LARGEST rows and columns, any batch.

A batch of small matrices (a `vmap` of `solve`: 256 systems of 16 x 16) is too many LAPACK calls for a Python loop
(a few microseconds each) and too little work per matrix for numpy steps over the batch (a dozen numpy calls per
column); and a small solve in a loop body (a Kalman filter's `scan`) paid a call into Python per iteration. These
kernels loop over the matrices in compiled code instead: LLVM IR written here, one kernel per routine, dtype and
matrix size (the batch is the launch's length), compiled by the CPU device and kept in its disk cache like any kernel
(`DEBUG=4` prints their IR when they are compiled). A jitted program launches them among its own kernels, over the
slots of its linear algebra steps (HostCallback's `native`, lower/realize.py); eager calls, DEBUG and profiled runs go
through lax/_lapack.py, which calls the same kernels on numpy arrays.

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

Each kernel has the CPU kernel ABI `void fn(ptr args, i64 start, i64 end)` over the matrices [start, end), LANES at
a time in lockstep (launched with that grain across the runtime's threads); args holds its operands' addresses, then
its results'. 2 cores, against JAX 0.10.2: `vmap(jnp.linalg.solve)` of 256 16 x 16 systems 0.18-0.21 ms (JAX 1.0;
numpy steps over the batch in host calls took 2.2-3.0), a Kalman filter's log-likelihood over 1000 steps 0.92 ms (JAX
13.5; a call into Python per solve took 220).
"""
from __future__ import annotations

import functools
import math
import struct

import numpy as np

LANES = 4  # matrices factored at once, in lockstep: their sums are independent chains that overlap
WIDE_RHS = 8  # right-hand sides from which a triangular solve runs along the rows of x (vectors), not by columns
_TYPES = {np.dtype(np.float32): ("float", "f32"), np.dtype(np.float64): ("double", "f64")}
_SUFFIXES = dict(_TYPES.values())  # an LLVM float type -> its intrinsics' suffix


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

  def __init__(self, name: str, ctype: str, params: int):
    self.ctype, self.count = ctype, 0
    self.allocas: list[str] = []
    self.lines = ["entry:"]
    self.header = f"define void @{name}(ptr noalias %args, i64 %start, i64 %end) nounwind {{"
    self.params = [self.load("ptr", self.gep("ptr", "%args", str(i))) for i in range(params)]

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

  def loop(self, low: str, high: str, body, step: int | str = 1, by: str = "add") -> None:
    """for i in [low, high) by `step` (a number, or a value known at run time): body(i); `by` "mul": i *= step."""
    counter = self.var()
    head, inside, done = self.label(), self.label(), self.label()
    self.store("i64", low, counter)
    self.emit(f"br label %{head}")
    self.block(head)
    i = self.load("i64", counter)
    self.emit(f"br i1 {self.op('icmp slt', i, high)}, label %{inside}, label %{done}")
    self.block(inside)
    body(i)
    self.store("i64", self.op(by, i, str(step)), counter)
    self.emit(f"br label %{head}, !llvm.loop !0")
    self.block(done)

  def row_loop(self, count: str, body) -> None:
    """for c in [0, count): body(c, kind) over a row, whole vectors first (kind: the vector type, c its first
    element), then one element at a time (kind: the scalar type)."""
    lanes = _vector_lanes(self.ctype)
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
  ctype, suffix = ir.ctype, _SUFFIXES[ir.ctype]
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


def _matrices(ir: _Builder, body) -> None:
  """body(matrices) for the matrices [start, end): groups of LANES (their indices), then the rest one at a time (a
  launch chunk starts at a multiple of LANES, its launch grain; only the last may end between)."""
  group = ir.var()
  ir.store("i64", "%start", group)
  last_group = ir.op("sub", "%end", str(LANES - 1))
  ir.loop("%start", last_group, lambda b: [body([ir.op("add", b, str(lane)) for lane in range(LANES)]),
                                            ir.store("i64", ir.op("add", b, str(LANES)), group)], step=LANES)
  ir.loop(ir.load("i64", group), "%end", lambda b: body([b]))


def _copy(ir: _Builder, source: str, target: str, count: int) -> None:
  """count elements from source to target (a matrix the kernel then works on in place)."""
  ir.row_loop(str(count), lambda c, kind: ir.store(kind, ir.load(kind, ir.element(source, c)), ir.element(target, c)))


def _getrf_ir(name: str, dtype: np.dtype, m: int, n: int) -> str:
  """args: a (batch, m, n) in, its packed factors out, pivots (batch, min(m, n)) int32 out, the row permutation
  (batch, m) int32 out. Crout's order (column j of L and U from dot products over the finished columns, then its
  pivot): each element takes the same operations, in the same order, as in the right-looking getf2, without its
  trailing updates' stores and reloads."""
  ctype, suffix = _TYPES[dtype]
  ir = _Builder(name, ctype, 4)
  a0, factors0, pivots0, permutation0 = ir.params
  k, size = min(m, n), m * n

  def group(bs: list[str]) -> None:
    matrices = [ir.element(factors0, ir.op("mul", b, str(size))) for b in bs]
    for b, matrix in zip(bs, matrices): _copy(ir, ir.element(a0, ir.op("mul", b, str(size))), matrix, size)

    def at(matrix: str, row: str, column: str) -> str:
      return ir.element(matrix, ir.op("add", ir.op("mul", row, str(n)), column))

    def column(j: str) -> None:
      def update(i: str) -> None:
        count = ir.value(f"call i64 @llvm.smin.i64(i64 {i}, i64 {j})")
        starts = [ir.load(ctype, at(matrix, i, j)) for matrix in matrices]
        totals = _dots(ir, starts, count, lambda lane, p: ir.load(ctype, at(matrices[lane], i, p)),
                       lambda lane, p: ir.load(ctype, at(matrices[lane], p, j)))
        for matrix, total in zip(matrices, totals): ir.store(ctype, total, at(matrix, i, j))
      ir.loop("0", str(m), update)
      if len(bs) == 1: ir.when(ir.op("icmp slt", j, str(k)), lambda: pivot(bs[0], j))
      else: ir.when(ir.op("icmp slt", j, str(k)), lambda: ir.loop("0", str(len(bs)), lambda lane: pivot(
          ir.op("add", bs[0], lane), j)))

    def pivot(b: str, j: str) -> None:  # (a loop over the lanes: this part is O(n^2))
      matrix, permutation = ir.element(factors0, ir.op("mul", b, str(size))), ir.gep("i32", permutation0,
                                                                                      ir.op("mul", b, str(m)))
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
      ir.loop(below, str(m), search)
      p = ir.load("i64", best)
      ir.store("i32", ir.value(f"trunc i64 {p} to i32"),
               ir.gep("i32", pivots0, ir.op("add", ir.op("mul", b, str(k)), j)))

      def swap(kind: str, here: str, there: str) -> None:
        x, y = ir.load(kind, here), ir.load(kind, there)
        ir.store(kind, y, here)
        ir.store(kind, x, there)

      def scale() -> None:
        def rows() -> None:
          ir.loop("0", str(n), lambda c: swap(ctype, at(matrix, j, c), at(matrix, p, c)))
          swap("i32", ir.gep("i32", permutation, j), ir.gep("i32", permutation, p))
        ir.when(ir.op("icmp ne", p, j), rows)
        reciprocal = ir.value(f"fdiv {ctype} 1.0, {ir.load(ctype, at(matrix, j, j))}")

        def multiply(i: str) -> None:
          address = at(matrix, i, j)
          ir.store(ctype, ir.value(f"fmul {ctype} {ir.load(ctype, address)}, {reciprocal}"), address)
        ir.loop(below, str(m), multiply)
      ir.when(ir.value(f"fcmp une {ctype} {ir.load(ctype, at(matrix, p, j))}, 0.0"), scale)

    for b in bs:
      permutation = ir.gep("i32", permutation0, ir.op("mul", b, str(m)))
      ir.loop("0", str(m), lambda i: ir.store("i32", ir.value(f"trunc i64 {i} to i32"),
                                               ir.gep("i32", permutation, i)))
    ir.loop("0", str(n), column)
  _matrices(ir, group)
  return ir.text(["declare i64 @llvm.smin.i64(i64, i64)", f"declare {ctype} @llvm.fabs.{suffix}({ctype})",
                  *_fmuladd(ctype, suffix)])


def _trsm_ir(name: str, dtype: np.dtype, k: int, nrhs: int, strides: tuple[int, int], x_strides: tuple[int, int],
             lower: bool, unit: bool) -> str:
  """args: triangles (batch, k, k), b in, x out (batch, k * nrhs each): op(t) x = b, op(t) lower or not, where
  op(t)[i, j] is at i * strides[0] + j * strides[1] and x[i, c] at i * x_strides[0] + c * x_strides[1] (the
  transposes of a right-side solve read through strides). A few columns of x, or columns that are not contiguous,
  by substitution a column at a time, the lanes in lockstep (the rows already known, forward for lower, backward
  for upper, then the diagonal unless unit); many contiguous columns along the rows of x, whole vectors at a time
  (the same operations on each element, in the same order)."""
  ctype, suffix = _TYPES[dtype]
  ir = _Builder(name, ctype, 3)
  t0, b0, x0 = ir.params

  def ordered(s: str) -> str: return s if lower else ir.op("sub", str(k - 1), s)

  def group(bs: list[str]) -> None:
    triangles = [ir.element(t0, ir.op("mul", b, str(k * k))) for b in bs]
    xs = [ir.element(x0, ir.op("mul", b, str(k * nrhs))) for b in bs]
    for b, x in zip(bs, xs): _copy(ir, ir.element(b0, ir.op("mul", b, str(k * nrhs))), x, k * nrhs)

    def entry(lane: int, i: str, j: str) -> str:
      index = ir.op("add", ir.op("mul", i, str(strides[0])), ir.op("mul", j, str(strides[1])))
      return ir.load(ctype, ir.element(triangles[lane], index))

    def x_at(lane: int, i: str, c: str) -> str:
      return ir.element(xs[lane], ir.op("add", ir.op("mul", i, str(x_strides[0])), ir.op("mul", c, str(x_strides[1]))))

    def solve(c: str, s: str) -> None:
      i = ordered(s)
      starts = [ir.load(ctype, x_at(lane, i, c)) for lane in range(len(bs))]
      totals = _dots(ir, starts, s, lambda lane, u: entry(lane, i, ordered(u)),
                     lambda lane, u: ir.load(ctype, x_at(lane, ordered(u), c)))
      for lane, total in enumerate(totals):
        ir.store(ctype, total if unit else ir.value(f"fdiv {ctype} {total}, {entry(lane, i, i)}"), x_at(lane, i, c))

    def rows(lane: int) -> None:
      def row(s: str) -> None:
        i = ordered(s)
        target = x_at(lane, i, "0")

        def known(u: str) -> None:
          j = ordered(u)
          factor, source = ir.value(f"fneg {ctype} {entry(lane, i, j)}"), x_at(lane, j, "0")

          def axpy(c: str, kind: str) -> None:
            address = ir.element(target, c)
            scale = _splat(ir, kind, factor)
            ir.store(kind, ir.value(f"call {kind} @llvm.fmuladd.{_name(kind, suffix)}({kind} {scale}, {kind} "
                                    f"{ir.load(kind, ir.element(source, c))}, {kind} {ir.load(kind, address)})"),
                     address)
          ir.row_loop(str(nrhs), axpy)
        ir.loop("0", s, known)
        if not unit:
          diagonal = entry(lane, i, i)
          ir.row_loop(str(nrhs), lambda c, kind: ir.store(kind, ir.value(
              f"fdiv {kind} {ir.load(kind, ir.element(target, c))}, {_splat(ir, kind, diagonal)}"),
              ir.element(target, c)))
      ir.loop("0", str(k), row)
    if nrhs >= WIDE_RHS and x_strides[1] == 1:
      for lane in range(len(bs)): rows(lane)
    else: ir.loop("0", str(nrhs), lambda c: ir.loop("0", str(k), lambda s: solve(c, s)))
  _matrices(ir, group)
  return ir.text(_fmuladd(ctype, suffix))


def _potrf_ir(name: str, dtype: np.dtype, n: int) -> str:
  """args: a (batch, n, n) in (its lower triangle read), the lower factor out (zeros above; NaN on and below the
  diagonal where not positive-definite)."""
  ctype, suffix = _TYPES[dtype]
  ir = _Builder(name, ctype, 2)
  a0, factors0 = ir.params
  size = n * n
  nan = _float(float("nan"))

  def group(bs: list[str]) -> None:
    matrices = [ir.element(factors0, ir.op("mul", b, str(size))) for b in bs]
    for b, matrix in zip(bs, matrices): _copy(ir, ir.element(a0, ir.op("mul", b, str(size))), matrix, size)
    failed = [ir.var("i1") for _ in bs]
    for flag in failed: ir.store("i1", "false", flag)

    def at(lane: int, row: str, column: str) -> str:
      return ir.element(matrices[lane], ir.op("add", ir.op("mul", row, str(n)), column))

    def dots(i: str, j: str) -> list[str]:
      """a[i, j] - sum_(c < j) a[i, c] a[j, c], each lane's"""
      return _dots(ir, [ir.load(ctype, at(lane, i, j)) for lane in range(len(bs))], j,
                   lambda lane, c: ir.load(ctype, at(lane, i, c)), lambda lane, c: ir.load(ctype, at(lane, j, c)))

    def column(j: str) -> None:
      reciprocals = []
      for lane, pivot in enumerate(dots(j, j)):
        positive = ir.value(f"fcmp ogt {ctype} {pivot}, 0.0")
        ir.store("i1", ir.op("or", ir.load("i1", failed[lane]), ir.value(f"xor i1 {positive}, true"), "i1"),
                 failed[lane])
        root = ir.value(f"call {ctype} @llvm.sqrt.{suffix}({ctype} {pivot})")
        ir.store(ctype, root, at(lane, j, j))
        reciprocals.append(ir.value(f"fdiv {ctype} 1.0, {root}"))  # (the column below times it, as potf2)

      def below(i: str) -> None:
        for lane, total in enumerate(dots(i, j)):
          ir.store(ctype, ir.value(f"fmul {ctype} {total}, {reciprocals[lane]}"), at(lane, i, j))
      ir.loop(ir.op("add", j, "1"), str(n), below)

      def above(c: str) -> None:
        for lane in range(len(bs)): ir.store(ctype, "0.0", at(lane, j, c))
      ir.loop(ir.op("add", j, "1"), str(n), above)
    ir.loop("0", str(n), column)
    for lane in range(len(bs)):  # (not positive-definite: NaN on and below the diagonal, as JAX)
      ir.when(ir.load("i1", failed[lane]), lambda: ir.loop("0", str(n), lambda i: ir.loop(
          "0", ir.op("add", i, "1"), lambda c: ir.store(ctype, nan, at(lane, i, c)))))
  _matrices(ir, group)
  return ir.text([*_fmuladd(ctype, suffix), f"declare {ctype} @llvm.sqrt.{suffix}({ctype})"])


def _name(kind: str, suffix: str) -> str:
  """An intrinsic's type suffix: f32, or v8f32 for a vector."""
  return f"v{kind[1:].split()[0]}{suffix}" if kind.startswith("<") else suffix


def _splat(ir: _Builder, kind: str, value: str) -> str:
  """`value` in every lane of a vector type (itself for a scalar type)."""
  if not kind.startswith("<"): return value
  lanes = kind[1:].split()[0]
  one = ir.value(f"insertelement {kind} poison, {ir.ctype} {value}, i64 0")
  return ir.value(f"shufflevector {kind} {one}, {kind} poison, <{lanes} x i32> zeroinitializer")


def _fmuladd(ctype: str, suffix: str) -> list[str]:
  vector = f"<{_vector_lanes(ctype)} x {ctype}>"
  return [f"declare {ctype} @llvm.fmuladd.{suffix}({ctype}, {ctype}, {ctype})",
          f"declare {vector} @llvm.fmuladd.{_name(vector, suffix)}({vector}, {vector}, {vector})"]


def _vector_lanes(ctype: str) -> int: return VECTOR_BYTES // (4 if ctype == "float" else 8)


_BUILDERS = {"getrf": _getrf_ir, "trsm": _trsm_ir, "potrf": _potrf_ir}


@functools.cache
def source(routine: str, dtype: np.dtype, *sizes) -> tuple[str, str]:
  """(name, LLVM IR) of the kernel of `routine` for `dtype` and its sizes."""
  name = f"tj_{routine}_{_TYPES[dtype][1]}_{'_'.join(str(int(size)) for size in _flat(sizes))}"
  return name, _BUILDERS[routine](name, dtype, *sizes)


def program(routine: str, dtype: np.dtype, *sizes):
  """The CPU program of `routine` for `dtype` and its sizes (compiled, or loaded from the disk cache, on first use):
  a kernel launched over the matrices with grain LANES."""
  from tinyjax.devices import cpu
  return cpu.compile_cpu(*source(routine, np.dtype(dtype), *sizes))


# Matrices of at most LARGEST rows and columns take these kernels, in programs and eagerly: their unblocked loops
# still beat a Python loop of LAPACK calls there (2 cores, float32: 256 LUs of 32 x 32 1.4 ms against 6.8; 16 of
# 64 x 64 0.77 against 0.61, 8 of 128 x 128 8.9 against 1.4)
LARGEST = 32


def compiled(*operands) -> bool:
  """Whether linear algebra over these operands runs the compiled kernels (float32 / float64 matrices of at most
  LARGEST rows and columns, not empty, one dtype, the same batch), not LAPACK through Python."""
  return all(np.dtype(x.dtype) in _TYPES and x.ndim >= 2 and 0 < max(x.shape[-2:]) <= LARGEST and
             math.prod(x.shape) > 0 for x in operands) and len({np.dtype(x.dtype) for x in operands}) == 1 and \
      len({tuple(x.shape[:-2]) for x in operands}) == 1


def native(routine: str, dtype: np.dtype, batch: int, *sizes):
  """A HostCallback's `native`: the kernel of `routine`, launched over `batch` matrices with grain LANES (compiled
  along with the program's kernels)."""
  from tinyjax.trace.callback import NativeKernel
  return NativeKernel(lambda: source(routine, np.dtype(dtype), *sizes), batch, LANES)


def _flat(sizes: tuple) -> list:
  return [value for size in sizes for value in (size if isinstance(size, tuple) else (size,))]


def _run(routine: str, batch: int, sizes: tuple, *arrays: np.ndarray) -> None:
  """Run `routine` over the `batch` matrices of `arrays` (C-contiguous), across the CPU runtime's threads (a host
  step runs while they are idle)."""
  program(routine, arrays[0].dtype, *sizes)([array.ctypes.data for array in arrays], batch, grain=LANES)


def getrf(stack: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
  """LU of a (batch, m, n) stack: packed factors, 0-based int32 pivots (batch, min(m, n)) and the int32 row
  permutation (batch, m) their swaps make."""
  batch, m, n = stack.shape
  factors = np.empty_like(stack)
  pivots, permutation = np.empty((batch, min(m, n)), np.int32), np.empty((batch, m), np.int32)
  _run("getrf", batch, (m, n), np.ascontiguousarray(stack), factors, pivots, permutation)
  return factors, pivots, permutation


def trsm_sizes(k: int, m: int, n: int, *, left_side: bool, lower: bool, transpose_a: bool,
               unit_diagonal: bool) -> tuple:
  """The kernel's sizes for op(a) x = b (left_side, b (m, n), m = k) or x op(a) = b (b (m, n), n = k), as the
  left-side solve op(a)' x' = b' it is on the transposes (x' = x^T, op(a)' = op(a)^T: the other triangle)."""
  transpose = transpose_a != (not left_side)
  strides = (1, k) if transpose else (k, 1)
  x_strides, nrhs = ((n, 1), n) if left_side else ((1, n), m)
  return k, nrhs, strides, x_strides, lower != transpose, unit_diagonal


def trsm(triangles: np.ndarray, rhs: np.ndarray, **params: bool) -> np.ndarray:
  """x with op(t) x = rhs (left_side) or x op(t) = rhs for stacks (batch, k, k) and (batch, m, n)."""
  batch, m, n = rhs.shape
  x = np.empty_like(rhs)
  _run("trsm", batch, trsm_sizes(triangles.shape[-1], m, n, **params), np.ascontiguousarray(triangles),
       np.ascontiguousarray(rhs), x)
  return x


def potrf(stack: np.ndarray) -> np.ndarray:
  """Lower Cholesky factors of the lower triangles of a (batch, n, n) stack; NaN where not positive-definite."""
  factors = np.empty_like(stack)
  _run("potrf", stack.shape[0], (stack.shape[-1],), np.ascontiguousarray(stack), factors)
  return factors
