"""Devices: compiled programs and running them (CPU via llvmlite), and the persistent compile cache."""
from tinyjax.devices.cache import DiskCache, cache_directory
from tinyjax.devices.cpu import (CompileStream, CPUProgram, LaunchList, cache_stats, compile_cpu, compile_cpu_many,
                                 compile_worker, cpu_data_layout, cpu_target_triple, cpu_threads, get_runtime,
                                 reset_cache_stats, stamp_target)

__all__ = ["CompileStream", "CPUProgram", "DiskCache", "LaunchList", "cache_directory", "cache_stats", "compile_cpu",
           "compile_cpu_many", "compile_worker", "cpu_data_layout", "cpu_target_triple", "cpu_threads", "get_runtime",
           "reset_cache_stats", "stamp_target"]
