"""`tinyjax.tree`: the short names of `tinyjax.tree_util`, as `jax.tree` (`tree.map(f, params)`, `tree.leaves(x)`)."""
from tinyjax.tree_util import tree_all as all  # noqa: A004  (JAX's name)
from tinyjax.tree_util import tree_flatten as flatten
from tinyjax.tree_util import tree_flatten_with_path as flatten_with_path
from tinyjax.tree_util import tree_leaves as leaves
from tinyjax.tree_util import tree_leaves_with_path as leaves_with_path
from tinyjax.tree_util import tree_map as map  # noqa: A004
from tinyjax.tree_util import tree_map_with_path as map_with_path
from tinyjax.tree_util import tree_reduce as reduce
from tinyjax.tree_util import tree_structure as structure
from tinyjax.tree_util import tree_transpose as transpose
from tinyjax.tree_util import tree_unflatten as unflatten

__all__ = ["all", "flatten", "flatten_with_path", "leaves", "leaves_with_path", "map", "map_with_path", "reduce",
           "structure", "transpose", "unflatten"]
