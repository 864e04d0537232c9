"""Convolution and windowed reductions: JAX 0.10's outputs for 17 configurations (dimension numbers, strides, SAME /
VALID / explicit and negative padding, lhs and rhs dilation, feature and batch groups, 1-D, conv_transpose, pooling and
gradients; tests/data/conv_reference.npz), a numpy float64 im2col reference, finite differences, vmap and errors."""
import os
import re

import numpy as np
import pytest

import tinyjax as tj
import tinyjax.numpy as tnp
from tests.data.make_conv_reference import conv_cases
from tinyjax import lax
from tinyjax.uop import Ops

REFERENCE = np.load(os.path.join(os.path.dirname(os.path.abspath(__file__)), "data", "conv_reference.npz"))
OURS = {}


def _ours():
  if not OURS: OURS.update({name: np.asarray(value) for name, value in conv_cases(lax, tnp, tj.grad).items()})
  return OURS


@pytest.mark.parametrize("name", sorted(REFERENCE.files))
def test_matches_jax(name):
  got, want = _ours()[name], REFERENCE[name]
  assert got.shape == want.shape and got.dtype == want.dtype
  np.testing.assert_allclose(got, want, rtol=2e-5, atol=2e-5)


def numpy_conv(x, w, stride, padding, dilation=(1, 1)):
  """NCHW / OIHW cross-correlation in float64 by im2col."""
  x = np.pad(x.astype(np.float64), ((0, 0), (0, 0), padding[0], padding[1]))
  kh, kw = w.shape[2:]
  (sh, sw), (dh, dw) = stride, dilation
  oh = (x.shape[2] - (kh - 1) * dh - 1) // sh + 1
  ow = (x.shape[3] - (kw - 1) * dw - 1) // sw + 1
  out = np.zeros((x.shape[0], w.shape[0], oh, ow))
  for a in range(kh):
    for b in range(kw):
      window = x[:, :, a * dh:a * dh + (oh - 1) * sh + 1:sh, b * dw:b * dw + (ow - 1) * sw + 1:sw]
      out += np.einsum("nchw,oc->nohw", window, w[:, :, a, b].astype(np.float64))
  return out


@pytest.mark.parametrize("stride,padding,dilation", [((1, 1), ((1, 1), (1, 1)), (1, 1)),
                                                     ((2, 3), ((0, 2), (1, 0)), (1, 1)),
                                                     ((1, 1), ((2, 2), (2, 2)), (2, 2))])
def test_matches_numpy_im2col(stride, padding, dilation):
  rng = np.random.default_rng(1)
  x = rng.standard_normal((2, 5, 11, 10)).astype(np.float32)
  w = rng.standard_normal((7, 5, 3, 3)).astype(np.float32)
  got = lax.conv_general_dilated(x, w, stride, padding, rhs_dilation=dilation)
  np.testing.assert_allclose(np.asarray(got), numpy_conv(x, w, stride, padding, dilation), rtol=1e-4, atol=1e-4)
  jitted = tj.jit(lambda a, b: lax.conv_general_dilated(a, b, stride, padding, rhs_dilation=dilation))(x, w)
  np.testing.assert_allclose(np.asarray(jitted), np.asarray(got), rtol=1e-6, atol=1e-6)


def test_gradients_vmap_and_pooling_helpers():
  rng = np.random.default_rng(2)
  x = rng.standard_normal((1, 2, 5, 5)).astype(np.float32)
  w = rng.standard_normal((3, 2, 2, 2)).astype(np.float32)

  def loss(w):
    return (tnp.tanh(lax.conv_general_dilated(x, w, (1, 2), "SAME")) ** 2).sum()
  grad = np.asarray(tj.grad(loss)(tnp.asarray(w)))
  eps, numeric = 1e-2, np.zeros_like(w, dtype=np.float64)
  for index in np.ndindex(w.shape):
    step = np.zeros_like(w)
    step[index] = eps
    numeric[index] = (float(loss(tnp.asarray(w + step))) - float(loss(tnp.asarray(w - step)))) / (2 * eps)
  np.testing.assert_allclose(grad, numeric, rtol=2e-2, atol=2e-2)
  xs = rng.standard_normal((4, 2, 5, 5)).astype(np.float32)
  batched = tj.vmap(lambda image: lax.conv(image[None], w, (1, 1), "VALID")[0])(xs)
  np.testing.assert_allclose(np.asarray(batched), np.asarray(lax.conv(xs, w, (1, 1), "VALID")), rtol=1e-5, atol=1e-5)
  ws = np.stack([w, 2 * w])
  per_kernel = tj.jit(tj.vmap(lambda k: lax.conv(x, k, (1, 1), "VALID")))(ws)
  np.testing.assert_allclose(np.asarray(per_kernel)[1], 2 * np.asarray(per_kernel)[0], rtol=1e-5, atol=1e-5)
  nhwc = np.transpose(xs, (0, 2, 3, 1))
  pooled = lax.reduce_window(nhwc, 0.0, lax.add, (1, 2, 2, 1), (1, 2, 2, 1), "VALID") / 4
  want = nhwc[:, :4, :4].reshape(4, 2, 2, 2, 2, 2).mean(axis=(2, 4))
  np.testing.assert_allclose(np.asarray(pooled), want, rtol=1e-5, atol=1e-6)
  grad = tj.grad(lambda v: lax.reduce_window(v, -tnp.inf, lax.max, (2, 2), (2, 2), "VALID").sum())(
    tnp.asarray(np.array([[1.0, 5.0], [2.0, 3.0]], np.float32)))
  np.testing.assert_array_equal(np.asarray(grad), [[0, 1], [0, 0]])
  np.testing.assert_allclose(np.asarray(tnp.convolve(np.arange(5.0), np.array([1.0, 2.0, 0.5]), mode="same")),
                             np.convolve(np.arange(5.0), [1.0, 2.0, 0.5], mode="same"), rtol=1e-6)


def test_conv_errors():
  x, w = tnp.ones((1, 4, 5, 5)), tnp.ones((2, 4, 3, 3))
  with pytest.raises(TypeError, match="same dtypes"):
    lax.conv(x, w.astype(tnp.int32), (1, 1), "SAME")
  with pytest.raises(ValueError, match="feature"):  # a channel mismatch is a ValueError in JAX
    lax.conv(x, tnp.ones((2, 3, 3, 3)), (1, 1), "SAME")
  with pytest.raises(ValueError, match="feature_group_count"):
    lax.conv_general_dilated(x, tnp.ones((3, 2, 3, 3)), (1, 1), "SAME", feature_group_count=3)
  with pytest.raises(ValueError, match="padding"):
    lax.conv(x, w, (1, 1), "FULL")
  with pytest.raises(ValueError, match="spec"):
    lax.conv_general_dilated(x, w, (1, 1), "SAME", dimension_numbers=("NCHW", "OIHX", "NNHW"))
  with pytest.raises(TypeError, match="window_dimensions"):
    lax.reduce_window(x, 0.0, lax.add, (2, 2), (1, 1), "VALID")
  with pytest.raises(NotImplementedError, match="computation"):
    lax.reduce_window(x, 0.0, lambda a, b: a - b, (1, 1, 2, 2), (1, 1, 1, 1), "VALID")


@pytest.mark.parametrize("config", [
  dict(window_strides=(2, 1), padding="SAME"),
  dict(window_strides=(1, 1), padding=[(2, 0), (1, 1)], rhs_dilation=(2, 1)),
  dict(window_strides=(1, 2), padding=[(1, 1), (0, 2)], lhs_dilation=(2, 2)),
  dict(window_strides=(1, 1), padding="VALID", feature_group_count=2),
  dict(window_strides=(2, 2), padding="SAME", batch_group_count=2),
  dict(window_strides=(1, 1), padding="SAME", dimension_numbers=("NHWC", "HWIO", "NHWC")),
], ids=["stride", "rhs_dilation", "lhs_dilation", "feature_groups", "batch_groups", "nhwc"])
def test_convolution_transposes_match_the_decomposition(config):
  """The gradients are JAX's transposed convolutions; they must equal the derivative of the movement-op
  decomposition itself (differentiated op by op)."""
  from tinyjax.lax._conv import _conv_impl, conv_general_dilated_p
  rng = np.random.default_rng(6)
  nhwc = "dimension_numbers" in config
  x = rng.standard_normal((4, 7, 6, 4) if nhwc else (4, 4, 7, 6)).astype(np.float32)
  groups = config.get("feature_group_count", 1)
  w = rng.standard_normal((3, 2, 4, 6) if nhwc else (6, 4 // groups, 3, 2)).astype(np.float32)
  out = lax.conv_general_dilated(x, w, **config)
  weights = tnp.asarray(rng.standard_normal(out.shape).astype(np.float32))
  captured = {}
  original = conv_general_dilated_p.bind

  def capture(*operands, **params):
    captured.update(params)
    return original(*operands, **params)
  conv_general_dilated_p.bind = capture
  try:
    lax.conv_general_dilated(x, w, **config)
  finally:
    conv_general_dilated_p.bind = original

  def by_primitive(a, b): return (lax.conv_general_dilated(a, b, **config) * weights).sum()
  def by_decomposition(a, b): return (_conv_impl(a, b, **captured) * weights).sum()
  got = tj.grad(by_primitive, argnums=(0, 1))(tnp.asarray(x), tnp.asarray(w))
  want = tj.grad(by_decomposition, argnums=(0, 1))(tnp.asarray(x), tnp.asarray(w))
  for g, v in zip(got, want): np.testing.assert_allclose(np.asarray(g), np.asarray(v), rtol=1e-4, atol=1e-4)
  tangent = tj.jvp(lambda b: by_primitive(tnp.asarray(x), b), (tnp.asarray(w),), (tnp.ones(w.shape),))[1]
  assert float(tangent) == pytest.approx(float(tnp.sum(got[1])), rel=1e-4)


def test_convolution_inside_a_scan_differentiates():
  rng = np.random.default_rng(7)
  x = tnp.asarray(rng.standard_normal((3, 1, 2, 6, 6)).astype(np.float32))
  w = tnp.asarray(rng.standard_normal((2, 2, 3, 3)).astype(np.float32))

  def scanned(k): return lax.scan(lambda c, xi: (c + (lax.conv(xi, k, (1, 1), "SAME") ** 2).sum(), None), 0.0, x)[0]
  def unrolled(k): return sum((lax.conv(x[i], k, (1, 1), "SAME") ** 2).sum() for i in range(3))
  np.testing.assert_allclose(np.asarray(tj.grad(scanned)(w)), np.asarray(tj.grad(unrolled)(w)), rtol=1e-5)


def test_jax_edge_cases():
  rng = np.random.default_rng(5)
  # the spatial axes are ordered by the kernel spec (JAX): lhs 'NWHC' with kernel 'WHIO' and output 'CNHW' puts W
  # first in the output's 'HW' positions
  x = rng.standard_normal((2, 7, 5, 3)).astype(np.float32)  # N W H C
  w = rng.standard_normal((3, 2, 3, 4)).astype(np.float32)  # W H I O
  got = lax.conv_general_dilated(x, w, (1, 1), "VALID", dimension_numbers=("NWHC", "WHIO", "CNHW"))
  want = numpy_conv(np.transpose(x, (0, 3, 1, 2)), np.transpose(w, (3, 2, 0, 1)), (1, 1), ((0, 0), (0, 0)))
  assert got.shape == (4, 2, 4, 5)  # (C, N, H, W)
  np.testing.assert_allclose(np.asarray(got), np.transpose(want, (1, 0, 3, 2)), rtol=1e-5, atol=1e-5)
  # a window that never fits gives an empty result (and its gradient is zero)
  empty = lax.conv(tnp.ones((1, 3, 2, 5)), tnp.ones((6, 3, 3, 3)), (1, 1), "VALID")
  assert empty.shape == (1, 6, 0, 3)
  zero = tj.grad(lambda v: lax.conv(v, tnp.ones((6, 3, 3, 3)), (1, 1), "VALID").sum())(tnp.ones((1, 3, 2, 5)))
  np.testing.assert_array_equal(np.asarray(zero), np.zeros((1, 3, 2, 5)))
  assert lax.reduce_window(tnp.ones((2, 5)), 0.0, lax.add, (3, 2), (1, 1), "VALID").shape == (0, 4)
  # integer inputs to jnp.convolve/correlate give float32, as JAX
  a, v = np.arange(5, dtype=np.int32), np.array([1, 3, -2], np.int32)
  for fn, mode in ((tnp.convolve, "full"), (tnp.correlate, "valid")):
    out = fn(a, v, mode=mode)
    assert out.dtype == np.float32
    np.testing.assert_array_equal(np.asarray(out), getattr(np, fn.__name__)(a, v, mode=mode))


@pytest.mark.parametrize("a,b", [((2, 3), (4, 5)), ((3,), (2, 2)), ((2, 1, 3), (3,)), ((), (3,)), ((2, 2), ())])
def test_kron_shapes(a, b):
  x = np.arange(1, 1 + int(np.prod(a)), dtype=np.float32).reshape(a)
  y = np.arange(2, 2 + int(np.prod(b)), dtype=np.float32).reshape(b)
  got = tnp.kron(x, y)
  want = np.kron(x.astype(np.float64), y.astype(np.float64))
  assert got.shape == want.shape
  np.testing.assert_array_equal(np.asarray(got), want)


def test_pooling_gradient_goes_to_the_first_extremum_as_jax():
  """Max/min pooling's gradient is JAX's select_and_gather_add: the first maximal (minimal) element of each window in
  window order gets the whole cotangent, tied ones nothing. Expected values are JAX 0.10.2's."""
  x = tnp.asarray(np.array([[1, 5, 5, 2], [5, 3, 0, 0], [1, 1, 1, 1], [1, 1, 1, 1]], np.float32))

  def max_pool(v): return lax.reduce_window(v, -tnp.inf, lax.max, (2, 2), (2, 2), "VALID").sum()

  def min_pool(v): return lax.reduce_window(v, tnp.inf, lax.min, (2, 2), (1, 1), "SAME").sum()
  want_max = [0, 1, 1, 0, 0, 0, 0, 0, 1, 0, 1, 0, 0, 0, 0, 0]
  want_min = [1, 0, 0, 0, 0, 0, 4, 2, 2, 1, 1, 1, 1, 1, 1, 1]
  for transform in (lambda g: g, tj.jit):
    np.testing.assert_array_equal(np.asarray(transform(tj.grad(max_pool))(x)).ravel(), want_max)
    got = np.asarray(transform(tj.grad(min_pool))(x)).ravel()
    np.testing.assert_array_equal(got, want_min)
    assert not np.signbit(got).any()
  batched = np.asarray(tj.vmap(tj.grad(max_pool))(tnp.stack([x, -x])))
  np.testing.assert_array_equal(batched[0].ravel(), want_max)
  np.testing.assert_array_equal(batched[1].ravel(), [1, 0, 0, 0, 0, 0, 1, 0, 1, 0, 1, 0, 0, 0, 0, 0])
  # without ties the gradient is the derivative (finite differences), window dilation and padding included
  rng = np.random.default_rng(3)
  v = rng.standard_normal((5, 7)).astype(np.float64)

  def pooled(a): return (lax.reduce_window(a, -tnp.inf, lax.max, (3, 2), (1, 2), ((1, 1), (0, 1)),
                                           window_dilation=(1, 2)) ** 2).sum()
  grad = np.asarray(tj.grad(pooled)(tnp.asarray(v.astype(np.float32))))
  numeric = np.zeros_like(v)
  for index in np.ndindex(v.shape):
    step = np.zeros_like(v)
    step[index] = 1e-3
    numeric[index] = (float(pooled(tnp.asarray((v + step).astype(np.float32)))) -
                      float(pooled(tnp.asarray((v - step).astype(np.float32))))) / 2e-3
  np.testing.assert_allclose(grad, numeric, rtol=1e-2, atol=1e-2)

  def in_scan(a):  # the rule also applies inside a loop body
    def body(c, _): return c + lax.reduce_window(a * c, -tnp.inf, lax.max, (2, 2), (2, 2), "VALID").sum(), None
    return lax.scan(body, 1.0, None, length=3)[0]
  np.testing.assert_array_equal(np.asarray(tj.grad(in_scan)(x)).ravel(), 507 * np.array(want_max))


def test_non_overlapping_windows_are_a_reshape_view():
  """Windows that don't overlap (pooling with stride >= window) are cut out by pads, shrinks and reshapes only: no
  tiled broadcast, whose transpose (the pooling gradient) would be a sum over copies with heavy index arithmetic."""
  from tinyjax.lax._conv import _windows
  from tinyjax.uop import Ops
  x = tnp.asarray(np.arange(2 * 7 * 9, dtype=np.float32).reshape(2, 7, 9))
  for sizes, strides, dilations in [((2, 2), (2, 2), (1, 1)), ((2, 3), (3, 4), (1, 1)), ((2, 2), (4, 3), (2, 1))]:
    view, out = _windows(x, (1, 2), sizes, strides, dilations)
    assert not any(node.op is Ops.EXPAND for node in view.uop.toposort)
    host = np.asarray(x)
    for o1, k1, o2, k2 in np.ndindex(out[0], sizes[0], out[1], sizes[1]):
      want = host[:, o1 * strides[0] + k1 * dilations[0], o2 * strides[1] + k2 * dilations[1]]
      np.testing.assert_array_equal(np.asarray(view)[:, o1, k1, o2, k2], want)
  overlapping, _ = _windows(x, (1,), (3,), (1,), (1,))
  assert any(node.op is Ops.EXPAND for node in overlapping.uop.toposort)


def _flat_calls(monkeypatch) -> list:
  """Count the convolutions lowered as one flat GEMM (lax/_conv.py `_flat_conv`)."""
  from tinyjax.lax import _conv
  calls, original = [], _conv._flat_conv
  monkeypatch.setattr(_conv, "_flat_conv", lambda *a, **k: calls.append(1) or original(*a, **k))
  return calls


@pytest.mark.parametrize("shape,kernel,padding", [
  ((2, 3, 9, 8), (4, 3, 8, 7), ((0, 0), (0, 0))),   # the kernel covers all but a 2x2 of the input
  ((2, 3, 7, 6), (5, 3, 8, 7), ((1, 1), (0, 2))),   # padded: the grid is the padded input
  ((1, 2, 5, 1, 5), (3, 2, 4, 1, 5), ((0, 0), (0, 0), (1, 0))),  # 3-D, a length-1 axis
])
def test_wide_kernels_are_one_flat_gemm(monkeypatch, shape, kernel, padding):
  calls = _flat_calls(monkeypatch)
  rng = np.random.default_rng(8)
  x, w = rng.standard_normal(shape).astype(np.float32), rng.standard_normal(kernel).astype(np.float32)
  got = tj.jit(lambda a, b: lax.conv_general_dilated(a, b, (1,) * (x.ndim - 2), padding))(x, w)
  assert calls, "the convolution was not lowered as a flat GEMM"
  if x.ndim == 5:  # the 3-D case with its length-1 axis dropped is a 2-D one
    x, w, padding = x[:, :, :, 0], w[:, :, :, 0], (padding[0], padding[2])
  want = numpy_conv(x, w, (1, 1), padding)
  np.testing.assert_allclose(np.asarray(got).reshape(want.shape), want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("padding,dilation,numbers,flat", [
  ("SAME", (1, 1), None, True), ("VALID", (2, 2), None, False),  # dilated: the gradient's conv is strided
  ([(2, 0), (0, 1)], (1, 1), ("NHWC", "HWIO", "NHWC"), True)])
def test_weight_gradient_as_flat_gemm_matches_numpy(monkeypatch, padding, dilation, numbers, flat):
  """The weight gradient of a stride-1 convolution is a convolution whose window is the output's extent (the flat
  GEMM's case): against dw[o, c, a, b] = sum g[n, o, h, w] * xpad[n, c, h + a*d, w + b*d] in float64."""
  calls = _flat_calls(monkeypatch)
  rng = np.random.default_rng(9)
  x = rng.standard_normal((3, 4, 10, 9)).astype(np.float32)
  w = rng.standard_normal((5, 4, 3, 3)).astype(np.float32)
  pads = lax.padtype_to_pads((10, 9), [(k - 1) * d + 1 for k, d in zip((3, 3), dilation)], (1, 1), padding) \
      if isinstance(padding, str) else padding
  g = rng.standard_normal(numpy_conv(x, w, (1, 1), pads, dilation).shape).astype(np.float32)
  to_layout = (lambda a, spec: a) if numbers is None else \
      (lambda a, spec: np.transpose(a, ["NCHW".index(c) if spec != "HWIO" else "OIHW".index(c) for c in spec]))
  xs, ws = to_layout(x, "NHWC"), to_layout(w, "HWIO")
  gs = to_layout(g, "NHWC")

  def loss(b): return (lax.conv_general_dilated(xs, b, (1, 1), padding, rhs_dilation=dilation,
                                                dimension_numbers=numbers) * gs).sum()
  got = np.asarray(tj.jit(tj.grad(loss))(ws))
  assert bool(calls) == flat
  xp = np.pad(x.astype(np.float64), ((0, 0), (0, 0), *pads))
  if flat:  # the flat GEMM's rows (NCHW: after a transposing copy) read the input through its padding, in one pass
    from tinyjax.lower.schedule import kernels_of
    padded = "e_" + "_".join(map(str, to_layout(xp, "NHWC").shape)) + "_"
    kernels = kernels_of(tj.jit(tj.grad(loss)).lower(ws)._compiled.schedule.schedule.kernels)
    assert len(kernels) > 1 and not any(kernel.name.startswith(padded) for kernel in kernels)
    if numbers is None:  # the input and the output gradient copied channels last first (register transposes)
      names = [kernel.name for kernel in kernels]
      assert any(name.startswith("e_3_10_9_4_") for name in names), names
      assert any(name.startswith(f"e_3_{g.shape[2]}_{g.shape[3]}_5_") for name in names), names
  oh, ow = g.shape[2:]
  want = np.zeros(w.shape)
  for a in range(3):
    for b in range(3):
      window = xp[:, :, a * dilation[0]:a * dilation[0] + oh, b * dilation[1]:b * dilation[1] + ow]
      want[:, :, a, b] = np.einsum("nohw,nchw->oc", g.astype(np.float64), window)
  np.testing.assert_allclose(got, to_layout(want, "HWIO"), rtol=1e-4, atol=1e-4)
  # composed: per-example weight gradients (vmap of grad, jitted) against the loop over examples
  def per_example(xi, gi):
    return tj.grad(lambda b: (lax.conv_general_dilated(xi[None], b, (1, 1), padding, rhs_dilation=dilation,
                                                       dimension_numbers=numbers) * gi[None]).sum())(ws)
  batched = np.asarray(tj.jit(tj.vmap(per_example))(xs, gs))
  looped = np.stack([np.asarray(per_example(xs[i], gs[i])) for i in range(3)])
  np.testing.assert_allclose(batched, looped, rtol=1e-4, atol=1e-4)
  np.testing.assert_allclose(batched.sum(0), got, rtol=1e-4, atol=1e-4)


def test_gradient_with_a_wider_preferred_element_type():
  """bfloat16 inputs with float32 results: the cotangent is float32, the transposed convolutions run in float32 and
  the gradients come back in bfloat16, as in JAX (they equal the float32 gradients of the same values, rounded)."""
  import ml_dtypes
  rng = np.random.default_rng(10)
  x = rng.standard_normal((2, 6, 6, 3)).astype(ml_dtypes.bfloat16)
  w = rng.standard_normal((3, 3, 3, 4)).astype(ml_dtypes.bfloat16)
  numbers = ("NHWC", "HWIO", "NHWC")

  def loss(a, b, out=np.float32):
    return (lax.conv_general_dilated(a, b, (1, 1), "SAME", dimension_numbers=numbers,
                                     preferred_element_type=out) ** 2).sum()
  got = tj.jit(tj.grad(loss, argnums=(0, 1)))(tnp.asarray(x), tnp.asarray(w))
  want = tj.grad(loss, argnums=(0, 1))(tnp.asarray(x.astype(np.float32)), tnp.asarray(w.astype(np.float32)))
  for g, v in zip(got, want):
    assert g.dtype == ml_dtypes.bfloat16
    np.testing.assert_allclose(np.asarray(g).astype(np.float32), np.asarray(v), rtol=1e-2, atol=1e-1)


def test_padded_input_is_copied_in_its_own_layout():
  """The zero-padded copies of an NHWC input are written NHWC, reading the fused values that feed it in their order,
  not transposed to NCHW (ResNet-50's backward pass: 117 ms -> gone); dilated by 2, the input is not interleaved
  with zeros at all: each output phase's convolution reads it padded (`_phase_conv`). Values against the
  reference."""
  rng = np.random.default_rng(5)
  x = rng.standard_normal((2, 6, 6, 16)).astype(np.float32)
  w = rng.standard_normal((3, 3, 16, 8)).astype(np.float32)

  def f(x, w):
    return lax.conv_general_dilated(tnp.exp(x), w, (1, 1), ((1, 1), (1, 1)), lhs_dilation=(2, 2),
                                    dimension_numbers=("NHWC", "HWIO", "NHWC"))

  with tj.profile() as prof:
    got = np.asarray(tj.jit(f)(x, w))
  names = [k.name for k in prof.kernels]
  assert any(name.startswith("e_2_7_7_16_") for name in names), names
  assert not any(name.startswith("e_2_13_13_") or "_16_13_13_" in name or "_16_7_7_" in name for name in names), names
  ref = np.zeros((2, 11, 11, 16), np.float64)
  ref[:, ::2, ::2] = np.exp(x.astype(np.float64))
  ref = np.pad(ref, ((0, 0), (1, 1), (1, 1), (0, 0)))
  windows = np.stack([ref[:, i:i + 11, j:j + 11] for i in range(3) for j in range(3)], axis=3)  # (2, 11, 11, 9, 16)
  np.testing.assert_allclose(got, np.einsum("nhwkc,kco->nhwo", windows, w.reshape(9, 16, 8)), rtol=1e-5, atol=1e-5)


def _max_pool_grad_reference(x: np.ndarray, ct: np.ndarray, window: tuple[int, int], strides: tuple[int, int],
                             dilation: tuple[int, int]) -> np.ndarray:
  """The gradient of a VALID max pool over axes 1, 2 of NHWC `x`: each window's cotangent to its first maximum."""
  grad = np.zeros(x.shape, np.float64)
  for i in range(ct.shape[1]):
    for j in range(ct.shape[2]):
      rows = [i * strides[0] + a * dilation[0] for a in range(window[0])]
      cols = [j * strides[1] + b * dilation[1] for b in range(window[1])]
      patch = x[:, rows][:, :, cols].reshape(x.shape[0], -1, x.shape[3])  # (N, window, C), window order
      first = patch.argmax(axis=1)
      for n in range(x.shape[0]):
        for c in range(x.shape[3]):
          a, b = divmod(first[n, c], window[1])
          grad[n, rows[a], cols[b], c] += ct[n, i, j, c]
  return grad


@pytest.mark.parametrize("window, strides, dilation", [((3, 3), (2, 2), (1, 1)), ((3, 2), (2, 1), (2, 3)),
                                                       ((11, 11), (1, 1), (1, 1)), ((2, 2), (2, 2), (1, 1))])
def test_max_pool_gradient_with_overlapping_windows(window, strides, dilation):
  """Overlapping windows (ResNet's 3x3 stride 2), dilated ones, a single global window and disjoint ones: the
  gradient (built from strided slices of the input reshaped by the stride, see `_phased_windows`) against numpy, also
  under jit, vmap and jit(vmap(grad))."""
  rng = np.random.default_rng(7)
  x = rng.standard_normal((2, 11, 11, 3)).astype(np.float32)

  def pooled(v):
    return lax.reduce_window(v, -tnp.inf, lax.max, (1, *window, 1), (1, *strides, 1), "VALID",
                             window_dilation=(1, *dilation, 1))

  out = np.asarray(pooled(tnp.asarray(x)))
  ct = rng.standard_normal(out.shape)

  def loss(v): return (pooled(v) * tnp.asarray(ct.astype(np.float32))).sum()
  want = _max_pool_grad_reference(x.astype(np.float64), ct, window, strides, dilation)
  for transform in (lambda g: g, tj.jit):
    np.testing.assert_allclose(np.asarray(transform(tj.grad(loss))(tnp.asarray(x))), want, rtol=1e-6, atol=1e-6)
  batched = np.asarray(tj.jit(tj.vmap(tj.grad(loss)))(tnp.asarray(np.stack([x, -x]))))
  np.testing.assert_allclose(batched[0], want, rtol=1e-6, atol=1e-6)
  np.testing.assert_allclose(batched[1], _max_pool_grad_reference(-x.astype(np.float64), ct, window, strides, dilation),
                             rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("im2col", [False, True])
def test_im2col_and_direct_products_agree_with_numpy(monkeypatch, im2col):
  """Convolutions with many taps take an explicit im2col copy and one GEMM (IM2COL_TAPS_BYTES), others the direct
  product of the windowed view: both, forced, against numpy for strides, dilation and padding, NCHW and NHWC, values
  and the gradients (the transposed convolutions take the same path)."""
  from tinyjax.lax import _conv
  monkeypatch.setattr(_conv, "IM2COL_TAPS_BYTES", 0 if im2col else 1 << 62)
  rng = np.random.default_rng(11)
  x = rng.standard_normal((2, 5, 9, 8)).astype(np.float32)
  w = rng.standard_normal((6, 5, 3, 2)).astype(np.float32)
  for stride, padding, dilation in [((1, 1), ((1, 1), (0, 1)), (1, 1)), ((2, 1), ((0, 0), (2, 1)), (1, 2))]:
    want = numpy_conv(x, w, stride, padding, dilation)
    got = lax.conv_general_dilated(x, w, stride, padding, rhs_dilation=dilation)
    np.testing.assert_allclose(np.asarray(got), want, rtol=1e-5, atol=1e-5)
    nhwc = tj.jit(lambda a, b, s=stride, p=padding, d=dilation: lax.conv_general_dilated(
      a, b, s, p, rhs_dilation=d, dimension_numbers=("NHWC", "HWIO", "NHWC")))
    got = nhwc(x.transpose(0, 2, 3, 1), w.transpose(2, 3, 1, 0))
    np.testing.assert_allclose(np.asarray(got), want.transpose(0, 2, 3, 1), rtol=1e-5, atol=1e-5)
    # gradients of <conv(x, w), ct>: each is linear, so exact against numpy's directional derivative
    ct = rng.standard_normal(want.shape)

    def loss(a, b, s=stride, p=padding, d=dilation):
      return (lax.conv_general_dilated(a, b, s, p, rhs_dilation=d) * tnp.asarray(ct.astype(np.float32))).sum()
    gx, gw = tj.jit(tj.grad(loss, argnums=(0, 1)))(x, w)
    dx, dw = rng.standard_normal(x.shape), rng.standard_normal(w.shape)
    np.testing.assert_allclose((np.asarray(gx, np.float64) * dx).sum(),
                               (numpy_conv(dx, w, stride, padding, dilation) * ct).sum(), rtol=1e-4)
    np.testing.assert_allclose((np.asarray(gw, np.float64) * dw).sum(),
                               (numpy_conv(x, dw, stride, padding, dilation) * ct).sum(), rtol=1e-4)


@pytest.mark.usefixtures("avx512_tiles")  # (plans sized for AVX-512 registers)
def test_channels_first_convolution_stores_channels_first_from_its_product(on_cpu):
  """A 3x3 NCHW convolution big enough (codegen/opt.py `permuted_store_pays`) is one product in channels-last loop
  order (its register tile's column the output channels) that stores NCHW element by element: no transposing copy
  after it. Values and both gradients against numpy in float64, and jit(vmap(grad)) against a loop."""
  from tinyjax.codegen.opt import applied_opts, global_ranges_of
  from tinyjax.lower.schedule import kernels_of
  rng = np.random.default_rng(16)
  x = rng.standard_normal((2, 32, 24, 24)).astype(np.float32)
  w = (rng.standard_normal((64, 32, 3, 3)) / 10).astype(np.float32)
  pads = ((1, 1), (1, 1))

  def conv(a, b): return lax.conv_general_dilated(a, b, (1, 1), pads)
  f = tj.jit(conv)
  kernels = kernels_of(f.lower(x, w)._compiled.schedule.schedule.kernels)
  (product,) = [kernel for kernel in kernels if kernel.name.startswith("r_")]
  assert kernels[-1] is product and product.name.startswith("r_2_64_24_24_")
  column = global_ranges_of(product.ast)[-1]  # the tile's column: the output channels, the product's last loop
  assert column.src[0].arg == 64 and ("upcast", column.arg[0], 64) in applied_opts(product.ast)
  want = numpy_conv(x, w, (1, 1), pads)
  np.testing.assert_allclose(np.asarray(f(x, w), np.float64), want, rtol=2e-5, atol=2e-5)
  ct = rng.standard_normal(want.shape).astype(np.float32)
  gx, gw = tj.jit(tj.grad(lambda a, b: (conv(a, b) * ct).sum(), argnums=(0, 1)))(x, w)
  dx, dw = rng.standard_normal(x.shape), rng.standard_normal(w.shape)  # conv is bilinear: exact directional derivatives
  np.testing.assert_allclose(np.sum(np.asarray(gx, np.float64) * dx), np.sum(numpy_conv(dx, w, (1, 1), pads) * ct),
                             rtol=1e-4)
  np.testing.assert_allclose(np.sum(np.asarray(gw, np.float64) * dw), np.sum(numpy_conv(x, dw, (1, 1), pads) * ct),
                             rtol=1e-4)
  per_example = tj.jit(tj.vmap(tj.grad(lambda a, b, c: (conv(a[None], b) * c[None]).sum(), argnums=1),
                               in_axes=(0, None, 0)))(x, w, ct)
  looped = [np.asarray(tj.grad(lambda b: (conv(x[i:i + 1], b) * ct[i:i + 1]).sum())(w)) for i in range(2)]
  np.testing.assert_allclose(np.asarray(per_example), np.stack(looped), rtol=1e-4, atol=1e-4)


@pytest.mark.usefixtures("avx512_tiles")  # (plans sized for AVX-512 registers)
def test_channels_first_gradients_run_in_the_products_order(on_cpu):
  """An NCHW training step's gradients on a small grid (two 3x3 convolutions with ReLUs, 32x32x14x14 -> 32 -> 64):
  the gradient into the first layer's output (the second's input gradient times the first ReLU's mask), and the
  second's weight gradient (64x32x3x3, small, but summed over 32x16x16 positions) followed by an SGD update, each run
  in the product's own loop order (`_contraction_order`, through the elementwise ops on top and composed permutes),
  its column the channels: they ran in the output's order, 14- and 3-wide columns (in JAX's docs' style NCHW CNN, 24
  and 13 ms of a 46 ms step; now 1.2 and 1.9 ms). Values against numpy's directional derivatives in float64."""
  from tinyjax.codegen.opt import applied_opts, global_ranges_of
  from tinyjax.lower.schedule import kernels_of
  rng = np.random.default_rng(18)
  x = rng.standard_normal((32, 32, 14, 14)).astype(np.float32)
  w1 = (rng.standard_normal((32, 32, 3, 3)) / 10).astype(np.float32)
  w2 = (rng.standard_normal((64, 32, 3, 3)) / 10).astype(np.float32)
  ct = rng.standard_normal((32, 64, 14, 14)).astype(np.float32)
  pads = ((1, 1), (1, 1))

  def loss(u, v):
    hidden = tj.nn.relu(lax.conv_general_dilated(x, u, (1, 1), pads))
    return (tj.nn.relu(lax.conv_general_dilated(hidden, v, (1, 1), pads)) * ct).sum()

  def step(u, v):
    gu, gv = tj.grad(loss, argnums=(0, 1))(u, v)
    return gu, v - 0.1 * gv
  f = tj.jit(step)
  kernels = kernels_of(f.lower(w1, w2)._compiled.schedule.schedule.kernels)
  for shape, channels in (((32, 32, 14, 14), 32), ((64, 32, 3, 3), 64)):  # (the first: the forward too)
    tiled = [k for k in kernels if k.name.startswith("r_" + "_".join(map(str, shape)) + "_") and
             any(opt[0] == "upcast" for opt in applied_opts(k.ast))]
    assert tiled and all(global_ranges_of(kernel.ast)[-1].src[0].arg == channels for kernel in tiled)
  gu, updated = f(w1, w2)
  first = numpy_conv(x, w1, (1, 1), pads)
  hidden = np.maximum(first, 0)
  mask = numpy_conv(hidden, w2, (1, 1), pads) > 0
  du, dv = rng.standard_normal(w1.shape), rng.standard_normal(w2.shape)
  np.testing.assert_allclose(np.sum(np.asarray(gu, np.float64) * du), np.sum(
      numpy_conv(numpy_conv(x, du, (1, 1), pads) * (first > 0), w2, (1, 1), pads) * ct * mask), rtol=1e-3)
  gv = (w2.astype(np.float64) - np.asarray(updated, np.float64)) / 0.1
  np.testing.assert_allclose(np.sum(gv * dv), np.sum(numpy_conv(hidden, dv, (1, 1), pads) * ct * mask), rtol=1e-3)


@pytest.mark.usefixtures("avx512_tiles")  # (plans sized for AVX-512 registers)
def test_nchw_product_stores_through_register_transposes(on_cpu):
  """An NCHW 3x3 convolution's product (positions the row, channels the column) stores its row groups' results
  through register transposes, each channel's positions as a vector (llvm.py `store_sums_transposed`), its epilogue
  (a bias per channel, a ReLU) on those vectors; 40 positions a row: two squares of 16 and 8 rows one by one. An
  output of 16 MB or more is stored non-temporally from a row whose element starts a line. Values against numpy in
  float64."""
  from tinyjax.codegen.llvm import render_llvm
  from tinyjax.lower.schedule import kernels_of
  rng = np.random.default_rng(22)
  x = rng.standard_normal((2, 64, 40, 40)).astype(np.float32)
  w = (rng.standard_normal((64, 64, 3, 3)) / 24).astype(np.float32)
  b = rng.standard_normal(64).astype(np.float32)

  def f(x, w, b): return tj.nn.relu(lax.conv_general_dilated(x, w, (1, 1), "SAME") + b[:, None, None])
  kernels = kernels_of(tj.jit(f).lower(x, w, b)._compiled.schedule.schedule.kernels)
  (product,) = [k for k in kernels if k.name.startswith("r_2_64_40_40_")]
  ir = render_llvm(product.name, product.ast)
  outputs = set(re.findall(r"(%\w+) = getelementptr inbounds float, ptr %buf0,", ir))
  assert any(address in outputs for address in re.findall(r"store <16 x float> %\w+, ptr (%\w+)", ir))
  assert "!nontemporal" not in ir  # (800 KB: stored through the caches)
  big = np.zeros((32, 64, 56, 56), np.float32)  # (25.7 MB: each line-aligned vector stored non-temporally)
  (product,) = [k for k in kernels_of(tj.jit(f).lower(big, w, b)._compiled.schedule.schedule.kernels)
                if k.name.startswith("r_32_64_56_56_")]
  assert "store <16 x float> %" in (ir := render_llvm(product.name, product.ast)) and "!nontemporal" in ir
  want = np.maximum(numpy_conv(x.astype(np.float64), w.astype(np.float64), (1, 1), ((1, 1), (1, 1))) +
                    b[:, None, None], 0)
  np.testing.assert_allclose(np.asarray(tj.jit(f)(x, w, b)), want, rtol=1e-4, atol=1e-4)


def test_contraction_read_through_a_padding_keeps_its_tile(on_cpu):
  """A contraction read only through a padding, after elementwise operations and a permute (a convolution's output
  masked by a ReLU, then padded for the next layer's gradient), is a kernel of its own with a register tile
  (lower/schedule.py `_read_shifted`): fused into the padding's kernel it was a gated loop nest over the padded shape
  (a small NCHW CNN's step 3 -> 60 ms). Values against numpy in float64."""
  from tinyjax.codegen.opt import applied_opts
  from tinyjax.lower.schedule import kernels_of
  rng = np.random.default_rng(21)
  a, b, c = (rng.standard_normal(shape).astype(np.float32) for shape in ((96, 80), (80, 64), (64, 96)))

  def f(a, b, c): return tj.numpy.pad((tj.nn.relu(a @ b) * c.T).T, 1)
  kernels = kernels_of(tj.jit(f).lower(a, b, c)._compiled.schedule.schedule.kernels)
  assert any(any(opt[0] == "upcast" for opt in applied_opts(k.ast)) for k in kernels if k.name.startswith("r_"))
  want = np.pad((np.maximum(a.astype(np.float64) @ b, 0) * c.T).T, 1)
  np.testing.assert_allclose(np.asarray(tj.jit(f)(a, b, c)), want, rtol=1e-4, atol=1e-4)


@pytest.mark.usefixtures("avx512_tiles")  # (plans sized for AVX-512 registers)
def test_permuted_store_only_where_it_pays(on_cpu):
  """A contraction stored permuted runs in its own loop order only with a long sum, whole vectors along its own last
  axis, no whole column tiles along the output's and a big output; a 512x512 weight gradient (whole tiles both ways)
  and a classifier's 512x10 one (small) keep the output's order or a copy. einsum values against numpy either way."""
  from tinyjax.codegen.opt import permuted_store_pays
  from tinyjax.lower.schedule import kernels_of
  assert permuted_store_pays(56, 64, 576, 32 * 64 * 56 * 56)
  assert not permuted_store_pays(512, 512, 512, 512 * 512) and not permuted_store_pays(10, 512, 512, 5120)
  assert not permuted_store_pays(56, 64, 128, 1 << 20) and not permuted_store_pays(56, 40, 576, 1 << 20)
  rng = np.random.default_rng(17)
  for p, kernels_wanted in ((1100, 1), (300, 2)):  # 70400 outputs: one kernel; 19200: the product and its copy
    a, b = rng.standard_normal((p, 256)).astype(np.float32), rng.standard_normal((256, 64)).astype(np.float32)
    f = tj.jit(lambda u, v: tnp.einsum("pk,ko->op", u, v))
    assert len(kernels_of(f.lower(a, b)._compiled.schedule.schedule.kernels)) == kernels_wanted
    np.testing.assert_allclose(np.asarray(f(a, b), np.float64), (a.astype(np.float64) @ b).T, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("stride, padding", [((1, 1), ((0, 0), (0, 0))), ((2, 2), ((0, 0), (0, 0))),
                                             ((2, 1), ((1, 0), (0, 2)))], ids=str)
def test_pointwise_convolution_is_one_gemm_over_the_channels_last_rows(stride, padding):
  """A 1x1 convolution of a channels-last input is one GEMM (N * H * W, C) @ (C, O) over the input as it lies
  (`_pointwise_conv`; a strided one's positions copied first): values against numpy, gradients against numpy's
  directional derivative (conv is bilinear), jit(vmap(grad)) against a loop, and NCHW (its own GEMM, below)."""
  rng = np.random.default_rng(5)
  x = rng.standard_normal((3, 5, 7, 6)).astype(np.float32)  # NCHW for numpy_conv
  w = rng.standard_normal((32, 5, 1, 1)).astype(np.float32)  # OIHW
  want = numpy_conv(x, w, stride, padding)
  nhwc = lambda a, b: lax.conv_general_dilated(a, b, stride, padding, dimension_numbers=("NHWC", "HWIO", "NHWC"))
  xl, wl = x.transpose(0, 2, 3, 1), w.transpose(2, 3, 1, 0)
  lowered = tj.jit(nhwc).lower(xl, wl).as_text()
  program = tj.make_jaxpr(nhwc)(xl, wl).sink  # (the printed jaxpr shows conv_general_dilated, not its Ops)
  rows = (3 * want.shape[2] * want.shape[3], 5)
  assert any(node.op is Ops.RESHAPE and node.shape == rows for node in program.toposort)  # the rows of the one GEMM
  if stride == (1, 1) and padding == ((0, 0), (0, 0)): assert lowered.count("# kernel ") == 1
  np.testing.assert_allclose(np.asarray(tj.jit(nhwc)(xl, wl)), want.transpose(0, 2, 3, 1), rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(np.asarray(lax.conv_general_dilated(x, w, stride, padding)), want, rtol=1e-5, atol=1e-5)
  # an output in another layout than the input's
  nchw_out = lax.conv_general_dilated(xl, wl, stride, padding, dimension_numbers=("NHWC", "HWIO", "NCHW"))
  np.testing.assert_allclose(np.asarray(nchw_out), want, rtol=1e-5, atol=1e-5)
  ct = rng.standard_normal(want.shape).transpose(0, 2, 3, 1)

  def loss(a, b): return (nhwc(a, b) * tnp.asarray(ct.astype(np.float32))).sum()
  gx, gw = tj.jit(tj.grad(loss, argnums=(0, 1)))(xl, wl)
  dx, dw = rng.standard_normal(x.shape), rng.standard_normal(w.shape)
  ct_nchw = ct.transpose(0, 3, 1, 2)
  np.testing.assert_allclose((np.asarray(gx, np.float64) * dx.transpose(0, 2, 3, 1)).sum(),
                             (numpy_conv(dx, w, stride, padding) * ct_nchw).sum(), rtol=1e-4)
  np.testing.assert_allclose((np.asarray(gw, np.float64) * dw.transpose(2, 3, 1, 0)).sum(),
                             (numpy_conv(x, dw, stride, padding) * ct_nchw).sum(), rtol=1e-4)
  # per-example weight gradients: vmap over the batch, each example a batch of one
  per_example = tj.jit(tj.vmap(tj.grad(lambda b, a: (nhwc(a[None], b) ** 2).sum()), in_axes=(None, 0)))(wl, xl)
  for i in range(x.shape[0]):
    single = numpy_conv(x[i:i + 1], w, stride, padding)  # d/dw sum(conv^2) = 2 * sum over positions of conv * x
    xi = np.pad(x[i].astype(np.float64), ((0, 0), *padding))[:, ::stride[0], ::stride[1]][:, :single.shape[2],
                                                                                       :single.shape[3]]
    expected = 2 * np.einsum("ohw,chw->co", single[0], xi)
    np.testing.assert_allclose(np.asarray(per_example[i], np.float64)[0, 0], expected, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("stride, padding", [((1, 1), ((0, 0), (0, 0))), ((2, 2), ((0, 0), (0, 0))),
                                             ((2, 1), ((1, 0), (0, 2)))], ids=str)
def test_pointwise_convolution_of_channels_first_data_writes_channels_first(stride, padding, on_cpu):
  """A 1x1 convolution of NCHW data into NCHW (JAX's default layout) is, per image, (O, C) @ (C, H * W) written in
  place: one kernel and no transpose of a channels-last result (`_pointwise_conv`). Values against numpy in float64,
  both gradients against numpy's directional derivatives (conv is bilinear), per-example gradients through
  jit(vmap(grad)) against a loop, and the 1-D form (NCW) against an einsum."""
  from tinyjax.lower.schedule import kernels_of
  rng = np.random.default_rng(15)
  x = rng.standard_normal((3, 5, 7, 6)).astype(np.float32)
  w = rng.standard_normal((32, 5, 1, 1)).astype(np.float32)
  want = numpy_conv(x, w, stride, padding)

  def conv(a, b): return lax.conv_general_dilated(a, b, stride, padding)
  f = tj.jit(conv)
  if stride == (1, 1) and padding == ((0, 0), (0, 0)):
    assert len(list(kernels_of(f.lower(x, w)._compiled.schedule.schedule.kernels))) == 1
  np.testing.assert_allclose(np.asarray(f(x, w), np.float64), want, rtol=1e-5, atol=1e-5)
  ct = rng.standard_normal(want.shape).astype(np.float32)
  gx, gw = tj.jit(tj.grad(lambda a, b: (conv(a, b) * ct).sum(), argnums=(0, 1)))(x, w)
  dx, dw = rng.standard_normal(x.shape), rng.standard_normal(w.shape)
  np.testing.assert_allclose((np.asarray(gx, np.float64) * dx).sum(), (numpy_conv(dx, w, stride, padding) * ct).sum(),
                             rtol=1e-4)
  np.testing.assert_allclose((np.asarray(gw, np.float64) * dw).sum(), (numpy_conv(x, dw, stride, padding) * ct).sum(),
                             rtol=1e-4)
  per_example = tj.jit(tj.vmap(tj.grad(lambda b, a: (conv(a[None], b) ** 2).sum()), in_axes=(None, 0)))(w, x)
  for i in range(x.shape[0]):
    single = numpy_conv(x[i:i + 1], w, stride, padding)[0]
    xi = np.pad(x[i].astype(np.float64), ((0, 0), *padding))[:, ::stride[0], ::stride[1]][:, :single.shape[1],
                                                                                       :single.shape[2]]
    np.testing.assert_allclose(np.asarray(per_example[i], np.float64)[:, :, 0, 0],
                               2 * np.einsum("ohw,chw->oc", single, xi), rtol=1e-4, atol=1e-4)
  signal, taps = x[:, :, 0, :], w[:, :, 0, :]  # NCW, OIW
  np.testing.assert_allclose(np.asarray(lax.conv_general_dilated(signal, taps, (1,), "VALID"), np.float64),
                             np.einsum("ncw,oc->now", signal.astype(np.float64), taps[:, :, 0]), rtol=1e-5, atol=1e-5)


@pytest.mark.usefixtures("avx512_tiles")  # (AVX-512's 64-column tiles; AVX2's pack: test_tile_geometry.py)
def test_pointwise_channels_first_product_runs_image_by_image(on_cpu):
  """An NCHW 1x1 convolution's product reads each image's channels in place, unpacked (codegen/opt.py
  IN_PLACE_BYTES), launched over the images (each image's input and output streamed through once), not over column
  tiles of the positions; the input gradient's product too. Values and gradients against numpy in float64."""
  from tinyjax.codegen.opt import applied_opts, choose_opts
  from tinyjax.lower.schedule import kernels_of
  rng = np.random.default_rng(21)
  x = rng.standard_normal((3, 64, 56, 56)).astype(np.float32)  # (rows of 3136 floats spread over L1's sets)
  w = (rng.standard_normal((48, 64, 1, 1)) / 8).astype(np.float32)
  ct = rng.standard_normal((3, 48, 56, 56)).astype(np.float32)

  def conv(a, b): return lax.conv_general_dilated(a, b, (1, 1), "VALID")
  f = tj.jit(conv)
  (product,) = kernels_of(f.lower(x, w)._compiled.schedule.schedule.kernels)
  assert product.outer_size == 3 and choose_opts(product.ast).packed == ()
  assert not any(opt[0] == "pack" for opt in applied_opts(product.ast))
  want = numpy_conv(x, w, (1, 1), ((0, 0), (0, 0)))
  np.testing.assert_allclose(np.asarray(f(x, w), np.float64), want, rtol=1e-5, atol=1e-5)
  grad = tj.jit(tj.grad(lambda a, b: (conv(a, b) * ct).sum(), argnums=(0, 1)))
  (dx_product,) = [k for k in kernels_of(grad.lower(x, w)._compiled.schedule.schedule.kernels)
                   if k.name.startswith("r_3_64_56_56")]
  assert dx_product.outer_size == 3 and choose_opts(dx_product.ast).packed == ()
  gx, gw = grad(x, w)
  np.testing.assert_allclose(np.asarray(gx, np.float64), np.einsum("nohw,oc->nchw", ct.astype(np.float64),
                                                                   w[:, :, 0, 0].astype(np.float64)),
                             rtol=1e-4, atol=1e-4)
  np.testing.assert_allclose(np.asarray(gw, np.float64)[:, :, 0, 0],
                             np.einsum("nohw,nchw->oc", ct.astype(np.float64), x.astype(np.float64)),
                             rtol=1e-4, atol=1e-3)


@pytest.mark.usefixtures("avx512_tiles")  # (plans sized for AVX-512 registers)
@pytest.mark.parametrize("channels", [128, 256])
def test_weight_gradient_is_launched_over_its_column_tiles(channels, on_cpu):
  """A 3x3 weight gradient (kh, kw, C, O) as one flat GEMM over the grid was launched over kh alone: 3 units, one of
  two threads idle a third of the time. Its output channels are cut into column tiles as the launch range
  (`schedule._split_columns`), kh and kw inside, each tile's work the same (scheduled for 2 threads, whatever this
  machine's count: as many tiles as threads do). Values against numpy in float64."""
  from tinyjax.codegen.opt import applied_opts
  from tinyjax.lower.schedule import schedule
  rng = np.random.default_rng(channels)
  x = rng.standard_normal((3, 14, 14, channels)).astype(np.float32)  # (a grid near the window: the flat GEMM)
  g = rng.standard_normal((3, 14, 14, channels)).astype(np.float32)
  w = rng.standard_normal((3, 3, channels, channels)).astype(np.float32)

  def loss(b): return (lax.conv_general_dilated(x, b, (1, 1), "SAME", dimension_numbers=("NHWC", "HWIO", "NHWC"))
                       * g).sum()
  f = tj.jit(tj.grad(loss))
  (gemm,) = [k for k in schedule(f.lower(w)._compiled.jaxpr.sink, threads=2).kernels if k.name.startswith("r_3_3")]
  # (kh and kw read as one range, schedule._merge_contiguous_ranges: the row groups span that one range inside each
  # sum block)
  assert gemm.outer_size == channels // 64 and any(opt[0] == "span" and len(opt) == 2 for opt in applied_opts(gemm.ast))
  xp = np.pad(x.astype(np.float64), ((0, 0), (1, 1), (1, 1), (0, 0)))
  want = np.zeros(w.shape)
  for a in range(3):
    for b in range(3):
      want[a, b] = np.einsum("nhwc,nhwo->co", xp[:, a:a + 14, b:b + 14], g.astype(np.float64))
  np.testing.assert_allclose(np.asarray(f(w)), want, rtol=1e-4, atol=1e-3)


@pytest.mark.parametrize("strides, padding", [((2, 2), "SAME"), ((2, 1), "VALID"), ((1, 1), ((1, 0), (0, 1)))],
                         ids=str)
def test_pointwise_transposed_convolution_matches_the_general_path(strides, padding):
  """A 1x1 conv_transpose of a channels-last input (zeros interleaved by lhs dilation, then the flat GEMM) equals
  the same transposed convolution in NCHW (the windowed product), and the lhs-dilated conv_general_dilated."""
  rng = np.random.default_rng(4)
  x, w = rng.standard_normal((2, 5, 6, 3)).astype(np.float32), rng.standard_normal((1, 1, 3, 4)).astype(np.float32)
  nhwc = lax.conv_transpose(x, w, strides, padding, dimension_numbers=("NHWC", "HWIO", "NHWC"))
  nchw = lax.conv_transpose(x.transpose(0, 3, 1, 2), w.transpose(3, 2, 0, 1), strides, padding,
                            dimension_numbers=("NCHW", "OIHW", "NCHW"))
  np.testing.assert_allclose(np.asarray(nhwc), np.asarray(nchw).transpose(0, 2, 3, 1), rtol=1e-5, atol=1e-5)
  dilated = lax.conv_general_dilated(x, w, (1, 1), [(0, 0), (0, 0)], lhs_dilation=strides,
                                     dimension_numbers=("NHWC", "HWIO", "NHWC"))
  spread = np.zeros((2, (5 - 1) * strides[0] + 1, (6 - 1) * strides[1] + 1, 3))
  spread[:, ::strides[0], ::strides[1]] = x
  np.testing.assert_allclose(np.asarray(dilated), spread @ w[0, 0].astype(np.float64), rtol=1e-5, atol=1e-5)


def test_pointwise_convolution_reads_its_rows_as_one_range(on_cpu):
  """A 1x1 convolution over NHWC data reads N, H and W as one range (`schedule._merge_contiguous_ranges`): its kernel
  is the (N*H*W, C) @ (C, O) product with two global ranges, register-tiled across all the rows. A padded 3x3
  convolution keeps H and W apart (its gates read them). Values against numpy in float64."""
  from tinyjax.codegen.opt import global_ranges_of
  from tinyjax.lower.schedule import kernels_of
  rng = np.random.default_rng(11)
  x = rng.standard_normal((4, 10, 12, 16)).astype(np.float32)
  w1 = rng.standard_normal((1, 1, 16, 24)).astype(np.float32)
  w3 = rng.standard_normal((3, 3, 16, 24)).astype(np.float32)

  def conv(a, b): return lax.conv_general_dilated(a, b, (1, 1), "SAME", dimension_numbers=("NHWC", "HWIO", "NHWC"))
  f = tj.jit(conv)
  (pointwise,) = kernels_of(f.lower(x, w1)._compiled.schedule.schedule.kernels)
  assert [rng_.src[0].arg for rng_ in global_ranges_of(pointwise.ast)] == [4 * 10 * 12, 24]
  np.testing.assert_allclose(np.asarray(f(x, w1)), np.einsum("nhwc,co->nhwo", x.astype(np.float64), w1[0, 0]),
                             rtol=1e-5, atol=1e-5)
  window = [k for k in kernels_of(f.lower(x, w3)._compiled.schedule.schedule.kernels) if k.name.startswith("r_")]
  assert [len(global_ranges_of(k.ast)) for k in window] == [4]
  # its gradients: matrix products of the views in place (no copy of the input or the output gradient)
  g = rng.standard_normal((4, 10, 12, 24)).astype(np.float32)
  grads = tj.jit(tj.grad(lambda a, b, c: (conv(a, b) * c).sum(), argnums=(0, 1)))
  assert all(k.name.startswith("r_") for k in kernels_of(grads.lower(x, w1, g)._compiled.schedule.schedule.kernels))
  dx, dw = grads(x, w1, g)
  np.testing.assert_allclose(np.asarray(dx), np.einsum("nhwo,co->nhwc", g.astype(np.float64), w1[0, 0]), rtol=1e-5,
                             atol=1e-4)
  np.testing.assert_allclose(np.asarray(dw)[0, 0], np.einsum("nhwc,nhwo->co", x.astype(np.float64), g), rtol=1e-5,
                             atol=1e-4)


@pytest.mark.parametrize("features", [8, 128], ids=["direct", "im2col"])
def test_channels_last_convolution_writes_its_output_in_place(features, on_cpu, monkeypatch):
  """A 3x3 convolution of NHWC data into NHWC computes its product as (N, H, W, O), the output's own layout: the GEMM
  stores the result (no copy of a materialised product after it, 1.1 ms of 20 at 32x56x56x64), and a bias and a relu
  after it fuse into its epilogue. Both the direct product and the im2col GEMM (taps of at least IM2COL_TAPS_BYTES,
  lowered here so the test stays small). Values and both gradients against numpy in float64."""
  from tinyjax.lax import _conv
  from tinyjax.lower.schedule import kernels_of
  monkeypatch.setattr(_conv, "IM2COL_TAPS_BYTES", 1 << 14)
  rng = np.random.default_rng(21)
  x = rng.standard_normal((2, 9, 7, features)).astype(np.float32)
  w = (rng.standard_normal((3, 3, features, 16)) / features).astype(np.float32)
  b = rng.standard_normal(16).astype(np.float32)
  numbers = ("NHWC", "HWIO", "NHWC")

  def conv(a, k): return lax.conv_general_dilated(a, k, (1, 1), "SAME", dimension_numbers=numbers)
  f, layer = tj.jit(conv), tj.jit(lambda a, k, c: tj.nn.relu(conv(a, k) + c))
  for fn, args in ((f, (x, w)), (layer, (x, w, b))):
    kernels = list(kernels_of(fn.lower(*args)._compiled.schedule.schedule.kernels))
    assert kernels[-1].name.startswith("r_"), [k.name for k in kernels]  # the product writes the result
  want = numpy_conv(x.transpose(0, 3, 1, 2), w.transpose(3, 2, 0, 1), (1, 1), ((1, 1), (1, 1))).transpose(0, 2, 3, 1)
  np.testing.assert_allclose(np.asarray(f(x, w), np.float64), want, rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(np.asarray(layer(x, w, b), np.float64), np.maximum(want + b, 0), rtol=1e-5, atol=1e-5)
  ct = rng.standard_normal(want.shape).astype(np.float32)
  gx, gw = tj.jit(tj.grad(lambda a, k: (conv(a, k) * ct).sum(), argnums=(0, 1)))(x, w)
  dx, dw = rng.standard_normal(x.shape), rng.standard_normal(w.shape)
  lhs = (np.asarray(gx, np.float64) * dx).sum() + (np.asarray(gw, np.float64) * dw).sum()
  rhs = ((numpy_conv(dx.transpose(0, 3, 1, 2), w.transpose(3, 2, 0, 1), (1, 1), ((1, 1), (1, 1))) +
          numpy_conv(x.transpose(0, 3, 1, 2), dw.transpose(3, 2, 0, 1), (1, 1), ((1, 1), (1, 1)))) *
         ct.transpose(0, 3, 1, 2)).sum()
  np.testing.assert_allclose(lhs, rhs, rtol=1e-4)


@pytest.mark.usefixtures("avx512_tiles")  # (plans sized for AVX-512 registers)
@pytest.mark.parametrize("channels,width", [(32, 20), (35, 13), (128, 10)])
def test_window_taps_beyond_l1_run_in_channel_blocks(channels, width, on_cpu):
  """A direct 3x3 convolution whose taps for a column tile exceed WINDOW_BLOCK_BYTES runs its tiles in row groups,
  its channels in WINDOW_BLOCKS blocks with float32 sums where those fit in it, else in blocks that fit with float64
  sums (codegen/opt.py `_window_chunk`; 35 channels: blocks of 9, the last of 8; 128: 8 blocks of 17, the last of 9;
  13-wide rows: a partial tile per group). Values and both gradients against float64 numpy; jit(vmap) against a
  loop. Taps that fit keep the plain tiles."""
  from tinyjax.codegen.llvm import render_llvm
  from tinyjax.codegen.opt import WINDOW_BLOCK_BYTES, WINDOW_BLOCKS, applied_opts
  from tinyjax.lower.schedule import kernels_of
  rng = np.random.default_rng(22)
  x = rng.standard_normal((2, width, width, channels)).astype(np.float32)
  w = (rng.standard_normal((3, 3, channels, 64)) / 10).astype(np.float32)
  numbers = ("NHWC", "HWIO", "NHWC")

  def conv(a, b): return lax.conv_general_dilated(a, b, (1, 1), "SAME", dimension_numbers=numbers)
  f = tj.jit(conv)
  (product,) = [k for k in kernels_of(f.lower(x, w)._compiled.schedule.schedule.kernels) if k.name.startswith("r_")]
  chunk = next(opt[2] for opt in applied_opts(product.ast) if opt[0] == "chunk")
  assert chunk == min(-(-channels // WINDOW_BLOCKS), WINDOW_BLOCK_BYTES // (9 * 64 * 4))
  assert any(opt[0] == "group" for opt in applied_opts(product.ast))
  assert ("x double]" in render_llvm("k", product.ast)) == (-(-channels // chunk) > WINDOW_BLOCKS)  # the group's sums
  to_nchw = (lambda a: a.transpose(0, 3, 1, 2))
  w_oihw = w.transpose(3, 2, 0, 1)
  want = numpy_conv(to_nchw(x), w_oihw, (1, 1), ((1, 1), (1, 1))).transpose(0, 2, 3, 1)
  np.testing.assert_allclose(np.asarray(f(x, w), np.float64), want, rtol=2e-5, atol=2e-5)
  ct = rng.standard_normal(want.shape).astype(np.float32)
  gx, gw = tj.jit(tj.grad(lambda a, b: (conv(a, b) * ct).sum(), argnums=(0, 1)))(x, w)
  dx, dw = rng.standard_normal(x.shape), rng.standard_normal(w.shape)
  along_x = numpy_conv(to_nchw(dx), w_oihw, (1, 1), ((1, 1), (1, 1))).transpose(0, 2, 3, 1)
  along_w = numpy_conv(to_nchw(x), dw.transpose(3, 2, 0, 1), (1, 1), ((1, 1), (1, 1))).transpose(0, 2, 3, 1)
  np.testing.assert_allclose(np.sum(np.asarray(gx, np.float64) * dx), np.sum(along_x * ct), rtol=1e-4)
  np.testing.assert_allclose(np.sum(np.asarray(gw, np.float64) * dw), np.sum(along_w * ct), rtol=1e-4)
  batched = np.asarray(tj.vmap(tj.jit(conv), in_axes=(0, None))(x[:, None], w))
  np.testing.assert_allclose(batched[:, 0], np.stack([np.asarray(f(x[i:i + 1], w))[0] for i in range(2)]),
                             rtol=1e-5, atol=1e-5)
  small = w[:, :, :4]  # taps that fit: the plain tiles
  (plain,) = [k for k in kernels_of(f.lower(x[..., :4], small)._compiled.schedule.schedule.kernels)
              if k.name.startswith("r_")]
  assert not any(opt[0] == "chunk" for opt in applied_opts(plain.ast))


@pytest.mark.usefixtures("avx512_tiles")  # (plans sized for AVX-512 registers)
@pytest.mark.parametrize("size,channels", [(5, 12), (7, 8)])
def test_wider_windows_in_channel_blocks_match_numpy(size, channels, on_cpu):
  """5x5 and 7x7 windows whose taps exceed WINDOW_BLOCK_BYTES also run in channel blocks (their taps unrolled as
  `reduce_loops` unrolls them); values against float64 numpy."""
  from tinyjax.codegen.opt import applied_opts
  from tinyjax.lower.schedule import kernels_of
  rng = np.random.default_rng(23)
  x = rng.standard_normal((2, 20, 20, channels)).astype(np.float32)
  w = (rng.standard_normal((size, size, channels, 64)) / 10).astype(np.float32)
  f = tj.jit(lambda a, b: lax.conv_general_dilated(a, b, (1, 1), "SAME", dimension_numbers=("NHWC", "HWIO", "NHWC")))
  (product,) = [k for k in kernels_of(f.lower(x, w)._compiled.schedule.schedule.kernels) if k.name.startswith("r_")]
  assert any(opt[0] == "chunk" for opt in applied_opts(product.ast))
  half = size // 2
  xp = np.pad(x.astype(np.float64), ((0, 0), (half, half), (half, half), (0, 0)))
  want = sum(np.einsum("nhwc,co->nhwo", xp[:, a:a + 20, b:b + 20], w[a, b].astype(np.float64))
             for a in range(size) for b in range(size))
  np.testing.assert_allclose(np.asarray(f(x, w), np.float64), want, rtol=3e-5, atol=3e-5)


def _numpy_dilated_conv(x, w, lhs_dilation, padding, rhs_dilation, groups=1):
  """NC... / OI... cross-correlation in float64 of x with zeros interleaved (lhs_dilation) and padded (negative
  padding crops), any number of spatial axes, feature groups."""
  spatial = x.ndim - 2
  shape = [*x.shape[:2], *[(n - 1) * d + 1 for n, d in zip(x.shape[2:], lhs_dilation)]]
  dilated = np.zeros(shape)
  dilated[(slice(None), slice(None), *[slice(None, None, d) for d in lhs_dilation])] = x
  for axis, (lo, hi) in enumerate(padding, start=2):
    pad = [(0, 0)] * x.ndim
    pad[axis] = (max(lo, 0), max(hi, 0))
    dilated = np.pad(dilated, pad)
    n = dilated.shape[axis]
    dilated = np.take(dilated, range(max(-lo, 0), n - max(-hi, 0)), axis=axis)
  kernel = w.shape[2:]
  outs = [n - (k - 1) * r for n, k, r in zip(dilated.shape[2:], kernel, rhs_dilation)]
  per_group = x.shape[1] // groups
  out = np.zeros((x.shape[0], w.shape[0], *outs))
  for taps in np.ndindex(*kernel):
    starts = [t * r for t, r in zip(taps, rhs_dilation)]
    window = dilated[(slice(None), slice(None), *[slice(start, start + o) for start, o in zip(starts, outs)])]
    for g in range(groups):
      rows = slice(g * (w.shape[0] // groups), (g + 1) * (w.shape[0] // groups))
      out[:, rows] += np.einsum("nc...,oc->no...", window[:, g * per_group:(g + 1) * per_group],
                                w[(rows, slice(None), *taps)].astype(np.float64))
  assert spatial == len(outs)
  return out


@pytest.mark.parametrize("x_shape,w_shape,lhs_dilation,padding,rhs_dilation,groups", [
  ((2, 4, 6, 5), (3, 4, 3, 3), (2, 2), ((1, 1), (1, 1)), (1, 1), 1),  # a stride-2 3x3 convolution's input gradient
  ((2, 3, 5, 4), (4, 3, 3, 2), (3, 2), ((2, 0), (0, 3)), (1, 1), 1),
  ((1, 2, 6, 6), (2, 2, 3, 3), (2, 2), ((-1, 2), (1, -1)), (1, 1), 1),  # negative padding
  ((2, 2, 5, 5), (3, 2, 2, 3), (4, 1), ((0, 0), (1, 1)), (1, 1), 1),  # dilation past the kernel: phases without taps
  ((2, 2, 5, 7), (3, 2, 3, 2), (2, 1), ((1, 1), (2, 2)), (1, 2), 1),  # kernel dilation on the undilated axis
  ((2, 4, 5, 5), (6, 2, 3, 3), (2, 2), ((1, 2), (2, 1)), (1, 1), 2),  # feature groups
  ((3, 2, 9), (4, 2, 4), (3,), ((2, 3),), (1,), 1),  # 1-D
  ((1, 2, 3, 4, 3), (2, 2, 2, 3, 2), (2, 2, 3), ((1, 1), (0, 2), (1, 0)), (1, 1, 1), 1),  # 3-D
])
def test_input_dilated_convolution_matches_numpy(x_shape, w_shape, lhs_dilation, padding, rhs_dilation, groups):
  """Zeros interleaved in the input (a transposed convolution) computed as one convolution per output phase
  (`_conv_impl`'s `_phase_conv`), against float64 numpy over the explicitly dilated input; eager and jitted."""
  rng = np.random.default_rng(len(x_shape) * 10 + lhs_dilation[0])
  x = rng.standard_normal(x_shape).astype(np.float32)
  w = rng.standard_normal(w_shape).astype(np.float32)
  expected = _numpy_dilated_conv(x, w, lhs_dilation, padding, rhs_dilation, groups)

  def f(x, w):
    return lax.conv_general_dilated(x, w, (1,) * len(lhs_dilation), padding, lhs_dilation=lhs_dilation,
                                    rhs_dilation=rhs_dilation, feature_group_count=groups)
  for got in (f(x, w), tj.jit(f)(x, w)):
    assert got.shape == expected.shape
    np.testing.assert_allclose(np.asarray(got, np.float64), expected, rtol=1e-5, atol=1e-5)


def test_strided_convolution_input_gradient_by_phases():
  """The input gradient of a stride-2 NHWC convolution (the phases' convolutions) against a central difference,
  composed as jit(vmap(grad)) against a loop of grads."""
  rng = np.random.default_rng(8)
  x = rng.standard_normal((3, 2, 7, 6, 4)).astype(np.float32)
  w = (rng.standard_normal((3, 3, 4, 5)) / 6).astype(np.float32)
  weights = rng.standard_normal((2, 4, 3, 5)).astype(np.float32)

  def loss(x, w):
    y = lax.conv_general_dilated(x, w, (2, 2), "SAME", dimension_numbers=("NHWC", "HWIO", "NHWC"))
    return (y * weights).sum() + (y ** 2).sum() * 0.01
  grads = tj.jit(tj.vmap(tj.grad(loss), in_axes=(0, None)))(x, w)
  for i in range(3):
    single = np.asarray(tj.grad(loss)(x[i], w), np.float64)
    np.testing.assert_allclose(np.asarray(grads[i], np.float64), single, rtol=1e-5, atol=1e-5)
    direction = rng.standard_normal(x[i].shape)
    eps = 1e-2
    numeric = (float(loss(x[i] + eps * direction, w)) - float(loss(x[i] - eps * direction, w))) / (2 * eps)
    np.testing.assert_allclose((single * direction).sum(), numeric, rtol=1e-3)
