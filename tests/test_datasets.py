"""nn.datasets: the IDX reader on files the test writes, fashion_mnist's search and error, and the batch iterator."""
from __future__ import annotations

import gc
import gzip
import threading

import numpy as np
import pytest

from tinyjax import random
from tinyjax.nn import datasets


def write_idx(path, array, code=0x08, compress=True):
  header = bytes([0, 0, code, array.ndim]) + b"".join(int(d).to_bytes(4, "big") for d in array.shape)
  data = header + array.astype(array.dtype.newbyteorder(">")).tobytes()
  path.write_bytes(gzip.compress(data) if compress else data)


def test_read_idx(tmp_path):
  images = np.arange(2 * 3 * 4, dtype=np.uint8).reshape(2, 3, 4)
  write_idx(tmp_path / "a.gz", images)
  np.testing.assert_array_equal(datasets.read_idx(tmp_path / "a.gz"), images)
  values = np.array([[1.5, -2.0], [3.25, 0.0]], np.float32)
  write_idx(tmp_path / "f", values, code=0x0D, compress=False)
  got = datasets.read_idx(tmp_path / "f")
  assert got.dtype == np.float32 and got.dtype.isnative
  np.testing.assert_array_equal(got, values)
  ints = np.array([-5, 70000, 3], np.int32)
  write_idx(tmp_path / "i", ints, code=0x0C, compress=False)
  np.testing.assert_array_equal(datasets.read_idx(tmp_path / "i"), ints)
  (tmp_path / "bad").write_bytes(b"\x01\x02\x08\x01")
  with pytest.raises(ValueError, match="not an IDX"):
    datasets.read_idx(tmp_path / "bad")
  write_idx(tmp_path / "short", images, compress=False)
  (tmp_path / "short").write_bytes((tmp_path / "short").read_bytes()[:-3])
  with pytest.raises(ValueError, match=r"shape \(2, 3, 4\)"):
    datasets.read_idx(tmp_path / "short")
  (tmp_path / "code").write_bytes(bytes([0, 0, 0x07, 1, 0, 0, 0, 1, 5]))
  with pytest.raises(ValueError, match="type code"):
    datasets.read_idx(tmp_path / "code")
  (tmp_path / "gz").write_bytes(gzip.compress(b"\x00\x00\x08\x01\x00\x00\x00\x02ab")[:-6])
  with pytest.raises(ValueError, match="gzip"):
    datasets.read_idx(tmp_path / "gz")


def test_fashion_mnist_reads_a_directory_and_explains_a_missing_one(tmp_path, monkeypatch):
  rng = np.random.default_rng(0)
  train, test = rng.integers(0, 256, (6, 28, 28)).astype(np.uint8), rng.integers(0, 256, (2, 28, 28)).astype(np.uint8)
  write_idx(tmp_path / "train-images-idx3-ubyte.gz", train)
  write_idx(tmp_path / "train-labels-idx1-ubyte.gz", np.arange(6, dtype=np.uint8))
  write_idx(tmp_path / "t10k-images-idx3-ubyte.gz", test)
  write_idx(tmp_path / "t10k-labels-idx1-ubyte", np.array([3, 9], np.uint8), compress=False)
  got = datasets.fashion_mnist(tmp_path)
  np.testing.assert_array_equal(got[0], train)
  np.testing.assert_array_equal(got[3], [3, 9])
  monkeypatch.setenv("TINYJAX_DATA", str(tmp_path))
  np.testing.assert_array_equal(datasets.fashion_mnist()[2], test)
  monkeypatch.setenv("TINYJAX_DATA", str(tmp_path / "nowhere"))
  monkeypatch.setattr(datasets, "FASHION_MNIST_DIRS", ())
  with pytest.raises(FileNotFoundError, match="apt-get install dataset-fashion-mnist"):
    datasets.fashion_mnist()


def test_batches_cover_every_example_once_and_shuffle_by_key():
  x = np.arange(50).reshape(25, 2)
  y = np.arange(25)
  ordered = list(datasets.batches((x, y), 10))
  assert len(ordered) == 2 and [b[1].shape for b in ordered] == [(10,), (10,)]
  np.testing.assert_array_equal(np.asarray(ordered[0][0]), x[:10])
  every = np.concatenate([np.asarray(b[1]) for b in datasets.batches((x, y), 10, drop_last=False)])
  np.testing.assert_array_equal(every, y)
  first = [np.asarray(b[1]) for b in datasets.batches((x, y), 5, key=random.PRNGKey(3))]
  again = [np.asarray(b[1]) for b in datasets.batches((x, y), 5, key=random.PRNGKey(3))]
  other = [np.asarray(b[1]) for b in datasets.batches((x, y), 5, key=random.PRNGKey(4))]
  np.testing.assert_array_equal(np.concatenate(first), np.concatenate(again))
  assert sorted(np.concatenate(first).tolist()) == list(range(25))
  assert not np.array_equal(np.concatenate(first), np.concatenate(other))
  for xb, yb in datasets.batches((x, y), 5, key=random.PRNGKey(3)):
    np.testing.assert_array_equal(np.asarray(xb)[:, 0], 2 * np.asarray(yb))  # rows stay paired
  with pytest.raises(ValueError, match="same number"):
    datasets.batches((x, y[:3]), 2)


def test_abandoned_iterator_stops_its_thread():
  before = threading.active_count()
  iterator = datasets.batches((np.zeros((100, 3)),), 2)
  next(iterator)
  del iterator
  gc.collect()
  for _ in range(50):
    if threading.active_count() <= before: break
    threading.Event().wait(0.05)
  assert threading.active_count() <= before
