"""`einsum`, `convolve`, `correlate`. Einstein summation over any valid subscripts (explicit or implicit output,
`...`, repeated indices within an operand, traces, sums over indices of one operand, outer products, any number of
operands); `convolve` and `correlate` are 1-D convolutions (tinyjax/lax/_conv.py).

Each operand first loses its repeated indices (diagonals) and the indices no one else needs (summed); then operands
are contracted pairwise with `lax.dot_general`, always the pair whose result is smallest next (greedy), so a chain
like `ij,jk,kl->il` never builds a large intermediate; the last operand is summed and transposed to the output's
order. `optimize` is accepted and ignored (the greedy order is always used).
"""
from __future__ import annotations

import math
import string
from typing import Any


from tinyjax import dtypes
from tinyjax.array import Array
from tinyjax.lax._base import staged
from tinyjax.lax._reductions import dot_general
from tinyjax.lax._shape import permute_raw
from tinyjax.numpy import _reductions as red
from tinyjax.numpy._creation import asarray
from tinyjax.numpy._more import diagonal
from tinyjax.lax._base import cast, reshape_raw

_LETTERS = set(string.ascii_letters)


def _parse(subscripts: str, shapes: list[tuple[int, ...]]) -> tuple[list[str], str]:
  """Each operand's indices and the output's, with `...` replaced by private symbols (one per broadcast axis,
  right-aligned across operands, as numpy broadcasts)."""
  subscripts = subscripts.replace(" ", "")
  inputs_text, arrow, output_text = subscripts.partition("->")
  if "->" in output_text: raise ValueError("einsum subscripts can contain at most one '->'")
  terms = inputs_text.split(",")
  if len(terms) != len(shapes):
    raise ValueError(f"einsum: the subscripts name {len(terms)} operands but {len(shapes)} were given")
  for text in terms + [output_text]:
    if text.count("...") > 1: raise ValueError(f"einsum: {text!r} contains '...' more than once")
    for char in text.replace("...", ""):
      if char not in _LETTERS: raise ValueError(f"einsum: invalid subscript character {char!r} in {subscripts!r}")
  ranks = []
  for term, shape in zip(terms, shapes):
    letters = len(term.replace("...", ""))
    rank = len(shape) - letters
    if rank < 0 or (rank and "..." not in term):
      raise ValueError(f"einsum: subscripts {term!r} do not match an operand of shape {shape}")
    ranks.append(rank)
  ellipsis_rank = max(ranks, default=0)
  symbols = "".join(chr(0x100 + i) for i in range(ellipsis_rank))
  expanded = [term.replace("...", symbols[ellipsis_rank - rank:]) for term, rank in zip(terms, ranks)]
  if not arrow:  # implicit output: the broadcast axes, then the indices that appear once, sorted
    counts: dict[str, int] = {}
    for term in expanded:
      for char in term:
        if char in _LETTERS: counts[char] = counts.get(char, 0) + 1
    output = symbols + "".join(sorted(c for c, n in counts.items() if n == 1))
  else:
    output = output_text.replace("...", symbols)
  if len(set(output)) != len(output): raise ValueError(f"einsum: output subscripts {output_text!r} repeat an index")
  known = set("".join(expanded))
  for char in output:
    if char not in known: raise ValueError(f"einsum: output subscript {char!r} does not appear in the inputs")
  return expanded, output


def _remove_repeats(x: Array, term: str) -> tuple[Array, str]:
  """Take diagonals until every index of the operand is distinct."""
  while True:
    repeated = next((c for c in term if term.count(c) > 1), None)
    if repeated is None: return x, term
    first = term.index(repeated)
    second = term.index(repeated, first + 1)
    x = diagonal(x, 0, first, second)  # the diagonal becomes the last axis
    term = "".join(c for i, c in enumerate(term) if i not in (first, second)) + repeated


def _sum_out(x: Array, term: str, keep: set[str]) -> tuple[Array, str]:
  axes = tuple(i for i, c in enumerate(term) if c not in keep)
  if not axes: return x, term
  return red.sum(x, axis=axes, dtype=x.dtype), "".join(c for c in term if c in keep)


@staged(static_argnames=("optimize", "precision", "preferred_element_type", "_use_xeinsum"))
def einsum(subscripts: str, *operands: Any, out: None = None, optimize: Any = "auto", precision: Any = None,
           preferred_element_type: Any = None, _use_xeinsum: bool = False, _dot_general: Any = None,
           out_sharding: Any = None) -> Array:
  """Einstein summation: `einsum("ij,jk->ik", a, b)` is a @ b. Operands are promoted to one dtype (or
  `preferred_element_type`); 16-bit floats accumulate in float32. `out_sharding`: how the result is laid out."""
  if out_sharding is not None:
    from tinyjax.placement import with_sharding_constraint
    result = einsum(subscripts, *operands, out=out, optimize=optimize, precision=precision,
                    preferred_element_type=preferred_element_type)
    return with_sharding_constraint(result, out_sharding)
  if out is not None: raise NotImplementedError("The 'out' argument to einsum is not supported.")
  if not isinstance(subscripts, str):
    raise TypeError("einsum: the first argument must be a subscripts string (the interleaved form is not supported)")
  arrays = [asarray(x) for x in operands]
  if arrays:
    common = dtypes.result_type(*arrays)
    arrays = [cast(a, common, False) for a in arrays]
  if not arrays: raise ValueError("einsum: at least one operand is needed")
  if preferred_element_type is not None:
    target = dtypes.canonicalize_dtype(dtypes.dtype(preferred_element_type))
    arrays = [cast(a, target, False) for a in arrays]
  terms, output = _parse(subscripts, [tuple(a.shape) for a in arrays])
  sizes: dict[str, int] = {}
  for array, term in zip(arrays, terms):
    for char, size in zip(term, array.shape):
      if size != 1 and sizes.get(char, 1) != 1 and sizes[char] != size:
        raise ValueError(f"einsum: index {char!r} has sizes {sizes[char]} and {size} (operand shape {array.shape})")
      if size != 1 or char not in sizes: sizes[char] = size
  # size-1 axes of an index that is larger elsewhere are broadcasts: drop them from that operand
  prepared = []
  for array, term in zip(arrays, terms):
    squeeze = [i for i, c in enumerate(term) if array.shape[i] == 1 and sizes[c] != 1]
    if squeeze:
      array = reshape_raw(array, tuple(d for i, d in enumerate(array.shape) if i not in squeeze))
      term = "".join(c for i, c in enumerate(term) if i not in squeeze)
    prepared.append(_remove_repeats(array, term))
  # sum out what only one operand has and the output does not
  operands_left = []
  for index, (array, term) in enumerate(prepared):
    elsewhere = set(output)
    for other_index, (_, other) in enumerate(prepared):
      if other_index != index: elsewhere |= set(other)
    operands_left.append(_sum_out(array, term, elsewhere))
  while len(operands_left) > 1:
    best = None
    for i in range(len(operands_left)):
      for j in range(i + 1, len(operands_left)):
        needed = set(output) | {c for k, (_, t) in enumerate(operands_left) if k not in (i, j) for c in t}
        union = set(operands_left[i][1]) | set(operands_left[j][1])
        result_size = math.prod(sizes[c] for c in union if c in needed)
        if best is None or result_size < best[0]: best = (result_size, i, j)
    _, i, j = best
    (a, term_a), (b, term_b) = operands_left[i], operands_left[j]
    needed = set(output) | {c for k, (_, t) in enumerate(operands_left) if k not in (i, j) for c in t}
    shared = [c for c in term_a if c in term_b]
    batch = [c for c in shared if c in needed]
    contract = [c for c in shared if c not in needed]
    dimension_numbers = (([term_a.index(c) for c in contract], [term_b.index(c) for c in contract]),
                         ([term_a.index(c) for c in batch], [term_b.index(c) for c in batch]))
    product = dot_general(a, b, dimension_numbers, precision)
    free_a = [c for c in term_a if c not in shared]
    free_b = [c for c in term_b if c not in shared]
    new_term = "".join(batch + free_a + free_b)
    operands_left = [item for k, item in enumerate(operands_left) if k not in (i, j)] + [(product, new_term)]
  result, term = operands_left[0]
  result, term = _sum_out(result, term, set(output))
  return permute_raw(result, [term.index(c) for c in output])



def convolve(a: Any, v: Any, mode: str = "full", *, precision: Any = None, preferred_element_type: Any = None
             ) -> Array:
  """The discrete linear convolution of 1-D arrays (numpy's modes 'full', 'same', 'valid')."""
  x, kernel = asarray(a), asarray(v)
  if x.ndim != 1 or kernel.ndim != 1: raise ValueError("convolve() only supports 1-dimensional inputs.")
  if x.size == 0 or kernel.size == 0: raise ValueError("convolve: inputs cannot be empty")
  if kernel.size > x.size: x, kernel = kernel, x
  common = dtypes.to_inexact_dtype(dtypes.result_type(x, kernel))  # integer inputs give floats, as JAX
  x, kernel = cast(x, common, False), cast(kernel, common, False)
  n = kernel.size
  if mode == "full": padding = [(n - 1, n - 1)]
  elif mode == "same": padding = [(n // 2, (n - 1) // 2)]  # the centre of 'full', as numpy
  elif mode == "valid": padding = [(0, 0)]
  else: raise ValueError(f"mode must be one of ['full', 'same', 'valid'], got {mode!r}")
  from tinyjax.lax._conv import conv_general_dilated
  from tinyjax.lax._shape import flip_raw
  flipped = reshape_raw(flip_raw(kernel, [0]), (1, 1, n))
  out = conv_general_dilated(reshape_raw(x, (1, 1, x.size)), flipped, (1,), padding, precision=precision,
                             preferred_element_type=preferred_element_type)
  return reshape_raw(out, (out.shape[-1],))


def correlate(a: Any, v: Any, mode: str = "valid", *, precision: Any = None, preferred_element_type: Any = None
              ) -> Array:
  """The cross-correlation of 1-D arrays: convolve(a, conj(v)[::-1], mode) (numpy's: v is conjugated)."""
  kernel = asarray(v)
  if kernel.ndim != 1: raise ValueError("correlate() only supports 1-dimensional inputs.")
  from tinyjax.lax._elementwise import _conj
  from tinyjax.lax._shape import flip_raw
  return convolve(a, flip_raw(_conj(kernel), [0]), mode, precision=precision,
                  preferred_element_type=preferred_element_type)
