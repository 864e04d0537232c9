"""`jax.experimental.shard_map.shard_map`: the same function as `tinyjax.shard_map` (its `check_rep` is the old name
of `check_vma`)."""
from tinyjax.trace.shard_map import shard_map

__all__ = ["shard_map"]
