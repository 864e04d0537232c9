"""Tests for tinyjax.tree_util: JAX's pytree semantics on optree.

Expected values are literals taken from real JAX (jax 0.10.2, `from jax import tree_util as tu`, in a separate
virtualenv); tinyjax never imports jax. Where tinyjax prints differently (optree's `PyTreeSpec(...)` instead of JAX's
`PyTreeDef(...)`), the test says so.
"""
import collections
import dataclasses
import functools
import re

import numpy as np
import optree
import pytest

from tinyjax import tree_util as tu
from tinyjax.tree_util import DictKey, FlattenedIndexKey, GetAttrKey, SequenceKey

Point = collections.namedtuple("Point", "x y")

# ------------------------------------------------------------------------------------------------ flatten basics


@pytest.mark.parametrize("tree, leaves", [
  (1, [1]),
  ([1, (2, 3), {"a": 4}], [1, 2, 3, 4]),
  ({"b": 1, "a": 2, "c": 3}, [2, 1, 3]),  # dict keys sorted
  ({"b": {"d": 1, "c": 2}, "a": [3]}, [3, 2, 1]),
  (Point(1, (2, 3)), [1, 2, 3]),
  ((), []),
  ([[], {}, ()], []),
])
def test_leaves(tree, leaves):
  assert tu.tree_leaves(tree) == leaves
  flat, treedef = tu.tree_flatten(tree)
  assert flat == leaves and treedef.num_leaves == len(leaves)
  assert tu.tree_structure(tree) == treedef
  assert isinstance(treedef, tu.PyTreeDef)


def test_arrays_are_leaves():
  arrays = {"w": np.ones((2, 3)), "b": np.zeros(3)}
  leaves = tu.tree_leaves(arrays)
  assert leaves[0] is arrays["b"] and leaves[1] is arrays["w"]


def test_unflatten_round_trip():
  tree = [1, (2, None), {"a": 3, "b": Point(4, 5)}]
  leaves, treedef = tu.tree_flatten(tree)
  assert tu.tree_unflatten(treedef, leaves) == tree
  assert tu.tree_unflatten(treedef, [x * 10 for x in leaves]) == [10, (20, None), {"a": 30, "b": Point(40, 50)}]
  assert tu.tree_unflatten(treedef, iter(leaves)) == tree


def test_unflatten_wrong_leaf_count():
  treedef = tu.tree_structure([1, 2])
  with pytest.raises(ValueError, match="(?i)too few leaves"):
    tu.tree_unflatten(treedef, [1])
  with pytest.raises(ValueError, match="(?i)too many leaves"):
    tu.tree_unflatten(treedef, [1, 2, 3])


def test_treedef_prints_readably():
  # JAX: PyTreeDef([*, (*, None), {'a': *}]); optree's spelling differs only in the type name.
  assert str(tu.tree_structure([1, (2, None), {"a": 3}])) == "PyTreeSpec([*, (*, None), {'a': *}])"
  assert str(tu.tree_structure({"b": 1, "a": 2, "c": None})) == "PyTreeSpec({'a': *, 'b': *, 'c': None})"
  assert str(tu.tree_structure(1)) == "PyTreeSpec(*)"


def test_treedef_methods():
  treedef = tu.tree_structure((1, [2, 3]))
  assert treedef.num_leaves == 3 and treedef.num_nodes == 5
  assert tu.treedef_children(treedef) == [tu.tree_structure(1), tu.tree_structure([2, 3])]
  assert tu.treedef_tuple([tu.tree_structure(1), tu.tree_structure([2, 3])]) == treedef
  assert treedef.flatten_up_to((1, [2, 3])) == [1, 2, 3]


# ------------------------------------------------------------------------------------------------ None


def test_none_is_an_empty_subtree():
  assert tu.tree_leaves(None) == []
  assert tu.tree_leaves([None, 1]) == [1]
  assert tu.tree_leaves({"a": None, "b": (None, 2)}) == [2]
  assert tu.tree_structure({"a": None}).num_leaves == 0
  assert str(tu.tree_structure(None)) == "PyTreeSpec(None)"  # JAX: PyTreeDef(None)
  assert tu.tree_structure(None) != tu.tree_structure(())
  assert tu.tree_structure(None) != tu.tree_structure(1)
  assert tu.tree_unflatten(tu.tree_structure([None, 1]), [5]) == [None, 5]


def test_none_with_is_leaf():
  # JAX: tree_flatten([1, None], is_leaf=lambda x: x is None) -> ([1, None], PyTreeDef([*, *]))
  leaves, treedef = tu.tree_flatten([1, None], is_leaf=lambda x: x is None)
  assert leaves == [1, None] and treedef == tu.tree_structure([1, 2])


def test_tree_map_keeps_none():
  assert tu.tree_map(lambda x: x + 1, [1, None, {"a": None, "b": 2}]) == [2, None, {"a": None, "b": 3}]
  # JAX: tree_map(lambda a, b: (a, b), [1, None], [3, None]) -> [(1, 3), None]
  assert tu.tree_map(lambda a, b: (a, b), [1, None], [3, None]) == [(1, 3), None]
  # a leaf of the first tree may face None (an empty subtree) in another: JAX gives [(1, None), (2, 3)]
  assert tu.tree_map(lambda a, b: (a, b), [1, 2], [None, 3]) == [(1, None), (2, 3)]
  # f returning None makes empty subtrees: JAX gives {'a': None, 'b': [None]}
  assert tu.tree_map(lambda x: None, {"a": 1, "b": [2]}) == {"a": None, "b": [None]}


# ------------------------------------------------------------------------------------------------ dict ordering


def test_dict_flattens_sorted_and_rebuilds_sorted():
  tree = {"b": 1, "a": 2, "c": None}
  leaves, treedef = tu.tree_flatten(tree)
  assert leaves == [2, 1]
  # JAX rebuilds dicts with sorted keys: {'a': 10, 'b': 20, 'c': None}
  rebuilt = tu.tree_unflatten(treedef, [10, 20])
  assert rebuilt == {"a": 10, "b": 20, "c": None} and list(rebuilt) == ["a", "b", "c"]
  assert list(tu.tree_map(lambda x: x, tree)) == ["a", "b", "c"]
  nested = tu.tree_map(lambda x: x + 1, {"b": {"d": 1, "c": 2}, "a": 3})
  assert nested == {"a": 4, "b": {"c": 3, "d": 2}} and list(nested) == ["a", "b"] and list(nested["b"]) == ["c", "d"]


def test_dict_structure_ignores_insertion_order():
  assert tu.tree_structure({"a": 1, "b": 2}) == tu.tree_structure({"b": 1, "a": 2})
  assert hash(tu.tree_structure({"a": 1, "b": 2})) == hash(tu.tree_structure({"b": 1, "a": 2}))
  assert tu.tree_structure({"a": 1}) != tu.tree_structure({"b": 1})
  # tree_map across dicts built in different orders pairs leaves by key
  assert tu.tree_map(lambda a, b: a - b, {"x": 10, "y": 20}, {"y": 2, "x": 1}) == {"x": 9, "y": 18}


def test_ordered_dict_keeps_its_order():
  tree = collections.OrderedDict([("b", 1), ("a", 2)])
  leaves, treedef = tu.tree_flatten(tree)
  assert leaves == [1, 2]  # JAX: ([1, 2], PyTreeDef(CustomNode(OrderedDict[('b', 'a')], [*, *])))
  mapped = tu.tree_map(lambda x: x * 2, tree)
  assert isinstance(mapped, collections.OrderedDict) and list(mapped.items()) == [("b", 2), ("a", 4)]
  assert treedef != tu.tree_structure(collections.OrderedDict([("a", 1), ("b", 2)]))
  assert treedef != tu.tree_structure({"b": 1, "a": 2})


def test_defaultdict_sorted_with_its_factory():
  tree = collections.defaultdict(list, {"b": 1, "a": 2})
  assert tu.tree_leaves(tree) == [2, 1]
  mapped = tu.tree_map(lambda x: x, tree)  # JAX: defaultdict(<class 'list'>, {'a': 2, 'b': 1})
  assert type(mapped) is collections.defaultdict and mapped.default_factory is list
  assert list(mapped.items()) == [("a", 2), ("b", 1)]
  assert tu.tree_structure(tree) != tu.tree_structure(dict(tree))
  assert tu.tree_structure(tree) != tu.tree_structure(collections.defaultdict(int, {"b": 1, "a": 2}))


def test_namedtuple():
  leaves, treedef = tu.tree_flatten(Point(1, (2, 3)))
  assert leaves == [1, 2, 3]
  assert tu.tree_unflatten(treedef, [4, 5, 6]) == Point(4, (5, 6))
  assert treedef != tu.tree_structure((1, (2, 3)))
  assert type(tu.tree_map(lambda x: x, Point(1, 2))) is Point


def test_unflatten_with_unhashable_aux_data():
  class Box:
    def __init__(self, value, tags):
      self.value, self.tags = value, tags

  tu.register_pytree_node(Box, lambda box: ((box.value,), box.tags), lambda tags, children: Box(children[0], tags))
  box = tu.tree_map(lambda x: x + 1, {"k": Box(1, ["list", "aux"]), "j": 0})
  assert box["k"].value == 2 and box["k"].tags == ["list", "aux"] and list(box) == ["j", "k"]


# ------------------------------------------------------------------------------------------------ is_leaf


def test_is_leaf():
  assert tu.tree_leaves({"b": 1, "a": 2}, is_leaf=lambda x: isinstance(x, dict)) == [{"b": 1, "a": 2}]
  # JAX: [2, (2, 3, 2, 3)]
  assert tu.tree_map(lambda x: x * 2, [1, (2, 3)], is_leaf=lambda x: isinstance(x, tuple)) == [2, (2, 3, 2, 3)]
  assert tu.tree_structure([1, (2, 3)], is_leaf=lambda x: isinstance(x, tuple)).num_leaves == 2


def test_all_leaves_and_treedef_is_leaf():
  assert tu.all_leaves([1, 2]) and not tu.all_leaves([1, [2]]) and not tu.all_leaves([None])
  assert tu.all_leaves([1, None], is_leaf=lambda x: x is None)
  assert not tu.all_leaves([[1]], is_leaf=lambda x: isinstance(x, tuple))
  assert tu.all_leaves(tu.tree_leaves({"a": [1, 2, 3]}))
  assert tu.treedef_is_leaf(tu.tree_structure(1)) and tu.treedef_is_leaf(tu.tree_structure(None))
  assert not tu.treedef_is_leaf(tu.tree_structure([1]))


# ------------------------------------------------------------------------------------------------ tree_map


def test_tree_map_several_trees():
  assert tu.tree_map(lambda a, b, c: a + b + c, [1, {"x": 2}], [10, {"x": 20}], [100, {"x": 200}]) == [111, {"x": 222}]
  # the first tree is a prefix of the others: f receives their subtrees (JAX: [(1, [3, 4]), (2, 5)])
  assert tu.tree_map(lambda a, b: (a, b), [1, 2], [[3, 4], 5]) == [(1, [3, 4]), (2, 5)]


@pytest.mark.parametrize("first, other, where, first_has, other_has", [
  ([1, 2], [1, 2, 3], "(the root)", "a list of length 2", "a list of length 3"),
  ({"a": 1}, {"b": 1}, "(the root)", "a dict with keys ['a']", "a dict with keys ['b']"),
  ((1, 2), [1, 2], "(the root)", "a tuple of length 2", "a list of length 2"),
  ([1, None], [1, 2], "[1]", "None", "a leaf of type int"),
  ({"x": [1, 2]}, {"x": [1, 2, 3]}, "['x']", "a list of length 2", "a list of length 3"),
  ({"x": [1, (2, 3)]}, {"x": [1, 2]}, "['x'][1]", "a tuple of length 2", "a leaf of type int"),
  (Point(1, [2]), Point(1, (2,)), ".y", "a list of length 1", "a tuple of length 1"),
])
def test_tree_map_structure_mismatch(first, other, where, first_has, other_has):
  with pytest.raises(ValueError) as info:
    tu.tree_map(lambda a, b: a, first, other)
  message = str(info.value)
  assert f"at key path {where}:" in message
  assert f"the first tree has {first_has} there, tree 2 has {other_has}" in message
  assert str(tu.tree_structure(first)) in message and str(tu.tree_structure(other)) in message


def test_tree_map_mismatch_names_the_tree():
  with pytest.raises(ValueError, match=r"tree 3 does not match"):
    tu.tree_map(lambda a, b, c: a, [1, 2], [1, 2], [1])


def test_tree_map_with_path():
  # JAX: {'a': ["['a'][0]"]}
  assert tu.tree_map_with_path(lambda path, x: tu.keystr(path), {"a": [1]}) == {"a": ["['a'][0]"]}
  assert tu.tree_map_with_path(lambda path, a, b: (len(path), a + b), [1, (2,)], [10, (20,)]) == [(1, 11), ((2, 22),)]
  assert tu.tree_map_with_path(lambda path, x: x, None) is None
  with pytest.raises(ValueError, match="tree_map_with_path: the structure of tree 2"):
    tu.tree_map_with_path(lambda path, a, b: a, [1], [1, 2])


# ------------------------------------------------------------------------------------------------ key paths


def test_flatten_with_path():
  leaves_with_path, treedef = tu.tree_flatten_with_path({"a": [1, (2, 3)], "b": Point(4, 5)})
  assert treedef == tu.tree_structure({"a": [1, (2, 3)], "b": Point(4, 5)})
  # JAX, with keystr of each path: ['a'][0] ['a'][1][0] ['a'][1][1] ['b'].x ['b'].y
  assert leaves_with_path == [
    ((DictKey(key="a"), SequenceKey(idx=0)), 1),
    ((DictKey(key="a"), SequenceKey(idx=1), SequenceKey(idx=0)), 2),
    ((DictKey(key="a"), SequenceKey(idx=1), SequenceKey(idx=1)), 3),
    ((DictKey(key="b"), GetAttrKey(name="x")), 4),
    ((DictKey(key="b"), GetAttrKey(name="y")), 5),
  ]
  assert [tu.keystr(path) for path, _ in leaves_with_path] == [
    "['a'][0]", "['a'][1][0]", "['a'][1][1]", "['b'].x", "['b'].y"]
  assert tu.tree_leaves_with_path([1, [2]]) == [((SequenceKey(0),), 1), ((SequenceKey(1), SequenceKey(0)), 2)]
  assert tu.tree_leaves_with_path(5) == [((), 5)]
  assert tu.tree_leaves_with_path(None) == []


def test_paths_of_ordered_and_default_dicts():
  # JAX: [((DictKey(key='b'),), 1), ((DictKey(key='a'),), 2)] and, for the defaultdict, 'a' first
  ordered = collections.OrderedDict([("b", 1), ("a", 2)])
  assert tu.tree_leaves_with_path(ordered) == [((DictKey("b"),), 1), ((DictKey("a"),), 2)]
  default = collections.defaultdict(int, {"b": 1, "a": 2})
  assert tu.tree_leaves_with_path(default) == [((DictKey("a"),), 2), ((DictKey("b"),), 1)]


def test_flatten_with_path_is_leaf():
  paths = [path for path, _ in tu.tree_leaves_with_path([1, (2, 3)], is_leaf=lambda x: isinstance(x, tuple))]
  assert paths == [(SequenceKey(0),), (SequenceKey(1),)]


def test_flatten_with_path_is_leaf_takes_path():
  tree = {"a": [1, None, (2,)], "b": 3}
  stop_at = (DictKey("a"), SequenceKey(2))
  leaves_with_path, treedef = tu.tree_flatten_with_path(tree, is_leaf=lambda path, x: path == stop_at,
                                                        is_leaf_takes_path=True)
  assert leaves_with_path == [((DictKey("a"), SequenceKey(0)), 1), (stop_at, (2,)), ((DictKey("b"),), 3)]
  assert treedef == tu.tree_structure({"a": [1, None, 2], "b": 3})
  assert tu.tree_map_with_path(lambda path, x: x, tree, is_leaf=lambda path, x: path == stop_at,
                               is_leaf_takes_path=True) == tree


def test_key_types_print_as_jax():
  keys = (DictKey("a"), SequenceKey(0), GetAttrKey("b"), FlattenedIndexKey(3))
  assert tu.keystr(keys) == "['a'][0].b[<flat index 3>]"
  assert [str(key) for key in keys] == ["['a']", "[0]", ".b", "[<flat index 3>]"]
  assert [repr(key) for key in keys] == ["DictKey(key='a')", "SequenceKey(idx=0)", "GetAttrKey(name='b')",
                                         "FlattenedIndexKey(key=3)"]
  assert str(DictKey(1)) == "[1]"
  assert tu.keystr(()) == ""
  # JAX: keystr((DictKey(1), DictKey('x'), SequenceKey(2)), simple=True, separator='.') == '1.x.2'
  assert tu.keystr((DictKey(1), DictKey("x"), SequenceKey(2)), simple=True, separator=".") == "1.x.2"
  assert tu.keystr((DictKey("a"), SequenceKey(0)), simple=True, separator="/") == "a/0"


def test_key_types_compare_hash_and_match():
  assert DictKey("a") == DictKey("a") and hash(DictKey("a")) == hash(DictKey("a"))
  assert DictKey("a") != GetAttrKey("a") and SequenceKey(0) != FlattenedIndexKey(0)
  assert (DictKey("a").key, SequenceKey(1).idx, GetAttrKey("n").name, FlattenedIndexKey(2).key) == ("a", 1, "n", 2)
  match DictKey("q"):
    case DictKey(key=key): assert key == "q"
    case _: pytest.fail("DictKey does not match its own pattern")
  match SequenceKey(4):
    case SequenceKey(index): assert index == 4  # (by position: __match_args__)
    case _: pytest.fail("SequenceKey does not match by position")
  assert GetAttrKey(name="n") == GetAttrKey("n") and FlattenedIndexKey(key=1) == FlattenedIndexKey(1)
  for bad in ((), ("a", "b")):
    with pytest.raises(TypeError, match="takes one argument, key"): DictKey(*bad)
  with pytest.raises(TypeError, match="takes one argument, idx"): SequenceKey(key=0)
  with pytest.raises(AttributeError): DictKey("a").key = "b"  # (frozen, as JAX's)
  with pytest.raises(AttributeError): SequenceKey(0).other = 1  # (slots)
  import copy
  import pickle
  keys = (DictKey(("a", 1)), SequenceKey(2), GetAttrKey("b"), FlattenedIndexKey(3))
  assert pickle.loads(pickle.dumps(keys)) == keys and copy.deepcopy(keys) == keys and copy.copy(keys[0]) == keys[0]
  assert {keys[0]: 1}[DictKey(("a", 1))] == 1


# ------------------------------------------------------------------------------------------------ custom nodes


class Pair:
  def __init__(self, first, second, label="pair"):
    self.first, self.second, self.label = first, second, label

  def __eq__(self, other):
    return isinstance(other, Pair) and (self.first, self.second, self.label) == (other.first, other.second, other.label)


tu.register_pytree_node(Pair, lambda pair: ((pair.first, pair.second), pair.label),
                        lambda label, children: Pair(*children, label))


def test_register_pytree_node():
  tree = {"p": Pair(1, [2, None])}
  leaves, treedef = tu.tree_flatten(tree)
  assert leaves == [1, 2]
  assert tu.tree_unflatten(treedef, [3, 4]) == {"p": Pair(3, [4, None])}
  assert tu.tree_map(lambda x: x * 2, Pair(1, 2, "x")) == Pair(2, 4, "x")
  # aux data is part of the structure
  assert tu.tree_structure(Pair(1, 2, "x")) == tu.tree_structure(Pair(5, 6, "x"))
  assert tu.tree_structure(Pair(1, 2, "x")) != tu.tree_structure(Pair(1, 2, "y"))
  # JAX: ((FlattenedIndexKey(key=0),), 1), ((FlattenedIndexKey(key=1),), 2)
  assert tu.tree_leaves_with_path(Pair(1, 2)) == [((FlattenedIndexKey(0),), 1), ((FlattenedIndexKey(1),), 2)]
  assert tu.keystr(tu.tree_leaves_with_path([Pair(1, 2)])[1][0]) == "[0][<flat index 1>]"


def test_register_twice_is_an_error():
  with pytest.raises(ValueError):
    tu.register_pytree_node(Pair, lambda pair: ((), None), lambda aux, children: Pair(0, 0))


def test_registrations_stay_in_the_tinyjax_namespace():
  assert optree.tree_leaves(Pair(1, 2)) == [Pair(1, 2)]  # optree's default namespace does not know Pair
  assert tu.tree_leaves(Pair(1, 2)) == [1, 2]


def test_register_pytree_node_with_keys_func():
  class Vec:
    def __init__(self, x, y):
      self.x, self.y = x, y

  tu.register_pytree_node(Vec, lambda v: ((v.x, v.y), None), lambda aux, children: Vec(*children),
                          lambda v: (((GetAttrKey("x"), v.x), (GetAttrKey("y"), v.y)), None))
  # JAX: [((GetAttrKey(name='x'),), 1), ((GetAttrKey(name='y'),), 2)]
  assert tu.tree_leaves_with_path(Vec(1, 2)) == [((GetAttrKey("x"),), 1), ((GetAttrKey("y"),), 2)]
  assert tu.tree_leaves(Vec(1, [2, 3])) == [1, 2, 3]


def test_register_pytree_with_keys_class():
  @tu.register_pytree_with_keys_class
  class Special:
    def __init__(self, x, y):
      self.x, self.y = x, y

    def tree_flatten_with_keys(self):
      return (((GetAttrKey("x"), self.x), (GetAttrKey("y"), self.y)), None)

    @classmethod
    def tree_unflatten(cls, aux_data, children):
      return cls(*children)

  mapped = tu.tree_map(lambda v: v + 1, Special(1, 2))
  assert (mapped.x, mapped.y) == (2, 3)
  assert [tu.keystr(path) for path, _ in tu.tree_leaves_with_path({"s": Special(1, 2)})] == ["['s'].x", "['s'].y"]


def test_register_pytree_with_keys():
  class Named:
    def __init__(self, items):
      self.items = items

  tu.register_pytree_with_keys(Named, lambda n: ([(DictKey(k), v) for k, v in n.items], tuple(k for k, _ in n.items)),
                               lambda keys, values: Named(list(zip(keys, values))))
  assert tu.keystr(tu.tree_leaves_with_path(Named([("u", 1)]))[0][0]) == "['u']"
  assert tu.tree_map(lambda v: v * 3, Named([("u", 1), ("v", 2)])).items == [("u", 3), ("v", 6)]


def test_register_pytree_node_class():
  @tu.register_pytree_node_class
  class Scaled:
    def __init__(self, value, scale):
      self.value, self.scale = value, scale

    def tree_flatten(self):
      return (self.value,), self.scale

    @classmethod
    def tree_unflatten(cls, scale, children):
      return cls(children[0], scale)

  leaves, treedef = tu.tree_flatten(Scaled(np.float32(2), 3))
  assert leaves == [2] and tu.tree_unflatten(treedef, [5]).scale == 3


def test_register_static():
  @tu.register_static
  @dataclasses.dataclass(frozen=True)
  class Config:
    name: str

  assert tu.tree_leaves([Config("a"), 1]) == [1]
  assert tu.tree_structure(Config("a")) != tu.tree_structure(Config("b"))
  assert tu.tree_map(lambda x: x + 1, [Config("a"), 1]) == [Config("a"), 2]


# ------------------------------------------------------------------------------------------------ dataclasses


@tu.register_dataclass
@dataclasses.dataclass
class Linear:
  weight: object
  bias: object
  activation: str = dataclasses.field(default="relu", metadata={"static": True})


def test_register_dataclass_decorator_with_meta_field():
  layer = Linear(np.ones(2), None, "tanh")
  leaves, treedef = tu.tree_flatten(layer)
  assert len(leaves) == 1 and leaves[0] is layer.weight  # bias None: an empty subtree
  # JAX: PyTreeDef(CustomNode(Linear[('tanh',)], [*, None]))
  assert str(treedef) == "PyTreeSpec(CustomTreeNode(Linear[('tanh',)], [*, None]), namespace='tinyjax')"
  assert tu.tree_unflatten(treedef, [5]) == Linear(5, None, "tanh")
  assert treedef != tu.tree_structure(Linear(1, None, "relu"))
  assert tu.tree_map(lambda x: x * 2, Linear(1, 2)) == Linear(2, 4, "relu")
  # JAX: [((GetAttrKey(name='weight'),), 1), ((GetAttrKey(name='bias'),), 2)]
  assert tu.tree_leaves_with_path(Linear(1, 2)) == [((GetAttrKey("weight"),), 1), ((GetAttrKey("bias"),), 2)]
  assert tu.keystr(tu.tree_leaves_with_path({"l": Linear(1, 2)})[0][0]) == "['l'].weight"


def test_register_dataclass_explicit_fields():
  @functools.partial(tu.register_dataclass, data_fields=["x"], meta_fields=["op"])
  @dataclasses.dataclass
  class Op:
    x: int
    op: str

  # JAX: ([1], PyTreeDef(CustomNode(Op[('add',)], [*]))) and tree_unflatten(treedef, [5]) == Op(x=5, op='add')
  leaves, treedef = tu.tree_flatten(Op(1, "add"))
  assert leaves == [1] and tu.tree_unflatten(treedef, [5]) == Op(5, "add")
  assert tu.tree_structure(Op(1, "add")) == tu.tree_structure(Op(2, "add"))
  assert tu.tree_structure(Op(1, "add")) != tu.tree_structure(Op(1, "sub"))


def test_register_dataclass_on_a_plain_class():
  class Plain:
    def __init__(self, a, b, tag):
      self.a, self.b, self.tag = a, b, tag

  tu.register_dataclass(Plain, data_fields=["a", "b"], meta_fields=["tag"])
  mapped = tu.tree_map(lambda v: -v, Plain(1, 2, "t"))
  assert (mapped.a, mapped.b, mapped.tag) == (-1, -2, "t")


def test_register_dataclass_drop_fields():
  @dataclasses.dataclass
  class WithCache:
    x: int
    cache: object = None

  # JAX's message, verbatim
  with pytest.raises(ValueError, match=re.escape(
      "Missing fields: {'cache'}. Add them to drop_fields to suppress this error.")):
    tu.register_dataclass(WithCache, data_fields=["x"], meta_fields=[])
  tu.register_dataclass(WithCache, data_fields=["x"], meta_fields=[], drop_fields=["cache"])
  assert tu.tree_leaves(WithCache(3, 4)) == [3]
  assert tu.tree_map(lambda v: v, WithCache(3, 4)) == WithCache(3, None)  # JAX: W2(x=3, cache=None)


def test_register_dataclass_errors():
  @dataclasses.dataclass
  class NotInit:
    x: int
    y: int = dataclasses.field(default=0, init=False)

  # JAX's messages, verbatim
  with pytest.raises(ValueError, match=re.escape(
      "data_fields and meta_fields must include all dataclass fields with ``init=True`` and only them. "
      "Unexpected fields: {'y'}.")):
    tu.register_dataclass(NotInit)
  with pytest.raises(TypeError, match="data_fields and meta_fields must both be specified"):
    tu.register_dataclass(NotInit, data_fields=["x"])

  class NotADataclass:
    pass

  with pytest.raises(TypeError, match="data_fields and meta_fields are required when nodetype is not a dataclass"):
    tu.register_dataclass(NotADataclass)

  @dataclasses.dataclass
  class Single:
    x: int

  with pytest.raises(ValueError, match="Missing fields"):
    tu.register_dataclass(Single, data_fields=[], meta_fields=[])
  with pytest.raises(ValueError, match="must not overlap"):
    tu.register_dataclass(Single, data_fields=["x"], meta_fields=["x"])


# ---------------------------------------------------------------------------------------------- reduce, all, transpose


def test_tree_reduce():
  assert tu.tree_reduce(lambda a, b: a + b, [1, 2, 3]) == 6  # JAX: 6
  assert tu.tree_reduce(lambda a, b: a + b, [1, 2, 3], 10) == 16  # JAX: 16
  assert tu.tree_reduce(lambda a, b: a + b, [], 0) == 0
  assert tu.tree_reduce(lambda a, b: a + b, {"a": [1, None], "b": 2}, initializer=0) == 3
  assert tu.tree_reduce(lambda a, b: a + [b], [1, (2,)], [], is_leaf=lambda x: isinstance(x, tuple)) == [1, (2,)]
  assert tu.tree_reduce(lambda a, b: (a, b), [1], None) == (None, 1)


@pytest.mark.parametrize("empty", [[], None, {}, [None, ()]])
def test_tree_reduce_empty_without_initializer(empty):
  # JAX: TypeError('reduce() of empty iterable with no initial value'), as functools.reduce
  with pytest.raises(TypeError, match="reduce\\(\\) of empty iterable with no initial value"):
    tu.tree_reduce(lambda a, b: a + b, empty)


def test_tree_all():
  assert tu.tree_all([True, {"a": True}]) and not tu.tree_all([True, False]) and tu.tree_all([])
  assert tu.tree_all([None, 1]) and not tu.tree_all([1, 0])
  assert tu.tree_all([[0], 1], is_leaf=lambda x: isinstance(x, list))


def test_tree_transpose():
  outer, inner = tu.tree_structure([0, 0]), tu.tree_structure((0, 0, 0))
  # JAX: ([1, 4], [2, 5], [3, 6])
  assert tu.tree_transpose(outer, inner, [(1, 2, 3), (4, 5, 6)]) == ([1, 4], [2, 5], [3, 6])
  assert tu.tree_transpose(outer, None, [(1, 2, 3), (4, 5, 6)]) == ([1, 4], [2, 5], [3, 6])
  assert tu.tree_transpose(tu.tree_structure({"b": 0, "a": 0}), tu.tree_structure([0, 0]),
                           {"b": [1, 2], "a": [3, 4]}) == [{"a": 3, "b": 1}, {"a": 4, "b": 2}]
  # JAX: TypeError('Mismatch\nPyTreeDef([(*, *), (*, *)])\n != \nPyTreeDef([(*, *, *), (*, *, *)])')
  with pytest.raises(TypeError, match=re.escape("Mismatch\nPyTreeSpec([(*, *), (*, *)])\n != \n"
                                                "PyTreeSpec([(*, *, *), (*, *, *)])")):
    tu.tree_transpose(outer, inner, [(1, 2), (4, 5)])


# ------------------------------------------------------------------------------------------------ Partial


def test_partial_is_a_pytree():
  add = tu.Partial(lambda a, b, scale=1: (a + b) * scale, 1, scale=3)
  assert add(2) == 9
  # JAX: tree_leaves(Partial(max, 1, key=3)) == [1, 3]
  assert tu.tree_leaves(tu.Partial(max, 1, key=3)) == [1, 3]
  doubled = tu.tree_map(lambda x: x * 2, add)
  assert isinstance(doubled, tu.Partial) and doubled(2) == (2 + 2) * 6
  assert tu.tree_structure(tu.Partial(max, 1)) == tu.tree_structure(tu.Partial(max, 5))
  assert tu.tree_structure(tu.Partial(max, 1)) != tu.tree_structure(tu.Partial(min, 1))
  # JAX: [((FlattenedIndexKey(key=0), SequenceKey(idx=0)), 1), ((FlattenedIndexKey(key=1), DictKey(key='key')), 3)]
  assert tu.tree_leaves_with_path(tu.Partial(max, 1, key=3)) == [
    ((FlattenedIndexKey(0), SequenceKey(0)), 1), ((FlattenedIndexKey(1), DictKey("key")), 3)]
  assert tu.tree_leaves(tu.Partial(max)) == []


def test_partial_of_a_partial_keeps_inner_arguments_static():
  wrapped = tu.Partial(functools.partial(max, 1), 2)
  # JAX: tree_leaves(...) == [2], wrapped(0) == 2, wrapped.args == (2,)
  assert tu.tree_leaves(wrapped) == [2] and wrapped(0) == 2 and wrapped.args == (2,)
  assert tu.tree_map(lambda x: x + 10, wrapped)(0) == 12
