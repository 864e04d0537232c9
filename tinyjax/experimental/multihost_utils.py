"""`jax.experimental.multihost_utils` for tinyjax's processes (tinyjax.distributed): gathering, broadcasting and
barriers across processes. In one process each is what it is for a single process."""
from __future__ import annotations

from typing import Any

import numpy as np

from tinyjax import tree_util
from tinyjax.array import Array
from tinyjax.devices.device import process_count, process_index

__all__ = ["broadcast_one_to_all", "process_allgather", "sync_global_devices"]


def _spans_processes(leaf: Any) -> bool:
  """Whether a leaf is a global array laid out over a mesh with devices of several processes."""
  sharding = getattr(leaf.realize().uop.arg, "sharding", None) if type(leaf) is Array else None
  mesh = getattr(sharding, "mesh", None)
  return mesh is not None and len({getattr(device, "process_index", 0) for device in mesh.devices.flat}) > 1


def process_allgather(in_tree: Any, tiled: bool = False) -> Any:
  """Each leaf gathered from every process as numpy: a global array (over devices of several processes) is its
  whole value; any other leaf is this process's value, stacked with the others' along a new leading axis (`tiled`:
  concatenated along axis 0)."""
  def one(leaf: Any) -> np.ndarray:
    if _spans_processes(leaf): return np.asarray(leaf)
    value = np.asarray(leaf)
    if process_count() == 1: parts = [value]
    else:
      from tinyjax.distributed import gather_objects
      parts = gather_objects(value)
    return np.concatenate(parts) if tiled else np.stack(parts)
  return tree_util.tree_map(one, in_tree)


def broadcast_one_to_all(in_tree: Any, is_source: bool | None = None) -> Any:
  """Process 0's values of `in_tree` (or those of the process with `is_source`) in every process, as numpy."""
  if is_source is None: is_source = process_index() == 0
  if process_count() == 1: return tree_util.tree_map(np.asarray, in_tree)
  from tinyjax.distributed import gather_objects
  everyone = gather_objects((bool(is_source), tree_util.tree_map(np.asarray, in_tree) if is_source else None))
  sources = [values for source, values in everyone if source]
  if len(sources) != 1: raise ValueError(f"broadcast_one_to_all needs exactly one source process, got {len(sources)}")
  return sources[0]


def sync_global_devices(name: str) -> None:
  """A barrier: returns once every process has called it (with the same `name`, which is checked)."""
  if process_count() == 1: return
  from tinyjax.distributed import gather_objects
  names = gather_objects(name)
  if len(set(names)) != 1: raise AssertionError(f"sync_global_devices: the processes' names differ: {names}")
