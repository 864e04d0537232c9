"""Small shared helpers: the environment variables tinyjax reads, lazy imports (`LazyModule`, `lazy_attributes`), the
open profiles, and pausing the garbage collector while lowering.

The documented list (docs/debugging.md, README): DEBUG (0-4+, how much to print), NOOPT (1 turns optimisations off),
TINYJAX_CACHE_DIR (where compiled code is cached), TINYJAX_CPU_DEVICES (virtual CPU devices),
TINYJAX_CPU_THREADS (threads that run a CPU kernel; default: the usable cores), TINYJAX_COMPILE_WORKER (0: no
compile worker process, devices/llvm_compile.py).
"""
from __future__ import annotations

import contextlib
import functools
import gc
import importlib
import os
import sys
from typing import Any, Callable, Iterator


@functools.cache
def getenv(key: str, default=0):
  """Return environment variable `key` converted to the type of `default` (int by default), read once per process.

  An unset or empty variable gives `default`; booleans accept 0/1/true/false.
  """
  value = os.environ.get(key, "")
  if value == "": return default
  if isinstance(default, bool): return value.strip().lower() not in ("0", "false", "no", "off")
  if isinstance(default, int): return int(value)
  return type(default)(value)


DEBUG: int = getenv("DEBUG", 0)
NOOPT: int = getenv("NOOPT", 0)


class LazyModule:
  """A module imported on first use of one of its attributes, for what `import tinyjax` need not load: llvmlite (~35
  ms), and the lowering and code generation stack (lower/, codegen/, devices/cpu.py: ~50 ms with what they import),
  which no program needs before its first run. The import makes the module's namespace this object's, so later lookups
  cost what a module attribute's does and see what is assigned to the module afterwards (a test's monkeypatch)."""

  def __init__(self, name: str):
    self._name = name

  def __getattr__(self, attribute: str):
    module = importlib.import_module(self.__dict__.get("__name__") or self.__dict__["_name"])
    self.__dict__ = module.__dict__
    return getattr(module, attribute)

  def __repr__(self) -> str:
    return f"<lazy module {self.__dict__.get('__name__', self.__dict__.get('_name'))!r}>"


def lazy_attributes(package: str, names: dict[str, tuple[str, str | None]]) -> Callable[[str], Any]:
  """A package's module `__getattr__` (PEP 562) that imports `names` when first asked for: name -> (module, its
  attribute, or None for the module itself), kept in the package's namespace from then on."""
  def __getattr__(name: str) -> Any:
    if name not in names: raise AttributeError(f"module {package!r} has no attribute {name!r}")
    module_name, attribute = names[name]
    module = importlib.import_module(module_name)
    value = module if attribute is None else getattr(module, attribute)
    setattr(sys.modules[package], name, value)
    return value
  return __getattr__


# The programs' profiles being recorded (`tinyjax.profile`, profiler.py): here, so that checking whether there are any
# (what every launch and compiled call does) imports nothing.
open_profiles: list = []


@contextlib.contextmanager
def gc_paused() -> Iterator[None]:
  """Python's cyclic garbage collector off while tracing, lowering and compiling a program (on again after, if it
  was on): the nodes a lowering makes by the thousand trigger full collections, each walking every object the
  process holds, though they are not garbage yet. ResNet-50's first training step ran 10 of them, 0.45 s of its
  8.9; the MLP step's cold first call ran one or none, 14 ms, depending on where the counters stood. Nested use is
  a no-op; what became garbage meanwhile is collected later as usual."""
  if not gc.isenabled():
    yield
    return
  gc.disable()
  try: yield
  finally: gc.enable()


_PACKAGE_DIR = os.path.dirname(os.path.abspath(__file__)) + os.sep


def user_stacklevel() -> int:
  """The `stacklevel` for `warnings.warn` that names the first caller outside tinyjax (the user's line, as JAX's
  warnings do), however deep inside the package the warning is raised (through code it generates too: a dataclass's
  `__init__` is "<string>")."""
  frame, level = sys._getframe(1), 1
  while frame is not None and (frame.f_code.co_filename.startswith(_PACKAGE_DIR) or
                               frame.f_code.co_filename == "<string>"):
    frame, level = frame.f_back, level + 1
  return level
