"""tinyjax.lax: JAX's lax on tinyjax primitives. No implicit type promotion: operands share a dtype (weak Python
scalars adopt the other operand's dtype) and, for elementwise ops, a shape."""
from tinyjax.lax._elementwise import (RoundingMethod, abs, acos, add, asin, asinh, atan, atan2, atanh, acosh,
                                      bitcast_convert_type, bitwise_and, bitwise_not, bitwise_or, bitwise_xor, cbrt,
                                      ceil, convert_element_type, cos, cosh, div, eq, exp, exp2, expm1, floor, ge, gt,
                                      integer_pow, is_finite, le, log, log1p, logistic, lt, max, min, mul, ne, neg,
                                      pow, reciprocal, rem, round, rsqrt, shift_left, shift_right_arithmetic,
                                      shift_right_logical, sign, sin, sinh, sqrt, square, sub, tan, tanh)
from tinyjax.lax._reductions import (argmax, argmin, dot, dot_general, reduce_and, reduce_max, reduce_min, reduce_or,
                                     reduce_prod, reduce_sum)
from tinyjax.lax._shape import (broadcast_in_dim, clamp, concatenate, expand_dims, full, full_like, iota, pad,
                                reshape, rev, select_n, slice, squeeze, stop_gradient, transpose)

__all__ = [
  "RoundingMethod", "abs", "acos", "acosh", "add", "argmax", "argmin", "asin", "asinh", "atan", "atan2", "atanh",
  "bitcast_convert_type", "bitwise_and", "bitwise_not", "bitwise_or", "bitwise_xor", "broadcast_in_dim", "cbrt",
  "ceil", "clamp", "concatenate", "convert_element_type", "cos", "cosh", "div", "dot", "dot_general", "eq", "exp",
  "exp2", "expand_dims", "expm1", "floor", "full", "full_like", "ge", "gt", "integer_pow", "iota", "is_finite", "le",
  "log", "log1p", "logistic", "lt", "max", "min", "mul", "ne", "neg", "pad", "pow", "reciprocal", "reduce_and",
  "reduce_max", "reduce_min", "reduce_or", "reduce_prod", "reduce_sum", "rem", "reshape", "rev", "round", "rsqrt",
  "select_n", "shift_left", "shift_right_arithmetic", "shift_right_logical", "sign", "sin", "sinh", "slice", "sqrt",
  "square", "squeeze", "stop_gradient", "sub", "tan", "tanh", "transpose",
]
