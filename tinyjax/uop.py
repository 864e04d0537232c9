"""The one IR: `UOp`, an immutable, hash-consed node `(op, dtype, src, arg)`, and rewrites declared as data.

Building the same node twice returns the same object, so equal programs are equal graphs, `is` is structural
equality, and a node hashes cheaply as a cache key. Graph changes are `PatternMatcher` rules (`UPat` -> function)
applied by `graph_rewrite`.

Array-level nodes (what a jaxpr or a lazy Array is made of) carry a shape; kernel-level nodes (what lower/ hands to
codegen: RANGE, LOAD, STORE, ...) are scalar and have shape None.
"""
from __future__ import annotations

import math
import weakref
from typing import Any, Callable, Iterator, NamedTuple

import numpy as np


class auto:
  """A member of Ops in its class body (numbered in order, as enum.auto)."""


class _OpsType(type):
  """Ops' metaclass: each `auto()` of the class body becomes a member, an instance of the class with a `name` and a
  `value`; the class iterates over its members and looks them up by name (`Ops["ADD"]`), as an Enum does. (Ops is no
  enum.Enum: on Python 3.11 the EnumType's `__getattr__` makes every `Ops.ADD` cost ~60 ns instead of ~15, and
  member hashes are a Python call, a large share of an eager operation's and of lowering's Python time.)"""

  def __new__(mcs, name: str, bases: tuple, namespace: dict) -> type:
    names = [key for key, value in namespace.items() if isinstance(value, auto)]
    members: dict[str, Any] = {}
    cls = super().__new__(mcs, name, bases, {k: v for k, v in namespace.items() if k not in names} |
                          {"_members": members})
    for value, member_name in enumerate(names, 1):
      member = members[member_name] = object.__new__(cls)
      member.name, member.value = member_name, value
      type.__setattr__(cls, member_name, member)
    return cls

  def __iter__(cls) -> Iterator[Any]: return iter(cls._members.values())
  def __len__(cls) -> int: return len(cls._members)
  def __getitem__(cls, name: str) -> Any: return cls._members[name]
  def __setattr__(cls, name: str, value: Any) -> None: raise AttributeError(f"cannot set {cls.__name__}.{name}")


class Ops(metaclass=_OpsType):
  """The operations of the IR: the node kinds of a UOp (identity-compared, hashed by identity)."""
  __slots__ = ("name", "value")

  def __repr__(self) -> str: return f"<Ops.{self.name}: {self.value}>"
  def __str__(self) -> str: return f"Ops.{self.name}"
  def __reduce__(self) -> tuple: return (getattr, (Ops, self.name))
  def __copy__(self) -> Ops: return self
  def __deepcopy__(self, memo: dict) -> Ops: return self

  # leaves
  CONST = auto()      # scalar constant, arg = Python value, shape ()
  BUFFER = auto()     # a realised buffer, arg = devices.buffer.Buffer (has .shape)
  PARAM = auto()      # an input of a traced program, arg = (index, shape)
  IOTA = auto()       # [0, 1, ..., arg - 1] in the node's dtype, shape (arg,): a kernel computes it from its index
  # unary elementwise
  NEG = auto(); RECIP = auto(); SQRT = auto(); EXP2 = auto(); LOG2 = auto(); SIN = auto(); COS = auto()  # noqa: E702
  TRUNC = auto()      # round toward zero, float -> same float dtype
  CAST = auto()       # value conversion to self.dtype
  BITCAST = auto()    # reinterpret the bits as self.dtype (same itemsize)
  REAL = auto(); IMAG = auto()  # noqa: E702  (a complex value's parts, as self.dtype; lowered by lower/complex.py)
  # binary elementwise. FDIV: float division. IDIV / MOD: integer division truncating toward zero and its remainder
  # (C and lax.div / lax.rem semantics; by zero: IDIV -> -1, MOD -> the dividend, as XLA). MAX propagates NaN.
  ADD = auto(); MUL = auto(); MAX = auto(); FDIV = auto(); IDIV = auto(); MOD = auto()  # noqa: E702
  CMPLT = auto(); CMPNE = auto()  # noqa: E702
  AND = auto(); OR = auto(); XOR = auto(); SHL = auto(); SHR = auto()  # noqa: E702
  POW = auto()
  COMPLEX = auto()    # the complex number with real part src[0] and imaginary part src[1] (lower/complex.py)
  # ternary
  WHERE = auto()
  # reduction over axes, keeping them as size 1: arg = (Ops.ADD | Ops.MAX | Ops.MUL, axes tuple). Its dtype is its
  # operand's, except for the float64 partial sums of float32 / 16-bit floats that lower/split.py builds
  REDUCE_AXIS = auto()
  # movement: free until lowering
  RESHAPE = auto()    # arg = new shape
  PERMUTE = auto()    # arg = permutation
  EXPAND = auto()     # arg = new shape (size-1 dims broadcast)
  PAD = auto()        # arg = ((before, after), ...) zero padding
  SHRINK = auto()     # arg = ((start, end), ...)
  FLIP = auto()       # arg = tuple of bool, one per axis
  CONTIGUOUS = auto()  # explicit materialisation point
  # data-dependent memory access. src = (operand, indices): indices are integers of shape (*batch, k) holding, for each
  # batch element, the start of a window of sizes arg (k of them) in the operand's first k axes; the result has shape
  # (*batch, *arg, *operand.shape[k:]) and copies each window. Starts are clamped so the window fits (as XLA).
  GATHER = auto()
  # src = (operand, indices, updates), arg = ScatterArg: the operand with each window of `updates` (shape
  # (*batch, *window sizes, *operand.shape[k:])) combined into it at its start, in order (a later update sees the
  # earlier ones: duplicates accumulate). A window that does not fit is dropped (as XLA's FILL_OR_DROP), or with
  # `clip` its start is clamped as GATHER's.
  SCATTER = auto()
  # structured control flow, holding sub-programs (SINKs over PARAMs). Multi-output: each result is a PROJECT of the
  # node, arg = (index, shape). SCAN: src = (*carry inits, *xs, *consts), arg = ScanArg; the body maps (carries,
  # x slices, consts) to (new carries, y slices); results: final carries, then the stacked ys. WHILE: src = (*carry
  # inits, *consts), arg = WhileArg; runs body (carries, consts) -> carries while cond (carries, consts) -> bool.
  SCAN = auto()
  WHILE = auto()
  # COND: src = (int32 index, *operands), arg = the branch programs (a tuple of SINKs over the operands); runs the
  # branch the index picks (clamped into range)
  COND = auto()
  # a host function called between kernels (`pure_callback`): src = the operands (read from buffers), arg = a
  # HostCallback (trace/callback.py: the function and its results' avals); each result is a PROJECT of the node
  CALLBACK = auto()
  PROJECT = auto()
  # a named primitive (tanh, dot_general, scan, ...) kept whole in a loop body's program, so that differentiating or
  # batching the body applies the primitive's own rules: arg = a `PrimitiveCall` (trace/core.py) that knows the
  # output avals and expands the call into Ops for lowering (`arg.expand(operands)`). Multi-output: PROJECTs.
  PRIMITIVE = auto()
  # kernel level (built by lower/, rendered by codegen/)
  DEFINE_GLOBAL = auto()  # a kernel parameter: dtype = element dtype, arg = parameter index
  RANGE = auto()      # a loop index: dtype int64, src = (bound,), arg = (id, "global" | "reduce")
  LOAD = auto()       # src = (DEFINE_GLOBAL, index) or (DEFINE_GLOBAL, index, gate): gate false -> 0, no read
  STORE = auto()      # src = (DEFINE_GLOBAL, index, value)
  REDUCE = auto()     # src = (value, *reduce RANGEs), arg = Ops.ADD | Ops.MAX | Ops.MUL
  SINK = auto()       # src = the STOREs of a kernel
  # AD only (never lowered): a linear map known by its transpose, in the linear programs of vjp (custom_vjp,
  # checkpoint). src = the tangent inputs, arg = (handle with a `transpose(cotangent) -> input cotangents`, index)
  CUSTOM_LINEAR = auto()


class ScatterArg(NamedTuple):
  """The arg of a SCATTER: how updates combine (`mode`: "set", "add", "mul", "min", "max"), the window sizes (one per
  indexed leading axis of the operand), whether the caller promised no two updates hit one element, and whether starts
  that do not fit are clamped (`clip`) instead of dropped."""
  mode: str
  window: tuple[int, ...]
  unique_indices: bool = False
  clip: bool = False


class ScanArg(NamedTuple):
  """The arg of a SCAN: its body program, the number of iterations, whether xs/ys run from the end, and how many of
  its operands are carries and xs (the rest are loop-invariant consts)."""
  body: Any
  length: int
  reverse: bool
  n_carry: int
  n_xs: int


class WhileArg(NamedTuple):
  """The arg of a WHILE: its condition and body programs and how many of its operands are carries."""
  cond: Any
  body: Any
  n_carry: int


UNARY = {Ops.NEG, Ops.RECIP, Ops.SQRT, Ops.EXP2, Ops.LOG2, Ops.SIN, Ops.COS, Ops.TRUNC, Ops.CAST, Ops.BITCAST, Ops.REAL,
         Ops.IMAG}
BINARY = {Ops.ADD, Ops.MUL, Ops.MAX, Ops.FDIV, Ops.IDIV, Ops.MOD, Ops.CMPLT, Ops.CMPNE, Ops.AND, Ops.OR, Ops.XOR,
          Ops.SHL, Ops.SHR, Ops.POW, Ops.COMPLEX}
ELEMENTWISE = UNARY | BINARY | {Ops.WHERE}
MOVEMENT = {Ops.RESHAPE, Ops.PERMUTE, Ops.EXPAND, Ops.PAD, Ops.SHRINK, Ops.FLIP}
COMMUTATIVE = {Ops.ADD, Ops.MUL, Ops.MAX, Ops.CMPNE, Ops.AND, Ops.OR, Ops.XOR}
INDEX_DTYPE = np.dtype(np.int64)
BOOL = np.dtype(np.bool_)


def arg_key(arg: Any) -> Any:
  """Hash-consing key of an arg: floats by their bits, so -0.0 and 0.0 differ and nan equals nan."""
  if arg is None or type(arg) is tuple: return arg  # (the common args first)
  if isinstance(arg, float): return ("float", arg.hex())
  if isinstance(arg, complex): return ("complex", arg.real.hex(), arg.imag.hex())
  if isinstance(arg, np.generic): return ("np", arg.dtype.name, arg.tobytes())  # (the str of every float8 is '<V1')
  return arg


class _cached:
  """A property computed once per node and kept in its `__dict__` (functools.cached_property without its lock, which
  on Python 3.11 costs ~1 us per first access: every eager op asks its node's shape once)."""
  def __init__(self, fn: Callable[[Any], Any]):
    self.fn, self.name, self.__doc__ = fn, fn.__name__, fn.__doc__

  def __get__(self, node: Any, owner: Any = None) -> Any:
    if node is None: return self
    value = node.__dict__[self.name] = self.fn(node)
    return value


class UOp:
  """An immutable IR node. Construct with `UOp(op, dtype, src, arg)`; identical nodes are one object (hash-consed),
  except the `unshared` ones eager and linearized operations make."""
  __slots__ = ("op", "dtype", "src", "arg", "__weakref__", "__dict__")
  _cache: weakref.WeakValueDictionary = weakref.WeakValueDictionary()

  def __new__(cls, op: Ops, dtype: np.dtype, src: tuple[UOp, ...] = (), arg: Any = None):
    if op is Ops.BUFFER and getattr(arg, "dtype", None) == dtype and hasattr(arg, "_node"):
      if arg._node is not None and (node := arg._node()) is not None: return node
      return UOp.new_buffer(dtype, arg)
    key = (op, dtype, src, arg_key(arg))
    if (node := UOp._cache.get(key)) is not None: return node
    node = object.__new__(cls)
    node.op, node.dtype, node.src, node.arg = op, dtype, src, arg
    UOp._cache[key] = node
    return node

  @staticmethod
  def new_buffer(dtype: np.dtype, buffer: Any) -> UOp:
    """`UOp(Ops.BUFFER, dtype, (), buffer)` for a buffer (of that dtype) that no node names yet, such as a kernel's
    fresh output. A buffer keeps a weak reference to its node instead of the node going into `_cache`: the weak-value
    dictionary's entry and its removal when the node dies cost ~0.9 us per output of a jitted call, the weak reference
    ~0.1."""
    node = object.__new__(UOp)
    node.op, node.dtype, node.src, node.arg = Ops.BUFFER, dtype, (), buffer
    buffer._node = weakref.ref(node)
    return node

  @staticmethod
  def unshared(op: Ops, dtype: np.dtype, src: tuple[UOp, ...], arg: Any) -> UOp:
    """A node outside the hash-consing cache: an eager operation's (trace/core.py EvalTrace) or a linearized one's
    (trace/ad.py LinearTrace: two equal operations keep cotangents of their own). The cache's weak-value entry and
    its removal when the node dies cost ~1.3 us, most of an eager op's graph building; an eager graph is found in the
    schedule cache by its structure (lower/realize.py `program_key`), not by node identity, so equal eager nodes need
    not be one object (two equal ones are computed twice in one program)."""
    node = object.__new__(UOp)
    node.op, node.dtype, node.src, node.arg = op, dtype, src, arg
    return node

  def become_buffer(self, buffer: Any) -> None:
    """Turn this lazy node, now computed into `buffer`, into that buffer's BUFFER node, in place: graphs built on it
    before it was computed (`m2 = 0.9 * m` just before `m` was realised) then read the buffer, instead of computing
    its history again and keeping that history alive. Only for the array-level nodes of eager arrays (array.py),
    which are `unshared`: no hash-consing entry names the old computation."""
    self.op, self.src, self.arg = Ops.BUFFER, (), buffer
    self.__dict__.pop("toposort", None)
    self.__dict__.pop("sig", None)  # (lower/realize.py `signature_of`: its leaves and lazy nodes are no longer read)
    buffer._node = weakref.ref(self)

  def __reduce__(self): return (UOp, (self.op, self.dtype, self.src, self.arg))
  def __repr__(self) -> str: return pretty(self)
  def replace(self, **kwargs) -> UOp:
    fields = {"op": self.op, "dtype": self.dtype, "src": self.src, "arg": self.arg} | kwargs
    return UOp(fields["op"], fields["dtype"], fields["src"], fields["arg"])

  @_cached
  def shape(self) -> tuple[int, ...] | None:
    """Shape of an array-level node, None for kernel-level (scalar) nodes."""
    for src in self.src:
      if "shape" not in src.__dict__:
        _shapes_below(self)
        break
    return shape_of(self)

  @_cached
  def toposort(self) -> list[UOp]:
    """Every node this one depends on, itself last, each before its users. Iterative: graphs can be deep."""
    return toposort_of([self])

  # small constructors used by lower/ and codegen/ (symbolic simplification lives in lower/symbolic.py)
  @staticmethod
  def const(dtype: np.dtype, value: Any) -> UOp:
    dtype = np.dtype(dtype)
    if dtype == BOOL: value = bool(value)
    elif dtype.kind in "iu": value = int(value)
    elif dtype.kind == "c": value = complex(value)
    else: value = float(value)
    return UOp(Ops.CONST, dtype, (), value)

  def alu(self, op: Ops, *others: UOp) -> UOp:
    out_dtype = BOOL if op in (Ops.CMPLT, Ops.CMPNE) else (others[0].dtype if op is Ops.WHERE else self.dtype)
    return UOp(op, out_dtype, (self, *others))

  @_cached
  def vmin_vmax(self) -> tuple[Any, Any]:
    """Conservative bounds of an integer kernel-level expression (for index simplification)."""
    return _bounds(self)


def sub_programs(node: UOp) -> list[UOp]:
  """The sub-programs of a SCAN (body), WHILE (cond, body) or COND (branches) node."""
  if node.op is Ops.SCAN: return [node.arg.body]
  if node.op is Ops.WHILE: return [node.arg.cond, node.arg.body]
  return list(node.arg)


def rewrite_sub_programs(node: UOp, rewrite: Callable[[UOp], UOp]) -> Any:
  """The arg of a SCAN, WHILE or COND node with `rewrite` applied to each of its sub-programs."""
  programs = [rewrite(program) for program in sub_programs(node)]
  if node.op is Ops.SCAN: return node.arg._replace(body=programs[0])
  if node.op is Ops.WHILE: return node.arg._replace(cond=programs[0], body=programs[1])
  return tuple(programs)


def is_view(node: UOp) -> bool:
  """Whether `node` only rearranges a buffer or a constant (movement ops all the way down): cheap to recompute, so
  eager code keeps such a value lazy even while an array holds it (array.py `held_arrays`)."""
  while node.op in MOVEMENT: node = node.src[0]
  return node.op is Ops.BUFFER or node.op is Ops.CONST


def toposort_of(roots: list[UOp]) -> list[UOp]:
  """Every node the roots depend on, each before its users: the first root's nodes (as its `toposort`), then those of
  the second not yet listed, and so on; one walk over the graph."""
  order: list[UOp] = []
  seen: set[UOp] = set()
  for root in roots:
    if root in seen: continue
    seen.add(root)
    stack = [(root, iter(root.src))]  # (node, its sources not yet visited)
    while stack:
      node, sources = stack[-1]
      for source in sources:
        if source not in seen:
          seen.add(source)
          stack.append((source, iter(source.src)))
          break
      else:
        stack.pop()
        order.append(node)
  return order


def _shapes_below(node: UOp) -> None:
  """Compute the shapes of the nodes below `node` not known yet, sources first (iteratively: a graph built without
  asking its nodes' shapes, as a transposition builds one, can be thousands of nodes deep)."""
  stack, seen = [(src, False) for src in node.src], set()
  while stack:
    current, expanded = stack.pop()
    if expanded:
      current.__dict__["shape"] = shape_of(current)
      continue
    if current in seen or "shape" in current.__dict__: continue
    seen.add(current)
    stack.append((current, True))
    stack.extend((src, False) for src in current.src if "shape" not in src.__dict__)


def _broadcast_ok(node: UOp) -> tuple[int, ...]:
  shapes = {s.shape for s in node.src}
  if len(shapes) != 1: raise ValueError(f"{node.op.name}: operand shapes differ: {[s.shape for s in node.src]}")
  return node.src[0].shape


def shape_of(node: UOp) -> tuple[int, ...] | None:
  """The shape of `node` from its sources' (what its `shape` property computes and keeps; eager operations set it as
  they make a node, trace/core.py)."""
  op, arg = node.op, node.arg
  if op in ELEMENTWISE:
    sources = node.src
    shape = sources[0].shape
    if len(sources) == 1 or sources[1].shape == shape and (len(sources) == 2 or sources[2].shape == shape):
      return shape  # (the common cases, without a generator: every eager op's node comes here)
    if any(s.shape is None for s in node.src): return None
    return _broadcast_ok(node)
  if op is Ops.CONST: return ()
  if op is Ops.BUFFER: return tuple(arg.shape)
  if op is Ops.PARAM: return tuple(arg[1])
  if op is Ops.IOTA: return (arg,)
  if op is Ops.CUSTOM_LINEAR: return tuple(arg[0].out_shapes[arg[1]])
  if op is Ops.CONTIGUOUS: return node.src[0].shape
  if op is Ops.REDUCE_AXIS:
    src_shape = node.src[0].shape
    return tuple(1 if i in arg[1] else d for i, d in enumerate(src_shape))
  if op in (Ops.RESHAPE, Ops.EXPAND): return tuple(arg)
  if op is Ops.PERMUTE: return tuple(node.src[0].shape[i] for i in arg)
  if op is Ops.PAD: return tuple(d + lo + hi for d, (lo, hi) in zip(node.src[0].shape, arg))
  if op is Ops.SHRINK: return tuple(end - start for start, end in arg)
  if op is Ops.FLIP: return node.src[0].shape
  if op is Ops.GATHER:
    operand, indices = node.src
    return tuple(indices.shape[:-1]) + tuple(arg) + tuple(operand.shape[len(arg):])
  if op is Ops.SCATTER: return node.src[0].shape
  if op is Ops.PROJECT: return tuple(arg[1])
  if op is Ops.PRIMITIVE: return None if arg.prim.multiple_results else tuple(arg.out_avals[0][0])
  return None  # kernel-level nodes are scalars


def _bounds(node: UOp) -> tuple[Any, Any]:
  op = node.op
  if op is Ops.CONST: return node.arg, node.arg
  if op is Ops.RANGE:
    bound = node.src[0]
    return 0, (bound.vmin_vmax[1] - 1 if bound.op is Ops.CONST else math.inf)
  if node.dtype.kind not in "iub": return -math.inf, math.inf
  if op is Ops.ADD:
    (a0, a1), (b0, b1) = node.src[0].vmin_vmax, node.src[1].vmin_vmax
    return a0 + b0, a1 + b1
  if op is Ops.MUL:
    (a0, a1), (b0, b1) = node.src[0].vmin_vmax, node.src[1].vmin_vmax
    if any(math.isinf(v) for v in (a0, a1, b0, b1)): return -math.inf, math.inf
    corners = [a0 * b0, a0 * b1, a1 * b0, a1 * b1]
    return min(corners), max(corners)
  if op is Ops.IDIV:
    (a0, a1), (b0, b1) = node.src[0].vmin_vmax, node.src[1].vmin_vmax
    if b0 == b1 and b0 > 0 and a0 >= 0 and not math.isinf(a1): return a0 // b0, a1 // b0
  if op is Ops.MOD:
    (a0, a1), (b0, b1) = node.src[0].vmin_vmax, node.src[1].vmin_vmax
    if b0 == b1 and b0 > 0 and a0 >= 0: return (a0, a1) if a1 < b0 else (0, b0 - 1)
  if op is Ops.MAX:
    (a0, a1), (b0, b1) = node.src[0].vmin_vmax, node.src[1].vmin_vmax
    return max(a0, b0), max(a1, b1)
  if op is Ops.WHERE:
    cond, if_true, if_false = node.src
    (a0, a1), (b0, b1) = if_true.vmin_vmax, if_false.vmin_vmax
    if cond.op is Ops.CMPLT and cond.src == (if_true, if_false): return min(a0, b0), min(a1, b1)  # a minimum
    return min(a0, b0), max(a1, b1)
  if node.dtype == BOOL: return False, True
  return -math.inf, math.inf


# ---------------------------------------------------------------------------------------------------------------------
# printing

def pretty(root: UOp, max_lines: int = 200) -> str:
  """Readable listing of a UOp graph: one line per node, each node named once."""
  names: dict[UOp, str] = {}
  lines = []
  for node in root.toposort:
    names[node] = f"%{len(names)}"
    srcs = ", ".join(names[s] for s in node.src)
    arg = "" if node.arg is None else f" arg={node.arg!r}"
    shape = "" if node.shape is None else f"{list(node.shape)}"
    lines.append(f"{names[node]} = {node.op.name} {node.dtype.name}{shape} ({srcs}){arg}")
  if len(lines) > max_lines: lines = lines[:max_lines // 2] + ["..."] + lines[-max_lines // 2:]
  return "\n".join(lines)


# ---------------------------------------------------------------------------------------------------------------------
# patterns and rewrites

class UPat:
  """A pattern over UOps. `op` (one Ops or a tuple), `dtype`, `src` (tuple of UPat, matched in order; with
  commutative ops also swapped), `arg`, and `name` (the matched node is passed to the rule under that name)."""
  __slots__ = ("ops", "dtypes", "src", "arg", "name", "allow_any_len")

  def __init__(self, op: Ops | tuple[Ops, ...] | None = None, dtype: Any = None, src: tuple[UPat, ...] | None = None,
               arg: Any = None, name: str | None = None, allow_any_len: bool = False):
    self.ops = None if op is None else (op if isinstance(op, tuple) else (op,))
    self.dtypes = None if dtype is None else (tuple(np.dtype(d) for d in dtype) if isinstance(dtype, tuple)
                                              else (np.dtype(dtype),))
    self.src, self.arg, self.name, self.allow_any_len = src, arg, name, allow_any_len

  @staticmethod
  def var(name: str | None = None, dtype: Any = None) -> UPat: return UPat(dtype=dtype, name=name)
  @staticmethod
  def cvar(name: str | None = None, dtype: Any = None) -> UPat: return UPat(Ops.CONST, dtype=dtype, name=name)

  def match(self, node: UOp, store: dict[str, UOp]) -> bool:
    if self.ops is not None and node.op not in self.ops: return False
    if self.dtypes is not None and node.dtype not in self.dtypes: return False
    if self.arg is not None and node.arg != self.arg: return False
    if self.name is not None:
      if self.name in store and store[self.name] is not node: return False
      store[self.name] = node
    if self.src is None: return True
    if len(node.src) != len(self.src) and not (self.allow_any_len and len(node.src) >= len(self.src)): return False
    saved = dict(store)
    if all(p.match(s, store) for p, s in zip(self.src, node.src)): return True
    if node.op in COMMUTATIVE and len(self.src) == 2:
      store.clear(); store.update(saved)
      if self.src[0].match(node.src[1], store) and self.src[1].match(node.src[0], store): return True
    store.clear(); store.update(saved)
    return False


class PatternMatcher:
  """An ordered list of `(UPat, rule)`. A rule takes the named matches as keyword arguments (and `ctx` if it names
  it) and returns a replacement node or None (no change)."""

  def __init__(self, rules: list[tuple[UPat, Callable]]):
    self.rules = rules
    self.by_op: dict[Ops | None, list[tuple[UPat, Callable, bool]]] = {}
    for pattern, rule in rules:
      takes_ctx = "ctx" in rule.__code__.co_varnames[:rule.__code__.co_argcount]
      for op in (pattern.ops or (None,)): self.by_op.setdefault(op, []).append((pattern, rule, takes_ctx))

  def __add__(self, other: PatternMatcher) -> PatternMatcher: return PatternMatcher(self.rules + other.rules)

  def rewrite(self, node: UOp, ctx: Any = None) -> UOp | None:
    for pattern, rule, takes_ctx in self.by_op.get(node.op, []) + self.by_op.get(None, []):
      store: dict[str, UOp] = {}
      if not pattern.match(node, store): continue
      result = rule(ctx=ctx, **store) if takes_ctx else rule(**store)
      if result is not None and result is not node: return result
    return None


def graph_rewrite(root: UOp, matcher: PatternMatcher, ctx: Any = None) -> UOp:
  """Rewrite bottom-up to a fixed point: sources first, then the node, and again on whatever a rule returned."""
  done: dict[UOp, UOp] = {}
  stack: list[tuple[UOp, int, UOp | None]] = [(root, 0, None)]
  while stack:
    node, stage, link = stack.pop()
    if stage == 0:  # visit sources first
      if node in done: continue
      stack.append((node, 1, None))
      stack.extend((s, 0, None) for s in reversed(node.src) if s not in done)
    elif stage == 1:  # sources are done: rebuild and try the rules
      if node in done: continue
      new_src = tuple(done[s] for s in node.src)
      rebuilt = node if all(a is b for a, b in zip(new_src, node.src)) else node.replace(src=new_src)
      result = matcher.rewrite(rebuilt, ctx)
      if result is None: done[node] = rebuilt
      elif result in done: done[node] = done[result]
      else:
        stack.append((node, 2, result))
        stack.append((result, 0, None))
    else:  # the replacement has been rewritten itself
      done[node] = done[link]
  return done[root]
