"""A small persistent key -> bytes store on disk, safe across processes.

Used for object code of compiled kernels (namespace "kernels") and, later, lowered schedules. Each entry is one
file holding a header and the payload:

    magic (8 bytes) | format version (u32) | key length (u32) | payload length (u64) | sha256(key + payload) (32 bytes)
    | key (utf-8) | payload

An entry is trusted only if every field checks out, including the full key it was stored under, so a truncated,
bit-flipped, or copied/swapped entry reads as a miss (the caller recomputes and overwrites it). Writes go to a
temporary file in the same directory and are published with `os.replace`, so readers in other processes see
either the old entry or the new one, never half of one.

Directory: env TINYJAX_CACHE_DIR, else the config option `jax_compilation_cache_dir` if set, else ~/.cache/tinyjax.
"""
from __future__ import annotations

import hashlib
import os
import struct
import tempfile
import threading

MAGIC = b"TJCACHE\x00"
FORMAT_VERSION = 1
_HEADER = struct.Struct("<8sIIQ32s")  # magic, format version, key length, payload length, checksum


def cache_directory() -> str:
  """Return the root directory of the persistent cache (not created here)."""
  directory = os.environ.get("TINYJAX_CACHE_DIR")
  if directory: return os.path.expanduser(directory)
  try:
    from tinyjax.config import config  # written by a colleague; optional
    directory = config.read("jax_compilation_cache_dir")
  except Exception:  # no config module yet, or no such option: fall back to the default
    directory = None
  if directory: return os.path.expanduser(str(directory))
  return os.path.join(os.path.expanduser("~"), ".cache", "tinyjax")


def _checksum(key_bytes: bytes, payload: bytes) -> bytes:
  digest = hashlib.sha256(key_bytes)
  digest.update(payload)
  return digest.digest()


def encode_entry(key: str, payload: bytes) -> bytes:
  """Return the bytes of a cache entry file holding `payload` under `key`."""
  key_bytes = key.encode()
  header = _HEADER.pack(MAGIC, FORMAT_VERSION, len(key_bytes), len(payload), _checksum(key_bytes, payload))
  return header + key_bytes + payload


def decode_entry(key: str, entry: bytes) -> bytes | None:
  """Return the payload of `entry` if it is intact and was stored under exactly `key`, else None."""
  if len(entry) < _HEADER.size: return None
  magic, version, key_length, payload_length, checksum = _HEADER.unpack_from(entry)
  if magic != MAGIC or version != FORMAT_VERSION: return None
  if len(entry) != _HEADER.size + key_length + payload_length: return None
  key_bytes = key.encode()
  stored_key = entry[_HEADER.size:_HEADER.size + key_length]
  if stored_key != key_bytes: return None
  payload = entry[_HEADER.size + key_length:]
  if _checksum(key_bytes, payload) != checksum: return None
  return payload


class DiskCache:
  """A persistent key -> bytes store in one namespace (a subdirectory of the cache directory).

  `get` returns None for a missing or untrustworthy entry; `put` never raises on I/O errors (a cache that cannot
  be written is just a cache that misses). Counters in `stats`: hits, misses, rejected (entries present but
  corrupt or stored under another key), writes, write_errors.
  """

  def __init__(self, namespace: str, directory: str | None = None):
    self.namespace = namespace
    self._directory = directory
    self.stats = {"hits": 0, "misses": 0, "rejected": 0, "writes": 0, "write_errors": 0}
    self._lock = threading.Lock()

  @property
  def directory(self) -> str:
    """The directory holding this namespace's entries (resolved on each use, so env/config changes apply)."""
    return os.path.join(self._directory or cache_directory(), self.namespace)

  def path(self, key: str) -> str:
    """The file that holds the entry for `key`."""
    name = hashlib.sha256(key.encode()).hexdigest()[:40]
    return os.path.join(self.directory, name[:2], name + ".bin")

  def get(self, key: str) -> bytes | None:
    """Return the payload stored under `key`, or None if there is none or it fails any check."""
    try:
      with open(self.path(key), "rb") as entry_file: entry = entry_file.read()
    except OSError:
      self._count("misses")
      return None
    payload = decode_entry(key, entry)
    self._count("hits" if payload is not None else "rejected")
    if payload is None: self._count("misses")
    return payload

  def put(self, key: str, value: bytes) -> None:
    """Store `value` under `key`, replacing any previous entry atomically."""
    path = self.path(key)
    temp_path = None
    try:
      os.makedirs(os.path.dirname(path), exist_ok=True)
      descriptor, temp_path = tempfile.mkstemp(dir=os.path.dirname(path), prefix=".tmp-", suffix=".bin")
      with os.fdopen(descriptor, "wb") as temp_file: temp_file.write(encode_entry(key, value))
      os.replace(temp_path, path)
      temp_path = None
      self._count("writes")
    except OSError:
      self._count("write_errors")
    finally:  # also on KeyboardInterrupt: leave no temporary file behind
      if temp_path is not None:
        try: os.unlink(temp_path)
        except OSError: pass

  def _count(self, counter: str) -> None:
    with self._lock: self.stats[counter] += 1
