"""Small shared helpers: the environment variables tinyjax reads.

The documented list (see STYLE.md): DEBUG (0-4+, how much to print), NOOPT (1 turns optimisations off),
TINYJAX_CACHE_DIR (where compiled code is cached), TINYJAX_CPU_DEVICES (virtual CPU devices),
TINYJAX_CPU_THREADS (threads that run a CPU kernel; default: the usable cores), TINYJAX_COMPILE_WORKER (0: no
compile worker process, devices/llvm_compile.py).
"""
from __future__ import annotations

import functools
import os


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
