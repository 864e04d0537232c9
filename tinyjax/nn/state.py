"""Checkpoints: a pytree of arrays saved as one safetensors file and loaded back into the same structure.

    nn.state.save("model.safetensors", {"params": params, "opt": opt_state})
    restored = nn.state.load("model.safetensors", like={"params": params, "opt": opt_state})

The file is the safetensors format (written and parsed by the `safetensors` package, the format's reference
implementation, which every dtype here goes through: float16/bfloat16/float32/float64, signed and unsigned ints,
bool), so other tools read it. A tensor's key is its path in the pytree, the dict keys and sequence positions joined by
"/" ("params/layers/0/w"). Each tensor's CRC-32 goes into the file's metadata, so a damaged file is detected (files
written by other tools, without them, are checked for structure only).

Writing is atomic: the bytes go to a temporary file in the same directory, which is flushed, fsync'd and renamed over
the target; a crash leaves the old checkpoint or the new one, never a torn file. `load` raises a ValueError that names
the key (and the expected and found shapes and dtypes) for a truncated, corrupted or mismatched file; it never returns
garbage.
"""
from __future__ import annotations

import json
import os
import tempfile
import zlib
from typing import Any

import numpy as np

from tinyjax import tree_util
from tinyjax import numpy as jnp

FORMAT = "tinyjax"
_CRC_PREFIX = "crc32:"


def _safetensors() -> Any:
  try:
    import safetensors.numpy
  except ImportError:  # a dependency of tinyjax; only a broken install lacks it
    raise ImportError("tinyjax.nn.state needs the `safetensors` package: pip install safetensors") from None
  return safetensors.numpy


def _key(path: Any) -> str:
  return tree_util.keystr(path, simple=True, separator="/")


def flatten(pytree: Any) -> dict[str, np.ndarray]:
  """The pytree's leaves as host arrays keyed by their paths (the keys a checkpoint of it has)."""
  leaves, _ = tree_util.tree_flatten_with_path(pytree)
  flat: dict[str, np.ndarray] = {}
  for path, leaf in leaves:
    key = _key(path)
    if key in flat:
      raise ValueError(f"two leaves of the pytree have the key {key!r}; rename one (keys must be unique)")
    array = np.asarray(leaf)
    flat[key] = array if array.flags.c_contiguous else array.copy(order="C")  # (ascontiguousarray makes 0-d 1-d)
  return flat


def save(path: str | os.PathLike, pytree: Any, metadata: dict[str, str] | None = None) -> None:
  """Write the pytree's arrays to `path` (safetensors), atomically. `metadata`: extra string pairs for the header."""
  flat = flatten(pytree)
  header = {"format": FORMAT}
  header.update({_CRC_PREFIX + key: str(zlib.crc32(value.tobytes())) for key, value in flat.items()})
  if metadata: header.update({str(k): str(v) for k, v in metadata.items()})
  path = os.fspath(path)
  directory = os.path.dirname(os.path.abspath(path))
  descriptor, temporary = tempfile.mkstemp(prefix=".tmp-", suffix=".safetensors", dir=directory)
  os.close(descriptor)
  try:
    _safetensors().save_file(flat, temporary, metadata=header)
    with open(temporary, "rb+") as file: os.fsync(file.fileno())
    os.replace(temporary, path)
  except BaseException:
    if os.path.exists(temporary): os.unlink(temporary)
    raise
  try:  # make the rename itself durable
    directory_fd = os.open(directory, os.O_RDONLY)
    try: os.fsync(directory_fd)
    finally: os.close(directory_fd)
  except OSError:
    pass


def _read(path: str) -> tuple[dict[str, np.ndarray], dict[str, str]]:
  size = os.path.getsize(path)
  if size < 8: raise ValueError(f"{path}: not a safetensors checkpoint (only {size} bytes; the file is truncated)")
  _safetensors()
  from safetensors import safe_open
  try:
    with open(path, "rb") as raw:  # the shapes as written (the numpy reader gives a 0-d tensor shape (1,))
      header = json.loads(raw.read(int.from_bytes(raw.read(8), "little")))
    with safe_open(path, framework="np") as file:
      metadata = file.metadata() or {}
      tensors = {key: file.get_tensor(key).reshape(header[key]["shape"]) for key in file.keys()}
  except Exception as error:
    raise ValueError(f"{path}: not a valid safetensors checkpoint (truncated or corrupted: {error})") from None
  for key, value in tensors.items():
    expected = metadata.get(_CRC_PREFIX + key)
    if expected is not None and str(zlib.crc32(value.tobytes())) != expected:
      raise ValueError(f"{path}: the data of {key!r} is corrupted (its checksum does not match the one saved)")
  return tensors, metadata


def load(path: str | os.PathLike, like: Any = None) -> Any:
  """The arrays of a checkpoint: in the structure of `like` (its keys, shapes and dtypes must match the file's), or
  without `like` a flat dict {key: Array}."""
  path = os.fspath(path)
  if not os.path.exists(path): raise FileNotFoundError(f"no checkpoint at {path}")
  tensors, _ = _read(path)
  if like is None: return {key: jnp.asarray(value) for key, value in tensors.items()}
  leaves, treedef = tree_util.tree_flatten_with_path(like)
  keys = [_key(p) for p, _ in leaves]
  missing = [k for k in keys if k not in tensors]
  extra = sorted(set(tensors) - set(keys))
  if missing or extra:
    raise ValueError(f"{path} does not match the structure of `like`: missing keys {missing[:8]}, unexpected keys "
                     f"{extra[:8]}")
  restored = []
  for key, (_, leaf) in zip(keys, leaves):
    value, reference = tensors[key], leaf if hasattr(leaf, "dtype") else np.asarray(leaf)
    want_shape, want_dtype = tuple(reference.shape), np.dtype(reference.dtype)
    if value.shape != want_shape or value.dtype != want_dtype:
      raise ValueError(f"{path}: {key!r} is {value.dtype.name}{list(value.shape)} in the file but "
                       f"{want_dtype.name}{list(want_shape)} in `like`")
    restored.append(jnp.asarray(value))
  return tree_util.tree_unflatten(treedef, restored)


def metadata(path: str | os.PathLike) -> dict[str, str]:
  """The string pairs saved with a checkpoint (without tinyjax's checksums)."""
  _, meta = _read(os.fspath(path))
  return {k: v for k, v in meta.items() if not k.startswith(_CRC_PREFIX)}
