"""LAPACK on the host, for the linear algebra primitives of lax/linalg.py.

Which LAPACK: the one numpy's own wheels ship (scipy-openblas, an ILP64 OpenBLAS with `scipy_`-prefixed, `64_`-suffixed
Fortran symbols, in `numpy.libs` / `numpy/.dylibs`). It is already installed with numpy, it is what `numpy.linalg`
itself runs, and its routines are OpenBLAS's tuned, threaded ones; a new dependency (scipy, ~40 MB) would bring the
same library a second time. Where numpy was built against another LAPACK (Accelerate on recent macOS wheels, a
distribution's build), the system's `liblapack` / `libopenblas` or Accelerate is used (LP64, plain `name_` symbols);
`TINYJAX_LAPACK=/path/to/liblapack.so` names one explicitly.

Each routine here takes C-ordered numpy arrays with any leading batch dimensions and loops over the matrices in
Python (one ctypes call each, a few microseconds; the O(n^3) work is LAPACK's). For small matrices, where those
microseconds would dominate, LU, triangular solves and Cholesky run in compiled kernels that loop over the batch
(lax/_small_linalg.py), and eigh, svd and qr of batches in numpy.linalg's gufuncs (see the section below).
Row-major matrices are the column-major transposes LAPACK sees: where a routine's meaning allows, the call is
rephrased on the transpose instead of copying (a triangular solve flips side and triangle, an SVD swaps U and V^T);
getrf and geqrf copy to column-major.
Failures are values, as in JAX: a matrix that is not positive-definite gives a NaN factor, a singular one an LU with a
zero pivot.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import functools
import glob
import math
import os
from typing import Any

import numpy as np

from tinyjax import dtypes
from tinyjax.lax import _small_linalg

_PREFIX = {np.dtype(np.float32): "s", np.dtype(np.float64): "d", np.dtype(np.complex64): "c",
           np.dtype(np.complex128): "z"}


class Lapack:
  """One loaded LAPACK: `fn(name)` the Fortran routine `name` (e.g. 'sgetrf'), called with ctypes pointers."""

  def __init__(self, library: ctypes.CDLL, path: str, mangle: str, int_type: Any):
    self.library, self.path, self.mangle, self.int_type = library, path, mangle, int_type
    self._functions: dict[str, Any] = {}

  def fn(self, name: str) -> Any:
    if (function := self._functions.get(name)) is None:
      function = self._functions[name] = getattr(self.library, self.mangle.format(name))
    return function

  def __repr__(self) -> str: return f"Lapack({self.path}, {self.mangle}, {ctypes.sizeof(self.int_type) * 8}-bit ints)"


def _numpy_libraries() -> list[str]:
  """The shared libraries numpy's wheel ships next to it (scipy-openblas among them)."""
  root = os.path.dirname(os.path.abspath(np.__file__))
  found = []
  for folder in (os.path.join(root, ".dylibs"), os.path.join(os.path.dirname(root), "numpy.libs")):
    found += sorted(glob.glob(os.path.join(folder, "*openblas*")))
  return found


def _system_libraries() -> list[str]:
  names = [ctypes.util.find_library(name) for name in ("openblas", "lapack", "flexiblas")]
  accelerate = "/System/Library/Frameworks/Accelerate.framework/Accelerate"
  return [name for name in names if name] + ([accelerate] if os.path.exists(accelerate) else [])


# (symbol pattern, integer type): numpy's ILP64 scipy-openblas, a plain ILP64 OpenBLAS, then the usual LP64 ABI
_MANGLINGS = (("scipy_{}_64_", ctypes.c_int64), ("{}_64_", ctypes.c_int64), ("{}_", ctypes.c_int32))


@functools.cache
def lapack() -> Lapack:
  """The LAPACK to call (see the module docstring for the search order); RuntimeError if there is none."""
  explicit = os.environ.get("TINYJAX_LAPACK")
  candidates = [explicit] if explicit else _numpy_libraries() + _system_libraries()
  for path in candidates:
    try: library = ctypes.CDLL(path)
    except OSError: continue
    for mangle, int_type in _MANGLINGS:
      if hasattr(library, mangle.format("dgetrf")) and hasattr(library, mangle.format("dsyevd")):
        return Lapack(library, path, mangle, int_type)
  where = f"TINYJAX_LAPACK={explicit}" if explicit else "numpy's bundled OpenBLAS or a system liblapack"
  raise RuntimeError(f"tinyjax.linalg needs LAPACK and found none in {where}: install numpy from a wheel (it ships "
                     "OpenBLAS), or install liblapack and set TINYJAX_LAPACK=/path/to/liblapack.so")


# the character arguments (read, never written: made once) and string lengths gfortran's ABI passes after the others
_CHARS = {c: ctypes.byref(ctypes.c_char(c.encode())) for c in "NTCLURAVEIOS"}
_LENGTHS = (ctypes.c_size_t(1),) * 4
_INTS: dict[int, Any] = {}  # integer arguments by value (`_Call.int`), of the one LAPACK's integer type


@functools.lru_cache(maxsize=64)
def _lower_mask(n: int) -> np.ndarray:
  """The n x n mask of a lower triangle, diagonal included (np.tril builds one per call: 3.4 us of a 16x16 potrf's
  host step)."""
  return np.tri(n, dtype=bool)


class _Call:
  """Arguments by reference, as Fortran takes them: ints and chars made once, arrays by their data pointers. One per
  dtype (`_call`); each call has an info of its own (ctypes lets go of the GIL during the call)."""

  def __init__(self, dtype: np.dtype):
    self.lib, self.dtype, self.prefix = lapack(), np.dtype(dtype), _PREFIX[np.dtype(dtype)]
    self.int_dtype = np.dtype(self.lib.int_type)  # (numpy's dtype of a ctypes type: 1.4 us to find each time)

  def int(self, value: int) -> Any:
    # (LAPACK reads its integer arguments, never writes them: one per value, made once)
    if (made := _INTS.get(value)) is None: made = _INTS[value] = ctypes.byref(self.lib.int_type(value))
    return made

  @staticmethod
  def char(value: str) -> Any: return _CHARS[value]

  @staticmethod
  def ptr(array: np.ndarray) -> Any:
    """A pointer to `array`'s data: seen through the buffer protocol where it is writable and C-contiguous (0.26 us;
    numpy's `.ctypes.data` takes 0.8, a 64x64 solve's host steps make 8 of them), else from `.ctypes`."""
    try: return ctypes.byref(ctypes.c_char.from_buffer(array))
    except (TypeError, ValueError, BufferError): return ctypes.c_void_p(array.ctypes.data)

  def __call__(self, name: str, *args: Any, chars: int = 0) -> int:
    """Call `prefix + name` with `args` and the info pointer last (then the hidden lengths of `chars` string
    arguments, gfortran's ABI); returns info."""
    info = self.lib.int_type(0)
    self.lib.fn(self.prefix + name)(*args, ctypes.byref(info), *_LENGTHS[:chars])
    return info.value

  def workspace(self, name: str, *args: Any, chars: int = 0) -> int:
    """The optimal workspace size of a routine called with lwork = -1 (`args` ends with the work pointer's place)."""
    query = np.zeros(1, self.dtype)
    self(name, *args, self.ptr(query), self.int(-1), chars=chars)
    return max(1, int(query[0].real))


@functools.cache
def _one(dtype: np.dtype) -> np.ndarray:
  """A 1 of `dtype` for trsm's alpha (read, never written)."""
  return np.ones(1, dtype)


@functools.cache
def _call(dtype: np.dtype) -> _Call: return _Call(dtype)


def _stacked(x: np.ndarray) -> np.ndarray:
  """`x` as a (batch, m, n) stack of its matrices (a view; empty matrices and batches included)."""
  return x.reshape((math.prod(x.shape[:-2]), *x.shape[-2:]))


def _matrices(x: np.ndarray) -> np.ndarray:
  """`x` as a C-contiguous (batch, m, n) stack (a copy: the routines overwrite it)."""
  return np.array(_stacked(x), order="C", copy=True)


def _potrf_each(a: np.ndarray) -> np.ndarray:
  """Lower Cholesky factors of the lower triangles of symmetric (Hermitian) matrices (..., n, n); NaN where not
  positive-definite. Row-major a is LAPACK's a^T (= conj(a) when Hermitian), whose upper triangle is a's lower:
  potrf('U') there gives U with a^T = U^H U, and U column-major read row-major is U^T = L, a = L L^H."""
  call, stack = _call(a.dtype), _matrices(a)
  n = a.shape[-1]
  for matrix in stack:
    if call("potrf", call.char("U"), call.int(n), call.ptr(matrix), call.int(max(1, n)), chars=1) != 0:
      matrix[...] = np.nan
  return np.where(_lower_mask(n), stack, 0).reshape(a.shape)


def _getrf_each(a: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
  """LU with partial pivoting of (..., m, n): the packed factors (unit-lower L below the diagonal, U on and above) and
  the 0-based row pivots (..., min(m, n)) int32. A singular matrix factors with a zero pivot (no error), as JAX."""
  call = _call(a.dtype)
  m, n = a.shape[-2:]
  k = min(m, n)
  stack = _stacked(a)
  single = stack.shape[0] == 1  # (one matrix: its factors as LAPACK leaves them, not copied)
  factors = None if single else np.empty_like(stack)
  pivots = np.zeros((stack.shape[0], k), call.int_dtype)
  for index in range(stack.shape[0]):
    column_major = np.ascontiguousarray(stack[index].T)  # (a's transpose, row-major: a column-major)
    call("getrf", call.int(m), call.int(n), call.ptr(column_major), call.int(max(1, m)), call.ptr(pivots[index]))
    if single: factors = column_major.T
    else: factors[index] = column_major.T
  return factors.reshape(a.shape), np.subtract(pivots, 1, dtype=np.int32, casting="unsafe").reshape((*a.shape[:-2], k))


def permutation_of(pivots: np.ndarray, size: int) -> np.ndarray:
  """The row permutation that LAPACK's sequence of swaps (row i with row pivots[i]) applies: swapped in Python lists
  for a few matrices (a 64x64 LU's 64 swaps: 6 us, against 165 as numpy steps over every matrix at once, which is
  the way for many)."""
  flat_pivots = pivots.reshape(math.prod(pivots.shape[:-1]), pivots.shape[-1])
  if flat_pivots.shape[0] <= FEW_PERMUTATIONS:
    permutations = []
    for row in flat_pivots.tolist():
      permutation = list(range(size))
      for i, target in enumerate(row): permutation[i], permutation[target] = permutation[target], permutation[i]
      permutations.append(permutation)
    return np.array(permutations, np.int32).reshape((*pivots.shape[:-1], size))
  permutation = np.tile(np.arange(size, dtype=np.int32), (flat_pivots.shape[0], 1))
  matrices = np.arange(flat_pivots.shape[0])
  for i in range(flat_pivots.shape[1]):  # swap i with pivots[i], in every matrix at once
    targets = flat_pivots[:, i]
    swapped = permutation[matrices, targets]
    permutation[matrices, targets] = permutation[:, i]
    permutation[:, i] = swapped
  return permutation.reshape((*pivots.shape[:-1], size))


FEW_PERMUTATIONS = 32  # (a swap in a list: ~0.08 us per matrix; a numpy step: ~2.5 us for all of them)


def _trsm_each(a: np.ndarray, b: np.ndarray, *, left_side: bool, lower: bool, transpose_a: bool,
               unit_diagonal: bool, conjugate_a: bool = False) -> np.ndarray:
  """x with op(a) x = b (left_side) or x op(a) = b, a triangular (..., k, k), b (..., m, n), batch dims equal.
  On the column-major transposes that is x^T op(a)^T = b^T: the other side and the other triangle, same op."""
  call = _call(a.dtype)
  m, n = b.shape[-2:]
  k = a.shape[-1]
  out = np.array(b, order="C")  # (a copy: the routine overwrites it)
  triangles = np.ascontiguousarray(a)
  side, uplo = ("R" if left_side else "L"), ("U" if lower else "L")
  trans, diag = ("C" if conjugate_a else "T") if transpose_a else "N", ("U" if unit_diagonal else "N")
  if conjugate_a and not transpose_a: triangles = np.conj(triangles)  # (BLAS has no "conjugate, not transposed")
  routine = call.lib.fn(call.prefix + "trsm")
  before = (call.char(side), call.char(uplo), call.char(trans), call.char(diag), call.int(n), call.int(m),
            call.ptr(_one(a.dtype)))
  # (one matrix: its arrays as they are, no views per matrix: a 64x64 solve's triangular steps took 7 us for 1 of
  # BLAS)
  batch = math.prod(b.shape[:-2])
  pairs = [(triangles, out)] if b.ndim == 2 else zip(triangles.reshape(batch, k, k), out.reshape(batch, m, n))
  for triangle, matrix in pairs:
    routine(*before, call.ptr(triangle), call.int(max(1, k)), call.ptr(matrix), call.int(max(1, n)), *_LENGTHS)
  return out


def _syevd_each(a: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
  """Eigenvalues (ascending, real) and eigenvectors (columns) of symmetric / Hermitian (..., n, n), from their lower
  triangles. Row-major a is LAPACK's a^T = conj(a), whose upper triangle is a's lower: its eigenvectors are conj(V),
  column-major, so read row-major they are conj(V)^T (V^T for real a). Complex a is heevd, with rwork."""
  call, stack = _call(a.dtype), _matrices(a)
  n = a.shape[-1]
  is_complex = a.dtype.kind == "c"
  real_dtype = dtypes.real_dtype(a.dtype)
  values = np.zeros((stack.shape[0], n), real_dtype)
  if n == 0 or stack.shape[0] == 0: return values.reshape(a.shape[:-1]), stack.reshape(a.shape)
  name = "heevd" if is_complex else "syevd"
  query, rquery, iquery = np.zeros(1, a.dtype), np.zeros(1, real_dtype), np.zeros(1, call.int_dtype)

  def run(index: int, work, lwork, rwork, lrwork, iwork, liwork) -> int:
    real_work = [call.ptr(rwork), call.int(lrwork)] if is_complex else []
    return call(name, call.char("V"), call.char("U"), call.int(n), call.ptr(stack[index]), call.int(n),
                call.ptr(values[index]), call.ptr(work), call.int(lwork), *real_work, call.ptr(iwork), call.int(liwork),
                chars=2)
  run(0, query, -1, rquery, -1, iquery, -1)
  work = np.zeros(max(1, int(query[0].real)), a.dtype)
  rwork = np.zeros(max(1, int(rquery[0])), real_dtype)
  iwork = np.zeros(max(1, int(iquery[0])), call.int_dtype)
  for index in range(stack.shape[0]):
    if run(index, work, work.size, rwork, rwork.size, iwork, iwork.size) != 0:
      values[index], stack[index] = np.nan, np.nan
  vectors = np.swapaxes(stack, -1, -2)
  return values.reshape(a.shape[:-1]), (np.conj(vectors) if is_complex else vectors).reshape(a.shape)


def _gesdd_each(a: np.ndarray, *, full_matrices: bool, compute_uv: bool) -> tuple[np.ndarray, ...]:
  """Singular values (descending, real) of (..., m, n), and with `compute_uv` U (..., m, m|k) and V^H (..., n|k, n).
  LAPACK sees a^T (n x m) = U' S V'^H, so a = conj(V') S U'^T: its V'^H read row-major is conj(V') = our U, its U'
  read row-major U'^T = our V^H (for real a, the same without the conjugations). Complex a also takes rwork."""
  call, stack = _call(a.dtype), _matrices(a)
  m, n = a.shape[-2:]
  k, batch = min(m, n), stack.shape[0]
  jobz = ("A" if full_matrices else "S") if compute_uv else "N"
  rows_u, cols_vt = (m, n) if full_matrices else (k, k)
  is_complex = a.dtype.kind == "c"
  real_dtype = dtypes.real_dtype(a.dtype)
  rwork = [call.ptr(np.zeros(max(1, 5 * k * k + 7 * k, 2 * max(m, n) * k + 2 * k * k + k), real_dtype))] \
      if is_complex else []
  values = np.zeros((batch, k), real_dtype)
  u = np.zeros((batch, m, rows_u), a.dtype) if compute_uv else np.zeros((batch, 1), a.dtype)
  vt = np.zeros((batch, cols_vt, n), a.dtype) if compute_uv else np.zeros((batch, 1), a.dtype)
  if k > 0 and batch > 0:
    iwork = np.zeros(8 * k, call.int_dtype)
    # LAPACK's U' is n x ucol (ld n), its V'^T is vrow x m (ld vrow): our vt[i] and u[i] in row-major
    ld_u, ld_vt = (max(1, n), max(1, rows_u)) if compute_uv else (1, 1)

    def run(index: int, work: np.ndarray, lwork: int) -> int:
      return call("gesdd", call.char(jobz), call.int(n), call.int(m), call.ptr(stack[index]), call.int(max(1, n)),
                  call.ptr(values[index]), call.ptr(vt[index]), call.int(ld_u), call.ptr(u[index]), call.int(ld_vt),
                  call.ptr(work), call.int(lwork), *rwork, call.ptr(iwork), chars=1)
    query = np.zeros(1, a.dtype)
    run(0, query, -1)
    work = np.zeros(max(1, int(query[0].real)), a.dtype)
    for index in range(batch):
      if run(index, work, work.size) != 0: values[index], u[index], vt[index] = np.nan, np.nan, np.nan
  values = values.reshape((*a.shape[:-2], k))
  if not compute_uv: return (values,)
  return values, u.reshape((*a.shape[:-2], m, rows_u)), vt.reshape((*a.shape[:-2], cols_vt, n))


def _geqrf_orgqr_each(a: np.ndarray, *, full_matrices: bool) -> tuple[np.ndarray, np.ndarray]:
  """QR of (..., m, n) by Householder reflections: Q (..., m, m|k) with orthonormal columns, R (..., m|k, n) upper."""
  call = _call(a.dtype)
  m, n = a.shape[-2:]
  k = min(m, n)
  columns = m if full_matrices else k
  stack = _stacked(a)
  q = np.zeros((stack.shape[0], m, columns), a.dtype)
  r = np.zeros((stack.shape[0], columns, n), a.dtype)
  tau = np.zeros(max(1, k), a.dtype)
  for index in range(stack.shape[0]):
    work_matrix = np.zeros((m, max(n, columns)), a.dtype, order="F")
    work_matrix[:, :n] = stack[index]
    if k > 0:
      lwork = call.workspace("geqrf", call.int(m), call.int(n), call.ptr(work_matrix), call.int(max(1, m)),
                             call.ptr(tau))
      work = np.zeros(lwork, a.dtype)
      call("geqrf", call.int(m), call.int(n), call.ptr(work_matrix), call.int(max(1, m)), call.ptr(tau),
           call.ptr(work), call.int(lwork))
    r[index] = np.triu(work_matrix[:columns, :n])
    if columns == 0: continue
    generate = "ungqr" if a.dtype.kind == "c" else "orgqr"  # (Q from the reflectors: unitary for complex a)
    lwork = call.workspace(generate, call.int(m), call.int(columns), call.int(k), call.ptr(work_matrix),
                           call.int(max(1, m)), call.ptr(tau))
    work = np.zeros(lwork, a.dtype)
    call(generate, call.int(m), call.int(columns), call.int(k), call.ptr(work_matrix), call.int(max(1, m)),
         call.ptr(tau), call.ptr(work), call.int(lwork))
    q[index] = work_matrix[:, :columns]
  return q.reshape((*a.shape[:-2], m, columns)), r.reshape((*a.shape[:-2], columns, n))


def _unpack_eigenvectors(packed: np.ndarray, imaginary: np.ndarray, dtype: np.dtype) -> np.ndarray:
  """geev's real eigenvector matrix as complex columns: a complex-conjugate pair (imaginary part > 0 first) is stored
  as two columns, the real and the imaginary part."""
  vectors = packed.astype(dtype)
  j = 0
  while j < len(imaginary):
    if imaginary[j] > 0 and j + 1 < len(imaginary):
      vectors[:, j] = packed[:, j] + 1j * packed[:, j + 1]
      vectors[:, j + 1] = packed[:, j] - 1j * packed[:, j + 1]
      j += 2
    else: j += 1
  return vectors


def geev(a: np.ndarray, *, left: bool, right: bool) -> list[np.ndarray]:
  """Eigenvalues of real square matrices (..., n, n), complex, in LAPACK's order, and the left / right eigenvectors
  (unit columns, as complex arrays) when asked for: [w, vl?, vr?]. A matrix whose QR iteration fails gets NaN."""
  if a.dtype.kind == "c": return _geev_complex(a, left=left, right=right)
  call = _call(a.dtype)
  n = a.shape[-1]
  complex_dtype = dtypes.complex_dtype(a.dtype)
  stack = _stacked(a)
  values = np.zeros((stack.shape[0], n), complex_dtype)
  lefts, rights = np.zeros((stack.shape[0], n, n), complex_dtype), np.zeros((stack.shape[0], n, n), complex_dtype)
  for index in range(stack.shape[0] if n else 0):
    matrix = np.array(stack[index], order="F")
    real, imaginary = np.zeros(n, a.dtype), np.zeros(n, a.dtype)
    vl, vr = np.zeros((n, n), a.dtype, order="F"), np.zeros((n, n), a.dtype, order="F")
    args = [call.char("V" if left else "N"), call.char("V" if right else "N"), call.int(n), call.ptr(matrix),
            call.int(n), call.ptr(real), call.ptr(imaginary), call.ptr(vl), call.int(n), call.ptr(vr), call.int(n)]
    query = np.zeros(1, a.dtype)
    call("geev", *args, call.ptr(query), call.int(-1), chars=2)
    work = np.zeros(max(1, int(query[0])), a.dtype)
    if call("geev", *args, call.ptr(work), call.int(work.size), chars=2) != 0:
      values[index], lefts[index], rights[index] = np.nan, np.nan, np.nan
      continue
    values[index] = real + 1j * imaginary
    if left: lefts[index] = _unpack_eigenvectors(vl, imaginary, complex_dtype)
    if right: rights[index] = _unpack_eigenvectors(vr, imaginary, complex_dtype)
  outs = [values.reshape(a.shape[:-1])]
  if left: outs.append(lefts.reshape(a.shape).astype(complex_dtype))
  if right: outs.append(rights.reshape(a.shape).astype(complex_dtype))
  return outs


def _geev_complex(a: np.ndarray, *, left: bool, right: bool) -> list[np.ndarray]:
  """geev of complex matrices (c/z geev: eigenvalues and eigenvectors come complex, with a real workspace)."""
  call = _call(a.dtype)
  n = a.shape[-1]
  real_dtype = dtypes.real_dtype(a.dtype)
  stack = _stacked(a)
  values = np.zeros((stack.shape[0], n), a.dtype)
  lefts, rights = np.zeros((stack.shape[0], n, n), a.dtype), np.zeros((stack.shape[0], n, n), a.dtype)
  rwork = np.zeros(max(1, 2 * n), real_dtype)
  for index in range(stack.shape[0] if n else 0):
    matrix = np.array(stack[index], order="F")
    vl, vr = np.zeros((n, n), a.dtype, order="F"), np.zeros((n, n), a.dtype, order="F")
    args = [call.char("V" if left else "N"), call.char("V" if right else "N"), call.int(n), call.ptr(matrix),
            call.int(n), call.ptr(values[index]), call.ptr(vl), call.int(n), call.ptr(vr), call.int(n)]
    query = np.zeros(1, a.dtype)
    call("geev", *args, call.ptr(query), call.int(-1), call.ptr(rwork), chars=2)
    work = np.zeros(max(1, int(query[0].real)), a.dtype)
    if call("geev", *args, call.ptr(work), call.int(work.size), call.ptr(rwork), chars=2) != 0:
      values[index], vl[:], vr[:] = np.nan, np.nan, np.nan
    lefts[index], rights[index] = vl, vr
  outs = [values.reshape(a.shape[:-1])]
  if left: outs.append(lefts.reshape(a.shape))
  if right: outs.append(rights.reshape(a.shape))
  return outs


# ---------------------------------------------------------------------------------------------------------------------
# small matrices: LU, triangular solves and Cholesky of real matrices up to _small_linalg.LARGEST run LAPACK's
# unblocked algorithms in compiled kernels over the whole batch (lax/_small_linalg.py; the same kernels a jitted
# program launches itself, so eager and jitted results are the same bits), one LAPACK call per matrix costing more in
# Python than its O(n^3) work; eigh, svd and qr of batches go to numpy.linalg's gufuncs, which loop over the batch in
# C (in float64: numpy's rule)

SMALL_MATRIX = 16  # n at most this, and more than one matrix: the batched path (measured: benchmarks/run.py linalg)


def _getrf_batched(a: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
  factors, pivots, permutation = _small_linalg.getrf(_stacked(a))
  return factors.reshape(a.shape), pivots.reshape((*a.shape[:-2], pivots.shape[-1])), \
      permutation.reshape(a.shape[:-1])


def _trsm_batched(a: np.ndarray, b: np.ndarray, **params: bool) -> np.ndarray:
  return _small_linalg.trsm(_stacked(a), _stacked(b), **params).reshape(b.shape)


def _potrf_batched(a: np.ndarray) -> np.ndarray:
  return _small_linalg.potrf(_stacked(a)).reshape(a.shape)


def _per_matrix_on_failure(gufunc: Any, fallback: Any, a: np.ndarray) -> Any:
  """numpy.linalg's batched `gufunc(a)`, cast back to a's dtype; where it raises (a matrix that did not converge),
  the per-matrix LAPACK loop `fallback(a)`, which marks such matrices with NaN instead."""
  try: results = gufunc(a)
  except np.linalg.LinAlgError: return fallback(a)
  return tuple(np.asarray(r, a.dtype) for r in results)


def _syevd_batched(a: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
  return _per_matrix_on_failure(lambda x: tuple(np.linalg.eigh(x, "L")), _syevd_each, a)


def _gesdd_batched(a: np.ndarray, *, full_matrices: bool, compute_uv: bool) -> tuple[np.ndarray, ...]:
  def gufunc(x):
    if not compute_uv: return (np.linalg.svd(x, compute_uv=False),)
    u, s, vt = np.linalg.svd(x, full_matrices=full_matrices)
    return s, u, vt
  return _per_matrix_on_failure(gufunc, lambda x: _gesdd_each(x, full_matrices=full_matrices, compute_uv=compute_uv), a)


def _geqrf_orgqr_batched(a: np.ndarray, *, full_matrices: bool) -> tuple[np.ndarray, np.ndarray]:
  return tuple(np.asarray(r, a.dtype) for r in np.linalg.qr(a, mode="complete" if full_matrices else "reduced"))


# ---------------------------------------------------------------------------------------------------------------------
# the routines lax/linalg.py calls: batches of small matrices vectorised, the rest one LAPACK call per matrix

def _batched(a: np.ndarray) -> bool:
  return a.size > 0 and a.dtype.kind == "f" and math.prod(a.shape[:-2]) > 1 and max(a.shape[-2:]) <= SMALL_MATRIX


def potrf(a: np.ndarray) -> np.ndarray:
  """Lower Cholesky factors of the lower triangles of (..., n, n); NaN where not positive-definite."""
  return _potrf_batched(a) if _small_linalg.compiled(a) else _potrf_each(a)


def getrf(a: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
  """Packed LU factors of (..., m, n), the 0-based row pivots (..., min(m, n)) int32 and the row permutation
  (..., m) int32 that their swaps make."""
  if _small_linalg.compiled(a): return _getrf_batched(a)
  factors, pivots = _getrf_each(a)
  return factors, pivots, permutation_of(pivots, a.shape[-2])


def trsm(a: np.ndarray, b: np.ndarray, **params: bool) -> np.ndarray:
  """x with op(a) x = b (left_side) or x op(a) = b; params left_side, lower, transpose_a, unit_diagonal (and
  conjugate_a, for complex a)."""
  if _small_linalg.compiled(a, b):  # (real: conjugate_a means nothing)
    return _trsm_batched(a, b, **{name: value for name, value in params.items() if name != "conjugate_a"})
  return _trsm_each(a, b, **params)


def syevd(a: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
  """Ascending eigenvalues and eigenvectors (columns) of symmetric (..., n, n), from their lower triangles."""
  return _syevd_batched(a) if _batched(a) else _syevd_each(a)


def gesdd(a: np.ndarray, *, full_matrices: bool, compute_uv: bool) -> tuple[np.ndarray, ...]:
  """(s,) or (s, u, vt) of (..., m, n), s descending."""
  if _batched(a): return _gesdd_batched(a, full_matrices=full_matrices, compute_uv=compute_uv)
  return _gesdd_each(a, full_matrices=full_matrices, compute_uv=compute_uv)


def geqrf_orgqr(a: np.ndarray, *, full_matrices: bool) -> tuple[np.ndarray, np.ndarray]:
  """(q, r) of (..., m, n)."""
  if _batched(a): return _geqrf_orgqr_batched(a, full_matrices=full_matrices)
  return _geqrf_orgqr_each(a, full_matrices=full_matrices)
