"""Random tinyjax.numpy programs (tests/fuzz) with a fixed seed and a small budget: every program is checked
eagerly, under jit, under vmap and fused against a float64 numpy reference with JAX's dtype rules. `make fuzz` runs
the same search for longer; what it finds becomes a named test in test_regressions.py."""
import numpy as np

from tests.fuzz import programs
from tests.fuzz.ops import Aval, Operand

SEED = 20261123
COUNT = 200


def test_random_programs_match_the_reference():
  report = programs.search(SEED, count=COUNT)
  assert report.checked == COUNT
  failures = [f for f in report.failures if f.kind != "not built"]
  assert not failures, "\n\n".join(f"{f.summary()}\n{f.program.source()}" for f in failures[:5])


def test_the_reference_catches_wrong_answers():
  """The checker is not vacuous: a tinyjax.numpy stand-in whose add is off by a few ulps and whose multiply loses
  weak types fails programs that tinyjax passes."""
  import tinyjax as tj
  import tinyjax.numpy as tnp

  class Wrong:
    def __getattr__(self, name): return getattr(tnp, name)
    def add(self, x, y): return tnp.add(x, y) * (1 + 2.0 ** -20)
    def multiply(self, x, y):
      result = tnp.multiply(x, y)
      return tnp.asarray(np.asarray(result)) if result.weak_type else result

  floats = Operand(Aval((3,), "float32", False), np.array([1.5, 2.0, 3.0], np.float32))
  add = programs.Program([floats], [programs.Step("add", (0, 0), {}, Aval((3,), "float32", False))])
  weak = Operand(Aval((), "float32", True), np.asarray(2.5, np.float32), 2.5)
  multiply = programs.Program([weak], [programs.Step("multiply", (0, ("scalar", 2)), {}, Aval((), "float32", True))])
  for program, kind in ((add, "value"), (multiply, "weak_type")):
    assert not programs._Checker(tj, tnp, program).run()
    failures = programs._Checker(tj, Wrong(), program).run()
    assert failures and failures[0].kind == kind, failures
