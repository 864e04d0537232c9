"""Data: an IDX file reader, Fashion-MNIST from Debian's `dataset-fashion-mnist` files, and a batch iterator that
shuffles with a key and prepares the next batch while the training step runs.

    train_x, train_y, test_x, test_y = datasets.fashion_mnist()      # uint8 (60000, 28, 28), uint8 labels, ...
    for x, y in datasets.batches((train_x, train_y), 128, key=random.fold_in(key, epoch)):
      params, opt_state, loss = step(params, opt_state, x, y)

The data set is looked for in the directory given as `data_dir`, then in $TINYJAX_DATA, then in
/usr/share/datasets/fashion-mnist (where `apt-get install dataset-fashion-mnist` puts it).
"""
from __future__ import annotations

import gzip
import os
import queue
import threading
import weakref
from typing import Any, Iterator, Sequence

import numpy as np

FASHION_MNIST_DIRS = ("/usr/share/datasets/fashion-mnist",)
FASHION_MNIST_FILES = ("train-images-idx3-ubyte", "train-labels-idx1-ubyte", "t10k-images-idx3-ubyte",
                       "t10k-labels-idx1-ubyte")
# IDX type codes: the element type of the data, big-endian in the file
_IDX_TYPES = {0x08: np.dtype(np.uint8), 0x09: np.dtype(np.int8), 0x0B: np.dtype(">i2"), 0x0C: np.dtype(">i4"),
              0x0D: np.dtype(">f4"), 0x0E: np.dtype(">f8")}


def read_idx(path: str | os.PathLike) -> np.ndarray:
  """An IDX file (gzip-compressed or not) as a numpy array: magic 0x0000 then a type code and the number of
  dimensions, each dimension as a big-endian uint32, then the data."""
  path = os.fspath(path)
  with open(path, "rb") as file: raw = file.read()
  if raw[:2] == b"\x1f\x8b":
    try: raw = gzip.decompress(raw)
    except (OSError, EOFError) as error: raise ValueError(f"{path}: a damaged gzip file ({error})") from None
  if len(raw) < 4 or raw[:2] != b"\x00\x00":
    raise ValueError(f"{path}: not an IDX file (it must start with two zero bytes, a type code and a rank)")
  code, ndim = raw[2], raw[3]
  if code not in _IDX_TYPES: raise ValueError(f"{path}: unknown IDX element type code {code:#x}")
  header = 4 + 4 * ndim
  if len(raw) < header: raise ValueError(f"{path}: truncated IDX header ({len(raw)} bytes for {ndim} dimensions)")
  shape = tuple(int.from_bytes(raw[4 + 4 * i:8 + 4 * i], "big") for i in range(ndim))
  dtype = _IDX_TYPES[code]
  expected = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
  if len(raw) - header != expected:
    raise ValueError(f"{path}: the header says shape {shape} of {dtype.name} ({expected} bytes) but the file has "
                     f"{len(raw) - header} bytes of data")
  return np.frombuffer(raw, dtype, offset=header).reshape(shape).astype(dtype.newbyteorder("="))


def _find(directory: str, name: str) -> str | None:
  for candidate in (name + ".gz", name):
    path = os.path.join(directory, candidate)
    if os.path.exists(path): return path
  return None


def fashion_mnist(data_dir: str | os.PathLike | None = None) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
  """(train images, train labels, test images, test labels): uint8 (60000, 28, 28), uint8 (60000,), uint8 (10000, 28,
  28), uint8 (10000,), from `data_dir`, $TINYJAX_DATA or Debian's /usr/share/datasets/fashion-mnist."""
  candidates = [os.fspath(data_dir)] if data_dir is not None else []
  if os.environ.get("TINYJAX_DATA"): candidates.append(os.environ["TINYJAX_DATA"])
  candidates += list(FASHION_MNIST_DIRS)
  for directory in candidates:
    paths = [_find(directory, name) for name in FASHION_MNIST_FILES]
    if all(paths): return tuple(read_idx(p) for p in paths)  # type: ignore[return-value]
  raise FileNotFoundError(
    "Fashion-MNIST was not found (looked in " + ", ".join(candidates) + ").\n"
    "Install it with:  sudo apt-get install dataset-fashion-mnist\n"
    "or put train-images-idx3-ubyte.gz, train-labels-idx1-ubyte.gz, t10k-images-idx3-ubyte.gz and "
    "t10k-labels-idx1-ubyte.gz in a directory and set TINYJAX_DATA=/that/directory")


class _Prefetcher:
  """Produces the batches of one pass on a background thread, one ahead of the consumer."""

  def __init__(self, arrays: Sequence[np.ndarray], order: np.ndarray, batch_size: int, count: int):
    self.queue: queue.Queue = queue.Queue(maxsize=2)
    self.stop = threading.Event()
    self.thread = threading.Thread(target=self._produce, args=(arrays, order, batch_size, count), daemon=True)
    self.thread.start()

  def _produce(self, arrays: Sequence[np.ndarray], order: np.ndarray, batch_size: int, count: int) -> None:
    from tinyjax import numpy as jnp
    try:
      for i in range(count):
        if self.stop.is_set(): return
        index = order[i * batch_size:(i + 1) * batch_size]
        batch = tuple(jnp.asarray(np.ascontiguousarray(a[index])) for a in arrays)
        while not self.stop.is_set():
          try:
            self.queue.put(batch, timeout=0.1)
            break
          except queue.Full:
            continue
    except BaseException as error:  # handed to the consumer
      self.queue.put(error)
      return
    self.queue.put(None)

  def close(self) -> None:
    self.stop.set()
    self.thread.join(timeout=5)


def batches(arrays: Sequence[Any], batch_size: int, *, key: Any = None, drop_last: bool = True) -> Iterator[tuple]:
  """One pass over the examples (the first axis of every array), `batch_size` at a time, as tuples of tinyjax Arrays:
  in order, or shuffled by a permutation drawn with `key` (a tinyjax.random key: the same key, the same order). The
  next batch is gathered on a background thread while the caller works on the current one. `drop_last`: leave out a
  last, smaller batch."""
  arrays = [np.asarray(a) for a in arrays]
  if not arrays: raise ValueError("batches needs at least one array")
  n = arrays[0].shape[0]
  if any(a.shape[0] != n for a in arrays):
    raise ValueError(f"batches: every array needs the same number of examples, got {[a.shape[0] for a in arrays]}")
  if batch_size <= 0: raise ValueError(f"batch_size must be positive, got {batch_size}")
  if key is None: order = np.arange(n)
  else:
    from tinyjax import random
    order = np.asarray(random.permutation(key, n))
  count = n // batch_size if drop_last else -(-n // batch_size)
  return _BatchIterator(arrays, order, batch_size, count)


class _BatchIterator:
  """The iterator `batches` returns; abandoning it (or `close()`) stops its thread."""

  def __init__(self, arrays: Sequence[np.ndarray], order: np.ndarray, batch_size: int, count: int):
    self.count, self.done = count, 0
    self.prefetcher = _Prefetcher(arrays, order, batch_size, count)
    self._finalizer = weakref.finalize(self, self.prefetcher.close)

  def __iter__(self) -> _BatchIterator: return self
  def __len__(self) -> int: return self.count

  def __next__(self) -> tuple:
    if self.done >= self.count:
      self.close()
      raise StopIteration
    item = self.prefetcher.queue.get()
    if item is None:
      self.close()
      raise StopIteration
    if isinstance(item, BaseException):
      self.close()
      raise item
    self.done += 1
    return item

  def close(self) -> None:
    self._finalizer()
