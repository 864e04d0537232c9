"""Pytrees: JAX's `jax.tree_util` on optree's C++ traversal.

A pytree is a nest of containers (tuple, list, dict, None, namedtuple, OrderedDict, defaultdict and registered
classes) whose non-container values are the leaves. The semantics are JAX's:
- `None` is a container with no children (an empty subtree), not a leaf.
- dict keys flatten in sorted order, and dicts (and defaultdicts) come back from `tree_unflatten` and `tree_map`
  with their keys sorted, as JAX rebuilds them; OrderedDict keeps its own order, which is part of its structure.
- namedtuples are nodes whose key paths are attribute names (`.x`).
- `tree_map(f, tree, *rest)` requires `tree`'s structure to be a prefix of each tree in `rest`.

Traversal is optree's (`optree._C.flatten`), called directly: flattening sits on jit's dispatch path. Registrations
live in the "tinyjax" optree namespace, so they neither see nor disturb other optree users' registrations of the same
class. The tree structure object is optree's `PyTreeSpec`, exported as `PyTreeDef`; it prints as
`PyTreeSpec([*, {'a': *}])`.
"""
from __future__ import annotations

import collections
import dataclasses
import functools
import operator
from collections.abc import Callable, Hashable, Iterable, Sequence
from typing import Any, TypeVar

import optree
from optree import _C
from optree.accessors import FlattenedEntry, MappingEntry, NamedTupleEntry, SequenceEntry, StructSequenceEntry

__all__ = [
  "DictKey", "FlattenedIndexKey", "GetAttrKey", "Partial", "PyTreeDef", "SequenceKey", "all_leaves", "keystr",
  "register_dataclass", "register_pytree_node", "register_pytree_node_class", "register_pytree_with_keys",
  "register_pytree_with_keys_class", "register_static", "tree_all", "tree_flatten", "tree_flatten_with_path",
  "tree_leaves", "tree_leaves_with_path", "tree_map", "tree_map_with_path", "tree_reduce", "tree_structure",
  "tree_transpose", "tree_unflatten", "treedef_children", "treedef_is_leaf", "treedef_tuple",
]

NAMESPACE = "tinyjax"  # optree registry namespace of every registration made here
PyTreeDef = _C.PyTreeSpec
T = TypeVar("T")
Leaf = Any
_flatten = _C.flatten  # flatten(tree, leaf_predicate, none_is_leaf, namespace) -> (leaves, treedef)
_PyTreeKind = _C.PyTreeKind

# ------------------------------------------------------------------------------------------------ flatten / unflatten


def tree_flatten(tree: Any, is_leaf: Callable[[Any], bool] | None = None) -> tuple[list[Leaf], PyTreeDef]:
  """Flatten `tree` into its leaves (depth first, dict keys sorted) and its structure.

  `is_leaf(node) -> bool` stops the traversal at the nodes it accepts, which then count as leaves (None included).
  """
  return _flatten(tree, is_leaf, False, NAMESPACE)


def tree_leaves(tree: Any, is_leaf: Callable[[Any], bool] | None = None) -> list[Leaf]:
  """The leaves of `tree` in `tree_flatten` order."""
  return _flatten(tree, is_leaf, False, NAMESPACE)[0]


def tree_structure(tree: Any, is_leaf: Callable[[Any], bool] | None = None) -> PyTreeDef:
  """The structure (`PyTreeDef`) of `tree`."""
  return _flatten(tree, is_leaf, False, NAMESPACE)[1]


def _sort_dict_node(node_def: PyTreeDef) -> PyTreeDef:
  """The one-level structure `node_def` with its dict keys in sorted (= flattening) order; other nodes unchanged."""
  kind = node_def.kind
  if kind != _PyTreeKind.DICT and kind != _PyTreeKind.DEFAULTDICT: return node_def
  keys = node_def.entries()  # sorted, in the order of the children
  positions = dict(zip(keys, range(len(keys))))  # ints as stand-in leaves
  if kind == _PyTreeKind.DEFAULTDICT:
    positions = collections.defaultdict(node_def.unflatten(range(len(keys))).default_factory, positions)
  return _flatten(positions, None, False, NAMESPACE)[1]


# optree's treedef remembers each dict's insertion order and rebuilds it; JAX rebuilds dicts with sorted keys. Equal
# treedefs (equality ignores insertion order) share one sorted twin, made once by `_sort_dict_node` and cached here.
_sorted_treedefs: dict[PyTreeDef, PyTreeDef] = {}
_SORTED_TREEDEFS_MAX = 4096  # distinct structures remembered before the cache starts over


def _sorted_treedef(treedef: PyTreeDef) -> PyTreeDef:
  try:
    return _sorted_treedefs[treedef]
  except KeyError:
    pass
  except TypeError:  # unhashable aux data in a custom node: no caching
    return treedef.transform(_sort_dict_node)
  sorted_def = treedef.transform(_sort_dict_node)
  if len(_sorted_treedefs) >= _SORTED_TREEDEFS_MAX: _sorted_treedefs.clear()
  _sorted_treedefs[treedef] = sorted_def
  return sorted_def


def tree_unflatten(treedef: PyTreeDef, leaves: Iterable[Leaf]) -> Any:
  """Rebuild the tree of structure `treedef` from `leaves` (ValueError if their number is wrong).

  Dicts come back with sorted keys, as in JAX. (`treedef.unflatten(leaves)` is optree's own: it keeps the key order
  of the dict that `treedef` was made from.)
  """
  try:
    sorted_def = _sorted_treedefs[treedef]
  except (KeyError, TypeError):  # not seen yet, or unhashable
    sorted_def = _sorted_treedef(treedef)
  return sorted_def.unflatten(leaves)


def treedef_is_leaf(treedef: PyTreeDef) -> bool:
  """True if `treedef` has a single node: a leaf, or None (which has no leaves)."""
  return treedef.num_nodes == 1


def treedef_children(treedef: PyTreeDef) -> list[PyTreeDef]:
  """The structures of the children of the root of `treedef`."""
  return treedef.children()


def treedef_tuple(treedefs: Iterable[PyTreeDef]) -> PyTreeDef:
  """The structure of a tuple whose children have the structures `treedefs`."""
  return _C.make_from_collection(tuple(treedefs), False, NAMESPACE)


def all_leaves(iterable: Iterable[Any], is_leaf: Callable[[Any], bool] | None = None) -> bool:
  """True if every element of `iterable` is a leaf (None is not one, unless `is_leaf` says so)."""
  return all(_C.is_leaf(item, is_leaf, False, NAMESPACE) for item in iterable)


# ------------------------------------------------------------------------------------------------ key paths


class _Key:
  """A key path entry: one field (`__match_args__` names it), frozen, equal and hashed by its class and value, as
  JAX's; a plain class with slots rather than a dataclass (four of those took ~4 ms of `import tinyjax`)."""
  __slots__ = ()
  __match_args__: tuple[str]

  def __init__(self, *value: Any, **named: Any):
    (field,) = self.__match_args__
    if len(value) + len(named) != 1 or named.keys() - {field}:
      raise TypeError(f"{type(self).__name__}() takes one argument, {field}")
    object.__setattr__(self, field, value[0] if value else named[field])

  def __setattr__(self, name: str, value: Any) -> None:
    raise dataclasses.FrozenInstanceError(f"cannot assign to field {name!r}")

  __delattr__ = __setattr__

  def _value(self) -> Any: return getattr(self, self.__match_args__[0])
  def __eq__(self, other: Any) -> bool: return type(other) is type(self) and other._value() == self._value()
  def __hash__(self) -> int: return hash((type(self), self._value()))
  def __repr__(self) -> str: return f"{type(self).__name__}({self.__match_args__[0]}={self._value()!r})"
  def __reduce__(self) -> tuple: return type(self), (self._value(),)  # (pickle, copy)


class DictKey(_Key):
  """Key path entry of a dict (or OrderedDict, defaultdict) child: prints as `['a']`."""
  __slots__ = __match_args__ = ("key",)
  key: Hashable

  def __str__(self) -> str: return f"[{self.key!r}]"


class SequenceKey(_Key):
  """Key path entry of a tuple or list child: prints as `[0]`."""
  __slots__ = __match_args__ = ("idx",)
  idx: int

  def __str__(self) -> str: return f"[{self.idx!r}]"


class GetAttrKey(_Key):
  """Key path entry of a namedtuple field or dataclass attribute: prints as `.name`."""
  __slots__ = __match_args__ = ("name",)
  name: str

  def __str__(self) -> str: return f".{self.name}"


class FlattenedIndexKey(_Key):
  """Key path entry of a child of a custom node registered without keys: prints as `[<flat index 0>]`."""
  __slots__ = __match_args__ = ("key",)
  key: int

  def __str__(self) -> str: return f"[<flat index {self.key}>]"


KeyEntry = DictKey | SequenceKey | GetAttrKey | FlattenedIndexKey | Any
KeyPath = tuple[KeyEntry, ...]


class _KeyEntry(optree.PyTreeEntry):
  """optree path entry holding the JAX key (e.g. a `GetAttrKey`) that a keyed custom node's flatten returned."""


_KEY_OF_ENTRY: dict[type, Callable[[optree.PyTreeEntry], KeyEntry]] = {
  MappingEntry: lambda entry: DictKey(entry.entry),
  SequenceEntry: lambda entry: SequenceKey(entry.entry),
  NamedTupleEntry: lambda entry: GetAttrKey(entry.field),
  StructSequenceEntry: lambda entry: GetAttrKey(entry.field),
  FlattenedEntry: lambda entry: FlattenedIndexKey(entry.entry),
  _KeyEntry: lambda entry: entry.entry,
}


def _jax_key(entry: optree.PyTreeEntry) -> KeyEntry:
  """The JAX key of one optree path entry."""
  to_key = _KEY_OF_ENTRY.get(type(entry))
  return to_key(entry) if to_key is not None else FlattenedIndexKey(entry.entry)


def _paths(treedef: PyTreeDef) -> list[KeyPath]:
  """The key path of each leaf of `treedef`."""
  return [tuple(map(_jax_key, accessor)) for accessor in treedef.accessors()]


_BARE_KEY: dict[type, Callable[[Any], Hashable]] = {  # keystr(simple=True): the key inside each entry type
  DictKey: operator.attrgetter("key"), SequenceKey: operator.attrgetter("idx"),
  GetAttrKey: operator.attrgetter("name"), FlattenedIndexKey: operator.attrgetter("key"),
}


def keystr(keys: KeyPath, *, simple: bool = False, separator: str = "") -> str:
  """Print a key path as JAX does: `['a'][0].b`; with `simple=True` only the bare keys (`a`, `0`, `b`), joined by
  `separator`."""
  if not simple: return separator.join(map(str, keys))
  return separator.join(str(_BARE_KEY[type(key)](key)) if type(key) in _BARE_KEY else str(key) for key in keys)


def _flatten_with_path_taking_path(tree: Any, is_leaf: Callable[[KeyPath, Any], bool]):
  """`tree_flatten_with_path` for `is_leaf(path, node)`: a Python walk one level at a time decides the leaves, then
  optree flattens with those decisions replayed in its own (the same, depth-first pre-order) visiting order."""
  leaves_with_path, decisions = [], []

  def visit(node: Any, path: KeyPath):
    stop = bool(is_leaf(path, node))
    decisions.append(stop)
    if stop:
      leaves_with_path.append((path, node))
      return
    children, node_def = _flatten(node, lambda child: child is not node, False, NAMESPACE)  # one level down
    if node_def.is_leaf(strict=True):
      leaves_with_path.append((path, node))
      return
    for child, accessor in zip(children, node_def.accessors()):
      visit(child, path + (_jax_key(accessor[0]),))

  visit(tree, ())
  replay = iter(decisions)
  _, treedef = _flatten(tree, lambda node: next(replay), False, NAMESPACE)
  return leaves_with_path, treedef


def tree_flatten_with_path(tree: Any, is_leaf: Callable[..., bool] | None = None,
                           is_leaf_takes_path: bool = False) -> tuple[list[tuple[KeyPath, Leaf]], PyTreeDef]:
  """Like `tree_flatten`, but each leaf comes with its key path: `[((DictKey('a'), SequenceKey(0)), leaf), ...]`.

  With `is_leaf_takes_path=True`, `is_leaf` is called as `is_leaf(path, node)`.
  """
  if is_leaf_takes_path and is_leaf is not None: return _flatten_with_path_taking_path(tree, is_leaf)
  leaves, treedef = _flatten(tree, is_leaf, False, NAMESPACE)
  return list(zip(_paths(treedef), leaves)), treedef


def tree_leaves_with_path(tree: Any, is_leaf: Callable[..., bool] | None = None,
                          is_leaf_takes_path: bool = False) -> list[tuple[KeyPath, Leaf]]:
  """The `(key path, leaf)` pairs of `tree` in `tree_flatten` order."""
  return tree_flatten_with_path(tree, is_leaf, is_leaf_takes_path)[0]


# ------------------------------------------------------------------------------------------------ map and reduce


_NO_NODE = object()
_DICT_KINDS = (_PyTreeKind.DICT, _PyTreeKind.ORDEREDDICT, _PyTreeKind.DEFAULTDICT)


def _describe(node_def: PyTreeDef, node: Any = _NO_NODE) -> str:
  """Words for the root of the one-level structure `node_def` (of `node`, if given), for error messages."""
  kind = node_def.kind
  if kind == _PyTreeKind.LEAF: return "a leaf" if node is _NO_NODE else f"a leaf of type {type(node).__name__}"
  if kind == _PyTreeKind.NONE: return "None"
  name = node_def.type.__name__
  if kind in _DICT_KINDS: return f"a {name} with keys {node_def.entries()}"
  if kind == _PyTreeKind.CUSTOM: return f"a {name} node {node_def}"
  return f"a {name} of length {node_def.num_children}"


def _first_mismatch(prefix_def: PyTreeDef, tree: Any, path: KeyPath = ()) -> tuple[KeyPath, str, str] | None:
  """Where `tree` stops having `prefix_def` as a prefix: (key path, what the prefix has, what the tree has)."""
  if prefix_def.is_leaf(strict=True): return None
  node_def = prefix_def.one_level()
  children, tree_node_def = _flatten(tree, lambda child: child is not tree, False, NAMESPACE)
  if node_def != tree_node_def: return path, _describe(node_def), _describe(tree_node_def, tree)
  for child_def, child, accessor in zip(prefix_def.children(), children, node_def.accessors()):
    mismatch = _first_mismatch(child_def, child, path + (_jax_key(accessor[0]),))
    if mismatch is not None: return mismatch
  return None


def _structure_error(function_name: str, treedef: PyTreeDef, position: int, other: Any, error: Exception):
  """The ValueError raised when tree number `position` (1-based) does not have `treedef` as a prefix."""
  found = _first_mismatch(treedef, other)
  where, first_has, other_has = found if found is not None else ((), "?", str(error))
  try:
    other_def = str(tree_structure(other))
  except Exception as structure_error:  # noqa: BLE001 -- only for the message
    other_def = f"<unflattenable: {structure_error}>"
  return ValueError(
    f"{function_name}: the structure of tree {position} does not match the first tree's at key path "
    f"{keystr(where) or '(the root)'}: the first tree has {first_has} there, tree {position} has {other_has}.\n"
    f"  first tree: {treedef}\n  tree {position}:    {other_def}\n"
    f"Each tree after the first must have the first tree's structure, or extend it at its leaves.")


def _leaves_up_to(function_name: str, treedef: PyTreeDef, rest: tuple[Any, ...]) -> list[list[Leaf]]:
  """The subtrees of each tree in `rest` at the positions of `treedef`'s leaves."""
  leaves_of_rest = []
  for position, other in enumerate(rest, start=2):
    try:
      leaves_of_rest.append(treedef.flatten_up_to(other))
    except ValueError as error:
      raise _structure_error(function_name, treedef, position, other, error) from None
  return leaves_of_rest


def tree_map(f: Callable[..., Any], tree: Any, *rest: Any, is_leaf: Callable[[Any], bool] | None = None) -> Any:
  """The tree of `f(leaf, *leaves_of_rest)` over the leaves of `tree`, with `tree`'s structure.

  Each tree in `rest` must have `tree`'s structure or one that extends it below its leaves (then `f` receives those
  subtrees); otherwise ValueError naming the key path where they differ and both structures.
  """
  leaves, treedef = _flatten(tree, is_leaf, False, NAMESPACE)
  if rest: return tree_unflatten(treedef, map(f, leaves, *_leaves_up_to("tree_map", treedef, rest)))
  return tree_unflatten(treedef, map(f, leaves))


def tree_map_with_path(f: Callable[..., Any], tree: Any, *rest: Any, is_leaf: Callable[..., bool] | None = None,
                       is_leaf_takes_path: bool = False) -> Any:
  """`tree_map` where `f` also receives each leaf's key path first: `f(path, leaf, *leaves_of_rest)`."""
  leaves_with_path, treedef = tree_flatten_with_path(tree, is_leaf, is_leaf_takes_path)
  paths, leaves = zip(*leaves_with_path) if leaves_with_path else ((), ())
  return tree_unflatten(treedef, map(f, paths, leaves, *_leaves_up_to("tree_map_with_path", treedef, rest)))


class _NoInitializer:
  def __repr__(self) -> str: return "<no initializer>"


_NO_INITIALIZER = _NoInitializer()


def tree_reduce(function: Callable[[T, Any], T], tree: Any, initializer: T = _NO_INITIALIZER,
                is_leaf: Callable[[Any], bool] | None = None) -> T:
  """`functools.reduce(function, tree_leaves(tree), initializer)`; without an initializer an empty tree is a
  TypeError, as with `functools.reduce`."""
  leaves = _flatten(tree, is_leaf, False, NAMESPACE)[0]
  if initializer is _NO_INITIALIZER: return functools.reduce(function, leaves)
  return functools.reduce(function, leaves, initializer)


def tree_all(tree: Any, *, is_leaf: Callable[[Any], bool] | None = None) -> bool:
  """True if every leaf of `tree` is truthy (True for a tree with no leaves)."""
  return all(_flatten(tree, is_leaf, False, NAMESPACE)[0])


def tree_transpose(outer_treedef: PyTreeDef, inner_treedef: PyTreeDef | None, pytree_to_transpose: Any) -> Any:
  """Turn an outer tree of inner trees into an inner tree of outer trees (`[(1, 2), (3, 4)]` -> `([1, 3], [2, 4])`).

  `inner_treedef=None` takes the inner structure from the first inner tree. TypeError if the leaf count is not
  `outer_treedef.num_leaves * inner_treedef.num_leaves`.
  """
  leaves, treedef = _flatten(pytree_to_transpose, None, False, NAMESPACE)
  if inner_treedef is None: inner_treedef = tree_structure(outer_treedef.flatten_up_to(pytree_to_transpose)[0])
  inner_size, outer_size = inner_treedef.num_leaves, outer_treedef.num_leaves
  if treedef.num_leaves != inner_size * outer_size:
    raise TypeError(f"Mismatch\n{treedef}\n != \n{outer_treedef.compose(inner_treedef)}")
  rows = [leaves[row * inner_size:(row + 1) * inner_size] for row in range(outer_size)]
  return tree_unflatten(inner_treedef, [tree_unflatten(outer_treedef, column) for column in zip(*rows)])


# ------------------------------------------------------------------------------------------------ registration


def register_pytree_node(nodetype: type, flatten_func: Callable[[Any], tuple[Iterable[Any], Hashable]],
                         unflatten_func: Callable[[Hashable, Iterable[Any]], Any],
                         flatten_with_keys_func: Callable[[Any], tuple[Iterable[tuple[KeyEntry, Any]], Hashable]]
                         | None = None) -> None:
  """Make `nodetype` a pytree node: `flatten_func(node) -> (children, aux_data)` and
  `unflatten_func(aux_data, children) -> node`. `aux_data` is static (part of the structure; hashable, compared
  with ==). Key paths of its children are `FlattenedIndexKey(i)`, or the keys `flatten_with_keys_func(node) ->
  (((key, child), ...), aux_data)` gives; when that is given it serves every flatten, keyed or not.
  ValueError if `nodetype` is already registered.
  """
  if flatten_with_keys_func is None:
    _C.register_node(nodetype, flatten_func, unflatten_func, FlattenedEntry, NAMESPACE)
    return

  def flatten_with_entries(node):
    keys_and_children, aux_data = flatten_with_keys_func(node)
    keys_and_children = tuple(keys_and_children)
    return [child for _, child in keys_and_children], aux_data, [key for key, _ in keys_and_children]

  _C.register_node(nodetype, flatten_with_entries, unflatten_func, _KeyEntry, NAMESPACE)


def register_pytree_with_keys(nodetype: type,
                              flatten_with_keys: Callable[[Any], tuple[Iterable[tuple[KeyEntry, Any]], Hashable]],
                              unflatten_func: Callable[[Hashable, Iterable[Any]], Any],
                              flatten_func: Callable[[Any], tuple[Iterable[Any], Hashable]] | None = None) -> None:
  """`register_pytree_node` with key paths: `flatten_with_keys(node) -> (((key, child), ...), aux_data)`, e.g. keys
  `GetAttrKey('x')`. (`flatten_func` is accepted for JAX compatibility; the keyed function is used throughout.)"""
  del flatten_func  # one flatten function serves both: optree records the keys during any flatten
  register_pytree_node(nodetype, None, unflatten_func, flatten_with_keys)


def register_pytree_node_class(cls: type[T]) -> type[T]:
  """Class decorator: register `cls` using its `tree_flatten(self) -> (children, aux_data)` method and its
  `tree_unflatten(cls, aux_data, children)` classmethod."""
  register_pytree_node(cls, operator.methodcaller("tree_flatten"), cls.tree_unflatten)
  return cls


def register_pytree_with_keys_class(cls: type[T]) -> type[T]:
  """Class decorator: register `cls` using its `tree_flatten_with_keys` method and `tree_unflatten` classmethod."""
  register_pytree_with_keys(cls, operator.methodcaller("tree_flatten_with_keys"), cls.tree_unflatten)
  return cls


def register_static(cls: type[T]) -> type[T]:
  """Class decorator: instances of `cls` are pytrees with no leaves, kept whole in the structure (so hashable)."""
  register_pytree_node(cls, lambda node: ((), node), lambda node, _: node)
  return cls


def _attribute_tuple_getter(names: tuple[str, ...]) -> Callable[[Any], tuple]:
  """`node -> tuple(getattr(node, name) for name in names)`, with attrgetter's C speed where it returns a tuple."""
  if len(names) >= 2: return operator.attrgetter(*names)
  if len(names) == 1: return lambda node, name=names[0]: (getattr(node, name),)
  return lambda node: ()


def register_dataclass(nodetype: type[T], data_fields: Sequence[str] | None = None,
                       meta_fields: Sequence[str] | None = None, drop_fields: Sequence[str] = ()) -> type[T]:
  """Register a dataclass-like `nodetype` whose `data_fields` are children and `meta_fields` static aux data; it is
  rebuilt as `nodetype(**fields)`. Returns `nodetype`, so it works as a decorator.

  For a dataclass both field lists may be omitted: fields with `dataclasses.field(metadata=dict(static=True))` are
  meta, the rest data. For a dataclass the two lists must cover exactly the `init=True` fields less `drop_fields`
  (ValueError otherwise). Key paths are `GetAttrKey(name)`.
  """
  if data_fields is None or meta_fields is None:
    if (data_fields is None) != (meta_fields is None):
      raise TypeError("register_dataclass: data_fields and meta_fields must both be specified when either is "
                      f"specified. Got {data_fields=} {meta_fields=}.")
    if not dataclasses.is_dataclass(nodetype):
      raise TypeError("register_dataclass: data_fields and meta_fields are required when nodetype is not a "
                      f"dataclass. Got {nodetype=}.")
    fields = dataclasses.fields(nodetype)  # as JAX: drop_fields is not consulted here
    data_fields = [field.name for field in fields if not field.metadata.get("static", False)]
    meta_fields = [field.name for field in fields if field.metadata.get("static", False)]
  data_fields, meta_fields = tuple(data_fields), tuple(meta_fields)

  if dataclasses.is_dataclass(nodetype):
    init_fields = {field.name for field in dataclasses.fields(nodetype) if field.init} - set(drop_fields)
    if {*meta_fields, *data_fields} != init_fields:
      message = "data_fields and meta_fields must include all dataclass fields with ``init=True`` and only them."
      if missing := init_fields - {*meta_fields, *data_fields}:
        message += f" Missing fields: {missing}. Add them to drop_fields to suppress this error."
      if unexpected := {*meta_fields, *data_fields} - init_fields:
        message += f" Unexpected fields: {unexpected}."
      raise ValueError(message)
  if overlap := set(data_fields) & set(meta_fields):
    raise ValueError(f"data_fields and meta_fields must not overlap. Overlapping fields: {overlap}.")

  get_data, get_meta = _attribute_tuple_getter(data_fields), _attribute_tuple_getter(meta_fields)
  keys = [GetAttrKey(name) for name in data_fields]

  def flatten(node):
    return get_data(node), get_meta(node), keys

  def unflatten(meta, data):
    return nodetype(**dict(zip(meta_fields, meta)), **dict(zip(data_fields, data)))

  _C.register_node(nodetype, flatten, unflatten, _KeyEntry, NAMESPACE)
  return nodetype


# ------------------------------------------------------------------------------------------------ Partial


class _HashableCallableShim:
  """Wraps a functools.partial given to `Partial`, so that its arguments stay out of the pytree (as in JAX)."""

  def __init__(self, fun):
    self.fun = fun

  def __call__(self, *args, **kwargs):
    return self.fun(*args, **kwargs)

  def __hash__(self):
    return hash(self.fun)

  def __eq__(self, other):
    return self.fun == (other.fun if isinstance(other, _HashableCallableShim) else other)

  def __repr__(self):
    return f"_HashableCallableShim({self.fun!r})"


class Partial(functools.partial):
  """A `functools.partial` that is a pytree: its bound arguments are children, the function is static aux data, so it
  can be passed through `jit`, `grad` and `vmap`. `Partial(f)` with no arguments just makes `f` passable."""

  def __new__(cls, func, *args, **kwargs):
    if isinstance(func, functools.partial):
      # functools.partial would merge func's bound arguments into ours; box it so exactly ours are the children.
      original = func
      func = _HashableCallableShim(original)
      partial = super().__new__(cls, func, *args, **kwargs)
      func.func, func.args, func.keywords = original.func, original.args, original.keywords
      return partial
    return super().__new__(cls, func, *args, **kwargs)


register_pytree_node(Partial, lambda partial: ((partial.args, partial.keywords), partial.func),
                     lambda func, children: Partial(func, *children[0], **children[1]))
