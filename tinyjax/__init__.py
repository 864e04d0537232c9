"""tinyjax: JAX's front (pure functions, composable transformations, pytrees) on tinygrad's back (one small IR,
laziness, kernel fusion, LLVM)."""
__version__ = "0.1.0"

from tinyjax.config import config, debug_nans  # noqa: E402
from tinyjax.helpers import lazy_attributes as _lazy_attributes  # noqa: E402
from tinyjax.array import Array  # noqa: E402
from tinyjax import lax, numpy, tree, tree_util  # noqa: E402  (numpy also attaches Array's operators and methods)
from tinyjax.trace.core import ConcretizationTypeError, UnexpectedTracerError  # noqa: E402
from tinyjax.trace.jit import ShapeDtypeStruct, block_until_ready, eval_shape, jit, make_jaxpr  # noqa: E402
from tinyjax.trace.ad import grad, jvp, linear_transpose, linearize, value_and_grad, vjp  # noqa: E402
from tinyjax.trace.custom import checkpoint, custom_jvp, custom_vjp, remat  # noqa: E402
from tinyjax.trace.batching import vmap  # noqa: E402
from tinyjax.trace.jacobian import hessian, jacfwd, jacobian, jacrev  # noqa: E402
from tinyjax import debug  # noqa: E402
# (after every import of tinyjax.devices: the name `devices` is the function from here on, as in JAX)
from tinyjax.placement import (default_backend, device_count, device_get, device_put, devices,  # noqa: E402
                               effects_barrier,
                               local_device_count, local_devices, make_array_from_callback,
                               make_array_from_process_local_data, make_array_from_single_device_arrays,
                               process_count, process_index, reshard)
from tinyjax import errors, sharding  # noqa: E402
from tinyjax.sharding import NamedSharding, PartitionSpec, make_mesh, set_mesh  # noqa: E402
from tinyjax.sharding import PartitionSpec as P  # noqa: E402
from tinyjax.trace.shard_map import shard_map  # noqa: E402
from tinyjax.trace.callback import pure_callback  # noqa: E402
from tinyjax.trace.core import ShapedArray, typeof  # noqa: E402

# Imported on first use, as is what lowers, compiles and runs programs (lower/, codegen/, devices/cpu.py): `import
# tinyjax` takes ~0.1 s less. (`tinyjax.random` and `tinyjax.nn` too, as `jax.random`, `jax.nn`: ~10 ms.)
__getattr__ = _lazy_attributes(__name__, {
  "nn": ("tinyjax.nn", None), "random": ("tinyjax.random", None),
  "scipy": ("tinyjax.scipy", None), "test_util": ("tinyjax.test_util", None),
  "distributed": ("tinyjax.distributed", None), "runtime_stats": ("tinyjax.lower.realize", "runtime_stats"),
  "profile": ("tinyjax.profiler", "profile"), "machine_limits": ("tinyjax.profiler", "machine_limits"),
  "compile_cache_stats": ("tinyjax.devices.cpu", "cache_stats")})


__all__ = [
  "Array", "block_until_ready", "checkpoint", "compile_cache_stats", "ConcretizationTypeError", "config", "custom_jvp",
  "debug_nans", "effects_barrier",
  "custom_vjp", "debug", "default_backend", "device_count", "device_get", "device_put", "devices", "distributed",
  "errors",
  "local_device_count", "local_devices", "eval_shape", "make_array_from_callback",
  "make_array_from_process_local_data", "make_array_from_single_device_arrays", "make_mesh", "NamedSharding", "P",
  "PartitionSpec", "process_count", "process_index", "pure_callback", "reshard", "set_mesh", "shard_map", "sharding",
  "machine_limits", "profile",
  "grad", "hessian", "jacfwd", "jacobian", "jacrev", "jit", "jvp",
  "lax", "linear_transpose", "linearize",
  "make_jaxpr", "nn", "numpy", "random", "remat", "runtime_stats", "scipy", "ShapedArray", "ShapeDtypeStruct",
  "test_util", "tree", "tree_util", "typeof", "UnexpectedTracerError", "value_and_grad", "vjp", "vmap",
]
