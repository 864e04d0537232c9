"""Random `tinyjax.numpy` programs, run eagerly, under `jit` and under `vmap`, checked against the reference of ops.py.

A program is a few input arrays (random dtypes among bool, int8/16/32, uint8/32, float16, bfloat16, float32, weakly
typed scalars made from Python numbers; shapes with 0-size and size-1 dims) and a list of steps, each an op of
ops.py applied to earlier values and Python scalars. Running a program returns every step's value, so each step is
checked on its own: its dtype and weak type exactly, its values against the reference computed from the values
tinyjax gave for its operands (so an error is one op's rounding, never amplified by the ops after it). The last
value is also computed with nothing else returned (every step fused as lowering decides) and compared with the
stepwise one, eagerly and under jit.
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from tests.fuzz.ops import OPS, Aval, ExpectedError, Invalid, Operand, exact, scalar_operand
from tests.fuzz.promotion import BOOL, kind, np_dtype

INPUT_DTYPES = (BOOL, "int8", "int16", "int32", "uint8", "uint32", "float16", "bfloat16", "float32")
DIMS = (0, 1, 1, 2, 2, 3, 5, 7)
MAX_ELEMENTS = 200
# now and then a large input, so that threaded launches, split reductions and tiled contractions are exercised
LARGE_SHAPES = ((40, 1031), (70001,), (3, 129, 130), (1, 4099), (257, 1))
LARGE_ELEMENTS = 2 * 70001
# ops that also get strongly typed scalars (Python bools, numpy scalars); hypot, heaviside and power are left out:
# JAX's weak types there depend on how it composes them
STRONG_SCALAR_OPS = {"add", "multiply", "maximum", "minimum", "equal", "not_equal", "less", "logical_and",
                     "logical_xor", "bitwise_and", "bitwise_or", "where"}


@dataclass
class Step:
  op: str
  args: tuple[Any, ...]  # int: index of an earlier value; ("scalar", v): a Python scalar
  params: dict
  aval: Aval | None = None          # the expected result, or
  error: type | None = None         # the error kind JAX raises (only ever the last step)


@dataclass
class Program:
  inputs: list[Operand]
  steps: list[Step] = field(default_factory=list)

  def source(self) -> str:
    """The program as Python a person can run (tinyjax.numpy as tnp, numpy as np, ml_dtypes)."""
    lines = []
    for i, operand in enumerate(self.inputs):
      if operand.seed is not None:
        lines.append(f"v{i} = tnp.asarray(random_values(np.random.default_rng({operand.seed}), "
                     f"{operand.aval.dtype!r}, {operand.aval.shape}))  # from tests.fuzz.programs import random_values")
      elif operand.scalar is not None:
        lines.append(f"v{i} = tnp.asarray({operand.scalar!r})  # {operand.aval}")
      else:
        dtype = "ml_dtypes.bfloat16" if operand.aval.dtype == "bfloat16" else f"np.{operand.aval.dtype}"
        values = exact(operand.host, operand.aval.dtype).astype(np.float64 if kind(operand.aval.dtype) == "f" else
                                                                 np.int64).tolist()
        values = repr(values).replace("inf", "np.inf").replace("nan", "np.nan")  # runnable: np.inf, not inf
        lines.append(f"v{i} = tnp.asarray(np.array({values}, {dtype}).reshape({operand.aval.shape}))")
    for k, step in enumerate(self.steps):
      names = [f"v{a}" if isinstance(a, int) else repr(a[1]) for a in step.args]
      expected = f"JAX: {step.error.__name__}" if step.error else f"JAX: {step.aval}"
      lines.append(f"v{len(self.inputs) + k} = {OPS[step.op].code.format(*names, **step.params)}  # {expected}")
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------------- generation

def random_values(rng: np.random.Generator, dtype: str, shape: tuple[int, ...]) -> np.ndarray:
  """Input values: small numbers and a few extremes (ints), moderate values, signed zeros, inf and NaN (floats)."""
  size = math.prod(shape)
  if kind(dtype) == "b": return (rng.random(size) < 0.5).reshape(shape)
  if kind(dtype) in "iu":
    info = np.iinfo(np_dtype(dtype))
    small = rng.integers(max(info.min, -6), min(info.max, 9), size)
    extreme = rng.choice([info.min, info.max, 0, 1], size)
    values = np.where(rng.random(size) < 0.08, extreme, small)
    return values.astype(np_dtype(dtype)).reshape(shape)
  magnitude = rng.choice([0.5, 2.0, 10.0, 100.0], size)
  values = np.round(rng.uniform(-1, 1, size) * magnitude, int(rng.integers(0, 4)))
  special = rng.choice([0.0, -0.0, np.inf, -np.inf, np.nan, 0.5, -1.0], size)
  values = np.where(rng.random(size) < 0.06, special, values)
  with np.errstate(over="ignore"):
    return values.astype(np_dtype(dtype)).reshape(shape)


def _random_shape(rng: np.random.Generator) -> tuple[int, ...]:
  while True:
    shape = tuple(int(rng.choice(DIMS)) for _ in range(int(rng.integers(0, 4))))
    if math.prod(shape) <= MAX_ELEMENTS: return shape


def _element_limit(program: Program) -> int:
  return LARGE_ELEMENTS if any(math.prod(op.aval.shape) > MAX_ELEMENTS for op in program.inputs) else MAX_ELEMENTS


def random_input(rng: np.random.Generator, shape: tuple[int, ...] | None = None) -> Operand:
  if rng.random() < 0.12:  # a weakly typed array made from a Python scalar
    value = float(np.round(rng.uniform(-4, 4), 1)) if rng.random() < 0.5 else int(rng.integers(-5, 9))
    return Operand(Aval((), "int32" if type(value) is int else "float32", True),
                   np.asarray(value, np.int32 if type(value) is int else np.float32), value)
  dtype = str(rng.choice(INPUT_DTYPES))
  if shape is None and rng.random() < 0.03:  # a large input: its values come from a seed the repro can name
    shape, seed = LARGE_SHAPES[int(rng.integers(len(LARGE_SHAPES)))], int(rng.integers(1 << 30))
    return Operand(Aval(shape, dtype, False), random_values(np.random.default_rng(seed), dtype, shape), seed=seed)
  shape = _random_shape(rng) if shape is None else shape
  return Operand(Aval(shape, dtype, False), random_values(rng, dtype, shape))


NUMPY_SCALAR_TYPES = (np.int8, np.uint8, np.int16, np.int64, np.float16, np.float32, np.float64)


def _random_scalar(rng: np.random.Generator, op: str) -> Any:
  """A Python bool/int/float (weak, but for bool) or, now and then, a strongly typed numpy scalar."""
  choice = rng.random()
  if choice < 0.15 and op in STRONG_SCALAR_OPS: return bool(rng.random() < 0.5)
  if choice < 0.25 and op in STRONG_SCALAR_OPS:
    scalar_type = NUMPY_SCALAR_TYPES[int(rng.integers(len(NUMPY_SCALAR_TYPES)))]
    return scalar_type(rng.choice([0, 1, 3, -2, 100]) if np.dtype(scalar_type).kind != "u" else rng.choice([0, 3]))
  if choice < 0.55: return int(rng.choice([0, 1, 2, 3, -1, 7, 100, 300]))
  return float(rng.choice([0.5, 1.5, -2.25, 0.1, 3.0, 1e3]))


def _broadcast_partner(rng: np.random.Generator, shape: tuple[int, ...]) -> tuple[int, ...]:
  """A shape that broadcasts with `shape` (fewer leading dims, size-1 dims), or rarely one that does not."""
  if rng.random() < 0.03: return _random_shape(rng)
  drop = int(rng.integers(0, len(shape) + 1))
  return tuple(1 if rng.random() < 0.3 else d for d in shape[drop:])


def _avals(program: Program) -> list[Aval]:
  return [op.aval for op in program.inputs] + [s.aval for s in program.steps]


def _try_step(program: Program, step: Step) -> bool:
  """Compute the step's expected aval (or error); False if the op does not apply to these operands."""
  avals = _avals(program)
  args = [avals[a] if isinstance(a, int) else scalar_operand(a[1]).aval for a in step.args]
  try:
    step.aval = OPS[step.op].aval(*args, **step.params)
  except ExpectedError as error:
    step.error = error.kind
  except Exception:  # the op's parameters do not fit these operands (e.g. pad of a 0-d array)
    return False
  if step.aval is not None and math.prod(step.aval.shape) > _element_limit(program): return False
  return True


def _compatible(op: str, first: tuple[int, ...], other: tuple[int, ...]) -> bool:
  """Whether `other` can be the second operand of `op` next to `first` (broadcasting, or joinable)."""
  if op == "stack": return first == other
  if op == "concatenate":
    return len(first) == len(other) and sum(a != b for a, b in zip(first, other)) <= 1 and len(first) > 0
  try:
    np.broadcast_shapes(first, other)
    return True
  except ValueError:
    return False


def random_program(rng: np.random.Generator, max_steps: int = 6) -> Program:
  """A program of up to `max_steps` steps over 1-4 inputs (the later ones shaped to broadcast with the first); a
  step JAX rejects (TypeError/ValueError) ends it."""
  first = random_input(rng)
  program = Program([first])
  for _ in range(int(rng.integers(0, 4))):
    shape = _broadcast_partner(rng, first.aval.shape) if rng.random() < 0.8 else None
    program.inputs.append(random_input(rng, shape))
  names = sorted(OPS)
  for _ in range(int(rng.integers(1, max_steps + 1))):
    for _attempt in range(20):
      op = OPS[names[int(rng.integers(len(names)))]]
      avals = _avals(program)
      first_index = int(rng.integers(len(avals)))
      args: list[Any] = [first_index]
      for _ in range(op.arity - 1):
        partners = [i for i, a in enumerate(avals) if _compatible(op.name, avals[first_index].shape, a.shape)]
        if rng.random() < 0.03: partners = list(range(len(avals)))  # sometimes JAX's shape errors
        if op.name not in ("concatenate", "stack") and (not partners or rng.random() < 0.3):
          args.append(("scalar", _random_scalar(rng, op.name)))
        else:
          args.append(partners[int(rng.integers(len(partners)))] if partners else first_index)
      if op.arity > 1 and rng.random() < 0.5: args = args[::-1]
      if op.name == "power" and _concrete_integer_exponent(program, args[1]): continue
      if op.name == "power" and not isinstance(args[1], int) and isinstance(args[1][1], (int, np.integer)):
        op, args = OPS["integer_pow"], [args[0]]  # a static integer exponent: x ** 3 is integer_pow, as in JAX
      try:
        step = Step(op.name, tuple(args), op.params(rng, tuple(_arg_aval(program, a) for a in args)))
      except Invalid:
        continue
      # most steps JAX rejects are retried, so that programs mostly run to their end
      if _try_step(program, step) and (step.error is None or rng.random() < 0.3): break
    else:
      break
    program.steps.append(step)
    if step.error is not None: break
  return program


def _concrete_integer_exponent(program: Program, arg: Any) -> bool:
  """A 0-d integer or bool array exponent: JAX's jnp.power takes its eager integer_pow path for it (x1's dtype) but
  promotes under jit, so its answer depends on the mode; not generated."""
  if not isinstance(arg, int): return False
  aval = _avals(program)[arg]
  return aval.shape == () and kind(aval.dtype) in "biu"


def _arg_aval(program: Program, arg: Any) -> Aval:
  return _avals(program)[arg] if isinstance(arg, int) else scalar_operand(arg[1]).aval


# ---------------------------------------------------------------------------------------------- running

def _tinyjax_inputs(tnp: Any, program: Program) -> list[Any]:
  return [tnp.asarray(op.scalar) if op.scalar is not None else tnp.asarray(op.host) for op in program.inputs]


def _run_steps(tnp: Any, program: Program, inputs: list[Any], last_only: bool = False) -> Any:
  values = list(inputs)
  for step in program.steps:
    args = [values[a] if isinstance(a, int) else a[1] for a in step.args]
    values.append(OPS[step.op].call(tnp, *args, **step.params))
  return values[-1] if last_only else tuple(values[len(inputs):])


@dataclass
class Failure:
  kind: str        # "dtype", "weak_type", "shape", "value", "exception kind", "crash", "not built", "fused"
  mode: str        # "eager", "jit", "vmap"
  step: int
  detail: str
  program: Program

  def summary(self) -> str: return f"{self.kind} ({self.mode}, step {self.step}): {self.detail}"


class _Checker:
  """Checks one program; `failures` collects what is wrong (the first failure per mode)."""

  def __init__(self, tj: Any, tnp: Any, program: Program):
    self.tj, self.tnp, self.program = tj, tnp, program
    self.failures: list[Failure] = []

  def fail(self, kind: str, mode: str, step: int, detail: str) -> None:
    self.failures.append(Failure(kind, mode, step, detail, self.program))

  def run(self) -> list[Failure]:
    program, tj, tnp = self.program, self.tj, self.tnp
    inputs = _tinyjax_inputs(tnp, program)
    expected_error = program.steps[-1].error
    runs = {"eager": lambda: _run_steps(tnp, program, inputs),
            "jit": lambda: tj.jit(lambda *xs: _run_steps(tnp, program, list(xs)))(*inputs)}
    stepwise = {}
    for mode, run in runs.items():
      outputs = self._call(mode, run, expected_error)
      if outputs is None: continue
      stepwise[mode] = outputs
      self._check_steps(mode, [_host(x) for x in inputs], outputs)
    if expected_error is None:
      self._check_vmap(inputs)
      for mode, outputs in stepwise.items():
        self._check_fused(mode, inputs, outputs[-1])
    return self.failures

  def _call(self, mode: str, run: Any, expected_error: type | None) -> Any:
    try:
      outputs = run()
      if expected_error is None: return [_host(x) for x in outputs]
      self.fail("exception kind", mode, len(self.program.steps) - 1, f"no error, JAX raises {expected_error.__name__}")
    except (NotImplementedError, AttributeError) as error:  # a name or a case tinyjax has not built yet
      self.fail("not built", mode, -1, f"{type(error).__name__}: {str(error)[:200]}")
    except Exception as error:  # noqa: BLE001 - every kind is checked
      if expected_error is not None and isinstance(error, expected_error): return None
      kind = "exception kind" if expected_error is not None or isinstance(error, (TypeError, ValueError)) else "crash"
      self.fail(kind, mode, -1, f"{type(error).__name__}: {str(error)[:200]}"
                f"{f' (JAX: {expected_error.__name__})' if expected_error else ''}")
    return None

  def _check_steps(self, mode: str, inputs: list[Any], outputs: list[Any]) -> bool:
    """Each step against the reference from the values tinyjax gave its operands. `inputs`/`outputs` are
    (host array, dtype name, weak) triples."""
    values = list(inputs) + list(outputs)
    for k, step in enumerate(self.program.steps):
      index = len(inputs) + k
      host, dtype, weak = values[index]
      want = step.aval
      if dtype != want.dtype: return self.fail("dtype", mode, k, f"{dtype}, JAX: {want.dtype}") or False
      if weak != want.weak and dtype != BOOL:
        return self.fail("weak_type", mode, k, f"weak_type={weak}, JAX: {want.weak}") or False
      if host.shape != want.shape: return self.fail("shape", mode, k, f"{host.shape}, JAX: {want.shape}") or False
      operands = [self._operand(values, a) for a in step.args]
      try:
        expected = OPS[step.op].reference(want, *operands, **step.params)
      except Invalid:
        return False
      problem = compare(OPS[step.op], want, host, expected, operands, step.params)
      if problem: return self.fail("value", mode, k, problem) or False
    return True

  def _operand(self, values: list[Any], arg: Any) -> Operand:
    if not isinstance(arg, int): return scalar_operand(arg[1])
    host, dtype, weak = values[arg]
    scalar = self.program.inputs[arg].scalar if arg < len(self.program.inputs) else None
    return Operand(Aval(host.shape, dtype, weak), host, scalar)

  def _check_vmap(self, inputs: list[Any]) -> None:
    """vmap over two samples of every strongly typed input (weak scalars stay unbatched); each slice is checked
    stepwise like an eager run of that sample."""
    rng = np.random.default_rng(len(self.program.steps) + 7)
    batched = [op.scalar is None for op in self.program.inputs]
    if not any(batched): return
    seconds = [self.tnp.asarray(_random_like(rng, op)) if b else x
               for op, b, x in zip(self.program.inputs, batched, inputs)]
    stacked = [self.tnp.stack([x, y]) if b else x for x, y, b in zip(inputs, seconds, batched)]
    in_axes = tuple(0 if b else None for b in batched)
    try:
      outputs = self.tj.vmap(lambda *xs: _run_steps(self.tnp, self.program, list(xs)), in_axes=in_axes)(*stacked)
      outputs = [_host(x) for x in outputs]
    except NotImplementedError as error:
      return self.fail("not built", "vmap", -1, str(error)[:200])
    except Exception as error:  # noqa: BLE001
      return self.fail("crash", "vmap", -1, f"{type(error).__name__}: {str(error)[:200]}")
    for sample, sample_inputs in enumerate((inputs, seconds)):
      sliced = [(host[sample], dtype, weak) for host, dtype, weak in outputs]
      if not self._check_steps("vmap", [_host(x) for x in sample_inputs], sliced): return

  def _check_fused(self, mode: str, inputs: list[Any], stepwise_last: Any) -> None:
    """The last value alone (its steps fused however lowering decides) against the stepwise run's last value."""
    tj, tnp, program = self.tj, self.tnp, self.program
    run = (lambda: _run_steps(tnp, program, inputs, last_only=True)) if mode == "eager" else \
      (lambda: tj.jit(lambda *xs: _run_steps(tnp, program, list(xs), last_only=True))(*inputs))
    try:
      host, dtype, weak = _host(run())
    except Exception as error:  # noqa: BLE001
      return self.fail("crash", f"{mode} fused", -1, f"{type(error).__name__}: {str(error)[:200]}")
    want_host, want_dtype, want_weak = stepwise_last
    if (dtype, weak, host.shape) != (want_dtype, want_weak, want_host.shape):
      return self.fail("fused", mode, len(program.steps) - 1, f"{dtype} {weak} {host.shape} alone, "
                       f"{want_dtype} {want_weak} {want_host.shape} with every step returned")
    if OPS[program.steps[-1].op].reads_nan_sign: return  # the sign of a NaN is not specified: fusion may change it
    tolerance = {"float16": 2e-2, "bfloat16": 1e-1, "float32": 1e-4}.get(dtype, 0)
    got, want = exact(host, dtype).astype(float), exact(want_host, dtype).astype(float)
    with np.errstate(invalid="ignore"):
      close = (got == want) | (np.isnan(got) & np.isnan(want)) | \
        (np.abs(got - want) <= tolerance * np.maximum(1.0, np.abs(want)))
    if not np.all(close):
      bad = np.argwhere(~close)[0]
      self.fail("fused", mode, len(program.steps) - 1, f"at {tuple(int(i) for i in bad)}: {got[tuple(bad)]} alone, "
                f"{want[tuple(bad)]} with every step returned")


def _host(array: Any) -> tuple[np.ndarray, str, bool]:
  dtype = np.dtype(array.dtype)
  name = "bfloat16" if dtype == np_dtype("bfloat16") else dtype.name
  return np.asarray(array), name, bool(array.weak_type)


def _random_like(rng: np.random.Generator, operand: Operand) -> np.ndarray:
  return random_values(rng, operand.aval.dtype, operand.aval.shape)


def _ulp_scale(dtype: str) -> tuple[float, float]:
  info = np.finfo(np_dtype(dtype)) if dtype != "bfloat16" else None
  if dtype == "bfloat16": return 2.0 ** -7, 2.0 ** -126
  return float(info.eps), float(info.tiny)


def compare(op: Any, want: Aval, got: np.ndarray, expected: np.ndarray, operands: list[Operand],
            params: dict) -> str | None:
  """None if `got` matches `expected` (exactly for ints and bools; floats within the op's tolerance in ulps of the
  result dtype, NaN where NaN, infinities equal, -0.0 == 0.0), else a description of the first mismatch."""
  got_values, want_values = exact(got, want.dtype), exact(expected, want.dtype)
  if kind(want.dtype) != "f":
    mismatch = got_values != want_values
  else:
    eps, tiny = _ulp_scale(want.dtype)
    ulps = max(op.tolerance, 1)
    scale = np.abs(want_values) if op.scale is None else np.broadcast_to(op.scale(want, *operands, **params),
                                                                          want_values.shape)
    with np.errstate(invalid="ignore", over="ignore"):
      same = (got_values == want_values) | (np.isnan(got_values) & np.isnan(want_values))
      close = np.abs(got_values - want_values) <= ulps * (eps * scale + tiny)
    mismatch = ~(same | (close & np.isfinite(want_values)))
  mismatch = np.asarray(mismatch, dtype=bool)
  if not mismatch.any(): return None
  where = tuple(int(i) for i in np.argwhere(mismatch)[0])
  inputs = ", ".join(f"{np.asarray(exact(o.host, o.aval.dtype)).reshape(-1)[:4].tolist()}" for o in operands)
  return f"at {where}: {got_values[where]!r}, reference {want_values[where]!r} (operands {inputs}...)"


# ---------------------------------------------------------------------------------------------- search

def minimize(program: Program, failure: Failure, check: Any) -> Program:
  """The smallest program (steps the failing one needs, inputs they read) that still fails the same way."""
  def still_fails(candidate: Program) -> bool:
    try:
      return any(f.kind == failure.kind for f in check(candidate))
    except Exception:  # noqa: BLE001
      return False

  best = program
  last = failure.step if failure.step >= 0 else len(program.steps) - 1
  candidate = _prefix(best, last)
  if still_fails(candidate): best = candidate
  changed = True
  while changed:
    changed = False
    for k in range(len(best.steps) - 1):
      candidate = _without_step(best, k)
      if candidate is not None and still_fails(candidate): best, changed = candidate, True; break
  return best


def _prefix(program: Program, last: int) -> Program:
  """Steps up to `last` that it depends on, and only the inputs they read."""
  needed, stack = set(), [len(program.inputs) + last]
  while stack:
    index = stack.pop()
    if index in needed: continue
    needed.add(index)
    if index >= len(program.inputs): stack.extend(a for a in program.steps[index - len(program.inputs)].args
                                                  if isinstance(a, int))
  return _select(program, sorted(needed))


def _select(program: Program, keep: list[int]) -> Program:
  renumber = {old: new for new, old in enumerate(keep)}
  inputs = [program.inputs[i] for i in keep if i < len(program.inputs)]
  steps = []
  for index in keep:
    if index < len(program.inputs): continue
    step = program.steps[index - len(program.inputs)]
    steps.append(Step(step.op, tuple(renumber[a] if isinstance(a, int) else a for a in step.args), step.params,
                      step.aval, step.error))
  return Program(inputs, steps)


def _without_step(program: Program, k: int) -> Program | None:
  """The program with step k replaced by its first operand where that has the same aval (a no-op removal)."""
  step = program.steps[k]
  first = step.args[0]
  if not isinstance(first, int) or _avals(program)[first] != step.aval: return None
  index = len(program.inputs) + k
  steps = []
  for later in program.steps[k + 1:]:
    steps.append(Step(later.op, tuple((first if a == index else (a - 1 if isinstance(a, int) and a > index else a))
                                      for a in later.args), later.params, later.aval, later.error))
  return Program(program.inputs, program.steps[:k] + steps)


def check_program(program: Program) -> list[Failure]:
  import tinyjax as tj
  import tinyjax.numpy as tnp
  return _Checker(tj, tnp, program).run()


@dataclass
class Report:
  checked: int = 0
  seconds: float = 0.0
  failures: list[Failure] = field(default_factory=list)

  @property
  def per_minute(self) -> float: return 60 * self.checked / max(self.seconds, 1e-9)


def search(seed: int, count: int | None = None, seconds: float | None = None, shrink: bool = True) -> Report:
  """Check random programs from `seed` until `count` programs or `seconds` have passed; failures minimised."""
  rng = np.random.default_rng(seed)
  report, start = Report(), time.perf_counter()
  while (count is None or report.checked < count) and (seconds is None or time.perf_counter() - start < seconds):
    program = random_program(rng)
    if not program.steps: continue
    failures = check_program(program)
    report.checked += 1
    for failure in failures[:1]:
      if shrink and failure.kind != "not built":
        failure.program = minimize(program, failure, check_program)
      report.failures.append(failure)
  report.seconds = time.perf_counter() - start
  return report
