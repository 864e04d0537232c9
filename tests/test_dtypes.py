"""Tests for tinyjax.dtypes and tinyjax.config: JAX's type promotion, weak types, canonicalisation, reductions."""
import re
import warnings

import ml_dtypes
import numpy as np
import pytest

from tinyjax import dtypes
from tinyjax.config import Config, config

# ------------------------------------------------------------------------------------------------ reference tables
# Generated from real JAX (jax/jaxlib 0.10.2, ml_dtypes 0.6.0, numpy 2.x) in a separate virtualenv
# (python3 -m venv /tmp/jaxenv && /tmp/jaxenv/bin/pip install jax), once with jax_enable_x64 off (X32) and once on
# (X64), with `import jax.numpy as jnp; from jax._src import dtypes as D` and, for row dtype r / column c:
#   PROMOTE_TYPES: jnp.promote_types(r, c)              ('-': jax.dtypes.TypePromotionError)
#   RESULT_TYPE:   D.result_type(r, c, return_weak_type_flag=True) (dtype specifiers; 64-bit ones are canonicalised
#                  first; u64 with a signed int meets at the weak float node, so the result is a *weak* float64)
#   WITH_WEAK:     D.result_type(np.zeros(2, r), c, return_weak_type_flag=True) for c in
#                  True, 1, 1.0, jnp.asarray(1) (w_i: weak default int), jnp.asarray(1.0) (w_f: weak default float)
#   WEAK_WEAK:     D.result_type(a, b, return_weak_type_flag=True) over Python scalars, weak arrays and the types
#                  int, float, bool
#   REDUCTIONS:    getattr(jnp, op)(jnp.zeros(4, r)).dtype
# A trailing '*' means the result is weakly typed. tinyjax never imports jax; these literals are the reference.
SHORT_NAMES = {
  "b": np.dtype(np.bool_), "i8": np.dtype(np.int8), "i16": np.dtype(np.int16), "i32": np.dtype(np.int32),
  "i64": np.dtype(np.int64), "u8": np.dtype(np.uint8), "u16": np.dtype(np.uint16), "u32": np.dtype(np.uint32),
  "u64": np.dtype(np.uint64), "f16": np.dtype(np.float16), "bf16": np.dtype(ml_dtypes.bfloat16),
  "f32": np.dtype(np.float32), "f64": np.dtype(np.float64), "f8": np.dtype(ml_dtypes.float8_e4m3fn),
}

PROMOTE_TYPES_X32 = """
           b    i8   i16   i32   i64    u8   u16   u32   u64   f16  bf16   f32   f64    f8
b          b    i8   i16   i32   i64    u8   u16   u32   u64   f16  bf16   f32   f64    f8
i8        i8    i8   i16   i32   i64   i16   i32   i32   f64   f16  bf16   f32   f64    f8
i16      i16   i16   i16   i32   i64   i16   i32   i32   f64   f16  bf16   f32   f64    f8
i32      i32   i32   i32   i32   i64   i32   i32   i32   f64   f16  bf16   f32   f64    f8
i64      i64   i64   i64   i64   i64   i64   i64   i64   f64   f16  bf16   f32   f64    f8
u8        u8   i16   i16   i32   i64    u8   u16   u32   u64   f16  bf16   f32   f64    f8
u16      u16   i32   i32   i32   i64   u16   u16   u32   u64   f16  bf16   f32   f64    f8
u32      u32   i32   i32   i32   i64   u32   u32   u32   u64   f16  bf16   f32   f64    f8
u64      u64   f64   f64   f64   f64   u64   u64   u64   u64   f16  bf16   f32   f64    f8
f16      f16   f16   f16   f16   f16   f16   f16   f16   f16   f16   f32   f32   f64     -
bf16    bf16  bf16  bf16  bf16  bf16  bf16  bf16  bf16  bf16   f32  bf16   f32   f64     -
f32      f32   f32   f32   f32   f32   f32   f32   f32   f32   f32   f32   f32   f64     -
f64      f64   f64   f64   f64   f64   f64   f64   f64   f64   f64   f64   f64   f64     -
f8        f8    f8    f8    f8    f8    f8    f8    f8    f8     -     -     -     -    f8
"""

RESULT_TYPE_X32 = """
           b    i8   i16   i32   i64    u8   u16   u32   u64   f16  bf16   f32   f64    f8
b          b    i8   i16   i32   i32    u8   u16   u32   u32   f16  bf16   f32   f32    f8
i8        i8    i8   i16   i32   i32   i16   i32   i32   i32   f16  bf16   f32   f32    f8
i16      i16   i16   i16   i32   i32   i16   i32   i32   i32   f16  bf16   f32   f32    f8
i32      i32   i32   i32   i32   i32   i32   i32   i32   i32   f16  bf16   f32   f32    f8
i64      i32   i32   i32   i32   i32   i32   i32   i32   i32   f16  bf16   f32   f32    f8
u8        u8   i16   i16   i32   i32    u8   u16   u32   u32   f16  bf16   f32   f32    f8
u16      u16   i32   i32   i32   i32   u16   u16   u32   u32   f16  bf16   f32   f32    f8
u32      u32   i32   i32   i32   i32   u32   u32   u32   u32   f16  bf16   f32   f32    f8
u64      u32   i32   i32   i32   i32   u32   u32   u32   u32   f16  bf16   f32   f32    f8
f16      f16   f16   f16   f16   f16   f16   f16   f16   f16   f16   f32   f32   f32     -
bf16    bf16  bf16  bf16  bf16  bf16  bf16  bf16  bf16  bf16   f32  bf16   f32   f32     -
f32      f32   f32   f32   f32   f32   f32   f32   f32   f32   f32   f32   f32   f32     -
f64      f32   f32   f32   f32   f32   f32   f32   f32   f32   f32   f32   f32   f32     -
f8        f8    f8    f8    f8    f8    f8    f8    f8    f8     -     -     -     -    f8
"""

WITH_WEAK_X32 = """
        True     1   1.0   w_i   w_f
b          b  i32*  f32*  i32*  f32*
i8        i8    i8  f32*    i8  f32*
i16      i16   i16  f32*   i16  f32*
i32      i32   i32  f32*   i32  f32*
i64      i32   i32  f32*   i32  f32*
u8        u8    u8  f32*    u8  f32*
u16      u16   u16  f32*   u16  f32*
u32      u32   u32  f32*   u32  f32*
u64      u32   u32  f32*   u32  f32*
f16      f16   f16   f16   f16   f16
bf16    bf16  bf16  bf16  bf16  bf16
f32      f32   f32   f32   f32   f32
f64      f32   f32   f32   f32   f32
f8        f8    f8    f8    f8    f8
"""

WEAK_WEAK_X32 = """
        True     1   1.0   w_i   w_f   int float  bool
True       b  i32*  f32*  i32*  f32*  i32*  f32*     b
1       i32*  i32*  f32*  i32*  f32*  i32*  f32*  i32*
1.0     f32*  f32*  f32*  f32*  f32*  f32*  f32*  f32*
w_i     i32*  i32*  f32*  i32*  f32*  i32*  f32*  i32*
w_f     f32*  f32*  f32*  f32*  f32*  f32*  f32*  f32*
int     i32*  i32*  f32*  i32*  f32*  i32*  f32*  i32*
float   f32*  f32*  f32*  f32*  f32*  f32*  f32*  f32*
bool       b  i32*  f32*  i32*  f32*  i32*  f32*     b
"""

REDUCTIONS_X32 = """
         sum  prod cumsum  mean   var   max
b        i32   i32   i32   f32   f32     b
i8       i32   i32    i8   f32   f32    i8
i16      i32   i32   i16   f32   f32   i16
i32      i32   i32   i32   f32   f32   i32
i64      i32   i32   i32   f32   f32   i32
u8       u32   u32    u8   f32   f32    u8
u16      u32   u32   u16   f32   f32   u16
u32      u32   u32   u32   f32   f32   u32
u64      u32   u32   u32   f32   f32   u32
f16      f16   f16   f16   f16   f16   f16
bf16    bf16  bf16  bf16  bf16  bf16  bf16
f32      f32   f32   f32   f32   f32   f32
f64      f32   f32   f32   f32   f32   f32
f8        f8    f8    f8    f8    f8    f8
"""

PROMOTE_TYPES_X64 = """
           b    i8   i16   i32   i64    u8   u16   u32   u64   f16  bf16   f32   f64    f8
b          b    i8   i16   i32   i64    u8   u16   u32   u64   f16  bf16   f32   f64    f8
i8        i8    i8   i16   i32   i64   i16   i32   i64   f64   f16  bf16   f32   f64    f8
i16      i16   i16   i16   i32   i64   i16   i32   i64   f64   f16  bf16   f32   f64    f8
i32      i32   i32   i32   i32   i64   i32   i32   i64   f64   f16  bf16   f32   f64    f8
i64      i64   i64   i64   i64   i64   i64   i64   i64   f64   f16  bf16   f32   f64    f8
u8        u8   i16   i16   i32   i64    u8   u16   u32   u64   f16  bf16   f32   f64    f8
u16      u16   i32   i32   i32   i64   u16   u16   u32   u64   f16  bf16   f32   f64    f8
u32      u32   i64   i64   i64   i64   u32   u32   u32   u64   f16  bf16   f32   f64    f8
u64      u64   f64   f64   f64   f64   u64   u64   u64   u64   f16  bf16   f32   f64    f8
f16      f16   f16   f16   f16   f16   f16   f16   f16   f16   f16   f32   f32   f64     -
bf16    bf16  bf16  bf16  bf16  bf16  bf16  bf16  bf16  bf16   f32  bf16   f32   f64     -
f32      f32   f32   f32   f32   f32   f32   f32   f32   f32   f32   f32   f32   f64     -
f64      f64   f64   f64   f64   f64   f64   f64   f64   f64   f64   f64   f64   f64     -
f8        f8    f8    f8    f8    f8    f8    f8    f8    f8     -     -     -     -    f8
"""

RESULT_TYPE_X64 = """
           b    i8   i16   i32   i64    u8   u16   u32   u64   f16  bf16   f32   f64    f8
b          b    i8   i16   i32   i64    u8   u16   u32   u64   f16  bf16   f32   f64    f8
i8        i8    i8   i16   i32   i64   i16   i32   i64  f64*   f16  bf16   f32   f64    f8
i16      i16   i16   i16   i32   i64   i16   i32   i64  f64*   f16  bf16   f32   f64    f8
i32      i32   i32   i32   i32   i64   i32   i32   i64  f64*   f16  bf16   f32   f64    f8
i64      i64   i64   i64   i64   i64   i64   i64   i64  f64*   f16  bf16   f32   f64    f8
u8        u8   i16   i16   i32   i64    u8   u16   u32   u64   f16  bf16   f32   f64    f8
u16      u16   i32   i32   i32   i64   u16   u16   u32   u64   f16  bf16   f32   f64    f8
u32      u32   i64   i64   i64   i64   u32   u32   u32   u64   f16  bf16   f32   f64    f8
u64      u64  f64*  f64*  f64*  f64*   u64   u64   u64   u64   f16  bf16   f32   f64    f8
f16      f16   f16   f16   f16   f16   f16   f16   f16   f16   f16   f32   f32   f64     -
bf16    bf16  bf16  bf16  bf16  bf16  bf16  bf16  bf16  bf16   f32  bf16   f32   f64     -
f32      f32   f32   f32   f32   f32   f32   f32   f32   f32   f32   f32   f32   f64     -
f64      f64   f64   f64   f64   f64   f64   f64   f64   f64   f64   f64   f64   f64     -
f8        f8    f8    f8    f8    f8    f8    f8    f8    f8     -     -     -     -    f8
"""

WITH_WEAK_X64 = """
        True     1   1.0   w_i   w_f
b          b  i64*  f64*  i64*  f64*
i8        i8    i8  f64*    i8  f64*
i16      i16   i16  f64*   i16  f64*
i32      i32   i32  f64*   i32  f64*
i64      i64   i64  f64*   i64  f64*
u8        u8    u8  f64*    u8  f64*
u16      u16   u16  f64*   u16  f64*
u32      u32   u32  f64*   u32  f64*
u64      u64   u64  f64*   u64  f64*
f16      f16   f16   f16   f16   f16
bf16    bf16  bf16  bf16  bf16  bf16
f32      f32   f32   f32   f32   f32
f64      f64   f64   f64   f64   f64
f8        f8    f8    f8    f8    f8
"""

WEAK_WEAK_X64 = """
        True     1   1.0   w_i   w_f   int float  bool
True       b  i64*  f64*  i64*  f64*  i64*  f64*     b
1       i64*  i64*  f64*  i64*  f64*  i64*  f64*  i64*
1.0     f64*  f64*  f64*  f64*  f64*  f64*  f64*  f64*
w_i     i64*  i64*  f64*  i64*  f64*  i64*  f64*  i64*
w_f     f64*  f64*  f64*  f64*  f64*  f64*  f64*  f64*
int     i64*  i64*  f64*  i64*  f64*  i64*  f64*  i64*
float   f64*  f64*  f64*  f64*  f64*  f64*  f64*  f64*
bool       b  i64*  f64*  i64*  f64*  i64*  f64*     b
"""

REDUCTIONS_X64 = """
         sum  prod cumsum  mean   var   max
b        i64   i64   i64   f32   f32     b
i8       i64   i64    i8   f32   f32    i8
i16      i64   i64   i16   f32   f32   i16
i32      i64   i64   i32   f32   f32   i32
i64      i64   i64   i64   f64   f64   i64
u8       u64   u64    u8   f32   f32    u8
u16      u64   u64   u16   f32   f32   u16
u32      u64   u64   u32   f32   f32   u32
u64      u64   u64   u64   f64   f64   u64
f16      f16   f16   f16   f16   f16   f16
bf16    bf16  bf16  bf16  bf16  bf16  bf16
f32      f32   f32   f32   f32   f32   f32
f64      f64   f64   f64   f64   f64   f64
f8        f8    f8    f8    f8    f8    f8
"""


def parse_table(text):
  """{(row, column): cell} of a table above."""
  header, *rows = text.strip("\n").splitlines()
  columns = header.split()
  cells = {}
  for row in rows:
    name, *values = row.split()
    assert len(values) == len(columns), row
    cells.update({(name, column): value for column, value in zip(columns, values)})
  return cells


def table_cases(x32_text, x64_text):
  return [(x64, row, column, expected)
          for x64, text in ((False, x32_text), (True, x64_text))
          for (row, column), expected in parse_table(text).items()]


def expected_dtype(cell):
  """('f32*') -> (float32, True)."""
  return SHORT_NAMES[cell.rstrip("*")], cell.endswith("*")


class FakeArray:
  """Stands in for a tinyjax Array: a dtype and a weak_type flag."""
  def __init__(self, dtype, weak_type=False):
    self.dtype, self.weak_type = np.dtype(dtype), weak_type


def weak_operand(name):
  """The weak operands of the tables, built under the current x64 setting (as JAX built them)."""
  return {"True": True, "1": 1, "1.0": 1.0, "int": int, "float": float, "bool": bool,
          "w_i": FakeArray(dtypes.default_int_dtype(), True),
          "w_f": FakeArray(dtypes.default_float_dtype(), True)}[name]


@pytest.fixture(autouse=True)
def _restore_config():
  before = config.values()
  yield
  for name, value in before.items():
    config.update(name, value)


# ------------------------------------------------------------------------------------------------ promotion tables

@pytest.mark.parametrize("x64,row,column,expected", table_cases(PROMOTE_TYPES_X32, PROMOTE_TYPES_X64))
def test_promote_types_table(x64, row, column, expected):
  with config.override("jax_enable_x64", x64):
    if expected == "-":
      with pytest.raises(dtypes.TypePromotionError, match="8-bit floats"):
        dtypes.promote_types(SHORT_NAMES[row], SHORT_NAMES[column])
    else:
      assert dtypes.promote_types(SHORT_NAMES[row], SHORT_NAMES[column]) == SHORT_NAMES[expected]


@pytest.mark.filterwarnings("ignore:Explicitly requested dtype")
@pytest.mark.parametrize("x64,row,column,expected", table_cases(RESULT_TYPE_X32, RESULT_TYPE_X64))
def test_result_type_table(x64, row, column, expected):
  with config.override("jax_enable_x64", x64):
    if expected == "-":
      with pytest.raises(ValueError):
        dtypes.result_type(SHORT_NAMES[row], SHORT_NAMES[column])
    else:
      out = dtypes.result_type(SHORT_NAMES[row], SHORT_NAMES[column], return_weak_type_flag=True)
      assert out == expected_dtype(expected)
      # Arrays (strong) promote like their dtypes; tinyjax Arrays are FakeArrays here.
      out = dtypes.result_type(np.zeros(2, SHORT_NAMES[row]), FakeArray(SHORT_NAMES[column]),
                               return_weak_type_flag=True)
      assert out == expected_dtype(expected)


@pytest.mark.parametrize("x64,row,column,expected", table_cases(WITH_WEAK_X32, WITH_WEAK_X64))
def test_strong_with_weak_table(x64, row, column, expected):
  with config.override("jax_enable_x64", x64):
    operand = weak_operand(column)
    assert dtypes.result_type(np.zeros(2, SHORT_NAMES[row]), operand,
                              return_weak_type_flag=True) == expected_dtype(expected)
    assert dtypes.result_type(operand, np.zeros(2, SHORT_NAMES[row]),
                              return_weak_type_flag=True) == expected_dtype(expected)


@pytest.mark.parametrize("x64,row,column,expected", table_cases(WEAK_WEAK_X32, WEAK_WEAK_X64))
def test_weak_with_weak_table(x64, row, column, expected):
  with config.override("jax_enable_x64", x64):
    out = dtypes.result_type(weak_operand(row), weak_operand(column), return_weak_type_flag=True)
    assert out == expected_dtype(expected)


@pytest.mark.parametrize("x64", [False, True])
def test_promotion_is_symmetric_and_bool_is_bottom(x64):
  with config.override("jax_enable_x64", x64):
    for first in dtypes.SUPPORTED_DTYPES:
      assert dtypes.promote_types(np.bool_, first) == first
      for second in dtypes.SUPPORTED_DTYPES:
        try:
          forward = dtypes.promote_types(first, second)
        except dtypes.TypePromotionError:
          with pytest.raises(dtypes.TypePromotionError):
            dtypes.promote_types(second, first)
          continue
        assert forward == dtypes.promote_types(second, first)


# ------------------------------------------------------------------------------------------------ sharp edges (API.md)

@pytest.mark.parametrize("operands,expected", [
  ((np.float32, 1.0), "f32"),
  ((np.uint8, 1), "u8"),
  ((ml_dtypes.bfloat16, 1.0), "bf16"),
  ((np.int32, 1.5), "f32*"),                    # int + Python float meets at the weak float node: weak f32
  ((np.bool_, 1), "i32*"),
  ((1, 1.0), "f32*"),
  ((1, 2), "i32*"),
  ((True, False), "b"),
  ((ml_dtypes.bfloat16, np.float16), "f32"),
  ((np.int32, np.float16), "f16"),
  ((np.uint8, np.int8), "i16"),
  ((np.uint32, np.int32), "i32"),
  ((np.int8, np.uint8, 1.0), "f32*"),          # a Python float above two ints: weak float wins (JAX)
  ((np.zeros(2, np.uint8), 1, 2.0), "f32*"),
  ((np.float16, ml_dtypes.bfloat16, np.int8), "f32"),
  ((ml_dtypes.float8_e4m3fn, 1.0), "f8"),
  ((ml_dtypes.float8_e4m3fn, np.int32), "f8"),
  ((None,), "f32"),
  ((int,), "i32*"),
  ((float,), "f32*"),
  ((bool,), "b"),
  ((np.float32(1), 1), "f32"),                  # numpy scalars (like jnp.float32(1)) are strong
  ((FakeArray(np.float32, weak_type=True), FakeArray(np.float16)), "f16"),
  ((FakeArray(np.float16, weak_type=True),), "f32*"),  # a weak result takes the default dtype of its kind
  ((FakeArray(np.int8, weak_type=True), FakeArray(np.uint8)), "u8"),
])
def test_sharp_edges(operands, expected):
  assert dtypes.result_type(*operands, return_weak_type_flag=True) == expected_dtype(expected)


def test_sharp_edges_x64():
  with config.override("jax_enable_x64", True):
    assert dtypes.result_type(np.uint32, np.int32) == np.int64
    assert dtypes.result_type(1, 1.0, return_weak_type_flag=True) == (np.dtype(np.float64), True)
    assert dtypes.result_type(np.float32, 1.0) == np.float32
    assert dtypes.result_type(None) == np.float64


def test_promote_types_with_python_types():
  assert dtypes.promote_types("uint8", int) == np.uint8
  assert dtypes.promote_types("float16", float) == np.float16
  assert dtypes.promote_types(int, float) == np.float64  # not canonicalised, as jnp.promote_types
  assert dtypes.promote_types(bool, int) == np.int64


def test_weak_type_helpers():
  assert dtypes.is_weakly_typed(1) and dtypes.is_weakly_typed(1.0)
  assert not dtypes.is_weakly_typed(True)
  assert not dtypes.is_weakly_typed(np.float32(1))
  assert dtypes.is_weakly_typed(FakeArray(np.float32, weak_type=True))
  assert not dtypes.is_weakly_typed(FakeArray(np.float32))
  assert dtypes.python_scalar_dtype(1) == np.int32 and dtypes.python_scalar_dtype(1.0) == np.float32
  assert dtypes.python_scalar_dtype(True) == np.bool_ and dtypes.python_scalar_dtype(float) == np.float32
  with config.override("jax_enable_x64", True):
    assert dtypes.python_scalar_dtype(1) == np.int64 and dtypes.python_scalar_dtype(2.5) == np.float64
  assert dtypes.dtype_and_weak_type(1.0) == (np.dtype(np.float32), True)
  assert dtypes.dtype_and_weak_type(FakeArray(np.int8, weak_type=True)) == (np.dtype(np.int8), True)


@pytest.mark.parametrize("operands,want,weak", [
  ((1j,), np.complex64, True), ((np.float32, 1j), np.complex64, False), ((complex,), np.complex64, True),
  ((np.complex64, np.float32), np.complex64, False), ((np.int32, 1j), np.complex64, True),
  ((np.float16, 1j), np.complex64, False), ((1.0, 1j), np.complex64, True), ((np.bool_, 2j), np.complex64, True),
])
def test_complex_promotion(operands, want, weak):
  """JAX's lattice: float* -> complex* -> c64 -> c128, f32 -> c64, f64 -> c128 (checked against JAX 0.10.2)."""
  assert dtypes.result_type(*operands, return_weak_type_flag=True) == (np.dtype(want), weak)


def test_complex_promotion_with_x64():
  with config.override("jax_enable_x64", True):
    assert dtypes.result_type(np.float64, np.complex64) == np.complex128
    assert dtypes.result_type(1j) == np.complex128 and dtypes.result_type(np.float32, 1j) == np.complex64
  assert dtypes.result_type(np.ones(1), np.ones(1, np.complex64)) == np.complex64  # canonicalised without x64
  assert dtypes.promote_types(np.float64, np.complex64) == np.complex128


def test_result_type_needs_arguments():
  with pytest.raises(ValueError):
    dtypes.result_type()


# ------------------------------------------------------------------------------------------------ dtype() and names

@pytest.mark.parametrize("spec,expected", [
  ("float32", "f32"), ("bfloat16", "bf16"), ("float8_e4m3fn", "f8"), ("int64", "i64"), ("bool", "b"),
  (np.float16, "f16"), (ml_dtypes.bfloat16, "bf16"), (np.dtype("uint16"), "u16"), (dtypes.float8_e4m3fn, "f8"),
  (dtypes.bool_, "b"), (bool, "b"), (int, "i32"), (float, "f32"), (np.zeros(2, np.uint8), "u8"),
  (FakeArray(np.int16), "i16"), (np.float64(1.0), "f64"), (3, "i32"), (2.5, "f32"), (False, "b"),
])
def test_dtype_normalises(spec, expected):
  out = dtypes.dtype(spec)
  assert isinstance(out, np.dtype) and out == SHORT_NAMES[expected]


@pytest.mark.parametrize("name", ["bool_", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64",
                                  "float16", "bfloat16", "float32", "float64", "float8_e4m3fn"])
def test_module_names_are_supported_dtypes(name):
  assert dtypes.dtype(getattr(dtypes, name)) in dtypes.SUPPORTED_DTYPES
  assert dtypes.dtype(getattr(dtypes, name)) == getattr(dtypes, name)


@pytest.mark.parametrize("spec,shown", [
  (np.clongdouble, "complex256"), (object, "object"), ("U5", "<U5"),
  ("datetime64[s]", "datetime64[s]"), (np.array(["a"]), "<U1"), (np.float128, "float128"),
])
def test_unsupported_dtype_is_type_error(spec, shown):
  with pytest.raises(TypeError, match=r"tinyjax does not support dtype .*supported dtypes are bool, int8"):
    dtypes.dtype(spec)
  with pytest.raises(TypeError, match=f"does not support dtype {re.escape(shown)}"):
    dtypes.check_user_dtype_supported(spec)


def test_unknown_dtype_strings_and_objects():
  with pytest.raises(TypeError, match="Cannot interpret"):
    dtypes.dtype("not_a_dtype")
  with pytest.raises(TypeError, match="Cannot determine dtype"):
    dtypes.dtype(object())
  with pytest.raises(ValueError):
    dtypes.dtype(None)


# ------------------------------------------------------------------------------------------------ canonicalisation

@pytest.mark.parametrize("name", list(SHORT_NAMES))
def test_canonicalize_dtype(name):
  wide_to_narrow = {"i64": "i32", "u64": "u32", "f64": "f32"}
  assert dtypes.canonicalize_dtype(SHORT_NAMES[name]) == SHORT_NAMES[wide_to_narrow.get(name, name)]
  with config.override("jax_enable_x64", True):
    assert dtypes.canonicalize_dtype(SHORT_NAMES[name]) == SHORT_NAMES[name]


def test_default_dtypes():
  assert (dtypes.default_int_dtype(), dtypes.default_uint_dtype(), dtypes.default_float_dtype()) == (
    np.int32, np.uint32, np.float32)
  with config.override("jax_enable_x64", True):
    assert (dtypes.default_int_dtype(), dtypes.default_uint_dtype(), dtypes.default_float_dtype()) == (
      np.int64, np.uint64, np.float64)


@pytest.mark.parametrize("wide,narrow", [("float64", "float32"), ("int64", "int32"), ("uint64", "uint32")])
def test_64bit_request_warns_and_truncates(wide, narrow):
  with pytest.warns(UserWarning, match=f"Explicitly requested dtype {wide} requested in array is not available, "
                                       f"and will be truncated to dtype {narrow}. To enable more dtypes, set the "
                                       "jax_enable_x64 configuration option"):
    assert dtypes.check_user_dtype_supported(wide, "array") == np.dtype(narrow)
  with config.override("jax_enable_x64", True), warnings.catch_warnings():
    warnings.simplefilter("error")
    assert dtypes.check_user_dtype_supported(wide, "array") == np.dtype(wide)


def test_warnings_name_the_users_line():
  """A dtype truncated deep inside the package (`random.uniform`, `jnp.zeros`) and an unusable donation (raised while
  a dataclass's generated `__init__` plans the program) warn at the caller's line, as JAX's warnings do."""
  import tinyjax as tj
  import tinyjax.numpy as tnp
  from tinyjax import random
  with pytest.warns(UserWarning, match="truncated") as record:
    random.uniform(random.key(0), (4,), dtype=np.float64)
    tnp.zeros(3, dtype=np.float64)
  assert [w.filename for w in record] == [__file__, __file__]
  with pytest.warns(UserWarning, match="not usable") as record:
    tj.jit(lambda a, b: a + b.sum(), donate_argnums=1)(tnp.ones(3), tnp.ones(5))
  assert record[0].filename == __file__


def test_user_dtype_without_warning():
  with warnings.catch_warnings():
    warnings.simplefilter("error")
    assert dtypes.check_user_dtype_supported(float) == np.float32
    assert dtypes.check_user_dtype_supported(int) == np.int32
    assert dtypes.check_user_dtype_supported("bfloat16") == dtypes.bfloat16
    # Python scalars and arrays are not explicit requests: no warning (as JAX).
    assert dtypes.result_type(np.zeros(2), 1.0) == np.float32


# ------------------------------------------------------------------------------------------------ kinds, finfo/iinfo

@pytest.mark.parametrize("name", list(SHORT_NAMES))
def test_kind_helpers(name):
  dt = SHORT_NAMES[name]
  assert dtypes.is_floating(dt) == name.startswith(("f", "bf"))
  assert dtypes.is_integer(dt) == name.startswith(("i", "u"))
  assert dtypes.is_unsigned(dt) == name.startswith("u")
  assert dtypes.is_bool(dt) == (name == "b")
  assert dtypes.issubdtype(dt, np.inexact) == dtypes.is_floating(dt)
  assert dtypes.issubdtype(dt, np.number) == (name != "b")
  assert dtypes.issubdtype(dt, np.generic)
  assert dtypes.issubdtype(dt, dt)


def test_issubdtype_concrete():
  assert dtypes.issubdtype(ml_dtypes.bfloat16, "bfloat16")
  assert not dtypes.issubdtype(ml_dtypes.bfloat16, np.float16)
  assert not dtypes.issubdtype(np.float32, ml_dtypes.bfloat16)
  assert not dtypes.issubdtype(ml_dtypes.bfloat16, np.integer)
  assert dtypes.issubdtype(np.int8, np.signedinteger)


def test_finfo_iinfo():
  bf16 = dtypes.finfo(dtypes.bfloat16)
  assert (bf16.bits, float(bf16.eps), float(bf16.max)) == (16, 2.0 ** -7, 3.3895313892515355e38)
  assert bf16.dtype == dtypes.bfloat16
  f16 = dtypes.finfo("float16")
  assert (f16.bits, float(f16.eps), float(f16.max), float(f16.tiny)) == (16, 2.0 ** -10, 65504.0, 2.0 ** -14)
  assert float(dtypes.finfo(np.float32).eps) == float(np.finfo(np.float32).eps)
  assert float(dtypes.finfo(dtypes.float8_e4m3fn).max) == 448.0
  assert (dtypes.iinfo(np.uint8).min, dtypes.iinfo(np.uint8).max) == (0, 255)
  assert (dtypes.iinfo("int32").min, dtypes.iinfo("int32").max, dtypes.iinfo("int32").bits) == (-2**31, 2**31 - 1, 32)


# ------------------------------------------------------------------------------------------------ reductions

# cumsum and max keep their input dtype (bool cumsum -> default int); their columns are kept as a reference.
REDUCTION_HELPERS = {"sum": dtypes.sum_dtype, "prod": dtypes.sum_dtype, "mean": dtypes.mean_dtype,
                     "var": dtypes.mean_dtype}


@pytest.mark.parametrize("x64,row,column,expected", [
  case for case in table_cases(REDUCTIONS_X32, REDUCTIONS_X64) if case[2] in REDUCTION_HELPERS])
def test_reduction_dtypes(x64, row, column, expected):
  with config.override("jax_enable_x64", x64):
    assert REDUCTION_HELPERS[column](SHORT_NAMES[row]) == SHORT_NAMES[expected]


@pytest.mark.parametrize("name,expected", [("f16", "f32"), ("bf16", "f32"), ("f32", "f32"), ("f64", "f64"),
                                           ("f8", "f8"), ("i32", "i32"), ("b", "b")])
def test_accumulation_dtype(name, expected):
  assert dtypes.accumulation_dtype(SHORT_NAMES[name]) == SHORT_NAMES[expected]


@pytest.mark.parametrize("name,expected,expected_x64", [
  ("b", "f32", "f32"), ("i8", "f32", "f32"), ("u32", "f32", "f32"), ("i32", "f32", "f32"), ("i64", "f32", "f64"),
  ("f16", "f16", "f16"), ("bf16", "bf16", "bf16"), ("f64", "f32", "f64")])
def test_to_inexact_dtype(name, expected, expected_x64):
  assert dtypes.to_inexact_dtype(SHORT_NAMES[name]) == SHORT_NAMES[expected]
  with config.override("jax_enable_x64", True):
    assert dtypes.to_inexact_dtype(SHORT_NAMES[name]) == SHORT_NAMES[expected_x64]


# ------------------------------------------------------------------------------------------------ config

def test_config_defaults_and_update():
  fresh = Config()
  assert fresh.jax_debug_nans is False and fresh.jax_platforms is None and fresh.jax_compilation_cache_dir is None
  fresh.update("jax_enable_x64", True)
  assert fresh.jax_enable_x64 is True and fresh.read("jax_enable_x64") is True
  fresh.update("jax_platforms", "cpu")
  fresh.update("jax_compilation_cache_dir", "/tmp/cache")
  fresh.update("jax_compilation_cache_dir", None)
  assert fresh.read("jax_platforms") == "cpu" and fresh.jax_compilation_cache_dir is None


def test_config_unknown_name():
  with pytest.raises(AttributeError, match="Unrecognized config option: jax_enable_x65"):
    config.update("jax_enable_x65", True)
  with pytest.raises(AttributeError, match="Unrecognized config option: jax_nope"):
    config.read("jax_nope")
  with pytest.raises(AttributeError, match="Unrecognized config option: jax_nope"):
    _ = config.jax_nope
  with pytest.raises(AttributeError):
    config.jax_enable_x64 = True


@pytest.mark.parametrize("name,value", [("jax_enable_x64", 1), ("jax_enable_x64", "true"), ("jax_debug_nans", None),
                                        ("jax_platforms", 3), ("jax_compilation_cache_dir", True)])
def test_config_wrong_type(name, value):
  before = config.read(name)
  with pytest.raises(TypeError, match=name):
    config.update(name, value)
  assert config.read(name) == before


def test_config_override_restores_even_on_error():
  assert config.jax_enable_x64 is False
  with config.override("jax_enable_x64", True):
    assert config.jax_enable_x64 is True
    assert dtypes.canonicalize_dtype(np.float64) == np.float64
  assert config.jax_enable_x64 is False
  with pytest.raises(RuntimeError), config.override("jax_debug_nans", True):
    assert config.jax_debug_nans is True
    raise RuntimeError("boom")
  assert config.jax_debug_nans is False


def test_debug_nans_context_manager_and_effects_barrier(capsys):
  """JAX's `with jax.debug_nans(True):` sets jax_debug_nans inside the block (a NaN made there, eagerly or jitted,
  raises FloatingPointError) and restores it after; `jax.effects_barrier()` returns once the programs run so far have
  done their side effects (a jitted debug.print has printed)."""
  import tinyjax as tj
  import tinyjax.numpy as tnp
  assert config.jax_debug_nans is False
  with tj.debug_nans(True):
    assert config.jax_debug_nans is True
    with pytest.raises(FloatingPointError): tnp.log(-1.0)
    with pytest.raises(FloatingPointError): tj.jit(tnp.log)(-1.0)
  assert config.jax_debug_nans is False and np.isnan(float(tnp.log(-1.0)))
  tj.jit(lambda x: tj.debug.print("value {}", x))(2.0)
  assert tj.effects_barrier() is None and capsys.readouterr().out == "value 2.0\n"


def test_config_on_change_callback():
  fresh = Config()
  seen = []
  fresh.on_change(lambda name, value: seen.append((name, value)))
  fresh.update("jax_enable_x64", True)
  fresh.update("jax_enable_x64", True)  # unchanged: no call
  with fresh.override("jax_debug_nans", True):
    pass
  assert seen == [("jax_enable_x64", True), ("jax_debug_nans", True), ("jax_debug_nans", False)]


@pytest.mark.parametrize("env,expected", [("1", True), ("true", True), ("True", True), ("0", False), ("", False)])
def test_config_x64_from_environment(monkeypatch, env, expected):
  monkeypatch.setenv("JAX_ENABLE_X64", env)
  assert Config().jax_enable_x64 is expected
  monkeypatch.delenv("JAX_ENABLE_X64")
  assert Config().jax_enable_x64 is False


def test_config_with_absl_sets_options_from_the_command_line():
  """JAX programs call `jax.config.config_with_absl()` before `absl.app.run(main)` (JAX's examples do)."""
  import subprocess
  import sys
  import textwrap
  program = textwrap.dedent("""
    from absl import app
    import tinyjax
    tinyjax.config.config_with_absl()
    def main(argv):
      print(tinyjax.config.jax_enable_x64, tinyjax.config.jax_num_cpu_devices, tinyjax.numpy.ones(2).dtype)
    app.run(main)
  """)
  run = lambda *flags: subprocess.run([sys.executable, "-c", program, *flags], capture_output=True, text=True,  # noqa: E731
                                      timeout=120, env={**__import__("os").environ, "JAX_ENABLE_X64": "0"})
  assert run().stdout.split() == ["False", "-1", "float32"]
  assert run("--jax_enable_x64", "--jax_num_cpu_devices=3").stdout.split() == ["True", "3", "float64"]
  assert "jax_num_cpu_devices" in run("--jax_num_cpu_devices=x").stderr
