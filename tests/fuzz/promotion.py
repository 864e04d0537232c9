"""JAX's type promotion, written down again for the random-program reference (independent of tinyjax.dtypes, so a
mistake there is caught here, not copied).

The lattice is JAX's documented one (jax.numpy type promotion semantics, x64 off): Python scalars are the weak
nodes `i*` and `f*`; an array made from a Python scalar is weakly typed. A weak result takes the default dtype of
its kind (int32, float32) and stays weak; results never have 64-bit dtypes with x64 off.
"""
from __future__ import annotations

import functools

import ml_dtypes
import numpy as np

BOOL = "bool"
WEAK_INT, WEAK_FLOAT = "i*", "f*"

# Each node and the nodes directly above it.
LATTICE = {
  BOOL: [WEAK_INT],
  WEAK_INT: ["uint8", "int8"],
  "uint8": ["int16", "uint16"], "uint16": ["int32", "uint32"], "uint32": ["int64", "uint64"], "uint64": [WEAK_FLOAT],
  "int8": ["int16"], "int16": ["int32"], "int32": ["int64"], "int64": [WEAK_FLOAT],
  WEAK_FLOAT: ["bfloat16", "float16"],
  "bfloat16": ["float32"], "float16": ["float32"], "float32": ["float64"], "float64": [],
}
# What a node is as an array dtype with x64 off (weak nodes: the default dtype of their kind).
CANONICAL = {"int64": "int32", "uint64": "uint32", "float64": "float32", WEAK_INT: "int32", WEAK_FLOAT: "float32"}

FLOATS = ("bfloat16", "float16", "float32")


def np_dtype(name: str) -> np.dtype:
  return np.dtype(ml_dtypes.bfloat16) if name == "bfloat16" else np.dtype(name)


def kind(name: str) -> str:
  """'b', 'i', 'u' or 'f'."""
  return "f" if name in FLOATS else np_dtype(name).kind


@functools.cache
def _upper_bounds(node: str) -> frozenset[str]:
  reached, frontier = {node}, [node]
  while frontier:
    for above in LATTICE[frontier.pop()]:
      if above not in reached:
        reached.add(above)
        frontier.append(above)
  return frozenset(reached)


def least_upper_bound(nodes: frozenset[str]) -> str:
  common = frozenset.intersection(*(_upper_bounds(node) for node in nodes))
  (least,) = [candidate for candidate in common if common <= _upper_bounds(candidate)]
  return least


def _weak_node(name: str) -> str:
  return {"b": BOOL, "i": WEAK_INT, "u": WEAK_INT, "f": WEAK_FLOAT}[kind(name)]


def result_type(*operands: tuple[str, bool | None]) -> tuple[str, bool]:
  """(dtype name, weak) of a jnp operation on operands given as (dtype name, weak); bools are never weak."""
  names = [name for name, _ in operands]
  weaks = [bool(weak) for _, weak in operands]
  if len(operands) == 1:
    name, weak = names[0], weaks[0]
  elif len(set(names)) == 1 and not all(weaks):
    name, weak = names[0], False
  elif all(weaks):
    name, weak = least_upper_bound(frozenset(names)), True
  else:
    node = least_upper_bound(frozenset(_weak_node(n) if w else n for n, w in zip(names, weaks)))
    name, weak = node, node in (WEAK_INT, WEAK_FLOAT)
  return CANONICAL.get(name, name), weak and name != BOOL


def to_inexact(name: str) -> str:
  """The dtype float-only functions compute in: ints and bools become float32."""
  return name if kind(name) == "f" else "float32"


def to_numeric(name: str) -> str:
  """The dtype functions that treat bools as ints compute in (square, power, floor_divide, shifts)."""
  return "int32" if name == BOOL else name


def sum_dtype(name: str) -> str:
  """jnp.sum/prod without dtype=: bool and narrow ints widen to the default (unsigned) int."""
  if name in (BOOL, "int8", "int16"): return "int32"
  if name in ("uint8", "uint16"): return "uint32"
  return name
