"""tinyjax.numpy: jax.numpy's functions on tinyjax primitives, with JAX's type promotion (weak Python scalars,
the JAX lattice, 32-bit defaults unless x64). Importing it also gives `tinyjax.Array` its operators and methods."""
import numpy as _np

from tinyjax.array import Array
from tinyjax.dtypes import finfo, iinfo, issubdtype, promote_types, result_type
from tinyjax.helpers import lazy_attributes as _lazy_attributes
from tinyjax.numpy import _array_methods
from tinyjax.numpy._array_api import (__array_api_version__, __array_namespace_info__, acos, acosh, asin, asinh, atan,
                                      atan2, atanh, bitwise_invert, bitwise_left_shift, bitwise_right_shift, can_cast,
                                      concat, from_dlpack, isdtype, permute_dims, pow, unique_all, unique_counts,
                                      unique_inverse, unique_values, unstack, vecdot)
from tinyjax.numpy._covariance import corrcoef, cov
from tinyjax.numpy._creation import (arange, array, asarray, empty, empty_like, eye, full, full_like, geomspace,
                                     identity, linspace, logspace, ones, ones_like, SCALAR_TYPES as _SCALAR_TYPES, tri,
                                     tril, triu, zeros, zeros_like)
from tinyjax.numpy._differences import gradient, unwrap
from tinyjax.numpy._elementwise import (abs, absolute, add, arccos, arccosh, arcsin, arcsinh, arctan, arctan2, arctanh,
                                        around, astype, bitwise_and, bitwise_not, bitwise_or, bitwise_xor, cbrt, ceil,
                                        clip, copysign, cos, cosh, deg2rad, degrees, divide, equal, exp, exp2, expm1,
                                        fabs, floor, floor_divide, fmax, fmin, fmod, greater, greater_equal, heaviside,
                                        hypot, invert, isfinite, isinf, isnan, left_shift, less, less_equal, log,
                                        log10, log1p, log2, logaddexp, logaddexp2, logical_and, logical_not,
                                        logical_or, logical_xor, maximum, minimum, mod, multiply, negative, nextafter,
                                        not_equal,
                                        positive, power, rad2deg, radians, reciprocal, remainder, right_shift, rint,
                                        round, sign, signbit, sin, sinh, sqrt, square, subtract, tan, tanh,
                                        true_divide, trunc, where)
from tinyjax.numpy._elementwise import (angle, conj, conjugate, imag, iscomplex, iscomplexobj, isreal, isrealobj,
                                        real)
from tinyjax.numpy._functional import apply_along_axis, apply_over_axes, fromfunction, vectorize
from tinyjax.numpy._histograms import histogram2d, histogram_bin_edges, histogramdd
from tinyjax.numpy._index_tricks import c_, index_exp, ix_, mask_indices, mgrid, ogrid, r_, s_
from tinyjax.numpy._indexing import take, take_along_axis
from tinyjax.numpy._io import (array_repr, array_str, frombuffer, fromiter, fromstring, get_printoptions, load,
                               printoptions, save, savez, set_printoptions)
from tinyjax.numpy._manipulation import (array_equiv, block, choose, compress, diagflat, ediff1d, extract, iterable,
                                         packbits, place, put, put_along_axis, resize, rollaxis, trim_zeros,
                                         unpackbits, vander)
from tinyjax.numpy._einsum import convolve, correlate, einsum
from tinyjax.numpy._more import (allclose, append, argpartition, array_equal, array_split, cross, delete, diag,
                                 diag_indices, diag_indices_from, diagonal, digitize, fill_diagonal, frexp, gcd, hsplit,
                                 indices, insert, interp, intersect1d, isclose, isin, kron, lcm, ldexp, meshgrid, modf,
                                 nancumprod, nancumsum, partition, piecewise, polyval, ravel_multi_index, rot90, select,
                                 setdiff1d, setxor1d, split, trace, trapezoid, tril_indices, tril_indices_from,
                                 triu_indices, triu_indices_from, union1d, unravel_index, vsplit)
from tinyjax.numpy._polynomial import (poly, polyadd, polyder, polydiv, polyfit, polyint, polymul, polysub,
                                       roots)
from tinyjax.numpy._ufunc_compositions import (bitwise_count, copy, divmod, float_power, i0, isneginf, isposinf,
                                               nan_to_num, sinc, spacing)
from tinyjax.numpy._statistics import (average, median, nanmedian, nanpercentile, nanquantile, percentile, ptp,
                                       quantile)
from tinyjax.numpy._reductions import (count_nonzero, nanargmax, nanargmin, nanmax, nanmean, nanmin, nanprod, nanstd,
                                       nansum, nanvar)
from tinyjax.numpy._window import bartlett, blackman, hamming, hanning, kaiser
from tinyjax.numpy._sorting import (argsort, cummax, cummin, cumprod, cumsum, cumulative_prod, cumulative_sum, lexsort,
                                    sort, sort_complex)
from tinyjax.numpy._searching import (argwhere, bincount, flatnonzero, histogram, nonzero, searchsorted,
                                      unique)
from tinyjax.numpy._linalg import dot, inner, matmul, matvec, outer, tensordot, vdot, vecmat
from tinyjax.numpy._reductions import all, amax, amin, any, argmax, argmin, max, mean, min, prod, std, sum, var
from tinyjax.numpy._shape import (atleast_1d, atleast_2d, atleast_3d, broadcast_arrays, broadcast_shapes, broadcast_to,
                                  column_stack, concatenate, diff, dstack, expand_dims, flip, fliplr, flipud, hstack,
                                  isscalar, matrix_transpose, moveaxis, ndim, pad, ravel, repeat, reshape, roll, shape,
                                  size, squeeze, stack, swapaxes, tile, transpose, vstack)

ndarray = Array
dtype = _np.dtype
pi, e, inf, nan, euler_gamma = _np.pi, _np.e, _np.inf, _np.nan, _np.euler_gamma
newaxis = None

bool_ = _SCALAR_TYPES["bool_"]
bool = bool_  # noqa: A001 (the array API's name, as jax.numpy.bool)
int8, int16, int32, int64 = (_SCALAR_TYPES[name] for name in ("int8", "int16", "int32", "int64"))
uint8, uint16, uint32, uint64 = (_SCALAR_TYPES[name] for name in ("uint8", "uint16", "uint32", "uint64"))
float16, bfloat16, float32, float64 = (_SCALAR_TYPES[name] for name in ("float16", "bfloat16", "float32", "float64"))
float8_e3m4, float8_e4m3, float8_e4m3b11fnuz = (_SCALAR_TYPES[name] for name in (
  "float8_e3m4", "float8_e4m3", "float8_e4m3b11fnuz"))
float8_e4m3fn, float8_e4m3fnuz, float8_e5m2, float8_e5m2fnuz = (_SCALAR_TYPES[name] for name in (
  "float8_e4m3fn", "float8_e4m3fnuz", "float8_e5m2", "float8_e5m2fnuz"))
complex64, complex128 = _SCALAR_TYPES["complex64"], _SCALAR_TYPES["complex128"]
complex_ = complex128  # (numpy's name for the double-precision complex type, as jax.numpy.complex_)
# numpy's C-style names, as JAX's (64-bit types: 32-bit values unless x64)
float_ = double = float64
single = float32
int_ = int64
uint = uint64
csingle, cdouble = complex64, complex128
# numpy's abstract scalar types, for issubdtype (bfloat16 and float8 count as floating)
generic, number, inexact, floating, complexfloating = _np.generic, _np.number, _np.inexact, _np.floating, \
  _np.complexfloating
integer, signedinteger, unsignedinteger = _np.integer, _np.signedinteger, _np.unsignedinteger
character, flexible, object_ = _np.character, _np.flexible, _np.object_
ComplexWarning = _np.exceptions.ComplexWarning

_array_methods.attach()


# `fft` and `linalg`, imported on first use: with lax's FFT kernels and LAPACK bindings they take ~10 ms
__getattr__ = _lazy_attributes(__name__, {"fft": ("tinyjax.numpy.fft", None), "linalg": ("tinyjax.numpy.linalg", None)})

__all__ = [
  "angle", "fft", "complex128", "complex64", "complex_", "complexfloating", "conj", "conjugate", "imag", "iscomplex",
  "iscomplexobj", "isreal", "isrealobj", "real",
  "__array_api_version__", "__array_namespace_info__", "acos", "acosh", "asin", "asinh", "atan", "atan2", "atanh",
  "bitwise_invert", "bitwise_left_shift", "bitwise_right_shift", "bool", "can_cast", "concat", "from_dlpack", "isdtype",
  "permute_dims", "pow", "unique_all", "unique_counts", "unique_inverse", "unique_values", "unstack", "vecdot",
  "abs", "absolute", "add", "all", "allclose", "amax", "amin", "any", "append", "apply_along_axis", "apply_over_axes",
  "arange", "arccos", "arccosh", "arcsin", "arcsinh", "arctan", "arctan2", "arctanh", "argmax", "argmin",
  "argpartition", "argsort", "argwhere", "around", "array", "Array", "array_equal", "array_equiv", "array_repr",
  "array_split", "array_str", "asarray", "astype", "atleast_1d", "atleast_2d", "atleast_3d", "average", "bartlett",
  "bfloat16", "bincount", "bitwise_and", "bitwise_count", "bitwise_not", "bitwise_or", "bitwise_xor", "blackman",
  "block", "bool_", "broadcast_arrays", "broadcast_shapes", "broadcast_to", "c_", "cbrt", "cdouble", "ceil",
  "character", "choose", "clip", "column_stack", "ComplexWarning", "compress", "concatenate", "convolve", "copy",
  "copysign", "corrcoef", "correlate", "cos", "cosh", "count_nonzero", "cov", "cross", "csingle", "cummax", "cummin",
  "cumprod", "cumsum", "cumulative_prod", "cumulative_sum", "deg2rad", "degrees", "delete", "diag", "diag_indices",
  "diag_indices_from", "diagflat", "diagonal", "diff", "digitize", "divide", "divmod", "dot", "double", "dstack",
  "dtype", "e", "ediff1d", "einsum", "empty", "empty_like", "equal", "euler_gamma", "exp", "exp2", "expand_dims",
  "expm1", "extract", "eye", "fabs", "fill_diagonal", "finfo", "flatnonzero", "flexible", "flip", "fliplr", "flipud",
  "float16", "float32", "float64", "float8_e3m4", "float8_e4m3", "float8_e4m3b11fnuz",
  "float8_e4m3fn", "float8_e4m3fnuz", "float8_e5m2", "float8_e5m2fnuz", "float_", "float_power", "floating", "floor",
  "floor_divide",
  "fmax", "fmin", "fmod", "frexp", "frombuffer", "fromfunction", "fromiter", "fromstring", "full", "full_like", "gcd",
  "generic", "geomspace", "get_printoptions", "gradient", "greater", "greater_equal", "hamming", "hanning", "heaviside",
  "histogram", "histogram2d", "histogram_bin_edges", "histogramdd", "hsplit", "hstack", "hypot", "i0", "identity",
  "iinfo", "index_exp", "indices", "inexact", "inf", "inner", "insert", "int16", "int32", "int64", "int8", "int_",
  "integer", "interp", "intersect1d", "invert", "isclose", "isfinite", "isin", "isinf", "isnan", "isneginf", "isposinf",
  "isscalar", "issubdtype", "iterable", "ix_", "kaiser", "kron", "lcm", "ldexp", "left_shift", "less", "less_equal",
  "lexsort", "linalg", "linspace", "load", "log", "log10", "log1p", "log2", "logaddexp", "logaddexp2", "logical_and",
  "logical_not", "logical_or", "logical_xor", "logspace", "mask_indices", "matmul", "matrix_transpose", "matvec", "max",
  "maximum", "mean", "median", "meshgrid", "mgrid", "min", "minimum", "mod", "modf", "moveaxis", "multiply", "nan",
  "nan_to_num", "nanargmax", "nanargmin", "nancumprod", "nancumsum", "nanmax", "nanmean", "nanmedian", "nanmin",
  "nanpercentile", "nanprod", "nanquantile", "nanstd", "nansum", "nanvar", "ndarray", "ndim", "negative", "newaxis",
  "nextafter", "nonzero", "not_equal", "number", "object_", "ogrid", "ones", "ones_like", "outer", "packbits", "pad",
  "partition", "percentile", "pi", "piecewise", "place", "poly", "polyadd", "polyder", "polydiv", "polyfit", "polyint",
  "polymul", "polysub", "polyval", "positive", "power", "printoptions", "prod", "promote_types", "ptp", "put",
  "put_along_axis", "quantile", "r_", "rad2deg", "radians", "ravel", "ravel_multi_index", "reciprocal", "remainder",
  "repeat", "reshape", "resize", "result_type", "right_shift", "rint", "roll", "rollaxis", "roots", "rot90", "round",
  "s_", "save", "savez", "searchsorted", "select", "set_printoptions", "setdiff1d", "setxor1d", "shape", "sign",
  "signbit", "signedinteger", "sin", "sinc", "single", "sinh", "size", "sort", "sort_complex", "spacing", "split",
  "sqrt", "square", "squeeze", "stack", "std", "subtract", "sum", "swapaxes", "take", "take_along_axis", "tan", "tanh",
  "tensordot", "tile", "trace", "transpose", "trapezoid", "tri", "tril", "tril_indices", "tril_indices_from",
  "trim_zeros", "triu",
  "triu_indices", "triu_indices_from", "true_divide", "trunc", "uint", "uint16", "uint32", "uint64", "uint8", "union1d",
  "unique", "unpackbits", "unravel_index", "unsignedinteger", "unwrap", "vander", "var", "vdot", "vecmat", "vectorize",
  "vsplit", "vstack", "where", "zeros", "zeros_like",
]
