"""Devices: compiled programs and running them (CPU via llvmlite), and the persistent compile cache.

The CPU device (cpu.py) and the cache (cache.py) are imported when one of their names is first asked for here (as
`from tinyjax.devices import compile_cpu` does): `import tinyjax` loads only device.py and buffer.py, which arrays
need, and what compiles and runs programs is loaded by the first program."""
from tinyjax.helpers import lazy_attributes

_CPU_NAMES = ("CompileStream", "CPUProgram", "LaunchList", "cache_stats", "compile_cpu", "compile_cpu_many",
              "compile_worker", "cpu_data_layout", "cpu_target_triple", "cpu_threads", "get_runtime",
              "reset_cache_stats", "stamp_target")
_CACHE_NAMES = ("DiskCache", "cache_directory")

__all__ = sorted(_CPU_NAMES + _CACHE_NAMES)
__getattr__ = lazy_attributes(__name__, {**{name: ("tinyjax.devices.cpu", name) for name in _CPU_NAMES},
                                         **{name: ("tinyjax.devices.cache", name) for name in _CACHE_NAMES}})
