"""Library functions whose eager calls build one node (lax/_base.py `staged`): `jnp.take`, `clip`, `where`, `mean`,
`linalg.norm`, `argsort`, `nn.one_hot` and more (the table below). A staged call must give
exactly what the function itself gives (values, dtype, weak type, errors), and everything else (numpy data, lists,
transformations, jaxprs) must go through the function as before."""
import math

import numpy as np
import pytest

import tinyjax as tj
import tinyjax.numpy as jnp
import tinyjax.scipy.special  # noqa: F401 (tj.scipy.special)
from tinyjax.lower.realize import counters
from tinyjax.uop import Ops
from gradcheck import numeric_grad

RNG = np.random.default_rng(3)
X64 = RNG.uniform(-4, 4, 12)
M64 = RNG.uniform(-4, 4, (4, 6))
XI64 = RNG.integers(-5, 6, 12)
F32 = np.finfo(np.float32)
INDEX = np.array([1, 3, 11, 0, 14, -20])  # (two out of bounds: "fill" gives NaN for floats)


@pytest.fixture(autouse=True)
def _eager_staging(monkeypatch):
  from tinyjax.trace import core, sharding_types
  # (once a test placed a NamedSharding, primitives run op by op)
  monkeypatch.setattr(sharding_types, "_enabled", [False])
  monkeypatch.setattr(core, "_sharding_enabled", sharding_types._enabled)


def _taken(values: np.ndarray, index: np.ndarray, fill: float = np.nan) -> np.ndarray:
  inside = (index >= -len(values)) & (index < len(values))
  return np.where(inside, values[np.clip(index, -len(values), len(values) - 1)], fill)


def _cases():
  x, m = jnp.asarray(X64.astype(np.float32)), jnp.asarray(M64.astype(np.float32))
  xi = jnp.asarray(XI64.astype(np.int32))
  i, c = jnp.asarray(INDEX.astype(np.int32)), jnp.asarray(X64 > 0)
  shifted = M64 - M64.min()
  order = np.argsort(X64, kind="stable")
  return [  # (name, call, float64 numpy reference)
    ("take", lambda: jnp.take(x, i), _taken(X64, INDEX)),
    ("take", lambda: jnp.take(x, 2), X64[2]),
    ("take", lambda: jnp.take(m, i[:3], axis=1), M64[:, [1, 3, 11 % 6]] * [1, 1, np.nan]),
    ("take", lambda: jnp.take(x, i, mode="clip"), X64[np.clip(INDEX, 0, 11)]),
    ("take", lambda: jnp.take(xi, i, fill_value=-7), _taken(XI64, INDEX, -7)),
    ("clip", lambda: jnp.clip(x, -1, 2.5), np.clip(X64, -1, 2.5)),
    ("clip", lambda: jnp.clip(x, None, 0.5), np.minimum(X64, 0.5)),
    ("clip", lambda: jnp.clip(xi, -2, 3), np.clip(XI64, -2, 3)),
    ("clip", lambda: jnp.clip(xi, 1.5, 3), np.clip(XI64, 1.5, 3)),
    ("clip", lambda: jnp.clip(x, max=x * 0.5), np.minimum(X64, X64 * 0.5)),
    ("where", lambda: jnp.where(c, x, 0), np.where(X64 > 0, X64, 0)),
    ("where", lambda: jnp.where(c, 1, 0), np.where(X64 > 0, 1, 0)),
    ("where", lambda: jnp.where(c, xi, 2.5), np.where(X64 > 0, XI64, 2.5)),
    ("where", lambda: jnp.where(c, x, xi), np.where(X64 > 0, X64, XI64)),
    ("one_hot", lambda: tj.nn.one_hot(i, 12), INDEX[:, None] == np.arange(12)),  # (out of range: all zeros)
    ("one_hot", lambda: tj.nn.one_hot(i, 4, dtype=jnp.int32, axis=0), (np.arange(4)[:, None] == INDEX)),
    ("sum", lambda: jnp.sum(x), X64.sum()),
    ("sum", lambda: m.sum(axis=1, keepdims=True), M64.sum(axis=1, keepdims=True)),
    ("sum", lambda: jnp.sum(xi, dtype=jnp.float32, initial=0.5), XI64.sum() + 0.5),
    ("sum", lambda: jnp.sum(2.5), 2.5),
    ("sum", lambda: jnp.sum(m, axis=(0, 1), where=m > 0), M64[M64 > 0].sum()),
    ("prod", lambda: jnp.prod(m[:, :3], axis=0), M64[:, :3].prod(axis=0)),
    ("max", lambda: jnp.max(m, axis=0), M64.max(axis=0)),
    ("min", lambda: m.min(), M64.min()),
    ("max", lambda: jnp.max(xi, initial=3), np.max(XI64, initial=3)),
    ("argmax", lambda: jnp.argmax(m, axis=1), M64.argmax(axis=1)),
    ("argmin", lambda: jnp.argmin(x), X64.argmin()),
    ("matmul", lambda: m.T @ m, M64.T @ M64),
    ("matmul", lambda: jnp.matmul(x[:6], m.T), X64[:6] @ M64.T),
    ("dot", lambda: jnp.dot(x, xi), X64 @ XI64),
    ("inner", lambda: jnp.inner(m, m), np.inner(M64, M64)),
    ("tensordot", lambda: jnp.tensordot(m, m, axes=((0,), (0,))), np.tensordot(M64, M64, axes=([0], [0]))),
    ("einsum", lambda: jnp.einsum("ij,ik->jk", m, m), np.einsum("ij,ik->jk", M64, M64)),
    ("einsum", lambda: jnp.einsum("ij,j,i->", m, x[:6], x[:4]), np.einsum("ij,j,i->", M64, X64[:6], X64[:4])),
    ("roll", lambda: jnp.roll(m, 2, axis=1), np.roll(M64, 2, axis=1)),
    ("roll", lambda: jnp.roll(x, -5), np.roll(X64, -5)),
    ("tile", lambda: jnp.tile(x[:3], (2, 2)), np.tile(X64[:3], (2, 2))),
    ("repeat", lambda: jnp.repeat(m, 2, axis=0), np.repeat(M64, 2, axis=0)),
    ("pad", lambda: jnp.pad(m, ((1, 0), (2, 1)), constant_values=-1.5), np.pad(M64, ((1, 0), (2, 1)),
                                                                              constant_values=-1.5)),
    ("pad", lambda: jnp.pad(x, 3, mode="reflect"), np.pad(X64, 3, mode="reflect")),
    ("rot90", lambda: jnp.rot90(m, k=3), np.rot90(M64, k=3)),
    ("mean", lambda: jnp.mean(x), X64.mean()),
    ("mean", lambda: jnp.mean(m, axis=0), M64.mean(axis=0)),
    ("mean", lambda: jnp.mean(xi, keepdims=True), XI64.mean(keepdims=True)),
    ("mean", lambda: jnp.mean(m, axis=(0, 1), where=m > 0), M64[M64 > 0].mean()),
    ("norm", lambda: jnp.linalg.norm(x), np.linalg.norm(X64)),
    ("norm", lambda: jnp.linalg.norm(m, ord=1), np.linalg.norm(M64, ord=1)),
    ("norm", lambda: jnp.linalg.norm(m, "fro", axis=(0, 1)), np.linalg.norm(M64, "fro")),
    ("norm", lambda: jnp.linalg.norm(x, np.inf), np.linalg.norm(X64, np.inf)),
    ("argsort", lambda: jnp.argsort(x), order),
    ("argsort", lambda: jnp.argsort(m, axis=0, descending=True), np.argsort(-M64, axis=0, kind="stable")),
    ("isclose", lambda: jnp.isclose(x, x * 1.2, rtol=0.1, equal_nan=True), np.isclose(X64, X64 * 1.2, rtol=0.1)),
    ("allclose", lambda: jnp.allclose(x, x + 1e-6), True),
    ("allclose", lambda: jnp.allclose(x, x + 1), False),
    ("allclose", lambda: jnp.allclose(x, x * 1.2, rtol=0.3), True),
    ("stack", lambda: jnp.stack([x, x * 2]), np.stack([X64, X64 * 2])),
    ("stack", lambda: jnp.stack((m, shifted.astype(np.float32) + m), axis=2), np.stack((M64, shifted + M64), axis=2)),
    ("concatenate", lambda: jnp.concatenate([x, xi]), np.concatenate([X64, XI64])),
    ("concatenate", lambda: jnp.concatenate([m, m], axis=1), np.concatenate([M64, M64], axis=1)),
    ("arange", lambda: jnp.arange(50), np.arange(50)),
    ("arange", lambda: jnp.arange(1.5, 7, 0.5), np.arange(1.5, 7, 0.5)),
    ("arange", lambda: jnp.arange(10, dtype=jnp.float32), np.arange(10.0)),
    ("linspace", lambda: jnp.linspace(0, 1, 7), np.linspace(0, 1, 7)),
    ("linspace", lambda: jnp.linspace(x[:2], 5.0, 3, axis=1), np.linspace(X64[:2], 5.0, 3, axis=1)),
    ("nan_to_num", lambda: jnp.nan_to_num(x / (x > 0)), np.nan_to_num(np.where(X64 > 0, X64, np.inf * np.sign(X64)),
                                                                       posinf=F32.max, neginf=F32.min)),
    ("nan_to_num", lambda: jnp.nan_to_num((x - x) / (x - x), nan=1.5), np.full(12, 1.5)),
    ("searchsorted", lambda: jnp.searchsorted(jnp.sort(x), m), np.searchsorted(np.sort(X64), M64)),
    ("searchsorted", lambda: jnp.searchsorted(jnp.sort(xi), xi, side="right"), np.searchsorted(np.sort(XI64), XI64,
                                                                                            side="right")),
    ("round", lambda: jnp.round(x, 2), np.round(X64.astype(np.float32), 2)),
    ("hypot", lambda: jnp.hypot(x, 3.0), np.hypot(X64, 3.0)),
    ("isin", lambda: jnp.isin(xi, i), np.isin(XI64, INDEX)),
    ("isin", lambda: jnp.isin(xi, i, invert=True), ~np.isin(XI64, INDEX)),
    ("interp", lambda: jnp.interp(m, jnp.sort(x), x * 2), np.interp(M64, np.sort(X64), X64 * 2)),
    ("interp", lambda: jnp.interp(m, jnp.sort(x), x, left=-9.0, right=9), np.interp(M64, np.sort(X64), X64, -9, 9)),
    ("triu", lambda: jnp.triu(m, 1), np.triu(M64, 1)),
    ("tril", lambda: jnp.tril(m), np.tril(M64)),
    ("trace", lambda: jnp.trace(m, offset=1), np.trace(M64, offset=1)),
    ("average", lambda: jnp.average(m, axis=1, weights=m * m), np.average(M64, axis=1, weights=M64 * M64)),
    ("polyval", lambda: jnp.polyval(x[:4], m), np.polyval(X64[:4], M64)),
    ("diff", lambda: jnp.diff(x, n=2), np.diff(X64, n=2)),
    ("diff", lambda: jnp.diff(m, axis=0, prepend=0.5), np.diff(M64, axis=0, prepend=0.5)),
    ("outer", lambda: jnp.outer(x, xi), np.outer(X64, XI64)),
    ("diag", lambda: jnp.diag(m, -1), np.diag(M64, -1)),
    ("diag", lambda: jnp.diag(x, 2), np.diag(X64, 2)),
    ("cross", lambda: jnp.cross(m[:, :3], m[:, 3:]), np.cross(M64[:, :3], M64[:, 3:])),
    ("nanmean", lambda: jnp.nanmean(jnp.where(m > -3, m, np.nan), axis=0),
     np.nanmean(np.where(M64 > -3, M64, np.nan), axis=0)),
    ("sort", lambda: jnp.sort(m, axis=0), np.sort(M64, axis=0)),
    ("sort", lambda: jnp.sort(xi, descending=True), -np.sort(-XI64)),
    ("silu", lambda: tj.nn.silu(x), X64 / (1 + np.exp(-X64))),
    ("gelu", lambda: tj.nn.gelu(x, approximate=False), [X64[k] / 2 * (1 + math.erf(X64[k] / 2 ** 0.5)) for k in
                                                        range(12)]),
    ("det", lambda: jnp.linalg.det(m[:, :4]), np.linalg.det(M64[:, :4])),
    ("inv", lambda: jnp.linalg.inv(m[:, :4] + 9 * jnp.eye(4)), np.linalg.inv(M64[:, :4] + 9 * np.eye(4))),
    ("solve", lambda: jnp.linalg.solve(m[:, :4] + 9 * jnp.eye(4), x[:4]), np.linalg.solve(M64[:, :4] + 9 * np.eye(4),
                                                                                         X64[:4])),
  ] + _more_cases(x, m, xi, i)


def _more_cases(x, m, xi, i):
  p64 = np.abs(M64) / 5 + 0.05  # (in (0, 1))
  p = jnp.asarray(p64.astype(np.float32))
  erf = np.vectorize(math.erf)
  ndtr = lambda v: 0.5 * (1 + erf(v / 2 ** 0.5))
  sigmoid = lambda v: 1 / (1 + np.exp(-v))
  relu6 = lambda v: np.clip(v, 0, 6)
  elu = lambda v, alpha=1.0: np.where(v > 0, v, alpha * np.expm1(np.minimum(v, 0)))
  rows = M64 - M64.mean(axis=1, keepdims=True)
  nan64 = np.where(M64 > -3, M64, np.nan)  # (a NaN or two, never a whole row or column)
  nan = jnp.where(m > -3, m, np.nan)
  wrapped = (np.cumsum(np.abs(X64)) * 1.7).astype(np.float32).astype(np.float64)
  edges = np.linspace(X64.min(), X64.max(), 5)
  return [
    ("i0", lambda: jnp.i0(x), np.i0(X64)),
    ("spacing", lambda: jnp.spacing(x), np.spacing(X64.astype(np.float32))),
    ("sinc", lambda: jnp.sinc(x), np.sinc(X64)),
    ("rint", lambda: jnp.rint(x * 1.5), np.rint((X64.astype(np.float32) * 1.5).astype(np.float64))),
    ("nextafter", lambda: jnp.nextafter(x, 0.0), np.nextafter(X64.astype(np.float32), np.float32(0))),
    ("copysign", lambda: jnp.copysign(x, -m[0, 0]), np.copysign(X64, -M64[0, 0])),
    ("heaviside", lambda: jnp.heaviside(x * (xi > 0), 0.5), np.heaviside(X64 * (XI64 > 0), 0.5)),
    ("fmax", lambda: jnp.fmax(x, x[::-1]), np.fmax(X64, X64[::-1])),
    ("fmin", lambda: jnp.fmin(xi, 1.5), np.fmin(XI64, 1.5)),
    ("isinf", lambda: jnp.isinf(jnp.where(x > 0, x, -np.inf)), X64 <= 0),
    ("isfinite", lambda: jnp.isfinite(jnp.where(x > 0, x, np.nan)), X64 > 0),
    ("signbit", lambda: jnp.signbit(x), np.signbit(X64)),
    ("logical_and", lambda: jnp.logical_and(x > 0, xi), np.logical_and(X64 > 0, XI64)),
    ("logical_or", lambda: jnp.logical_or(x > 1, xi > 2), np.logical_or(X64 > 1, XI64 > 2)),
    ("logical_xor", lambda: jnp.logical_xor(x > 0, True), np.logical_xor(X64 > 0, True)),
    ("logical_not", lambda: jnp.logical_not(xi), np.logical_not(XI64)),
    ("log10", lambda: jnp.log10(p), np.log10(p64)),
    ("angle", lambda: jnp.angle(x * 1j + 1, deg=True), np.angle(X64 * 1j + 1, deg=True)),
    ("isreal", lambda: jnp.isreal(x), np.isreal(X64)),
    ("unwrap", lambda: jnp.unwrap(jnp.asarray(wrapped.astype(np.float32))), np.unwrap(wrapped)),
    ("vdot", lambda: jnp.vdot(x, x[::-1]), np.vdot(X64, X64[::-1])),
    ("vecmat", lambda: jnp.vecmat(x[:4], m), X64[:4] @ M64),
    ("matvec", lambda: jnp.matvec(m, x[:6]), M64 @ X64[:6]),
    ("kron", lambda: jnp.kron(m[:2, :3], xi[:2]), np.kron(M64[:2, :3], XI64[:2])),
    ("nancumsum", lambda: jnp.nancumsum(nan, axis=0), np.nancumsum(nan64, axis=0)),
    ("nancumprod", lambda: jnp.nancumprod(nan, axis=1), np.nancumprod(nan64, axis=1)),
    ("trapezoid", lambda: jnp.trapezoid(m, dx=0.5), np.trapezoid(M64, dx=0.5)),
    ("append", lambda: jnp.append(m, m[:1], axis=0), np.append(M64, M64[:1], axis=0)),
    ("diagonal", lambda: jnp.diagonal(m, 1), np.diagonal(M64, 1)),
    ("nanstd", lambda: jnp.nanstd(nan, axis=1, ddof=1),
     np.nanstd(nan64, axis=1, ddof=1)),
    ("nanvar", lambda: jnp.nanvar(nan), np.nanvar(nan64)),
    ("nanmin", lambda: jnp.nanmin(nan, axis=0), np.nanmin(nan64, axis=0)),
    ("nanmax", lambda: jnp.nanmax(nan, keepdims=True),
     np.nanmax(nan64, keepdims=True)),
    ("nansum", lambda: jnp.nansum(nan, axis=1), np.nansum(nan64, axis=1)),
    ("nanprod", lambda: jnp.nanprod(nan), np.nanprod(nan64)),
    ("nanargmin", lambda: jnp.nanargmin(nan, axis=1),
     np.nanargmin(nan64, axis=1)),
    ("nanargmax", lambda: jnp.nanargmax(nan), np.nanargmax(nan64)),
    ("count_nonzero", lambda: jnp.count_nonzero(m > 0, axis=0), np.count_nonzero(M64 > 0, axis=0)),
    ("all", lambda: jnp.all(m > -3, axis=1), np.all(M64 > -3, axis=1)),
    ("any", lambda: jnp.any(xi > 4), np.any(XI64 > 4)),
    ("ptp", lambda: jnp.ptp(m, axis=1, keepdims=True), np.ptp(M64, axis=1, keepdims=True)),
    ("cov", lambda: jnp.cov(m), np.cov(M64)),
    ("cov", lambda: jnp.cov(m, rowvar=False, ddof=0), np.cov(M64, rowvar=False, ddof=0)),
    ("corrcoef", lambda: jnp.corrcoef(m), np.corrcoef(M64)),
    ("histogram_bin_edges", lambda: jnp.histogram_bin_edges(x, bins=4), edges),
    ("geomspace", lambda: jnp.geomspace(1.0, 1000.0, 4), np.geomspace(1.0, 1000.0, 4)),
    ("logspace", lambda: jnp.logspace(0.0, 2.0, 5, base=2.0), np.logspace(0.0, 2.0, 5, base=2.0)),
    ("column_stack", lambda: jnp.column_stack([x, xi]), np.column_stack([X64, XI64])),
    ("dstack", lambda: jnp.dstack([m, m]), np.dstack([M64, M64])),
    ("vstack", lambda: jnp.vstack([x, xi]), np.vstack([X64, XI64])),
    ("hstack", lambda: jnp.hstack((m, m)), np.hstack((M64, M64))),
    ("ediff1d", lambda: jnp.ediff1d(m), np.ediff1d(M64)),
    ("lexsort", lambda: jnp.lexsort([x, xi]), np.lexsort([X64, XI64])),
    ("sort_complex", lambda: jnp.sort_complex(x), np.sort(X64)),
    ("poly", lambda: jnp.poly(x[:4]), np.poly(X64[:4])),
    ("hard_silu", lambda: tj.nn.hard_silu(x), X64 * relu6(X64 + 3) / 6),
    ("hard_sigmoid", lambda: tj.nn.hard_sigmoid(x), relu6(X64 + 3) / 6),
    ("relu6", lambda: tj.nn.relu6(x * 2), relu6(X64 * 2)),
    ("selu", lambda: tj.nn.selu(x), 1.0507009873554805 * elu(X64, 1.6732632423543772)),
    ("elu", lambda: tj.nn.elu(x, 0.5), elu(X64, 0.5)),
    ("celu", lambda: tj.nn.celu(x, 2.0), np.maximum(X64, 0) + 2.0 * np.expm1(np.minimum(X64, 0) / 2.0)),
    ("leaky_relu", lambda: tj.nn.leaky_relu(x, 0.1), np.where(X64 >= 0, X64, 0.1 * X64)),
    ("soft_sign", lambda: tj.nn.soft_sign(x), X64 / (1 + np.abs(X64))),
    ("squareplus", lambda: tj.nn.squareplus(x, 2), (X64 + np.sqrt(X64 ** 2 + 2)) / 2),
    ("sparse_plus", lambda: tj.nn.sparse_plus(x / 2), np.where(X64 / 2 <= -1, 0, np.where(X64 / 2 >= 1, X64 / 2,
                                                                                            (X64 / 2 + 1) ** 2 / 4))),
    ("sparse_sigmoid", lambda: tj.nn.sparse_sigmoid(x / 2), np.clip((X64 / 2 + 1) / 2, 0, 1)),
    ("log1mexp", lambda: tj.nn.log1mexp(p), np.log(-np.expm1(-p64))),
    ("mish", lambda: tj.nn.mish(x), X64 * np.tanh(np.log1p(np.exp(X64)))),
    ("log_sigmoid", lambda: tj.nn.log_sigmoid(x), np.log(sigmoid(X64))),
    ("hard_tanh", lambda: tj.nn.hard_tanh(x), np.clip(X64, -1, 1)),
    ("glu", lambda: tj.nn.glu(m, axis=1), M64[:, :3] * sigmoid(M64[:, 3:])),
    ("standardize", lambda: tj.nn.standardize(m, axis=1), rows / np.sqrt((M64 ** 2).mean(1, keepdims=True)
                                                                         - M64.mean(1, keepdims=True) ** 2 + 1e-5)),
    ("logmeanexp", lambda: tj.nn.logmeanexp(m, axis=0), np.log(np.exp(M64).mean(0))),
    ("entr", lambda: tj.scipy.special.entr(p), -p64 * np.log(p64)),
    ("xlogy", lambda: tj.scipy.special.xlogy(m, p), M64 * np.log(p64)),
    ("xlog1py", lambda: tj.scipy.special.xlog1py(m, p), M64 * np.log1p(p64)),
    ("log_ndtr", lambda: tj.scipy.special.log_ndtr(x), np.log(ndtr(X64))),
    ("ndtr", lambda: tj.scipy.special.ndtr(x), ndtr(X64)),
    ("ndtri", lambda: tj.scipy.special.ndtri(jnp.asarray([0.025, 0.5, 0.975])), [-1.959963984540054, 0,
                                                                                1.959963984540054]),
    ("logit", lambda: tj.scipy.special.logit(p), np.log(p64 / (1 - p64))),
    ("gammaln", lambda: tj.scipy.special.gammaln(p * 10), np.vectorize(math.lgamma)(p64 * 10)),
    ("digamma", lambda: tj.scipy.special.digamma(jnp.asarray([1.0, 2.0, 0.5])),
     [-0.5772156649015329, 0.42278433509846713, -1.9635100260214235]),
    ("eigvalsh", lambda: jnp.linalg.eigvalsh(m[:, :4].T @ m[:, :4]), np.linalg.eigvalsh(M64[:, :4].T @ M64[:, :4])),
    ("cholesky", lambda: jnp.linalg.cholesky(m.T @ m + jnp.eye(6)), np.linalg.cholesky(M64.T @ M64 + np.eye(6))),
  ]


def _is_staged(array) -> bool:
  return array.uop.op is Ops.PRIMITIVE and "_layout" in dict(array.uop.arg.params)


def _unstaged(call):
  """What `call` gives with the functions' own code run eagerly (the way before staging)."""
  from tinyjax.lax import _base
  original = _base.EvalTrace.stage_call
  try:
    _base.EvalTrace.stage_call = lambda self, prim, operands, params: (
      None if prim.name in _base._STAGED_NAMES and "_layout" in params else original(self, prim, operands, params))
    return call()
  finally:
    _base.EvalTrace.stage_call = original


@pytest.mark.parametrize("case", range(len(_cases())))
def test_a_staged_call_is_one_node_and_gives_what_the_function_gives(case):
  name, call, want = _cases()[case]
  out = call()
  assert _is_staged(out) and out.uop.arg.prim.name == name
  unstaged = _unstaged(call)
  assert not _is_staged(unstaged)
  assert (out.dtype, out.weak_type, out.shape) == (unstaged.dtype, unstaged.weak_type, unstaged.shape)
  np.testing.assert_array_equal(np.asarray(out), np.asarray(unstaged))
  tolerance = 4e-6 if out.dtype.kind in "fc" else 0  # (float32 results against float64: a few ulp)
  np.testing.assert_allclose(np.asarray(out).astype(np.complex128 if out.dtype.kind == "c" else np.float64), want,
                             rtol=tolerance, atol=tolerance)
  np.testing.assert_array_equal(np.asarray(tj.jit(call)()), np.asarray(out))  # (under jit: the function's body)


def test_python_scalars_are_operands_so_a_loop_over_values_runs_one_program():
  x = jnp.asarray(X64.astype(np.float32))
  np.asarray(jnp.clip(x, -1.0, 1.0))
  lowered = counters.schedules_lowered
  for low in (-3.0, -2.0, 0.5, 1.25):
    np.testing.assert_allclose(np.asarray(jnp.clip(x, low, 2.0)), np.clip(X64, low, 2.0), rtol=1e-6)
    np.testing.assert_allclose(np.asarray(jnp.where(x > low, x, low)), np.where(X64 > low, X64, low), rtol=1e-6)
  assert counters.schedules_lowered - lowered <= 1  # (where's program; clip's was lowered before the loop)
  assert jnp.clip(x, -1, 1).weak_type is False and jnp.where(x > 0, 1.0, 0.0).weak_type is True


def test_a_staged_call_is_expanded_with_its_operands_weak_types():
  """A Python scalar operand of a staged call is weakly typed where the call is made and where it is lowered: under
  x64, the 0 of `where(c, 0, x)` for int32 x takes x's dtype in both (read as a strong int64 where the call was
  expanded, the lowered where computed int64 under a node that said int32, and jnp.unwrap of int32 data failed to
  compile). Also in a loop body's staged call (`fori_loop`), and values against numpy."""
  from tinyjax.lower.schedule import expand_primitives
  from tinyjax.uop import UOp
  with tj.config.override("jax_enable_x64", True):
    x = jnp.asarray(np.array([3, -2, 5, -7], np.int32))
    result = jnp.where(x > 0, 0, x)
    node = result.uop
    assert node.op is Ops.PRIMITIVE and node.arg.in_weak == (False, True, False) and result.dtype == np.int32
    (expanded,) = expand_primitives(UOp(Ops.SINK, node.dtype, (node,))).src
    assert expanded.dtype == np.int32
    assert all(src.dtype == n.dtype for n in expanded.toposort if n.op in (Ops.ADD, Ops.MUL) for src in n.src)
    np.testing.assert_array_equal(np.asarray(result), np.array([0, -2, 0, -7], np.int32))
    looped = tj.jit(lambda v: tj.lax.fori_loop(0, 2, lambda i, c: jnp.where(c > 0, 0, c) + 1, v))(x)
    assert looped.dtype == np.int32
    np.testing.assert_array_equal(np.asarray(looped), np.array([1, 0, 1, -5], np.int32))
    np.testing.assert_array_equal(np.asarray(jnp.unwrap(np.array([0, 5, 9, 2, 7], np.int32), period=10)),
                                  np.array([0, 5, 9, 12, 17], np.int32))


def test_python_scalar_operands_are_made_once_per_value():
  """A staged call's Python scalar operand is one weakly typed 0-d node per (type, value, x64), kept across calls
  (lax/_base.py `_scalar_operand`): -0.0 is not 0.0, x64 gives 64-bit operands, and an int out of range runs the
  function itself (its OverflowError)."""
  from tinyjax.lax import _base
  x = jnp.asarray(X64.astype(np.float32))
  first = jnp.clip(x, 1, 5)
  kept = dict(_base._SCALAR_OPERANDS)
  second = jnp.clip(x, 1, 5)
  assert (int, 1, False) in kept and _base._SCALAR_OPERANDS.keys() == kept.keys()  # (the second call made none)
  assert all(_base._SCALAR_OPERANDS[key] is operand for key, operand in kept.items())
  assert first.uop.src[1] is second.uop.src[1] and first.uop.src[2] is second.uop.src[2]
  assert jnp.clip(x, 1.0, 5).uop.src[1] is not first.uop.src[1]  # (a float 1.0 is not the int 1)
  zero, negative_zero = jnp.where(x > 0, x, 0.0), jnp.where(x > 0, x, -0.0)
  assert zero.uop.src[2] is not negative_zero.uop.src[2]
  assert np.signbit(np.asarray(negative_zero)[X64 <= 0]).all() and not np.signbit(np.asarray(zero)).any()
  with tj.config.override("jax_enable_x64", True):
    assert jnp.clip(x, 1, 5).uop.src[1].dtype == np.int64
  assert first.uop.src[1].dtype == np.int32
  np.testing.assert_array_equal(np.asarray(first), np.clip(X64.astype(np.float32), 1, 5))
  with pytest.raises(OverflowError):
    jnp.clip(x, 2 ** 40, 2 ** 41)


def test_what_does_not_stage_runs_the_function():
  x = jnp.asarray(X64.astype(np.float32))
  # numpy data and lists: the function, as before
  np.testing.assert_array_equal(np.asarray(jnp.take(X64.astype(np.float32), [1, 2])), X64.astype(np.float32)[[1, 2]])
  np.testing.assert_allclose(np.asarray(jnp.mean(x, axis=[0])), X64.mean(), rtol=1e-6)  # (an unhashable axis)
  assert not _is_staged(jnp.take(X64.astype(np.float32), [1, 2]))
  # a value-dependent call (nonzero's size comes from the values): the function, each time
  for _ in range(2):
    np.testing.assert_array_equal(np.asarray(jnp.where(x > 0)[0]), np.nonzero(X64 > 0)[0])
  assert jnp.meshgrid() == []  # (a call of no results)
  # jaxprs show the function's body, not a call
  jaxpr = str(tj.make_jaxpr(lambda v: jnp.take(v, jnp.asarray([1, 2])))(x))
  assert "gather" in jaxpr and "take" not in jaxpr
  # a lazy staged node used inside a jitted function and a gradient (a constant of the trace)
  taken = jnp.take(x, jnp.asarray([0, 5, 7]))
  np.testing.assert_allclose(np.asarray(tj.jit(lambda v: v * taken)(jnp.ones(3))), X64[[0, 5, 7]], rtol=1e-6)
  np.testing.assert_allclose(np.asarray(tj.grad(lambda v: (v * jnp.clip(x, 0, 1)[:3]).sum())(jnp.ones(3))),
                             np.clip(X64, 0, 1)[:3], rtol=1e-6)


def test_errors_are_the_functions_own():
  x, m = jnp.asarray(X64.astype(np.float32)), jnp.asarray(M64.astype(np.float32))
  for _ in range(2):  # (the second time from the cached failed evaluation)
    with pytest.raises(ValueError, match="axis"):
      jnp.take(x, jnp.asarray([1]), axis=3)
    with pytest.raises(ValueError, match="axis"):
      jnp.argsort(m, axis=2)
    with pytest.raises(ValueError, match="mode"):
      jnp.take(x, jnp.asarray([1]), mode="bogus")
    with pytest.raises(TypeError, match="integer"):
      jnp.take(x, jnp.asarray([1.0]))
    with pytest.raises(TypeError, match="different numbers of dimensions"):
      jnp.concatenate([x, m])
    with pytest.raises(ValueError):
      jnp.stack([x, x[:3]])
  with pytest.raises(OverflowError):
    jnp.clip(x, 2 ** 40, None)


def test_staged_functions_under_transformations():
  """grad (finite differences, float64), vmap (against a loop) and their compositions with jit go through the
  functions' bodies; the eager results they close over are staged nodes."""
  with tj.config.override("jax_enable_x64", True):
    x = jnp.asarray(X64)
    index = jnp.asarray(np.array([2, 5, 5, 9]))

    def loss(v):
      picked = jnp.take(jnp.clip(v, -2.5, 3.0), index)
      return jnp.mean(jnp.where(picked > 0, picked ** 2, -picked)) + jnp.linalg.norm(v) + \
          (jnp.stack([v, v * 2]) ** 2).sum() * 1e-2 + (tj.nn.one_hot(index, 12) @ v).sum()
    numeric = numeric_grad(lambda v: float(loss(jnp.asarray(v))), X64, eps=1e-6)
    np.testing.assert_allclose(np.asarray(tj.grad(loss)(x)), numeric, rtol=1e-6, atol=1e-8)
    np.testing.assert_allclose(np.asarray(tj.jit(tj.grad(loss))(x)), numeric, rtol=1e-6, atol=1e-8)
    rows = jnp.asarray(np.stack([X64, -X64, X64 * 0.5]))
    per_row = np.stack([np.asarray(tj.grad(loss)(rows[k])) for k in range(3)])
    np.testing.assert_allclose(np.asarray(tj.vmap(tj.grad(loss))(rows)), per_row, rtol=1e-10)
    np.testing.assert_allclose(np.asarray(tj.jit(tj.vmap(tj.grad(loss)))(rows)), per_row, rtol=1e-10)
    np.testing.assert_allclose(np.asarray(tj.vmap(tj.jit(loss))(rows)), [float(loss(rows[k])) for k in range(3)],
                               rtol=1e-12)


def _multiple_cases():
  x, m = jnp.asarray(X64.astype(np.float32)), jnp.asarray(M64.astype(np.float32))
  square64 = M64[:, :4] + 4 * np.eye(4)
  square = jnp.asarray(square64.astype(np.float32))
  sign, logdet = np.linalg.slogdet(square64)
  q64, r64 = np.linalg.qr(square64)
  counts, edges = np.histogram(X64, bins=4)
  top = np.sort(X64)[::-1][:3]
  return [  # (name, call, float64 numpy reference of each result; None: checked against the function alone)
    ("split", lambda: jnp.split(x, 3), np.split(X64, 3)),
    ("array_split", lambda: jnp.array_split(m, 3, axis=1), np.array_split(M64, 3, axis=1)),
    ("meshgrid", lambda: jnp.meshgrid(x[:3], x[3:5], indexing="ij"), np.meshgrid(X64[:3], X64[3:5], indexing="ij")),
    ("frexp", lambda: jnp.frexp(x), np.frexp(X64.astype(np.float32))),
    ("modf", lambda: jnp.modf(x), np.modf(X64)),
    ("divmod", lambda: jnp.divmod(x, 1.5), np.divmod(X64.astype(np.float32), np.float32(1.5))),
    ("slogdet", lambda: jnp.linalg.slogdet(square), (sign, logdet)),
    ("eigh", lambda: jnp.linalg.eigh(square.T @ square)[:1], (np.linalg.eigvalsh(square64.T @ square64),)),
    ("svd", lambda: jnp.linalg.svd(m, compute_uv=False), np.linalg.svd(M64, compute_uv=False)),
    ("svd", lambda: jnp.linalg.svd(m, full_matrices=False), None),
    ("qr", lambda: jnp.linalg.qr(square), (q64 * np.sign(np.diag(r64)), (r64.T * np.sign(np.diag(r64))).T)),
    ("unique", lambda: jnp.unique(jnp.asarray(XI64), size=6, fill_value=-1),
     np.pad(np.unique(XI64), (0, max(0, 6 - len(np.unique(XI64)))), constant_values=-1)[:6]),
    ("histogram", lambda: jnp.histogram(x, bins=4), (counts, edges)),
    ("sort_key_val", lambda: tj.lax.sort_key_val(x, jnp.asarray(XI64)), (np.sort(X64), XI64[np.argsort(X64)])),
    ("top_k", lambda: tj.lax.top_k(x, 3), (top, np.argsort(-X64)[:3])),
  ]


@pytest.mark.parametrize("case", range(len(_multiple_cases())))
def test_a_staged_call_of_several_results_rebuilds_the_functions_sequence(case):
  """A function returning a tuple, list or namedtuple (or, for some arguments, one array) is one node with a result
  per array; the call gives the function's own container, each array bit for bit the function's, and numpy's values
  (`qr` up to the signs of Q's columns, taken from R's diagonal, as numpy's and LAPACK's agree on neither)."""
  name, call, want = _multiple_cases()[case]
  out, unstaged = call(), _unstaged(call)
  assert type(out) is type(unstaged)
  outs = [out] if isinstance(out, tj.Array) else list(out)
  theirs = [unstaged] if isinstance(unstaged, tj.Array) else list(unstaged)
  assert len(outs) == len(theirs)
  nodes = {a.uop.src[0] if a.uop.op is Ops.PROJECT else a.uop for a in outs}
  assert len(nodes) == 1 and _is_staged(tj.Array(nodes.pop())), name
  for mine, other in zip(outs, theirs):
    assert (mine.dtype, mine.weak_type, mine.shape) == (other.dtype, other.weak_type, other.shape)
    np.testing.assert_array_equal(np.asarray(mine), np.asarray(other))
  if name == "qr":
    q, r = (np.asarray(a, np.float64) for a in outs)
    signs = np.sign(np.diag(r))
    outs = [q * signs, (r.T * signs).T]
  if want is not None:
    for mine, reference in zip(outs, [want] if isinstance(want, np.ndarray) else want):
      np.testing.assert_allclose(np.asarray(mine).astype(np.float64), reference, rtol=4e-5, atol=4e-5)


def test_a_staged_call_runs_its_host_steps_once(monkeypatch):
  """A multiple-result staged call finds its container by tracing, not by running the function: slogdet's LU runs
  once, where the node is computed (and not at all until then). (A matrix bigger than lax/_small_linalg.py's, whose
  LU is a call into Python.)"""
  from tinyjax.lax import _lapack
  calls = []
  original = _lapack.getrf
  monkeypatch.setattr(_lapack, "getrf", lambda *args, **kwargs: calls.append(1) or original(*args, **kwargs))
  square = np.random.default_rng(5).uniform(-1, 1, (40, 40)) + 4 * np.eye(40)
  for k in range(2):
    sign, logdet = jnp.linalg.slogdet(jnp.asarray(square.astype(np.float32) * (k + 1)))
    assert len(calls) == k
    np.testing.assert_allclose(float(logdet), np.linalg.slogdet(square * (k + 1))[1], rtol=1e-6)
    assert len(calls) == k + 1
