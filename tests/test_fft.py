"""tinyjax.numpy.fft against numpy.fft (pocketfft, float64): every function, lengths that are powers of two, composite,
prime (Bluestein) and mixed, `n` / `s` / `axes` / `norm`, the identities (inverse, Parseval, linearity, the
convolution theorem), and the transformations (jit, vmap, grad against finite differences and JAX's values)."""
import numpy as np
import pytest

import tinyjax as tj
import tinyjax.numpy as jnp
from tests.gradcheck import numeric_grad

RNG = np.random.default_rng(20261127)


def _signal(*shape, dtype=np.complex64):
  values = RNG.standard_normal(shape) + (1j * RNG.standard_normal(shape) if np.dtype(dtype).kind == "c" else 0)
  return values.astype(dtype)


def _relative_error(got, want):
  return np.abs(np.asarray(got) - want).max() / max(np.abs(want).max(), 1e-30)


@pytest.mark.parametrize("n", [1, 2, 3, 8, 16, 17, 31, 64, 100, 97, 210, 1000, 1024, 1031, 2 * 257, 4096,
                               3 * 256, 5 * 128, 15 * 256])  # (an odd part, then the compiled power-of-two kernel)
def test_fft_and_ifft_of_every_kind_of_length(n):
  x = _signal(3, n)
  wide = x.astype(np.complex128)
  assert _relative_error(jnp.fft.fft(x), np.fft.fft(wide, axis=-1)) < 1e-6
  assert _relative_error(jnp.fft.ifft(x), np.fft.ifft(wide, axis=-1)) < 1e-6
  assert jnp.fft.fft(x).dtype == np.complex64
  real = x.real.copy()  # (a real signal's first stage contracts its values alone)
  assert _relative_error(jnp.fft.fft(real), np.fft.fft(real.astype(np.float64), axis=-1)) < 1e-6
  assert _relative_error(jnp.fft.rfft(real), np.fft.rfft(real.astype(np.float64), axis=-1)) < 1e-6
  assert _relative_error(jnp.fft.fft(real.astype(np.int32)), np.fft.fft(real.astype(np.int32), axis=-1)) < 1e-6


def test_float64_precision_under_x64():
  with tj.config.override("jax_enable_x64", True):
    x = _signal(2, 1000, dtype=np.complex128)
    got = jnp.fft.fft(x)
    assert got.dtype == np.complex128
    assert _relative_error(got, np.fft.fft(x)) < 1e-13
    assert jnp.fft.rfft(np.ones(8)).dtype == np.complex128


@pytest.mark.parametrize("norm", [None, "backward", "ortho", "forward"])
@pytest.mark.parametrize("n", [None, 7, 12])
def test_real_and_hermitian_transforms(norm, n):
  real = _signal(4, 10, dtype=np.float32)
  spectrum = np.fft.rfft(real.astype(np.float64))
  for name, operand, reference in (("fft", real, real), ("ifft", real, real), ("rfft", real, real),
                                   ("ihfft", real, real), ("irfft", spectrum.astype(np.complex64), spectrum),
                                   ("hfft", spectrum.astype(np.complex64), spectrum)):
    got = getattr(jnp.fft, name)(operand, n=n, norm=norm)
    want = getattr(np.fft, name)(np.asarray(reference, np.complex128 if reference.dtype.kind == "c" else np.float64),
                                 n=n, norm=norm)
    assert got.shape == want.shape, name
    np.testing.assert_allclose(np.asarray(got), want, rtol=2e-5, atol=2e-5, err_msg=name)
  assert jnp.fft.rfft(real).dtype == np.complex64 and jnp.fft.irfft(spectrum.astype(np.complex64)).dtype == np.float32


def test_n_dimensional_transforms():
  x = _signal(4, 6, 5, dtype=np.float32)
  wide = x.astype(np.float64)
  for name in ("fftn", "ifftn", "rfftn", "fft2", "ifft2", "rfft2"):
    np.testing.assert_allclose(np.asarray(getattr(jnp.fft, name)(x)), getattr(np.fft, name)(wide), rtol=1e-5,
                               atol=1e-4, err_msg=name)
    np.testing.assert_allclose(np.asarray(getattr(jnp.fft, name)(x, s=(3, 8), axes=(0, 2))),
                               getattr(np.fft, name)(wide, s=(3, 8), axes=(0, 2)), rtol=1e-5, atol=1e-4, err_msg=name)
  spectrum = np.fft.rfftn(wide)
  np.testing.assert_allclose(np.asarray(jnp.fft.irfftn(spectrum.astype(np.complex64), s=x.shape)),
                             np.fft.irfftn(spectrum, s=x.shape, axes=(0, 1, 2)), rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(np.asarray(jnp.fft.irfft2(spectrum.astype(np.complex64), s=x.shape[1:])),
                             np.fft.irfft2(spectrum, s=x.shape[1:]), rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(np.asarray(jnp.fft.fft(x, axis=1)), np.fft.fft(wide, axis=1), rtol=1e-5, atol=1e-5)


def test_frequencies_and_shifts():
  for n, d in ((5, 0.1), (6, 1.0), (1, 2.0)):
    np.testing.assert_allclose(np.asarray(jnp.fft.fftfreq(n, d)), np.fft.fftfreq(n, d), rtol=1e-6)
    np.testing.assert_allclose(np.asarray(jnp.fft.rfftfreq(n, d)), np.fft.rfftfreq(n, d), rtol=1e-6)
  grid = np.arange(30).reshape(5, 6)
  for axes in (None, 0, (1,), (0, 1)):
    np.testing.assert_array_equal(np.asarray(jnp.fft.fftshift(grid, axes)), np.fft.fftshift(grid, axes))
    np.testing.assert_array_equal(np.asarray(jnp.fft.ifftshift(grid, axes)), np.fft.ifftshift(grid, axes))


def test_identities():
  x, y = _signal(2, 96), _signal(2, 96)
  np.testing.assert_allclose(np.asarray(jnp.fft.ifft(jnp.fft.fft(x))), x, atol=1e-5)
  parseval = np.sum(np.abs(np.asarray(jnp.fft.fft(x, norm="ortho"))) ** 2, axis=-1)
  np.testing.assert_allclose(parseval, np.sum(np.abs(x) ** 2, axis=-1), rtol=1e-5)
  np.testing.assert_allclose(np.asarray(jnp.fft.fft(2 * x + 3j * y)),
                             2 * np.asarray(jnp.fft.fft(x)) + 3j * np.asarray(jnp.fft.fft(y)), rtol=1e-5, atol=1e-4)
  # the convolution theorem: a circular convolution is a product of spectra
  circular = np.array([[np.sum(x[b] * np.roll(y[b][::-1], k + 1)) for k in range(96)] for b in range(2)])
  np.testing.assert_allclose(np.asarray(jnp.fft.ifft(jnp.fft.fft(x) * jnp.fft.fft(y))), circular, rtol=1e-4,
                             atol=1e-4)
  real = _signal(50, dtype=np.float32)
  np.testing.assert_allclose(np.asarray(jnp.fft.irfft(jnp.fft.rfft(real), n=50)), real, atol=1e-5)


def test_jit_vmap_and_gradients():
  x = _signal(4, 40)
  np.testing.assert_allclose(np.asarray(tj.jit(jnp.fft.fft)(x)), np.asarray(jnp.fft.fft(x)), rtol=1e-6, atol=1e-6)
  np.testing.assert_allclose(np.asarray(tj.vmap(jnp.fft.fft)(x)), np.fft.fft(x.astype(np.complex128)), rtol=1e-5,
                             atol=1e-5)
  np.testing.assert_allclose(np.asarray(tj.vmap(jnp.fft.fft, in_axes=1, out_axes=1)(x)),
                             np.fft.fft(x.astype(np.complex128), axis=0), rtol=1e-5, atol=1e-5)
  with tj.config.override("jax_enable_x64", True):
    real = _signal(12, dtype=np.float64)
    weights = _signal(7, dtype=np.float64)

    def power(v):
      return jnp.sum(weights * jnp.abs(jnp.fft.rfft(v)) ** 2)
    numeric = numeric_grad(lambda v: power(jnp.asarray(v)), real, 1e-6)
    np.testing.assert_allclose(np.asarray(tj.grad(power)(real)), numeric, rtol=1e-6, atol=1e-8)
    np.testing.assert_allclose(np.asarray(tj.jit(tj.grad(power))(real)), numeric, rtol=1e-6, atol=1e-8)
    inverse = lambda v: jnp.sum(jnp.fft.irfft(v * (1 + 0.5j), n=12) * jnp.arange(12.0))  # noqa: E731
    spectrum = jnp.fft.rfft(real)
    grads = tj.vmap(tj.grad(inverse))(jnp.stack([spectrum, 2 * spectrum]))
    assert grads.shape == (2, 7) and grads.dtype == np.complex128
    np.testing.assert_allclose(np.asarray(grads[0]), np.asarray(grads[1]), rtol=1e-12)  # (linear: one gradient)
  # JAX 0.10.2's values for the irfft of a rescaled spectrum (its transpose convention)
  ramp = np.arange(6.0, dtype=np.float32)
  np.testing.assert_allclose(
    np.asarray(tj.grad(lambda v: jnp.sum(jnp.fft.irfft(v * (1 + 0.5j), n=6) * jnp.arange(6.0)))(jnp.fft.rfft(ramp))),
    np.array([2.5 + 1.25j, -0.13397461 - 2.232051j, -0.7113249 - 1.0773503j, -0.5 - 0.25j], np.complex64), rtol=1e-5,
    atol=1e-6)
  np.testing.assert_allclose(np.asarray(tj.grad(lambda v: jnp.sum(jnp.abs(jnp.fft.rfft(v)) ** 2 * jnp.arange(4.0)))(
    ramp)), [-36, 6, -12, 12, -6, 36], rtol=1e-5, atol=1e-5)
  # JAX 0.10.2: grad(lambda x: sum(abs(fft(x)) ** 2))(x) = 2 n x for complex x (Parseval), and its rfft form
  z = np.array([1 + 2j, -0.5 + 0.25j, 3 - 1j, 0.5j], np.complex64)
  np.testing.assert_allclose(np.asarray(tj.grad(lambda u: jnp.sum(jnp.abs(jnp.fft.fft(u)) ** 2))(z)),
                             2 * 4 * np.conj(z), rtol=1e-5)


def test_bad_input():
  with pytest.raises(ValueError, match="norm"):
    jnp.fft.fft(np.ones(4), norm="sideways")
  with pytest.raises(ValueError, match="Invalid number of FFT data points"):
    jnp.fft.fft(np.ones(4), n=0)
  with pytest.raises(ValueError, match="Invalid number of FFT data points"):
    jnp.fft.fft(np.ones((2, 0)))
  with pytest.raises(TypeError, match="real-valued"):
    jnp.fft.rfft(np.ones(4, np.complex64))
  with pytest.raises(ValueError, match="repeated axes"):
    jnp.fft.fftn(np.ones((2, 2)), axes=(0, 0))
  with pytest.raises(ValueError, match="at least one dimension"):
    jnp.fft.fft(np.float32(1.0))


def test_eager_transforms_run_as_jitted_programs():
  """An eager transform of an array runs at once as a jitted program, compiled once per shape and arguments (its DFT
  matrices are host constants): the same values as the function run op by op, axes given as lists, numpy input, and
  a loop over values that lowers nothing new."""
  from tinyjax.lower.realize import counters
  from tinyjax.uop import Ops
  x = _signal(6, 10)
  array = jnp.asarray(x)
  for name in ("fft", "ifft", "rfft", "irfft", "hfft", "ihfft", "fftn", "ifftn", "fft2", "ifft2", "rfftn", "irfftn",
               "rfft2", "irfft2"):
    transform = getattr(jnp.fft, name)
    source = jnp.asarray(x.real.astype(np.float32)) if name in ("rfft", "ihfft", "rfftn", "rfft2") else array
    out = transform(source)
    assert out.uop.op is Ops.BUFFER, name  # (computed: the program ran)
    np.testing.assert_array_equal(np.asarray(out), np.asarray(transform.__wrapped__(source)), err_msg=name)
  np.testing.assert_array_equal(np.asarray(jnp.fft.fftn(array, axes=[0, 1], norm="ortho")),
                                np.asarray(jnp.fft.fftn(array, axes=(0, 1), norm="ortho")))
  np.testing.assert_allclose(np.asarray(jnp.fft.fft(x, 12, 0)), np.fft.fft(x.astype(np.complex128), 12, 0),
                             rtol=2e-5, atol=2e-5)
  lowered = counters.schedules_lowered
  for k in range(3):
    values = _signal(6, 10)
    np.testing.assert_allclose(np.asarray(jnp.fft.fft(jnp.asarray(values), axis=0)), np.fft.fft(values, axis=0),
                               rtol=2e-5, atol=2e-5)
  assert counters.schedules_lowered - lowered <= 1
  with pytest.raises(ValueError, match="norm"):
    jnp.fft.fft(array, norm="bogus")


def test_stage_contractions_get_register_tiles(on_cpu):  # (the CPU's register tiles)
  """Every contraction stage of rfft, fft and irfft of 4x33324 (12 x 2777: longer than twice LONGEST_BLUESTEIN with a
  prime factor above LARGEST_RADIX, so it is factored: a DFT-matrix contraction of 12, then Bluestein's kernel)
  is one the register tile takes (no gated loads from stacked parts, no store fused with a transpose): each kernel
  with a sum lists its tile's opts."""
  import re
  x = jnp.asarray(np.random.default_rng(0).standard_normal((4, 12 * 2777)).astype(np.float32))
  for transform in (jnp.fft.rfft, jnp.fft.fft, lambda v: jnp.fft.irfft(jnp.fft.rfft(v))):
    text = tj.jit(transform).lower(x).as_text()
    kernels = [(block.split()[0], re.search(r"; opts: (.*)", block).group(1)) for block in text.split("# kernel ")[1:]]
    contractions = [(name, opts) for name, opts in kernels if name.startswith("r_")]
    assert len(contractions) >= 1
    assert all("upcast" in opts for _, opts in contractions), contractions


# ---- power-of-two lengths: the compiled kernel (lax/_fft.py)

@pytest.mark.parametrize("n", [16, 32, 64, 128, 512, 2048, 1 << 16])
def test_power_of_two_lengths_take_the_compiled_kernel(n):
  """fft, ifft, rfft and irfft of power-of-two lengths (the compiled radix-2 kernel; rfft / irfft by a complex
  transform of half the length) against numpy in float64, within float32's rounding over log2(n) stages."""
  rows = max(1, 4096 // n)
  x = _signal(rows, n)
  wide = x.astype(np.complex128)
  tolerance = 4e-7 * np.log2(n)
  assert _relative_error(jnp.fft.fft(x), np.fft.fft(wide)) < tolerance
  assert _relative_error(jnp.fft.ifft(x), np.fft.ifft(wide)) < tolerance
  real = x.real.copy()
  assert _relative_error(jnp.fft.fft(real), np.fft.fft(real.astype(np.float64))) < tolerance
  assert _relative_error(jnp.fft.rfft(real), np.fft.rfft(real.astype(np.float64))) < tolerance
  spectrum = x[:, :n // 2 + 1]  # (not Hermitian: the imaginary parts of its first and last values are ignored)
  got = jnp.fft.irfft(spectrum)
  assert got.dtype == np.float32 and got.shape == (rows, n)
  assert _relative_error(got, np.fft.irfft(spectrum.astype(np.complex128))) < tolerance
  assert _relative_error(jnp.fft.irfft(jnp.fft.rfft(real)), real) < tolerance  # (the identity)


def test_power_of_two_float64_and_the_other_arguments():
  with tj.config.override("jax_enable_x64", True):
    x = _signal(3, 4096, dtype=np.complex128)
    assert _relative_error(jnp.fft.fft(x), np.fft.fft(x)) < 1e-14
    assert _relative_error(jnp.fft.ifft(x, norm="ortho"), np.fft.ifft(x, norm="ortho")) < 1e-14
    real = x.real.copy()
    assert _relative_error(jnp.fft.rfft(real, norm="forward"), np.fft.rfft(real, norm="forward")) < 1e-14
    assert _relative_error(jnp.fft.irfft(x[:, :1025], n=2048), np.fft.irfft(x[:, :1025], n=2048)) < 1e-14
  real = _signal(5, 100, dtype=np.float32)  # cut and padded to a power of two, along another axis
  for n, axis, norm in ((64, -1, None), (128, -1, "ortho"), (8, 0, None), (32, 0, "forward")):
    want = np.fft.rfft(real.astype(np.float64), n=n, axis=axis, norm=norm)
    np.testing.assert_allclose(np.asarray(jnp.fft.rfft(real, n=n, axis=axis, norm=norm)), want, rtol=1e-5, atol=1e-5)
    spectrum = want.astype(np.complex64)
    np.testing.assert_allclose(np.asarray(jnp.fft.irfft(spectrum, n=2 * n, axis=axis, norm=norm)),
                               np.fft.irfft(want, n=2 * n, axis=axis, norm=norm), rtol=1e-5, atol=1e-5)
  image = _signal(2, 32, 64)
  assert _relative_error(jnp.fft.fft2(image), np.fft.fft2(image.astype(np.complex128))) < 3e-6
  assert _relative_error(jnp.fft.irfft2(jnp.fft.rfft2(image.real.copy())), image.real) < 3e-6


def test_power_of_two_transformations_and_gradients():
  """jit, vmap (the batch along any axis, the transform's included) and grad through the compiled kernel: against
  numpy, finite differences, and the identities grad sum |fft z|^2 = 2 n conj(z) (Parseval) and linearity."""
  x = _signal(4, 64)
  wide = x.astype(np.complex128)
  for transform in (jnp.fft.fft, tj.jit(jnp.fft.fft)):
    np.testing.assert_allclose(np.asarray(tj.vmap(transform, in_axes=1, out_axes=1)(x.T.copy())),
                               np.fft.fft(wide).T, rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(np.asarray(tj.vmap(jnp.fft.rfft)(x.real.copy())), np.fft.rfft(wide.real), rtol=1e-5,
                             atol=1e-5)
  z = x[0]
  parseval = tj.grad(lambda u: jnp.sum(jnp.abs(jnp.fft.fft(u)) ** 2))
  np.testing.assert_allclose(np.asarray(parseval(z)), 2 * 64 * np.conj(z), rtol=1e-5, atol=1e-4)
  np.testing.assert_allclose(np.asarray(tj.jit(tj.vmap(parseval))(x)), 2 * 64 * np.conj(x), rtol=1e-5, atol=1e-4)
  with tj.config.override("jax_enable_x64", True):
    real = _signal(32, dtype=np.float64)
    weights = _signal(17, dtype=np.float64)

    def power(v):
      return jnp.sum(weights * jnp.abs(jnp.fft.rfft(v)) ** 2)

    def weighted_inverse(v):
      return jnp.sum(jnp.sin(jnp.fft.irfft(v * (1 + 0.5j), n=32)) * jnp.arange(32.0))

    numeric = numeric_grad(lambda v: power(jnp.asarray(v)), real, 1e-6)
    np.testing.assert_allclose(np.asarray(tj.grad(power)(real)), numeric, rtol=1e-6, atol=1e-8)
    np.testing.assert_allclose(np.asarray(tj.jit(tj.grad(power))(real)), numeric, rtol=1e-6, atol=1e-8)
    spectrum = np.fft.rfft(real)
    # (a complex argument: JAX's gradient is the conjugate of df/dx + i df/dy, its parts by finite differences)
    along_real = numeric_grad(lambda v: weighted_inverse(jnp.asarray(v + 0j * spectrum.imag) + 1j * spectrum.imag),
                              spectrum.real, 1e-6)
    along_imag = numeric_grad(lambda v: weighted_inverse(spectrum.real + 1j * jnp.asarray(v)), spectrum.imag, 1e-6)
    np.testing.assert_allclose(np.asarray(tj.grad(weighted_inverse)(spectrum)), along_real - 1j * along_imag,
                               rtol=1e-6, atol=1e-8)
    stacked = jnp.stack([jnp.asarray(real), 2 * jnp.asarray(real)])
    np.testing.assert_allclose(np.asarray(tj.vmap(tj.grad(power))(stacked)[0]), numeric, rtol=1e-6, atol=1e-8)


def test_power_of_two_kernel_runs_in_the_program_and_eagerly_alike(monkeypatch, on_cpu):  # (the CPU's launches)
  """A jitted transform launches the compiled kernels among its own, without calling into Python, inside a scan too;
  an eager call runs the same kernel on numpy arrays: the same bits."""
  from tinyjax.lax import _fft
  x = _signal(8, 256)
  eager = np.asarray(jnp.fft.fft(x))
  twiddles, plan = _fft.tables("fft", 256, -1, np.dtype(np.float32))
  direct = _fft._run("fft", -1, np.stack([x.real, x.imag], -1), twiddles, plan)[0]
  np.testing.assert_array_equal(direct[..., 0] + 1j * direct[..., 1], eager)
  real = x.real.copy()
  eager_real = [np.asarray(jnp.fft.rfft(real)), np.asarray(jnp.fft.irfft(x[:, :129]))]

  def step(carry, row):
    return carry + jnp.fft.irfft(jnp.fft.rfft(row)), jnp.abs(jnp.fft.fft(row)).sum()
  scanned = tj.jit(lambda rows: tj.lax.scan(step, jnp.zeros(256), rows))
  programs = [tj.jit(jnp.fft.fft), tj.jit(jnp.fft.rfft), tj.jit(jnp.fft.irfft)]
  monkeypatch.setattr(_fft, "_run", lambda *args: pytest.fail("the transform was run through Python"))
  np.testing.assert_array_equal(np.asarray(programs[0](x)), eager)
  np.testing.assert_array_equal(np.asarray(programs[1](real)), eager_real[0])
  np.testing.assert_array_equal(np.asarray(programs[2](x[:, :129])), eager_real[1])
  total, sums = scanned(real)
  np.testing.assert_allclose(np.asarray(total), real.sum(0), rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(np.asarray(sums), np.abs(np.fft.fft(real.astype(np.float64))).sum(-1), rtol=1e-5)


def test_power_of_two_transforms_read_complex_inputs_in_place_and_profile(on_cpu):
  """A jitted fft or irfft of a complex input reads the input's memory in place (no kernel around the host step),
  and a profiled run, which calls the step's Python function on the slots' values (a complex input arrives as
  itself), gives the same bits and lists the step."""
  x = _signal(16, 512)
  half = x[:, :257].copy()
  for transform, operand in ((jnp.fft.fft, x), (jnp.fft.irfft, half), (jnp.fft.ifft, x)):
    program = tj.jit(transform)
    assert "# kernel" not in program.lower(operand).as_text()
    plain = np.asarray(program(operand))
    with tj.profile() as profile:
      profiled = np.asarray(program(operand))
    np.testing.assert_array_equal(profiled, plain)
    assert any("fft" in row.name for row in profile.kernels)
  np.testing.assert_allclose(np.asarray(tj.jit(jnp.fft.ifft)(x)), np.fft.ifft(x.astype(np.complex128)), rtol=1e-5,
                             atol=1e-7)


def test_power_of_two_transforms_down_other_axes():
  """fft / ifft along an axis before the last (the column kernel: VL columns per vector, then the columns left over
  one at a time) and the 2-D and n-D transforms built on it, against numpy; their gradients against the identities
  (Parseval: grad sum |ifft(z)|^2 = 2 conj(z) / n, the norm's scale kept by the transpose) and vmap along any axis."""
  z = _signal(3, 64, 6)  # (6 columns: one block of VL = 4 and two left over, in complex64)
  wide = z.astype(np.complex128)
  for axis in (0, 1, -2):
    for norm in (None, "ortho", "forward"):
      np.testing.assert_allclose(np.asarray(jnp.fft.fft(z, axis=axis, norm=norm)),
                                 np.fft.fft(wide, axis=axis, norm=norm), rtol=2e-5, atol=2e-5)
      np.testing.assert_allclose(np.asarray(jnp.fft.ifft(z, axis=axis, norm=norm)),
                                 np.fft.ifft(wide, axis=axis, norm=norm), rtol=2e-5, atol=2e-5)
  image = _signal(2, 32, 128)
  assert _relative_error(tj.jit(jnp.fft.fft2)(image), np.fft.fft2(image.astype(np.complex128))) < 2e-6
  assert _relative_error(jnp.fft.ifftn(image), np.fft.ifftn(image.astype(np.complex128))) < 2e-6
  real = image.real.copy()  # (rfft2: the columns of 65 frequencies)
  assert _relative_error(jnp.fft.rfft2(real), np.fft.rfft2(real.astype(np.float64))) < 2e-6
  assert _relative_error(jnp.fft.irfft2(jnp.fft.rfft2(real)), real) < 2e-6
  with tj.config.override("jax_enable_x64", True):
    z64 = _signal(16, 3, dtype=np.complex128)
    assert _relative_error(jnp.fft.fft(z64, axis=0), np.fft.fft(z64, axis=0)) < 1e-14
  for axis in (-1, 0, 1):  # (1: the column kernel, with its scale 1/64, forward and transposed)
    parseval = tj.grad(lambda u, axis=axis: jnp.sum(jnp.abs(jnp.fft.ifft(u, axis=axis)) ** 2))
    n = z.shape[axis]
    np.testing.assert_allclose(np.asarray(parseval(z)), 2 * np.conj(z) / n, rtol=1e-5, atol=1e-6)
    per_example = z.shape[:2][axis]  # (vmapped over the last axis: the transform's axis of a (3, 64) example)
    np.testing.assert_allclose(np.asarray(tj.jit(tj.vmap(parseval, in_axes=2, out_axes=2))(z)),
                               2 * np.conj(z) / per_example, rtol=1e-5, atol=1e-6)
  weights = _signal(3, 64, 6, dtype=np.float32)

  def loss(u):  # a real function of a real input through a column transform: finite differences
    return jnp.sum(weights * jnp.abs(jnp.fft.fft(u, axis=1)))
  real = z.real.astype(np.float32)
  np.testing.assert_allclose(np.asarray(tj.grad(loss)(real))[:, :4, :2],
                             numeric_grad(lambda v: loss(jnp.asarray(v)), real.astype(np.float64), 1e-3)[:, :4, :2],
                             rtol=2e-2, atol=2e-2)
  np.testing.assert_allclose(np.asarray(tj.vmap(lambda u: jnp.fft.fft(u, axis=0), in_axes=1, out_axes=1)(z)),
                             np.fft.fft(wide, axis=0), rtol=2e-5, atol=2e-5)


def test_a_long_row_is_transformed_in_four_steps():
  """A power-of-two row of FOUR_STEP_MIN or more, fewer rows than threads: columns, twiddles, rows and a transpose
  (each over the whole matrix), against numpy; with more rows, the rows' kernel; Parseval's gradient through both."""
  from tinyjax.numpy import fft as fft_module
  n = fft_module.FOUR_STEP_MIN
  x = _signal(1, n)
  wide = x.astype(np.complex128)
  assert _relative_error(jnp.fft.fft(x), np.fft.fft(wide)) < 3e-6
  assert _relative_error(tj.jit(lambda v: jnp.fft.ifft(v, norm="ortho"))(x), np.fft.ifft(wide, norm="ortho")) < 3e-6
  assert _relative_error(jnp.fft.rfft(x.real.copy(), n=2 * n), np.fft.rfft(wide.real, n=2 * n)) < 3e-6
  text = tj.jit(jnp.fft.fft).lower(x).as_text()
  assert text.count(" = fft[") == 2  # (down the columns, then along the rows)
  z = x[0, :]
  parseval = tj.grad(lambda u: jnp.sum(jnp.abs(jnp.fft.ifft(u)) ** 2))
  np.testing.assert_allclose(np.asarray(parseval(z)), 2 * np.conj(z) / n, rtol=1e-4, atol=1e-9)
  two = _signal(2, n // 4)
  assert _relative_error(jnp.fft.fft(two), np.fft.fft(two.astype(np.complex128))) < 3e-6


# ---- other lengths: the mixed-radix kernel (lax/_fft.py `_mixed_ir`)

def _kernel_steps(transform, x) -> tuple[int, int]:
  """(the transform's host steps, its contraction kernels) in the jitted program of `transform` on x."""
  text = tj.jit(transform).lower(x).as_text()
  return text.count(" = fft["), sum(block.split()[0].startswith("r_") for block in text.split("# kernel ")[1:])


@pytest.mark.parametrize("n", [18, 20, 24, 45, 49, 77, 100, 360, 961, 1000, 17, 58, 3 * 7 * 11, 59, 4 * 53, 32 * 37])
def test_mixed_radix_lengths_take_the_compiled_kernel(n):
  """fft, ifft, rfft and irfft of lengths whose prime factors are at most LARGEST_RADIX (4, 2, 3, 5 written out,
  7..61 by their direct sums; a prime length alone), 1 to 13 rows (whole vectors of lines and the lines left over):
  one host step each and no contraction, against numpy in float64."""
  from tinyjax.lax import _fft
  assert _fft.supported(n, np.float32) and _fft.radices(n) is not None
  for rows in (1, 5, 8, 13):
    x = _signal(rows, n)
    wide = x.astype(np.complex128)
    assert _relative_error(jnp.fft.fft(x), np.fft.fft(wide)) < 3e-6
    assert _relative_error(tj.jit(jnp.fft.ifft)(x), np.fft.ifft(wide)) < 3e-6
    assert _relative_error(jnp.fft.rfft(x.real.copy()), np.fft.rfft(wide.real)) < 3e-6
    spectrum = np.fft.rfft(wide.real)
    assert _relative_error(jnp.fft.irfft(spectrum.astype(np.complex64), n), np.fft.irfft(spectrum, n)) < 3e-6
  x = _signal(9, n)  # (a single row of MIXED_FOUR_STEP_MIN or more is four steps, two host steps)
  assert _kernel_steps(jnp.fft.fft, x) == (1, 0)
  assert _kernel_steps(jnp.fft.rfft, x.real.copy()) == (1, 0)
  assert _kernel_steps(lambda v: jnp.fft.irfft(v, n), x[:, :n // 2 + 1]) == (1, 0)  # (odd n: kind irfft_odd)


def test_mixed_radix_float64_norms_and_axes():
  """float64 under x64 to ~1e-14; every norm; down an axis before the last (a vector of adjacent columns, any count
  of them) and through `fft2` / `rfftn` of such lengths."""
  with tj.config.override("jax_enable_x64", True):
    x = _signal(6, 360, dtype=np.complex128)
    for norm in (None, "ortho", "forward"):
      assert _relative_error(jnp.fft.fft(x, norm=norm), np.fft.fft(x, norm=norm)) < 1e-13
      assert _relative_error(jnp.fft.ifft(x, norm=norm), np.fft.ifft(x, norm=norm)) < 1e-13
      assert _relative_error(jnp.fft.rfft(x.real.copy(), norm=norm), np.fft.rfft(x.real, norm=norm)) < 1e-13
      assert _relative_error(jnp.fft.irfft(x[:, :181], norm=norm), np.fft.irfft(x[:, :181], norm=norm)) < 1e-13
  for shape, axis in (((60, 3), 0), ((2, 100, 11), 1), ((3, 45, 16, 2), 1), ((24, 9), -2)):
    x = _signal(*shape)
    assert _relative_error(jnp.fft.fft(x, axis=axis), np.fft.fft(x.astype(np.complex128), axis=axis)) < 3e-6
    assert _relative_error(tj.jit(lambda v: jnp.fft.ifft(v, axis=axis))(x),
                           np.fft.ifft(x.astype(np.complex128), axis=axis)) < 3e-6
  image = _signal(2, 48, 100)
  assert _relative_error(jnp.fft.fft2(image), np.fft.fft2(image.astype(np.complex128))) < 3e-6
  assert _relative_error(jnp.fft.rfftn(image.real.copy()), np.fft.rfftn(image.real.astype(np.float64))) < 3e-6
  assert _relative_error(jnp.fft.irfftn(jnp.fft.rfftn(image.real.copy())), image.real) < 3e-6


def test_mixed_radix_long_rows_in_four_steps():
  """A row of MIXED_FOUR_STEP_MIN or more, fewer rows than the kernel's lanes: four steps (two transforms), its rfft
  and irfft through the complex transform's four steps, against numpy; rows of it enough to fill the lanes stay one
  transform."""
  from tinyjax.numpy import fft as fft_module
  n = 12000  # 2^5 3 5^3
  assert n >= fft_module.MIXED_FOUR_STEP_MIN
  x = _signal(1, n)
  short = _signal(1, 1000)
  assert _kernel_steps(jnp.fft.fft, short)[0] == 2
  assert _relative_error(jnp.fft.fft(short), np.fft.fft(short.astype(np.complex128))) < 3e-6
  real = x.real.copy()  # (rfft / irfft of such a row: the complex transform's four steps, not one line of 8 lanes)
  assert _kernel_steps(jnp.fft.rfft, real)[0] == 2
  assert _relative_error(jnp.fft.rfft(real), np.fft.rfft(real.astype(np.float64))) < 3e-6
  spectrum = np.fft.rfft(real.astype(np.float64))
  assert _relative_error(tj.jit(jnp.fft.irfft)(spectrum.astype(np.complex64)), np.fft.irfft(spectrum)) < 3e-6
  wide = x.astype(np.complex128)
  assert _relative_error(jnp.fft.fft(x), np.fft.fft(wide)) < 3e-6
  assert _relative_error(tj.jit(jnp.fft.ifft)(x[0]), np.fft.ifft(wide[0])) < 3e-6
  assert _kernel_steps(jnp.fft.fft, x)[0] == 2
  many = _signal(8, n)
  assert _kernel_steps(jnp.fft.fft, many)[0] == 1
  assert _relative_error(jnp.fft.fft(many), np.fft.fft(many.astype(np.complex128))) < 3e-6


def test_mixed_radix_transformations_and_gradients():
  """jit, vmap (along any axis) and grad through the mixed-radix kernel, composed: against numpy, finite differences,
  the transposes (the adjoint identity <fft x, y> = <x, W^T y> with numpy's DFT matrix) and Parseval."""
  x = _signal(4, 60)
  wide = x.astype(np.complex128)
  for transform in (jnp.fft.fft, tj.jit(jnp.fft.fft)):
    np.testing.assert_allclose(np.asarray(tj.vmap(transform, in_axes=1, out_axes=1)(x.T.copy())),
                               np.fft.fft(wide).T, rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(np.asarray(tj.vmap(tj.jit(jnp.fft.rfft))(x.real.copy())), np.fft.rfft(wide.real),
                             rtol=1e-5, atol=1e-5)
  parseval = tj.grad(lambda u: jnp.sum(jnp.abs(jnp.fft.fft(u)) ** 2))
  np.testing.assert_allclose(np.asarray(parseval(x[0])), 2 * 60 * np.conj(x[0]), rtol=1e-5, atol=1e-4)
  np.testing.assert_allclose(np.asarray(tj.jit(tj.vmap(parseval))(x)), 2 * 60 * np.conj(x), rtol=1e-5, atol=1e-4)
  with tj.config.override("jax_enable_x64", True):
    for n in (45, 60):  # (odd: rfft_odd and irfft_odd; even: by half the length)
      k = np.arange(n)
      dft = np.exp(-2j * np.pi * np.outer(k, k) / n)
      real, weights = _signal(n, dtype=np.float64), _signal(n // 2 + 1, dtype=np.complex128)

      def projected(v, weights=weights):
        spectrum = jnp.fft.rfft(v)
        return jnp.sum(jnp.real(spectrum) * weights.real + jnp.imag(spectrum) * weights.imag)
      exact = dft[:n // 2 + 1].real.T @ weights.real + dft[:n // 2 + 1].imag.T @ weights.imag
      np.testing.assert_allclose(np.asarray(tj.grad(projected)(real)), exact, rtol=1e-10, atol=1e-10)
      np.testing.assert_allclose(np.asarray(tj.jit(tj.grad(projected))(real)),
                                 numeric_grad(lambda v: projected(jnp.asarray(v)), real, 1e-6), rtol=1e-6, atol=1e-7)
      signal = _signal(n, dtype=np.complex128)
      _, pullback = tj.vjp(jnp.fft.fft, signal)
      np.testing.assert_allclose(np.asarray(pullback(weights.sum() * signal)[0]), dft.T @ (weights.sum() * signal),
                                 rtol=1e-10, atol=1e-9)

      def inverse(v):
        return jnp.sum(jnp.sin(jnp.fft.irfft(v * (1 + 0.5j), n=n)) * jnp.arange(float(n)))
      spectrum = np.fft.rfft(real)
      along_real = numeric_grad(lambda v: inverse(jnp.asarray(v) + 1j * spectrum.imag), spectrum.real, 1e-6)
      along_imag = numeric_grad(lambda v: inverse(spectrum.real + 1j * jnp.asarray(v)), spectrum.imag, 1e-6)
      np.testing.assert_allclose(np.asarray(tj.grad(inverse)(spectrum)), along_real - 1j * along_imag, rtol=1e-6,
                                 atol=1e-8)
      stacked = jnp.stack([jnp.asarray(real), 2 * jnp.asarray(real)])
      np.testing.assert_allclose(np.asarray(tj.jit(tj.vmap(tj.grad(projected)))(stacked))[1], exact, rtol=1e-10,
                                 atol=1e-10)


def test_mixed_radix_kernel_runs_in_the_program_and_eagerly_alike(monkeypatch, on_cpu):  # (the CPU's launches)
  """A jitted transform of such a length launches the compiled kernel without calling into Python, in a scan too;
  an eager call runs the same kernel on numpy arrays: the same bits."""
  from tinyjax.lax import _fft
  x = _signal(11, 300)
  real = x.real.copy()
  eager = [np.asarray(jnp.fft.fft(x)), np.asarray(jnp.fft.rfft(real)), np.asarray(jnp.fft.irfft(x[:, :151]))]

  def step(carry, row):
    return carry + jnp.fft.irfft(jnp.fft.rfft(row), 300), jnp.abs(jnp.fft.fft(row)).sum()
  scanned = tj.jit(lambda rows: tj.lax.scan(step, jnp.zeros(300), rows))
  programs = [tj.jit(jnp.fft.fft), tj.jit(jnp.fft.rfft), tj.jit(jnp.fft.irfft)]
  monkeypatch.setattr(_fft, "_run", lambda *args: pytest.fail("the transform was run through Python"))
  for program, value, want in zip(programs, (x, real, x[:, :151]), eager):
    np.testing.assert_array_equal(np.asarray(program(value)), want)
  total, sums = scanned(real)
  np.testing.assert_allclose(np.asarray(total), real.sum(0), rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(np.asarray(sums), np.abs(np.fft.fft(real.astype(np.float64))).sum(-1), rtol=1e-5)


def test_bluestein_takes_a_smooth_length():
  """A length with a prime factor above LARGEST_RADIX is Bluestein's convolution by transforms of the smallest length
  >= 2n - 1 whose factors are 2, 3 and 5, all in the mixed-radix kernel (one host step) along rows or down an axis,
  against numpy; gradients through it; the lengths themselves."""
  from tinyjax.lax import _fft
  assert _fft.smooth_length(2 * 1031 - 1) == 2160
  for n in range(1, 400):
    m = _fft.smooth_length(n)
    rest = m
    for p in (2, 3, 5):
      while rest % p == 0: rest //= p
    assert m >= n and rest == 1
    assert all(_fft.smooth_length(k) == m for k in range(n, m + 1))
  for n in (67, 1031, 2144, 127 * 3):
    assert _fft.radices(n) is None and _fft.supported(n, np.float32)
    x = _signal(9, n)
    assert _kernel_steps(jnp.fft.fft, x) == (1, 0)  # (the chirps, the convolution and both transforms in one kernel)
    assert _relative_error(jnp.fft.fft(x), np.fft.fft(x.astype(np.complex128))) < 5e-6
    assert _relative_error(jnp.fft.fft(x.T, axis=0), np.fft.fft(x.T.astype(np.complex128), axis=0)) < 5e-6
    for rows in (1, 9):
      wide = _signal(rows, n).astype(np.complex128)
      assert _relative_error(tj.jit(jnp.fft.ifft)(wide.astype(np.complex64)), np.fft.ifft(wide)) < 5e-6
  for n in (67, 134, 1031, 2018, 2144):  # (rfft and irfft: the complex transform of half of an even length)
    real = _signal(9, n, dtype=np.float32)  # (fewer rows than lanes, long: four steps, `_fills_lanes`)
    assert _kernel_steps(jnp.fft.rfft, real) == (1, 0)
    assert _relative_error(tj.jit(jnp.fft.rfft)(real), np.fft.rfft(real.astype(np.float64))) < 5e-6
    spectrum = np.fft.rfft(real.astype(np.float64))
    if n % 2 == 0: assert _kernel_steps(jnp.fft.irfft, spectrum.astype(np.complex64)) == (1, 0)
    assert _relative_error(jnp.fft.irfft(spectrum.astype(np.complex64), n), np.fft.irfft(spectrum, n)) < 5e-6
    inverse = tj.jit(lambda v, n=n: jnp.fft.irfft(v, n))
    assert _relative_error(inverse(x), np.fft.irfft(x.astype(np.complex128), n)) < 5e-6
  with tj.config.override("jax_enable_x64", True):
    signal = _signal(67, dtype=np.complex128)
    assert _relative_error(jnp.fft.fft(signal), np.fft.fft(signal)) < 1e-12
    parseval = tj.jit(tj.grad(lambda u: jnp.sum(jnp.abs(jnp.fft.fft(u)) ** 2)))
    np.testing.assert_allclose(np.asarray(parseval(signal)), 2 * 67 * np.conj(signal), rtol=1e-10)
    for n in (67, 134):
      real = _signal(n, dtype=np.float64)
      loss = lambda v: jnp.sum(jnp.sin(jnp.abs(jnp.fft.rfft(v))))  # noqa: E731
      np.testing.assert_allclose(np.asarray(tj.grad(loss)(real)), numeric_grad(lambda v: loss(jnp.asarray(v)), real,
                                                                               1e-6), rtol=1e-6, atol=1e-8)
    spectrum = np.fft.rfft(_signal(134, dtype=np.float64))

    def inverse(v):
      return jnp.sum(jnp.sin(jnp.fft.irfft(v * (1 + 0.5j), n=134)) * jnp.arange(134.0))
    along_real = numeric_grad(lambda v: inverse(jnp.asarray(v) + 1j * spectrum.imag), spectrum.real, 1e-6)
    along_imag = numeric_grad(lambda v: inverse(spectrum.real + 1j * jnp.asarray(v)), spectrum.imag, 1e-6)
    np.testing.assert_allclose(np.asarray(tj.jit(tj.grad(inverse))(spectrum)), along_real - 1j * along_imag,
                               rtol=1e-6, atol=1e-8)
