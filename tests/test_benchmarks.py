"""benchmarks/suite.py runs end to end (quick, two workloads, no JAX) and writes the JSON it documents; no time is
checked."""
import json
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_suite_quick_writes_json(tmp_path):
  out = tmp_path / "suite.json"
  env = os.environ | {"TINYJAX_CACHE_DIR": str(tmp_path / "cache")}  # the parent's machine_limits, measured afresh
  done = subprocess.run([sys.executable, os.path.join(ROOT, "benchmarks", "suite.py"), "--quick", "dispatch",
                         "elementwise", "--json", str(out)], capture_output=True, text=True, env=env, timeout=120)
  assert done.returncode == 0, done.stderr
  assert "elementwise" in done.stdout and "error" not in done.stdout, done.stdout
  report = json.loads(out.read_text())
  assert {"machine", "versions", "repeats", "workloads"} <= report.keys()
  assert {"flops", "bandwidth", "threads", "vector_lanes"} <= report["machine"].keys()
  assert set(report["workloads"]) == {"dispatch", "elementwise"}
  elementwise = report["workloads"]["elementwise"]
  assert {"tinyjax", "numpy", "ratio_numpy", "ratio_jax", "limit_fraction"} <= elementwise.keys()
  for library in ("tinyjax", "numpy"):
    assert elementwise[library]["errors"] == [] and len(elementwise[library]["samples"]) == 1
    assert elementwise[library]["median"] > 0
  assert "warning" not in done.stdout, done.stdout  # tinyjax's checksum agrees with numpy's
  assert report["workloads"]["dispatch"]["tinyjax"]["checksum"][0] == 16.0  # eight ones plus one
