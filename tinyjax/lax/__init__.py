"""tinyjax.lax: JAX's lax on tinyjax primitives. No implicit type promotion: operands share a dtype (weak Python
scalars adopt the other operand's dtype) and, for elementwise ops, a shape."""
from tinyjax.helpers import lazy_attributes as _lazy_attributes
from tinyjax.lax._elementwise import (RoundingMethod, abs, acos, add, asin, asinh, atan, atan2, atanh, acosh,
                                      bitcast_convert_type, bitwise_and, bitwise_not, bitwise_or, bitwise_xor, cbrt,
                                      ceil, convert_element_type, cos, cosh, div, eq, exp, exp2, expm1, floor, ge, gt,
                                      integer_pow, is_finite, le, log, log1p, logistic, lt, max, min, mul, ne, neg,
                                      nextafter,
                                      pow, reciprocal, rem, round, rsqrt, shift_left, shift_right_arithmetic,
                                      shift_right_logical, sign, sin, sinh, sqrt, square, sub, tan, tanh)
from tinyjax.lax._reductions import (Precision, argmax, argmin, dot, dot_general, reduce_and, reduce_max, reduce_min,
                                     reduce_or, reduce_prod, reduce_sum)
from tinyjax.lax._conv import (ConvDimensionNumbers, conv, conv_dimension_numbers, conv_general_dilated, conv_transpose,
                              conv_with_general_padding, padtype_to_pads, reduce_window)
from tinyjax.lax._gather import (GatherDimensionNumbers, GatherScatterMode, ScatterDimensionNumbers, gather, scatter,
                                 scatter_add, scatter_apply, scatter_max, scatter_min, scatter_mul, scatter_sub)
from tinyjax.lax._extras import (associative_scan, broadcasted_iota, clz, cumlogsumexp, optimization_barrier,
                                 population_count, reduce, reduce_precision)
from tinyjax.lax._control_flow import cond, fori_loop, map, scan, switch, while_loop
from tinyjax.lax._special import erf, erf_inv, erf_inv_p, erf_p, erfc, erfc_p
from tinyjax.lax._elementwise import complex, conj, imag, real  # noqa: A004 (lax's names)
from tinyjax.lax._cumulative import cummax, cummin, cumprod, cumsum
from tinyjax.lax._sort import sort, sort_key_val, top_k
from tinyjax.lax._slicing import (dynamic_index_in_dim, dynamic_slice, dynamic_slice_in_dim,
                                  dynamic_update_index_in_dim, dynamic_update_slice, dynamic_update_slice_in_dim)
from tinyjax.lax._shape import (broadcast_in_dim, clamp, concatenate, expand_dims, full, full_like, iota, pad,
                                reshape, rev, select, select_n, slice, slice_in_dim, squeeze, stop_gradient, transpose)
# the primitives (as jax.lax exposes them): Primitive objects with JAX's names and JVP rules
from tinyjax.lax._elementwise import (abs_p, acos_p, acosh_p, asin_p, asinh_p, atan2_p, atan_p, atanh_p, cbrt_p,
                                      ceil_p, cos_p, cosh_p, exp2_p, exp_p, expm1_p, floor_p, integer_pow_p,
                                      is_finite_p, log1p_p, log_p, logistic_p, max_p, min_p, pow_p, rem_p, round_p,
                                      rsqrt_p, sign_p, sin_p, sinh_p, sqrt_p, square_p, tan_p, tanh_p)
from tinyjax.lax._reductions import (argmax_p, argmin_p, dot_general_p, reduce_max_p, reduce_min_p, reduce_prod_p,
                                     reduce_sum_p)
from tinyjax.lax._shape import clamp_p, select_n_p
from tinyjax.trace.ad import stop_gradient_p
# collectives over named axes (vmap's axis_name, shard_map's mesh axes)
from tinyjax.placement import with_sharding_constraint
from tinyjax.trace.batching import (all_gather, all_to_all, axis_index, axis_size, pcast, pmax, pmean, pmin, ppermute,
                                    psum, psum_scatter, pvary)

__all__ = [
  "complex", "conj", "imag", "real",
  "abs", "abs_p", "acos", "acos_p", "acosh", "acosh_p", "add", "all_gather", "all_to_all", "argmax", "argmax_p",
  "argmin", "argmin_p", "asin",
  "asin_p", "asinh", "asinh_p", "associative_scan", "atan", "atan2", "atan2_p", "atan_p", "atanh", "atanh_p",
  "axis_index", "axis_size", "bitcast_convert_type", "bitwise_and", "bitwise_not", "bitwise_or", "bitwise_xor",
  "broadcast_in_dim",
  "broadcasted_iota", "cbrt", "cbrt_p", "ceil", "ceil_p", "clamp", "clamp_p", "clz", "concatenate", "cond", "conv",
  "conv_dimension_numbers", "conv_general_dilated", "conv_transpose", "conv_with_general_padding",
  "ConvDimensionNumbers", "convert_element_type", "cos", "cos_p", "cosh", "cosh_p", "cumlogsumexp", "cummax", "cummin",
  "cumprod", "cumsum", "div", "dot", "dot_general", "dot_general_p", "dynamic_index_in_dim", "dynamic_slice",
  "dynamic_slice_in_dim", "dynamic_update_index_in_dim", "dynamic_update_slice", "dynamic_update_slice_in_dim", "eq",
  "erf", "erf_inv", "erf_inv_p", "erf_p", "erfc", "erfc_p", "exp", "exp2", "exp2_p", "exp_p", "expand_dims", "expm1",
  "expm1_p", "floor", "floor_p", "fori_loop", "full", "full_like", "gather", "GatherDimensionNumbers",
  "GatherScatterMode", "ge", "gt", "integer_pow", "integer_pow_p", "iota", "is_finite", "is_finite_p", "le", "log",
  "log1p", "log1p_p", "log_p", "logistic", "logistic_p", "lt", "map", "max", "max_p", "min", "min_p", "mul", "ne",
  "neg", "nextafter", "optimization_barrier", "pad", "padtype_to_pads", "pcast", "pmax", "pmean", "pmin",
  "population_count",
  "pow", "pow_p", "ppermute", "Precision", "psum", "psum_scatter", "pvary", "reciprocal", "reduce", "reduce_and",
  "reduce_max", "reduce_max_p", "reduce_min",
  "reduce_min_p", "reduce_or", "reduce_precision", "reduce_prod", "reduce_prod_p", "reduce_sum", "reduce_sum_p",
  "reduce_window", "rem", "rem_p", "reshape", "rev", "round", "round_p", "RoundingMethod", "rsqrt", "rsqrt_p", "scan",
  "scatter", "scatter_add", "scatter_apply", "scatter_max", "scatter_min", "scatter_mul", "scatter_sub",
  "ScatterDimensionNumbers", "select", "select_n", "select_n_p", "shift_left", "shift_right_arithmetic",
  "shift_right_logical", "sign", "sign_p", "sin", "sin_p", "sinh", "sinh_p", "slice", "slice_in_dim", "sort",
  "sort_key_val", "sqrt", "sqrt_p", "square", "square_p", "squeeze", "stop_gradient", "stop_gradient_p", "sub",
  "switch", "tan", "tan_p", "tanh", "tanh_p", "top_k", "transpose", "while_loop", "with_sharding_constraint",
]


# `linalg` (jax.lax.linalg: the LAPACK-backed primitives), imported on first use
__getattr__ = _lazy_attributes(__name__, {"linalg": ("tinyjax.lax.linalg", None)})
