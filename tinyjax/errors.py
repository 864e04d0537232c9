"""The errors tinyjax raises where JAX raises its own, under JAX's names (`jax.errors`): catch them as
`tinyjax.errors.ConcretizationTypeError`, ... A `TracerBoolConversionError`, `TracerIntegerConversionError` or
`TracerArrayConversionError` is also a `ConcretizationTypeError` (and a TypeError), as in JAX."""
from tinyjax.trace.core import (ConcretizationTypeError, TracerArrayConversionError, TracerBoolConversionError,
                                TracerIntegerConversionError, UnexpectedTracerError)
from tinyjax.trace.sharding_types import ShardingTypeError

__all__ = ["ConcretizationTypeError", "ShardingTypeError", "TracerArrayConversionError", "TracerBoolConversionError",
           "TracerIntegerConversionError", "UnexpectedTracerError"]
