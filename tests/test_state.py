"""nn.state checkpoints: round trips of every dtype and nested pytrees, interchange with the safetensors package,
atomic writes, and clear errors for truncated, corrupted and mismatched files."""
from __future__ import annotations

import os

import ml_dtypes
import numpy as np
import pytest
import safetensors.numpy

import tinyjax as tj
import tinyjax.numpy as tnp
from tinyjax import nn
from tinyjax.nn import state


def tree_example():
  rng = np.random.default_rng(0)
  return {
    "params": {"w": tnp.asarray(rng.standard_normal((3, 4)).astype(np.float32)),
               "b": tnp.asarray(rng.standard_normal(4).astype(ml_dtypes.bfloat16)),
               "layers": [tnp.asarray(np.arange(5, dtype=np.float16)), tnp.asarray(np.float64(2.5))]},
    "step": tnp.asarray(np.int32(7)),
    "flags": tnp.asarray(np.array([True, False, True])),
    "ints": (tnp.asarray(np.array([-3, 4], np.int8)), tnp.asarray(np.array([250], np.uint8)),
             tnp.asarray(np.array([1, 2], np.uint32)), tnp.asarray(np.zeros((0, 3), np.int16))),
  }


def assert_tree_equal(a, b):
  leaves_a, tree_a = tj.tree.flatten(a)
  leaves_b, tree_b = tj.tree.flatten(b)
  assert tree_a == tree_b
  for x, y in zip(leaves_a, leaves_b):
    assert x.dtype == y.dtype and x.shape == y.shape
    np.testing.assert_array_equal(np.asarray(x).reshape(-1).view(np.uint8), np.asarray(y).reshape(-1).view(np.uint8))


def test_round_trip_every_dtype(tmp_path):
  tree = tree_example()
  path = tmp_path / "ckpt.safetensors"
  state.save(path, tree, metadata={"epoch": "3"})
  assert_tree_equal(state.load(path, like=tree), tree)
  flat = state.load(path)
  assert set(flat) == {"params/w", "params/b", "params/layers/0", "params/layers/1", "step", "flags", "ints/0",
                       "ints/1", "ints/2", "ints/3"}
  assert state.metadata(path) == {"format": "tinyjax", "epoch": "3"}
  # the layers' params and an optimizer state round-trip too
  model = nn.Sequential(nn.Linear(3, 4), nn.relu, nn.Linear(4, 2))
  params = model.init(tj.random.PRNGKey(0))
  opt_state = nn.optim.adam(1e-3).init(params)
  state.save(path, {"params": params, "opt": opt_state})
  assert_tree_equal(state.load(path, like={"params": params, "opt": opt_state}), {"params": params, "opt": opt_state})


def test_interchange_with_the_safetensors_package(tmp_path):
  tree = tree_example()
  ours = tmp_path / "ours.safetensors"
  state.save(ours, tree)
  theirs = safetensors.numpy.load_file(str(ours))
  np.testing.assert_array_equal(theirs["params/w"], np.asarray(tree["params"]["w"]))
  assert theirs["params/b"].dtype == ml_dtypes.bfloat16 and theirs["flags"].dtype == np.bool_
  written = tmp_path / "theirs.safetensors"
  safetensors.numpy.save_file({"a": np.arange(6, dtype=np.float32).reshape(2, 3), "b": np.ones(2, ml_dtypes.bfloat16)},
                              str(written))
  loaded = state.load(written, like={"a": tnp.zeros((2, 3)), "b": tnp.zeros(2, tnp.bfloat16)})
  np.testing.assert_array_equal(np.asarray(loaded["a"]), np.arange(6).reshape(2, 3))


def test_bad_files_raise_clear_errors(tmp_path):
  tree = tree_example()
  path = tmp_path / "ckpt.safetensors"
  state.save(path, tree)
  data = path.read_bytes()
  truncated = tmp_path / "truncated.safetensors"
  truncated.write_bytes(data[:len(data) - 10])
  with pytest.raises(ValueError, match="truncated or corrupted"):
    state.load(truncated, like=tree)
  tiny = tmp_path / "tiny.safetensors"
  tiny.write_bytes(data[:5])
  with pytest.raises(ValueError, match="truncated"):
    state.load(tiny)
  corrupted = tmp_path / "corrupted.safetensors"
  flipped = bytearray(data)
  flipped[-20] ^= 0xFF  # inside the data of the last tensor
  corrupted.write_bytes(bytes(flipped))
  with pytest.raises(ValueError, match="corrupted"):
    state.load(corrupted, like=tree)
  garbage = tmp_path / "garbage.safetensors"
  garbage.write_bytes(b"\xff" * 64)
  with pytest.raises(ValueError, match="not a valid"):
    state.load(garbage)
  wrong_shape = dict(tree, step=tnp.zeros((2,), tnp.int32))
  with pytest.raises(ValueError, match=r"'step' is int32\[\] in the file but int32\[2\]"):
    state.load(path, like=wrong_shape)
  wrong_dtype = dict(tree, step=tnp.asarray(np.float32(0)))
  with pytest.raises(ValueError, match=r"'step' is int32\[\] in the file but float32\[\]"):
    state.load(path, like=wrong_dtype)
  with pytest.raises(ValueError, match=r"missing keys \['extra'\]"):
    state.load(path, like=dict(tree, extra=tnp.zeros(1)))
  with pytest.raises(ValueError, match=r"unexpected keys \['step'\]"):
    state.load(path, like={k: v for k, v in tree.items() if k != "step"})
  with pytest.raises(FileNotFoundError):
    state.load(tmp_path / "missing.safetensors")


def test_atomic_write_keeps_the_old_file_on_failure(tmp_path, monkeypatch):
  path = tmp_path / "ckpt.safetensors"
  state.save(path, {"a": tnp.ones(3)})
  before = path.read_bytes()

  def failing_fsync(fd): raise OSError("disk full")
  monkeypatch.setattr(os, "fsync", failing_fsync)
  with pytest.raises(OSError, match="disk full"):
    state.save(path, {"a": tnp.zeros(3)})
  monkeypatch.undo()
  assert path.read_bytes() == before
  assert [p.name for p in tmp_path.iterdir()] == ["ckpt.safetensors"]  # no temporary file left behind
  with pytest.raises(ValueError, match="unique"):
    state.save(path, {"a/b": tnp.ones(1), "a": {"b": tnp.ones(1)}})
