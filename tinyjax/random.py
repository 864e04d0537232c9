"""tinyjax.random: JAX's counter-based random numbers (threefry2x32), bit for bit.

A key is two uint32 words. `PRNGKey(seed)` returns them as a uint32[2] array (a "raw" key, as JAX's); `key(seed)`
returns a typed key array of shape () (a `PRNGKeyArray`, a pytree whose one leaf is that uint32[..., 2] data, so it
passes through `jit`, `vmap`, `scan` and tree functions). Every function takes either kind.

Everything is built on one primitive, `threefry2x32` (the Threefry-2x32 block cipher, 20 rounds, as Salmon et al.
2011 and JAX), a composition of uint32 adds, rotations and xors that fuses into the kernels that use its bits. As in
JAX 0.10 (`jax_threefry_partitionable`, on by default): `split(key, shape)` enciphers the counters 0..n-1 (a 64-bit
iota, split in two words); `bits` does the same and xors the two output words; `fold_in(key, d)` enciphers the
words (0, d). Floats take their mantissa from the bits (`uniform`), normals are sqrt(2) erf_inv(u), integers a
double-width modulus (`randint`): the same algorithms as JAX, so the same key gives JAX's numbers.
"""
from __future__ import annotations

import math
from typing import Any, Sequence

import numpy as np

from tinyjax import dtypes, lax, tree_util
from tinyjax import numpy as jnp
from tinyjax.array import Array
from tinyjax.placement import with_out_sharding
from tinyjax.lax._base import cast, expand_raw, full, reshape_raw, to_array
from tinyjax.lax._elementwise import _add, _and, _binary, _or
from tinyjax.trace import batching
from tinyjax.trace.core import Primitive, Tracer, bind
from tinyjax.trace.jit import jit
from tinyjax.uop import Ops

UINT32 = np.dtype(np.uint32)
UINT_DTYPES = {8: np.dtype(np.uint8), 16: np.dtype(np.uint16), 32: np.dtype(np.uint32), 64: np.dtype(np.uint64)}
_ROTATIONS = ((13, 15, 26, 6), (17, 29, 16, 24))
_KEY_PARITY = 0x1BD11BDA


# ------------------------------------------------------------------------------------------------- the cipher

def _u32(x: Array, value: int) -> Array: return full(x.shape, value, UINT32)
def _xor(x: Array, y: Array) -> Array: return _binary(Ops.XOR, x, y)


def _rotate_left(x: Array, distance: int) -> Array:
  return _or(bind(Ops.SHL, x, _u32(x, distance)), bind(Ops.SHR, x, _u32(x, 32 - distance)))


def _threefry2x32(key1: Array, key2: Array, x0: Array, x1: Array) -> list[Array]:
  """Threefry-2x32 (20 rounds) of the counter words (x0, x1) under the key (key1, key2); all uint32 of one shape."""
  keys = (key1, key2, _xor(_xor(key1, key2), _u32(key1, _KEY_PARITY)))
  x0, x1 = _add(x0, keys[0]), _add(x1, keys[1])
  for block in range(5):
    for distance in _ROTATIONS[block % 2]:
      x0 = _add(x0, x1)
      x1 = _xor(_rotate_left(x1, distance), x0)
    x0 = _add(x0, keys[(block + 1) % 3])
    x1 = _add(_add(x1, keys[(block + 2) % 3]), _u32(x1, block + 1))
  return [x0, x1]


threefry2x32_p = Primitive("threefry2x32", _threefry2x32, multiple_results=True)


def _threefry_batch(trace, vals, dims, **params):
  operands, out_dim = batching.align_batch_axes(vals, dims)
  return threefry2x32_p.bind(*operands), [out_dim, out_dim]


batching.batch_rules[threefry2x32_p] = _threefry_batch


def threefry2x32(key1: Any, key2: Any, x0: Any, x1: Any) -> list[Array]:
  """The Threefry-2x32 block cipher on uint32 words (keys broadcast to the counters' shape)."""
  x0, x1 = to_array(x0), to_array(x1)
  key1, key2 = (expand_raw(cast(to_array(k), UINT32, False), x0.shape) for k in (key1, key2))
  return threefry2x32_p.bind(key1, key2, cast(x0, UINT32, False), cast(x1, UINT32, False))


def _counters(shape: tuple[int, ...]) -> tuple[Array, Array]:
  """The 64-bit iota over `shape` as its (high, low) uint32 words."""
  size = math.prod(shape)
  if size > 2 ** 32:
    raise NotImplementedError(f"random arrays of more than 2**32 elements are not supported (shape {shape})")
  low = reshape_raw(lax.iota(UINT32, size), shape) if size else full(shape, 0, UINT32)
  return full(shape, 0, UINT32), low


def _key_words(data: Array) -> tuple[Array, Array]:
  words = [reshape_raw(lax.slice_in_dim(data, i, i + 1, axis=data.ndim - 1), data.shape[:-1]) for i in (0, 1)]
  return words[0], words[1]


def _encipher_counters(data: Array, shape: tuple[int, ...]) -> list[Array]:
  key1, key2 = _key_words(data)
  high, low = _counters(shape)
  return threefry2x32_p.bind(expand_raw(key1, shape), expand_raw(key2, shape), high, low)


def _split(data: Array, shape: tuple[int, ...]) -> Array:
  bits1, bits2 = _encipher_counters(data, shape)
  return jnp.stack([bits1, bits2], axis=len(shape))


# Called eagerly, a split runs at once as a jitted program (compiled once per shape), as JAX's does: left lazy, each
# key of a chain of splits (stax's init, ResNet-50's 350 of them) was traced again and computed anew by every key
# and sample drawn from it.
_split_data = jit(_split, static_argnums=(1,))


def _fold_in_data(data: Array, value: Array) -> Array:
  key1, key2 = _key_words(data)
  bits = threefry2x32_p.bind(key1, key2, full((), 0, UINT32), value)
  return jnp.stack(bits)


def _random_bits(data: Array, bit_width: int, shape: tuple[int, ...]) -> Array:
  bits1, bits2 = _encipher_counters(data, shape)
  if bit_width == 64:
    high, low = cast(bits1, UINT_DTYPES[64], False), cast(bits2, UINT_DTYPES[64], False)
    return _or(bind(Ops.SHL, high, full(shape, 32, UINT_DTYPES[64])), low)
  bits = _xor(bits1, bits2)
  return bits if bit_width == 32 else cast(bits, UINT_DTYPES[bit_width], False)


# ------------------------------------------------------------------------------------------------- keys

class KeyDtype:
  """The dtype of typed key arrays: `key<fry>` (threefry2x32), as JAX prints it."""
  name = "key<fry>"
  def __repr__(self) -> str: return self.name
  def __str__(self) -> str: return self.name
  def __eq__(self, other: Any) -> bool: return isinstance(other, KeyDtype) or other == self.name
  def __hash__(self) -> int: return hash(self.name)


KEY_DTYPE = KeyDtype()


class PRNGKeyArray:
  """An array of typed random keys (`key(seed)`, `split` of one): shape `data.shape[:-1]`, dtype `key<fry>`. A
  pytree whose one leaf is the uint32[..., 2] key data, so transformations pass it through; `key_data` returns it."""
  __slots__ = ("data",)

  def __init__(self, data: Any):
    self.data = data

  @property
  def shape(self) -> tuple[int, ...]: return tuple(self.data.shape[:-1])
  @property
  def ndim(self) -> int: return len(self.shape)
  @property
  def size(self) -> int: return math.prod(self.shape)
  @property
  def dtype(self) -> KeyDtype: return KEY_DTYPE

  def __len__(self) -> int:
    if not self.shape: raise TypeError("len() of unsized object")
    return self.shape[0]

  def __iter__(self):
    if not self.shape: raise TypeError("iteration over a 0-d key array")
    return (self[i] for i in range(self.shape[0]))

  def __getitem__(self, index: Any) -> PRNGKeyArray:
    items = index if isinstance(index, tuple) else (index,)
    if any(item is Ellipsis for item in items): return PRNGKeyArray(self.data[(*items, slice(None))])
    return PRNGKeyArray(self.data[(*items, *(slice(None),) * (self.ndim - len(items) + 1))])

  def reshape(self, *shape: Any) -> PRNGKeyArray:
    if len(shape) == 1 and not isinstance(shape[0], int): shape = tuple(shape[0])
    return PRNGKeyArray(jnp.reshape(self.data, (*shape, 2)))

  def __repr__(self) -> str:
    return f"Array({self.shape}, dtype=key<fry>) overlaying:\n{np.asarray(self.data)}" if not isinstance(
      self.data, Tracer) else f"{self.data.kind_name()}(key<fry>[{','.join(map(str, self.shape))}])"


tree_util.register_pytree_node(PRNGKeyArray, lambda keys: ((keys.data,), None),
                               lambda _, children: PRNGKeyArray(children[0]))


def _seed_words(seed: Any) -> Array:
  """The two uint32 words of a key from an integer seed (a 64-bit seed's high and low words, as JAX)."""
  if isinstance(seed, (bool, np.bool_)) or isinstance(seed, float) or (
      isinstance(seed, (Array, np.ndarray, np.generic)) and not dtypes.issubdtype(seed.dtype, np.integer)):
    raise TypeError(f"PRNG key seed must be an integer; got {seed!r}")
  if isinstance(seed, (int, np.integer)) and not isinstance(seed, Array):
    value = int(seed)
    if not -2 ** 63 <= value < 2 ** 63: raise OverflowError("Python int too large to convert to C long")
    value %= 2 ** 64  # as int64; without x64 the seed is then an int32 (its low word, as JAX)
    high = value >> 32 if dtypes.canonicalize_dtype(np.dtype(np.int64)) == np.int64 else 0
    return to_array(np.array([high, value & 0xFFFFFFFF], dtype=np.uint32))
  seed = to_array(seed)
  if seed.shape: raise TypeError(f"PRNG key seed must be a scalar; got shape {seed.shape}.")
  low = cast(seed, UINT32, False)
  if seed.dtype.itemsize == 8:
    high = cast(bind(Ops.SHR, seed, full((), 32, seed.dtype)), UINT32, False)
  else:  # a 32-bit seed is padded with zeros
    high = full((), 0, UINT32)
  return jnp.stack([high, low])


def PRNGKey(seed: Any, *, impl: Any = None) -> Array:  # noqa: N802  (JAX's name)
  """A raw key: the uint32[2] array of the threefry2x32 key for an integer `seed`."""
  _check_impl(impl)
  return _seed_words(seed)


def key(seed: Any, *, impl: Any = None) -> PRNGKeyArray:
  """A typed key array of shape () for an integer `seed`."""
  _check_impl(impl)
  return PRNGKeyArray(_seed_words(seed))


def _check_impl(impl: Any) -> None:
  if impl not in (None, "threefry2x32", "threefry"):
    raise ValueError(f"unknown PRNG implementation {impl!r}: tinyjax implements 'threefry2x32'")


def key_data(keys: Any) -> Array:
  """The uint32[..., 2] data of typed keys (raw keys are returned as they are)."""
  if isinstance(keys, PRNGKeyArray): return keys.data
  return _check_raw(keys, "key_data")


def wrap_key_data(key_bits_array: Any, *, impl: Any = None) -> PRNGKeyArray:
  """Typed keys from uint32[..., 2] data."""
  _check_impl(impl)
  return PRNGKeyArray(_check_raw(key_bits_array, "wrap_key_data"))


def _check_raw(data: Any, name: str) -> Array:
  if isinstance(data, (list, tuple)): data = np.asarray(data)
  if not isinstance(data, (Array, np.ndarray)):
    raise TypeError(f"unexpected PRNG key type {type(data).__name__} in {name}: pass a key from tinyjax.random.key "
                    "or PRNGKey")
  data = to_array(data)
  if data.dtype != UINT32:
    raise TypeError(f"JAX encountered invalid PRNG key data: expected key_data.dtype = uint32; got "
                    f"dtype={data.dtype.name}")
  if not data.shape or data.shape[-1] != 2:
    raise TypeError(f"JAX encountered invalid PRNG key data: expected key_data.shape to end with (2,); got "
                    f"shape={data.shape} for impl=threefry2x32")
  return data


def _key(name: str, keys: Any, batched: bool = False) -> tuple[Array, bool]:
  """The uint32 data of a key argument and whether it was typed; a single key unless `batched`."""
  typed = isinstance(keys, PRNGKeyArray)
  data = keys.data if typed else _check_raw(keys, name)
  if not batched and data.ndim != 1:
    raise ValueError(f"{name} accepts a single key, but was given a key array of shape {tuple(data.shape[:-1])} != "
                     "(). Use jax.vmap for batching.")
  return data, typed


def _shape(shape: Any) -> tuple[int, ...]:
  if isinstance(shape, (int, np.integer)): return (int(shape),)
  try:
    return tuple(int(d) for d in shape)
  except TypeError:
    raise TypeError(f"shape must be a sequence of integers, got {shape!r}") from None


def split(key: Any, num: int | Sequence[int] = 2) -> Any:
  """`num` new keys (or an array of keys of shape `num`) from one key; typed in, typed out."""
  data, typed = _key("split", key)
  shape = _shape(num)
  new = _split_data(data, shape)
  return PRNGKeyArray(new) if typed else new


def fold_in(key: Any, data: Any) -> Any:
  """A new key from a key and an integer (e.g. a step number): the same (key, data) gives the same key."""
  key_bits, typed = _key("fold_in", key)
  value = to_array(data)
  if value.shape: raise TypeError(f"fold_in data must be a scalar, got shape {value.shape}")
  if not dtypes.issubdtype(value.dtype, np.integer):
    raise TypeError(f"fold_in data must be an integer, got {value.dtype.name}")
  new = _fold_in_data(key_bits, cast(value, UINT32, False))
  return PRNGKeyArray(new) if typed else new


def clone(key: Any) -> Any:
  """The key itself (JAX's clone, for keys that are consumed)."""
  return key


# ------------------------------------------------------------------------------------------------- samplers

def _float_dtype(name: str, dtype: Any) -> np.dtype:
  dtype = dtypes.default_float_dtype() if dtype is None else dtypes.check_user_dtype_supported(dtype)
  if not dtypes.issubdtype(dtype, np.floating):
    raise ValueError(f"dtype argument to `{name}` must be a float dtype, got {dtype}")
  return dtype


def _check_shape(name: str, shape: tuple[int, ...], *param_shapes: tuple[int, ...]) -> None:
  if param_shapes:
    try:
      combined = np.broadcast_shapes(shape, *param_shapes)
    except ValueError:
      combined = None
    if combined != shape:
      raise ValueError(f"{name} parameter shapes must be broadcast-compatible with shape argument, and the result of "
                       f"broadcasting the shapes must equal the shape argument, but got result {combined} for shape "
                       f"argument {shape}.")


@with_out_sharding
def bits(key: Any, shape: Sequence[int] = (), dtype: Any = None) -> Array:
  """Uniformly random unsigned integers of `dtype` (default uint32) and `shape`."""
  data, _ = _key("bits", key)
  dtype = np.dtype(np.uint32) if dtype is None else dtypes.check_user_dtype_supported(dtype)
  if dtype.kind != "u":
    raise TypeError(f"dtype argument to `bits` must be an unsigned int dtype, got {dtype}")
  return _random_bits_data(data, dtype.itemsize * 8, _shape(shape))


def _uniform(data: Array, shape: tuple[int, ...], dtype: np.dtype, minval: Any, maxval: Any) -> Array:
  info = dtypes.finfo(dtype)
  nbits, nmant = info.bits, info.nmant
  rng_bits = 8 if nmant < 8 else nbits
  uint = UINT_DTYPES[nbits]
  raw = _random_bits(data, rng_bits, shape)
  if rng_bits != nbits: raw = cast(raw, uint, False)
  one_bits = int(np.array(1.0, dtype).view(uint))
  mantissa = bind(Ops.SHR, raw, full(shape, rng_bits - nmant, uint))
  floats = bind(Ops.BITCAST, _or(mantissa, full(shape, one_bits, uint)), dtype=dtype)
  floats = lax.sub(floats, full(shape, 1.0, dtype))
  low = expand_raw(cast(to_array(minval), dtype, False), shape)
  high = expand_raw(cast(to_array(maxval), dtype, False), shape)
  span = lax.sub(high, low)
  if dtype == np.float32:  # floats * span + low rounded once, as XLA's fused multiply-add (exact product in float64)
    f64 = np.dtype(np.float64)
    scaled = cast(lax.add(lax.mul(cast(floats, f64, False), cast(span, f64, False)), cast(low, f64, False)), dtype,
                  False)
  else:
    scaled = lax.add(lax.mul(floats, span), low)
  return lax.max(low, scaled)


@with_out_sharding
def uniform(key: Any, shape: Sequence[int] = (), dtype: Any = None, minval: Any = 0.0, maxval: Any = 1.0) -> Array:
  """Uniform floats in [minval, maxval) of `shape` and float `dtype` (default float32)."""
  data, _ = _key("uniform", key)
  shape, dtype = _shape(shape), _float_dtype("uniform", dtype)
  _check_shape("uniform", shape, np.shape(minval), np.shape(maxval))
  return _uniform_data(data, shape, dtype, minval, maxval)


def _normal(data: Array, shape: tuple[int, ...], dtype: np.dtype) -> Array:
  low = -1.0 + float(dtypes.finfo(dtype).epsneg)  # nextafter(-1, 0)
  u = _uniform(data, shape, dtype, low, 1.0)
  return lax.mul(full(shape, math.sqrt(2), dtype), lax.erf_inv(u))


@with_out_sharding
def normal(key: Any, shape: Sequence[int] = (), dtype: Any = None) -> Array:
  """Standard normal floats of `shape` (sqrt(2) erf_inv of a uniform in (-1, 1), as JAX)."""
  data, _ = _key("normal", key)
  return _normal_data(data, _shape(shape), _float_dtype("normal", dtype))


# Called eagerly, `bits`, `uniform`, `normal` and `permutation`'s shuffle run at once as jitted programs (compiled
# once per shape and dtype), as JAX's do: built op by op, an eager `normal(key, (8,))` was 31 operations and a walk of
# their 51 nodes, 194 us against JAX's 14. (Inside a transformation they trace inline; the samplers built on them stay
# lazy.)
_random_bits_data = jit(_random_bits, static_argnums=(1, 2))
_uniform_data = jit(_uniform, static_argnums=(1, 2))
_normal_data = jit(_normal, static_argnums=(1, 2))


def _clip_integer(value: Array, dtype: np.dtype) -> Array:
  """An integer array converted to `dtype`, clipped to its range instead of wrapping."""
  info = np.iinfo(dtype)
  wide = np.dtype(np.int64) if value.dtype.kind == "i" or value.dtype.itemsize < 8 else value.dtype
  if value.dtype == np.uint64 or dtype == np.uint64:
    return cast(value, dtype, False)
  value = cast(value, wide, False)
  value = lax.min(lax.max(value, full(value.shape, max(info.min, np.iinfo(wide).min), wide)),
                  full(value.shape, min(info.max, np.iinfo(wide).max), wide))
  return cast(value, dtype, False)


@with_out_sharding
def randint(key: Any, shape: Sequence[int], minval: Any, maxval: Any, dtype: Any = None) -> Array:
  """Uniform integers in [minval, maxval) of `shape` and integer `dtype` (default int32), JAX's algorithm: a
  double-width remainder of random bits, so the same key gives the same integers as JAX."""
  data, _ = _key("randint", key)
  shape = _shape(shape)
  dtype = dtypes.default_int_dtype() if dtype is None else dtypes.check_user_dtype_supported(dtype)
  if not dtypes.issubdtype(dtype, np.integer): raise TypeError(f"randint only accepts integer dtypes, got {dtype}")
  _check_shape("randint", shape, np.shape(minval), np.shape(maxval))
  def as_int(value: Any) -> Array:
    array = jnp.asarray(value)
    return array if dtypes.issubdtype(array.dtype, np.integer) else cast(array, dtypes.default_int_dtype(), False)
  minval, maxval = as_int(minval), as_int(maxval)
  if np.iinfo(dtype).bits < 32:  # narrow dtypes sample in int32 (less biased), then convert (as JAX)
    info, int32 = np.iinfo(dtype), np.dtype(np.int32)
    low, high = cast(minval, int32, False), cast(maxval, int32, False)
    low = lax.min(lax.max(low, full(low.shape, int(info.min), int32)), full(low.shape, int(info.max), int32))
    high = lax.min(lax.max(high, full(high.shape, int(info.min), int32)), full(high.shape, int(info.max) + 1, int32))
    return cast(randint(key, shape, low, high, int32), dtype, False)
  wide = np.dtype(np.int64)
  top = full((), int(np.iinfo(dtype).max), dtype)
  out_of_range = lax.gt(cast(maxval, wide, False), cast(_clip_integer(top, maxval.dtype), wide, False))
  minval, maxval = expand_raw(_clip_integer(minval, dtype), shape), expand_raw(_clip_integer(maxval, dtype), shape)
  out_of_range = expand_raw(out_of_range, shape)
  nbits = np.iinfo(dtype).bits
  halves = _split_data(data, (2,))
  key1, key2 = halves[0], halves[1]
  higher, lower = _random_bits(key1, nbits, shape), _random_bits(key2, nbits, shape)
  unsigned = UINT_DTYPES[nbits]
  span = cast(lax.sub(maxval, minval), unsigned, False)
  span = lax.select(lax.le(maxval, minval), full(shape, 1, unsigned), span)
  span = lax.select(_and(out_of_range, lax.gt(maxval, minval)), lax.add(span, full(shape, 1, unsigned)), span)
  multiplier = lax.rem(full(shape, 2 ** (nbits // 2), unsigned), span)
  multiplier = lax.rem(lax.mul(multiplier, multiplier), span)
  offset = lax.add(lax.mul(lax.rem(higher, span), multiplier), lax.rem(lower, span))
  offset = lax.rem(offset, span)
  return lax.add(minval, cast(offset, dtype, False))


@with_out_sharding
def bernoulli(key: Any, p: Any = 0.5, shape: Sequence[int] | None = None, mode: str = "low") -> Array:
  """Booleans that are True with probability `p` (shape: `shape`, else p's)."""
  data, _ = _key("bernoulli", key)
  p = to_array(p)
  if not dtypes.issubdtype(p.dtype, np.floating): p = cast(p, dtypes.default_float_dtype(), False)
  shape = tuple(p.shape) if shape is None else _shape(shape)
  _check_shape("bernoulli", shape, p.shape)
  if mode not in ("low", "high"): raise ValueError(f"bernoulli mode must be 'low' or 'high', got {mode!r}")
  if mode == "high":
    both = _uniform(data, (2, *shape), p.dtype, 0.0, 1.0)
    u1, u2 = both[0], lax.mul(both[1], full(shape, 2.0 ** -dtypes.finfo(p.dtype).nmant, p.dtype))
    return lax.lt(u2, lax.sub(expand_raw(p, shape), u1))
  return lax.lt(_uniform(data, shape, p.dtype, 0.0, 1.0), expand_raw(p, shape))


def _gumbel(data: Array, shape: tuple[int, ...], dtype: np.dtype) -> Array:
  tiny = float(dtypes.finfo(dtype).tiny)
  return lax.neg(lax.log(lax.neg(lax.log(_uniform(data, shape, dtype, tiny, 1.0)))))


@with_out_sharding
def gumbel(key: Any, shape: Sequence[int] = (), dtype: Any = None, mode: str | None = None) -> Array:
  """Standard Gumbel samples: -log(-log(u))."""
  data, _ = _key("gumbel", key)
  if mode not in (None, "low"):
    raise NotImplementedError(f"gumbel mode={mode!r} is not implemented in tinyjax (only 'low', JAX's default)")
  return _gumbel(data, _shape(shape), _float_dtype("gumbel", dtype))


@with_out_sharding
def categorical(key: Any, logits: Any, axis: int = -1, shape: Sequence[int] | None = None, replace: bool = True,
                mode: str | None = None) -> Array:
  """Samples of categorical distributions with unnormalized log-probabilities `logits` along `axis` (the Gumbel-max
  trick, as JAX), of `shape` (default: logits' shape without `axis`)."""
  data, _ = _key("categorical", key)
  logits = jnp.asarray(logits)
  if not dtypes.issubdtype(logits.dtype, np.floating): logits = cast(logits, dtypes.default_float_dtype(), False)
  axis = axis % logits.ndim if logits.ndim else 0
  batch_shape = tuple(np.delete(np.array(logits.shape, dtype=np.int64), axis).tolist())
  shape = batch_shape if shape is None else _shape(shape)
  _check_shape("categorical", shape, batch_shape)
  if mode not in (None, "low"):
    raise NotImplementedError(f"categorical mode={mode!r} is not implemented in tinyjax (only 'low')")
  prefix = shape[:len(shape) - len(batch_shape)]
  if not replace:  # the Gumbel top-k trick
    noisy = lax.add(logits, _gumbel(data, tuple(logits.shape), logits.dtype))
    k = math.prod(prefix)
    if k > logits.shape[axis]:
      raise ValueError(f"Number of samples without replacement ({k}) cannot exceed number of categories "
                       f"({logits.shape[axis]}).")
    _, indices = lax.top_k(jnp.moveaxis(noisy, axis, -1), k)
    return jnp.reshape(jnp.moveaxis(indices, -1, 0), shape)
  relative = axis - logits.ndim
  logits_shape = list(shape[len(shape) - len(batch_shape):])
  logits_shape.insert(relative % logits.ndim, logits.shape[axis])
  noise = _gumbel(data, (*prefix, *logits_shape), logits.dtype)
  expanded = reshape_raw(logits, (1,) * len(prefix) + tuple(logits.shape))
  return jnp.argmax(lax.add(noise, expand_raw(expanded, noise.shape)), axis=relative)


@with_out_sharding
def exponential(key: Any, shape: Sequence[int] = (), dtype: Any = None) -> Array:
  """Standard exponential samples: -log1p(-u)."""
  data, _ = _key("exponential", key)
  shape, dtype = _shape(shape), _float_dtype("exponential", dtype)
  return lax.neg(lax.log1p(lax.neg(_uniform(data, shape, dtype, 0.0, 1.0))))


@with_out_sharding
def laplace(key: Any, shape: Sequence[int] = (), dtype: Any = None) -> Array:
  """Standard Laplace samples: sign(u) log1p(-|u|) for u uniform in (-1, 1)."""
  data, _ = _key("laplace", key)
  shape, dtype = _shape(shape), _float_dtype("laplace", dtype)
  u = _uniform(data, shape, dtype, -1.0 + float(dtypes.finfo(dtype).epsneg), 1.0)
  return lax.mul(lax.sign(u), lax.log1p(lax.neg(lax.abs(u))))


@with_out_sharding
def logistic(key: Any, shape: Sequence[int] = (), dtype: Any = None) -> Array:
  """Standard logistic samples: log(u / (1 - u))."""
  data, _ = _key("logistic", key)
  shape, dtype = _shape(shape), _float_dtype("logistic", dtype)
  u = _uniform(data, shape, dtype, float(dtypes.finfo(dtype).tiny), 1.0)
  return lax.log(lax.div(u, lax.sub(full(shape, 1.0, dtype), u)))


@with_out_sharding
def truncated_normal(key: Any, lower: Any, upper: Any, shape: Sequence[int] | None = None,
                     dtype: Any = None) -> Array:
  """Normal samples truncated to (lower, upper): sqrt(2) erf_inv of a uniform between erf(lower/sqrt2) and
  erf(upper/sqrt2), clamped strictly inside the bounds (as JAX)."""
  data, _ = _key("truncated_normal", key)
  dtype = _float_dtype("truncated_normal", dtype)
  shape = tuple(np.broadcast_shapes(np.shape(lower), np.shape(upper))) if shape is None else _shape(shape)
  _check_shape("truncated_normal", shape, np.shape(lower), np.shape(upper))
  root2 = math.sqrt(2)
  low, high = (expand_raw(cast(to_array(bound), dtype, False), shape) for bound in (lower, upper))
  a = lax.erf(lax.div(low, full(shape, root2, dtype)))
  b = lax.erf(lax.div(high, full(shape, root2, dtype)))
  out = lax.mul(full(shape, root2, dtype), lax.erf_inv(_uniform(data, shape, dtype, a, b)))
  inf = full(shape, math.inf, dtype)
  return jnp.clip(out, jnp.nextafter(lax.stop_gradient(low), inf), jnp.nextafter(lax.stop_gradient(high), -inf))


@with_out_sharding
def rademacher(key: Any, shape: Sequence[int] = (), dtype: Any = None) -> Array:
  """Random -1 / +1 values (integer dtype, default int32)."""
  data, _ = _key("rademacher", key)
  dtype = dtypes.default_int_dtype() if dtype is None else dtypes.check_user_dtype_supported(dtype)
  heads = lax.lt(_uniform(data, _shape(shape), np.dtype(np.float32), 0.0, 1.0), full(_shape(shape), 0.5,
                                                                                        np.float32))
  return lax.sub(lax.mul(cast(heads, dtype, False), full(_shape(shape), 2, dtype)), full(_shape(shape), 1, dtype))


@with_out_sharding
def orthogonal(key: Any, n: int, shape: Sequence[int] = (), dtype: Any = None, m: int | None = None) -> Array:
  """Matrices (*shape, n, m) (m = n by default) drawn uniformly from the orthogonal group (orthonormal columns or rows,
  whichever side is smaller): the Q of a Gaussian matrix's QR, its columns' signs fixed by R's diagonal (as JAX)."""
  columns = n if m is None else int(m)
  n, shape = int(n), _shape(shape)
  dtype = _float_dtype("orthogonal", dtype)
  z = normal(key, (*shape, max(n, columns), min(n, columns)), dtype)
  q, r = jnp.linalg.qr(z)
  d = jnp.diagonal(r, 0, -2, -1)
  x = q * jnp.expand_dims(jnp.sign(d), -2)
  return jnp.swapaxes(x, -1, -2) if n < columns else x


@with_out_sharding
def multivariate_normal(key: Any, mean: Any, cov: Any, shape: Sequence[int] | None = None, dtype: Any = None,
                        method: str = "cholesky") -> Array:
  """Samples of N(mean, cov): mean + normal @ cholesky(cov).T (method "cholesky", JAX's default)."""
  data, _ = _key("multivariate_normal", key)
  if method != "cholesky":
    raise NotImplementedError(f"multivariate_normal method={method!r}: tinyjax implements 'cholesky'")
  dtype = _float_dtype("multivariate_normal", dtype)
  mean, cov = cast(jnp.asarray(mean), dtype, False), cast(jnp.asarray(cov), dtype, False)
  if mean.ndim < 1 or cov.ndim < 2 or cov.shape[-2:] != (mean.shape[-1], mean.shape[-1]):
    raise ValueError(f"multivariate_normal requires mean.shape[-1] == cov.shape[-2] == cov.shape[-1], got mean shape "
                     f"{mean.shape} and cov shape {cov.shape}")
  n = mean.shape[-1]
  batch = np.broadcast_shapes(mean.shape[:-1], cov.shape[:-2])
  shape = tuple(batch) if shape is None else _shape(shape)
  _check_shape("multivariate_normal", shape, mean.shape[:-1], cov.shape[:-2])
  factor = jnp.linalg.cholesky(cov)
  z = _normal(data, (*shape, n), dtype)
  return lax.add(expand_raw(mean, (*shape, n)), jnp.matmul(expand_raw(factor, (*shape, n, n)), z[..., None])[..., 0])


def _shuffle(data: Array, x: Array, axis: int) -> Array:
  """x shuffled along `axis` by sorting on random 32-bit keys, in as many rounds as JAX takes (3 log(size) /
  log(2**32 - 1), so that ties are unlikely to leave a bias)."""
  rounds = int(np.ceil(3 * np.log(max(1, x.size)) / np.log(np.iinfo(np.uint32).max)))
  for _ in range(rounds):
    halves = _split_data(data, (2,))
    data, subkey = halves[0], halves[1]
    _, x = lax.sort_key_val(_random_bits(subkey, 32, tuple(x.shape)), x, axis)
  return x


_shuffle_data = jit(_shuffle, static_argnums=(2,))  # (as `_uniform_data`; permutation(key, 64) eagerly: 188 -> 40 us)


@with_out_sharding
def permutation(key: Any, x: Any, axis: int = 0, independent: bool = False) -> Array:
  """A random permutation of `x` along `axis` (of range(x) for an integer x); rows permuted together unless
  `independent` (then each 1-D slice along `axis` on its own)."""
  data, _ = _key("permutation", key)
  if isinstance(x, (list, tuple)): raise TypeError("permutation requires an array or an integer x, not a list")
  array = jnp.asarray(x)
  if array.ndim == 0:
    if not dtypes.issubdtype(array.dtype, np.integer):
      raise TypeError("x must be an integer or at least 1-dimensional")
    if isinstance(array, Tracer): array.concrete("argument x of tinyjax.random.permutation()")
    return _shuffle_data(data, jnp.arange(int(array)), 0)
  axis = axis % array.ndim
  if independent or array.ndim == 1: return _shuffle_data(data, array, axis)
  order = _shuffle_data(data, jnp.arange(array.shape[axis]), 0)
  return jnp.take(array, order, axis=axis, unique_indices=True)


def choice(key: Any, a: Any, shape: Sequence[int] = (), replace: bool = True, p: Any = None, axis: int = 0,
           mode: str | None = None) -> Array:
  """Random samples of `a` (or of range(a) for an integer a) along `axis`: uniform, or with probabilities `p`;
  without replacement a permutation's head (uniform) or the Gumbel top-k (with p), as JAX."""
  data, _ = _key("choice", key)
  if not isinstance(shape, Sequence):
    raise TypeError(f"shape argument of tinyjax.random.choice must be a sequence, got {shape}")
  array = jnp.asarray(a)
  if array.ndim == 0:
    if isinstance(array, Tracer): array.concrete("argument a of tinyjax.random.choice()")
    n_inputs = int(array)
  else:
    axis = axis % array.ndim
    n_inputs = array.shape[axis]
  shape = _shape(shape)
  n_draws = math.prod(shape)
  if n_draws == 0: return jnp.zeros(shape, dtype=array.dtype)
  if n_inputs <= 0: raise ValueError("a must be greater than 0 unless no samples are taken")
  if not replace and n_draws > n_inputs:
    raise ValueError(f"Cannot take a larger sample (size {n_draws}) than population (size {n_inputs}) when "
                     "'replace=False'")
  if p is None:
    if replace:
      indices = randint(PRNGKeyArray(data), shape, 0, n_inputs)
      result = indices if array.ndim == 0 else jnp.take(array, indices, axis=axis)
    else:
      source = n_inputs if array.ndim == 0 else array
      result = permutation(PRNGKeyArray(data), source, axis)[(slice(None),) * axis + (slice(n_draws),)]
  else:
    weights = jnp.asarray(p)
    if not dtypes.issubdtype(weights.dtype, np.floating): weights = cast(weights, dtypes.default_float_dtype(), False)
    if weights.shape != (n_inputs,):
      raise ValueError(f"p must be None or a 1D vector with the same size as a.shape[axis]. p has shape "
                       f"{weights.shape} and a.shape[axis] is {n_inputs}.")
    if replace:
      cumulative = jnp.cumsum(weights)
      u = _uniform(data, shape, cumulative.dtype, 0.0, 1.0)
      r = lax.mul(expand_raw(cumulative[-1], shape), lax.sub(full(shape, 1.0, cumulative.dtype), u))
      indices = jnp.searchsorted(cumulative, r).astype(dtypes.default_int_dtype())
    else:
      noise = lax.add(_gumbel(data, (n_inputs,), weights.dtype), jnp.log(weights))
      indices = lax.top_k(noise, n_draws)[1].astype(dtypes.default_int_dtype())
    result = indices if array.ndim == 0 else jnp.take(array, indices, axis=axis)
  final = shape if array.ndim == 0 else tuple(array.shape[:axis]) + shape + tuple(array.shape[axis + 1:])
  return jnp.reshape(result, final)
