"""Running a jitted function with a chosen first tier (devices/cpu.py `CompileStream.tier`), for the tests that
compare a kernel's first tier with its own build (test_gemm_library, test_first_tiers)."""
from typing import Any, Callable

import numpy as np

import tinyjax as tj
from tinyjax.devices import cpu
from tinyjax.lower import realize


def run_in_tier(monkeypatch, tier: Callable, fun: Callable, *args: Any,
                check: Callable[[Any], None] = lambda f: None) -> list[np.ndarray]:
  """`jit(fun)(*args)` lowered with `tier` as `CompileStream.tier` and no background upgrade, its results flattened;
  `check(f)` is called on the jitted function first (it may lower it)."""
  with monkeypatch.context() as patch:
    patch.setattr(cpu.CompileStream, "tier", tier)
    patch.setattr(cpu, "_upgrade_later", lambda jobs, opt_level: None)
    realize._memory_cache.clear()  # (programs lowered before keep the kernels they were compiled with)
    f = tj.jit(lambda *args: fun(*args))  # (a new function each time: jit keeps one program per function)
    check(f)
    results = [np.asarray(leaf) for leaf in tj.tree_util.tree_leaves(f(*args))]
  realize._memory_cache.clear()
  return results
