"""Tests of the CPU device layer: compiling hand-written kernels, the thread pool, the disk cache, Ctrl-C."""
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time

import numpy as np
import pytest

from tinyjax.devices import (DiskCache, cache_stats, compile_cpu, compile_cpu_many, cpu, get_runtime, reset_cache_stats,
                             stamp_target)
from tinyjax.devices.cache import decode_entry, encode_entry

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SUBPROCESS_TIMEOUT_S = 60


def unary_kernel(name: str, body: str, declarations: str = "") -> str:
  """IR of `out[i] = f(a[i])` over float32 for i in [start, end); `body` maps %x to %z."""
  return stamp_target(f"""
{declarations}
define void @{name}(ptr noalias %args, i64 %start, i64 %end) {{
entry:
  %a = load ptr, ptr %args
  %out_slot = getelementptr ptr, ptr %args, i64 1
  %out = load ptr, ptr %out_slot
  %nonempty = icmp slt i64 %start, %end
  br i1 %nonempty, label %loop, label %exit
loop:
  %i = phi i64 [ %start, %entry ], [ %i_next, %loop ]
  %a_at = getelementptr float, ptr %a, i64 %i
  %x = load float, ptr %a_at
  {body}
  %out_at = getelementptr float, ptr %out, i64 %i
  store float %z, ptr %out_at
  %i_next = add i64 %i, 1
  %more = icmp slt i64 %i_next, %end
  br i1 %more, label %loop, label %exit
exit:
  ret void
}}
""")


AXPB_IR = unary_kernel("axpb", "%y = fmul float %x, 2.0\n  %z = fadd float %y, 1.0")
EXPF_IR = unary_kernel("expf_kernel", "%z = call float @expf(float %x)", "declare float @expf(float)")
EXP_INTRINSIC_IR = unary_kernel("exp_intrinsic", "%z = call float @llvm.exp.f32(float %x)",
                                "declare float @llvm.exp.f32(float)")

# out[i] = a[i] iterated `count` times through acc = acc * 0.9999 + 0.0001 (a latency-bound chain, ~20 ms per
# outer iteration for count = 10M): a deliberately slow kernel for the Ctrl-C tests. args: a, out, int64 count.
SLOW_IR = stamp_target("""
define void @slow(ptr noalias %args, i64 %start, i64 %end) {
entry:
  %a = load ptr, ptr %args
  %out_slot = getelementptr ptr, ptr %args, i64 1
  %out = load ptr, ptr %out_slot
  %count_slot = getelementptr ptr, ptr %args, i64 2
  %count_ptr = load ptr, ptr %count_slot
  %count = load i64, ptr %count_ptr
  %nonempty = icmp slt i64 %start, %end
  br i1 %nonempty, label %outer, label %exit
outer:
  %i = phi i64 [ %start, %entry ], [ %i_next, %outer_end ]
  %a_at = getelementptr float, ptr %a, i64 %i
  %x = load float, ptr %a_at
  br label %inner
inner:
  %k = phi i64 [ 0, %outer ], [ %k_next, %inner ]
  %acc = phi float [ %x, %outer ], [ %acc_next, %inner ]
  %scaled = fmul float %acc, 0x3FEFFF2E40000000
  %acc_next = fadd float %scaled, 0x3F1A36E2E0000000
  %k_next = add i64 %k, 1
  %inner_more = icmp slt i64 %k_next, %count
  br i1 %inner_more, label %inner, label %outer_end
outer_end:
  %out_at = getelementptr float, ptr %out, i64 %i
  store float %acc_next, ptr %out_at
  %i_next = add i64 %i, 1
  %more = icmp slt i64 %i_next, %end
  br i1 %more, label %outer, label %exit
exit:
  ret void
}
""")


def run_unary(program, a: np.ndarray, parallel: bool = True) -> np.ndarray:
  out = np.full_like(a, np.nan)
  program([a.ctypes.data, out.ctypes.data], a.size, parallel=parallel)
  return out


def slow_reference(a: np.ndarray, count: int) -> np.ndarray:
  acc = a.copy()
  for _ in range(count): acc = acc * np.float32(0.9999) + np.float32(0.0001)
  return acc


@pytest.fixture(autouse=True, scope="module")
def private_cache_dir(tmp_path_factory):
  """Keep this file's cache entries out of the user's ~/.cache/tinyjax."""
  previous = os.environ.get("TINYJAX_CACHE_DIR")
  os.environ["TINYJAX_CACHE_DIR"] = str(tmp_path_factory.mktemp("tinyjax_cache"))
  yield
  if previous is None: del os.environ["TINYJAX_CACHE_DIR"]
  else: os.environ["TINYJAX_CACHE_DIR"] = previous


@pytest.fixture
def cache_dir(tmp_path, monkeypatch):
  """A fresh TINYJAX_CACHE_DIR for this test (and the subprocesses it starts)."""
  directory = tmp_path / "cache"
  monkeypatch.setenv("TINYJAX_CACHE_DIR", str(directory))
  return str(directory)


# ---- in-process: correctness, parallel launch, counters

@pytest.mark.parametrize("n", [0, 1, 7, 1000, 1_000_003])
@pytest.mark.parametrize("parallel", [True, False])
def test_elementwise_matches_numpy(n, parallel):
  program = compile_cpu("axpb", AXPB_IR)
  a = np.random.default_rng(n).standard_normal(n).astype(np.float32)
  np.testing.assert_array_equal(run_unary(program, a, parallel), a * np.float32(2) + np.float32(1))


@pytest.mark.parametrize("ir,name", [(EXPF_IR, "expf_kernel"), (EXP_INTRINSIC_IR, "exp_intrinsic")])
def test_libm_and_intrinsic_calls_resolve(ir, name):
  program = compile_cpu(name, ir)
  a = np.linspace(-5, 5, 100_001, dtype=np.float32)
  np.testing.assert_allclose(run_unary(program, a), np.exp(a), rtol=2e-6)


def test_program_attributes_and_target():
  program = compile_cpu("axpb", AXPB_IR)
  assert program.name == "axpb" and program.src == AXPB_IR and program.fn_addr > 0
  assert "ret" in program.asm
  assert cpu.cpu_target_triple() in AXPB_IR and cpu.cpu_data_layout() in AXPB_IR
  assert stamp_target(AXPB_IR) == AXPB_IR


def test_same_name_different_kernels_do_not_clash():
  first = compile_cpu("same_name", unary_kernel("same_name", "%z = fadd float %x, 1.0"))
  second = compile_cpu("same_name", unary_kernel("same_name", "%z = fadd float %x, 2.0"))
  a = np.arange(10, dtype=np.float32)
  np.testing.assert_array_equal(run_unary(first, a), a + 1)
  np.testing.assert_array_equal(run_unary(second, a), a + 2)


def test_call_to_unknown_function_raises():
  ir = unary_kernel("calls_unknown", "%z = call float @tj_no_such_function(float %x)",
                    "declare float @tj_no_such_function(float)")
  with pytest.raises(ValueError, match="tj_no_such_function"): compile_cpu("calls_unknown", ir)
  quoted = unary_kernel("calls_quoted", '%z = call float @"tj no such function"(float %x)',
                        'declare float @"tj no such function"(float)')
  with pytest.raises(ValueError, match="tj no such function"): compile_cpu("calls_quoted", quoted)


def test_counters_and_memo(cache_dir):
  reset_cache_stats()
  ir = unary_kernel("counted", f"%z = fadd float %x, {time.time_ns() % 1000}.0")  # new IR: nothing cached
  program = compile_cpu("counted", ir)
  stats = cache_stats()
  assert stats["misses"] == 1 and stats["hits"] == 0 and stats["compile_seconds"] > 0
  assert compile_cpu("counted", ir) is program
  stats = cache_stats()
  assert stats["memory_hits"] == 1 and stats["misses"] == 1
  assert os.listdir(os.path.join(cache_dir, "kernels"))
  reset_cache_stats()
  assert cache_stats()["misses"] == 0 and cache_stats()["compile_seconds"] == 0.0


def _fresh_kernels(count: int, tag: str) -> list[tuple[str, str]]:
  """`count` kernels out[i] = a[i] + c with IR no cache has seen (c differs per kernel and per test run)."""
  base = time.time_ns() % 100_000
  return [(f"{tag}_{i}", unary_kernel(f"{tag}_{i}", f"%z = fadd float %x, {base + i}.0")) for i in range(count)]


def _check_adds(programs, kernels) -> None:
  a = np.arange(17, dtype=np.float32)
  for program, (_, ir) in zip(programs, kernels):
    constant = float(ir.split("fadd float %x, ")[1].split()[0])
    np.testing.assert_array_equal(run_unary(program, a), a + np.float32(constant))


def test_compile_worker_compiles_the_same_object_code(cache_dir):
  """A program's new kernels are compiled here and by the compile worker at once: the worker's object code is the
  bytes this process compiles for the same IR, cached and counted as misses like any other."""
  if cpu._cpu_count() < 2: pytest.skip("one usable core: no compile worker is started")
  worker = cpu.compile_worker()
  assert worker is not None, "this machine has more than one core: the compile worker should run"
  kernels = _fresh_kernels(8, "many")
  reset_cache_stats()
  jobs_before = worker.jobs
  programs = compile_cpu_many(kernels)
  assert worker.jobs > jobs_before
  stats = cache_stats()
  assert stats["misses"] == 8 and stats["hits"] == 0 and stats["compile_seconds"] > 0
  _check_adds(programs, kernels)
  for name, ir in kernels:
    key = cpu.object_code_key(name, ir, cpu.default_opt_level())
    assert cpu._kernel_cache.get(key) == cpu.compile_object(name, ir, cpu.kernel_symbol(key), cpu.default_opt_level())
  assert compile_cpu_many(kernels) == programs and cache_stats()["memory_hits"] == 8


def test_kernels_differing_only_in_their_names_share_one_object(cache_dir):
  """Two kernels whose IR is the same but for their names (the same loop over arrays of two sizes) are compiled once
  and run the same code; a kernel that differs in anything else is compiled on its own."""
  base = time.time_ns() % 100_000
  kernels = [(f"e_{size}_{base}", unary_kernel(f"e_{size}_{base}", f"%z = fadd float %x, {base}.0")) for size in (3, 5)]
  kernels.append((f"e_7_{base}", unary_kernel(f"e_7_{base}", f"%z = fadd float %x, {base + 1}.0")))
  get_runtime()
  reset_cache_stats()
  programs = compile_cpu_many(kernels)
  assert cache_stats()["misses"] == 2
  assert programs[0].fn_addr == programs[1].fn_addr != programs[2].fn_addr
  assert [program.name for program in programs] == [name for name, _ in kernels]
  _check_adds(programs, kernels)
  assert compile_cpu(*kernels[1]) is programs[1] and cache_stats()["misses"] == 2


def test_prepared_kernels_compile_early_and_load_in_submit_order(cache_dir):
  """A CompileStream's `prepare` starts a kernel's compile before the lowering hands it over in order (`submit`):
  `finish` returns the programs in submit order, each kernel compiled once, and one prepared but never submitted
  (compiled for nothing) is not loaded."""
  kernels = _fresh_kernels(5, "prepared")
  get_runtime()  # (loaded before the counts: a fresh cache compiles it, one more miss)
  reset_cache_stats()
  stream = cpu.CompileStream()
  for name, ir in kernels[2:]: stream.prepare(name, ir)
  for name, ir in kernels[:4]: stream.submit(name, ir)
  programs = stream.finish()
  assert len(programs) == 4 and cache_stats()["misses"] == 4
  _check_adds(programs, kernels[:4])


def test_dead_compile_worker_is_replaced_and_its_kernels_compiled_here(cache_dir):
  if cpu._cpu_count() < 2: pytest.skip("one usable core: no compile worker is started")
  worker = cpu.compile_worker()
  worker.process.kill()
  worker.process.wait()
  kernels = _fresh_kernels(6, "orphaned")
  _check_adds(compile_cpu_many(kernels), kernels)
  assert worker.failed
  replacement = cpu.compile_worker()
  assert replacement is not None and replacement is not worker and not replacement.failed


def test_kernel_errors_are_raised_with_the_compile_worker(cache_dir):
  """A kernel that calls an unknown function, or isn't valid IR, raises here as it does without the worker (the
  worker's object code is never loaded unchecked)."""
  unknown = unary_kernel("calls_unknown_many", "%z = call float @tj_no_such_function(float %x)",
                         "declare float @tj_no_such_function(float)")
  with pytest.raises(ValueError, match="tj_no_such_function"):
    compile_cpu_many(_fresh_kernels(3, "before_unknown") + [("calls_unknown_many", unknown)])
  broken = unary_kernel("broken_many", "%z = fadd float %x, %undefined_value")
  with pytest.raises(RuntimeError):
    compile_cpu_many([("broken_many", broken)] + _fresh_kernels(3, "after_broken"))
  kernels = _fresh_kernels(4, "after_errors")
  _check_adds(compile_cpu_many(kernels), kernels)


def test_no_compile_worker_when_turned_off():
  script = ("from tinyjax.devices import cpu; import json; "
            "print(json.dumps(cpu.compile_worker() is None))")
  env = os.environ | {"TINYJAX_COMPILE_WORKER": "0"}
  result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env,
                          timeout=SUBPROCESS_TIMEOUT_S)
  assert result.returncode == 0, result.stderr
  assert json.loads(result.stdout.strip().splitlines()[-1]) is True


def test_noopt_compiles_and_runs():
  program = compile_cpu("axpb", AXPB_IR, opt_level=0)
  a = np.arange(1001, dtype=np.float32)
  np.testing.assert_array_equal(run_unary(program, a), a * 2 + 1)


def test_many_launches_of_random_sizes():
  program = compile_cpu("axpb", AXPB_IR)
  rng = np.random.default_rng(0)
  a = rng.standard_normal(50_000).astype(np.float32)
  expected = a * 2 + 1
  out = np.zeros_like(a)
  for n in rng.integers(1, a.size, size=500):
    out[:] = 0
    program([a.ctypes.data, out.ctypes.data], int(n))
    assert np.array_equal(out[:n], expected[:n]) and not out[n:].any(), n


def test_launches_from_several_threads():
  program = compile_cpu("axpb", AXPB_IR)
  errors = []

  def launch_many(seed):
    a = np.random.default_rng(seed).standard_normal(100_003).astype(np.float32)
    for _ in range(50):
      if not np.array_equal(run_unary(program, a), a * 2 + 1): errors.append(seed)

  threads = [threading.Thread(target=launch_many, args=(seed,)) for seed in range(3)]
  for thread in threads: thread.start()
  for thread in threads: thread.join(timeout=SUBPROCESS_TIMEOUT_S)
  assert not errors


# chunk_start[i] = start and chunk_end[i] = end for every i of a call [start, end): which chunk ran each iteration
CHUNKS_IR = stamp_target("""
define void @chunks(ptr noalias %args, i64 %start, i64 %end) {
entry:
  %starts = load ptr, ptr %args
  %ends_slot = getelementptr ptr, ptr %args, i64 1
  %ends = load ptr, ptr %ends_slot
  %nonempty = icmp slt i64 %start, %end
  br i1 %nonempty, label %loop, label %exit
loop:
  %i = phi i64 [ %start, %entry ], [ %i_next, %loop ]
  %start_at = getelementptr i64, ptr %starts, i64 %i
  store i64 %start, ptr %start_at
  %end_at = getelementptr i64, ptr %ends, i64 %i
  store i64 %end, ptr %end_at
  %i_next = add i64 %i, 1
  %more = icmp slt i64 %i_next, %end
  br i1 %more, label %loop, label %exit
exit:
  ret void
}
""")


def check_chunks(starts: np.ndarray, ends: np.ndarray, n: int, grain: int) -> None:
  """Every iteration ran once, in a chunk that starts at a multiple of `grain` and ends at one (or at n)."""
  assert (starts <= np.arange(n)).all() and (np.arange(n) < ends).all()
  assert (starts % grain == 0).all() and ((ends % grain == 0) | (ends == n)).all()


@pytest.mark.parametrize("parallel", [True, False])
@pytest.mark.parametrize("n, grain", [(1, 1), (4096, 4096), (4100, 4096), (12288, 4096), (1023, 4), (100_003, 4),
                                      (100_003, 1), (7, 64)])
def test_chunks_keep_grains_whole(n: int, grain: int, parallel: bool):
  program = compile_cpu("chunks", CHUNKS_IR)
  starts, ends = np.full(n, -1, np.int64), np.full(n, -1, np.int64)
  program([starts.ctypes.data, ends.ctypes.data], n, parallel, grain=grain)
  check_chunks(starts, ends, n, grain)
  if n <= grain: assert (starts == 0).all() and (ends == n).all()  # one grain: one call


def test_launch_list_runs_every_kernel_in_order():
  """One runtime call runs several launches over a slot table; a later launch sees what an earlier one wrote."""
  chunks, axpb = compile_cpu("chunks", CHUNKS_IR), compile_cpu("axpb", AXPB_IR)
  n, grain = 10_007, 8
  starts, ends = np.full(n, -1, np.int64), np.full(n, -1, np.int64)
  a = np.arange(n, dtype=np.float32)
  middle, out = np.zeros_like(a), np.zeros_like(a)
  launches = cpu.LaunchList([(chunks, (0, 1), n, grain, True), (axpb, (2, 3), n, 1, True),
                             (axpb, (3, 4), n, 1, False), (axpb, (2, 3), 0, 1, True)])
  assert launches.count == 3  # empty launches are dropped
  for _ in range(3):
    starts[:], middle[:], out[:] = -1, 0, 0
    launches([buffer.ctypes.data for buffer in (starts, ends, a, middle, out)])
    check_chunks(starts, ends, n, grain)
    np.testing.assert_array_equal(out, (a * 2 + 1) * 2 + 1)


def test_slow_kernel_small_count_matches_numpy():
  program = compile_cpu("slow", SLOW_IR)
  a = np.linspace(0, 1, 33, dtype=np.float32)
  out, count = np.zeros_like(a), np.array([5], dtype=np.int64)
  program([a.ctypes.data, out.ctypes.data, count.ctypes.data], a.size)
  np.testing.assert_allclose(out, slow_reference(a, 5), rtol=1e-6)


def test_disk_cache_entry_checks(tmp_path):
  store = DiskCache("unit", directory=str(tmp_path))
  assert store.get("a") is None
  store.put("a", b"payload of a")
  store.put("b", b"payload of b")
  assert store.get("a") == b"payload of a"
  entry = encode_entry("a", b"payload")
  assert decode_entry("a", entry) == b"payload"
  assert decode_entry("b", entry) is None  # stored under another key
  assert decode_entry("a", entry[:-1]) is None  # truncated
  flipped = bytearray(entry)
  flipped[-3] ^= 0x10
  assert decode_entry("a", bytes(flipped)) is None  # bit flip in the payload
  shutil.copy(store.path("a"), store.path("b"))  # swapped
  assert store.get("b") is None and store.stats["rejected"] == 1
  assert not [name for name in os.listdir(os.path.dirname(store.path("a"))) if name.startswith(".tmp")]


def test_unwritable_cache_is_not_an_error(tmp_path):
  blocker = tmp_path / "a_file"
  blocker.write_bytes(b"not a directory")
  store = DiskCache("unit", directory=str(blocker))
  store.put("key", b"value")
  assert store.stats["write_errors"] == 1 and store.get("key") is None


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_parallel_launch_in_forked_child():
  program = compile_cpu("axpb", AXPB_IR)
  a = np.arange(100_003, dtype=np.float32)
  run_unary(program, a)  # workers started in the parent
  child = os.fork()
  if child == 0:  # pragma: no cover (runs in the child)
    ok = np.array_equal(run_unary(program, a), a * 2 + 1)
    os._exit(0 if ok else 1)
  _, status = os.waitpid(child, 0)
  assert os.waitstatus_to_exitcode(status) == 0


def test_workers_waking_late_never_claim_a_finished_launch():
  """Workers that wake from their futex sleep (the program paused for a while) find launches that the launcher ran
  alone and finished; one that read such a launch's claim counter just before the next launch was published must not
  claim its grains. The runtime once let it (the next launch's grain count was read against the old counter): the
  grains ran twice, the increments below came out wrong, or the launcher waited forever on a grain count it had
  passed. Three threads on two cores make a late worker likely: the old runtime failed 4 of 5 runs of this."""
  script = CHILD_PRELUDE + """
import time
from test_devices import unary_kernel
from tinyjax.devices import cpu
increment = compile_cpu("increment", unary_kernel("increment", "%z = fadd float %x, 1.0"))
small, large = np.zeros(8, np.float32), np.zeros(4096, np.float32)
bursts, pairs = 2000, 20
launches = cpu.LaunchList([(increment, (0, 0), 8, 1, True), (increment, (1, 1), 4096, 1, True)] * pairs)
for burst in range(1, bursts + 1):
  time.sleep(0.001)  # (the workers fall asleep)
  launches([small.ctypes.data, large.ctypes.data])
  assert (small == burst * pairs).all() and (large == burst * pairs).all(), (burst, np.unique(large))
print("ok")
"""
  env = os.environ | {"TINYJAX_CPU_THREADS": "3"}
  try:
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env,
                            timeout=SUBPROCESS_TIMEOUT_S)
  except subprocess.TimeoutExpired:
    pytest.fail("a parallel launch never finished (a grain was counted twice)")
  assert result.returncode == 0 and result.stdout.strip().endswith("ok"), result.stderr[-2000:]


# ---- real subprocesses sharing a cache directory

CHILD_PRELUDE = f"""
import signal; signal.signal(signal.SIGINT, signal.default_int_handler)  # even if started with SIGINT ignored
import sys; sys.path.insert(0, {REPO_ROOT!r}); sys.path.insert(0, {os.path.dirname(os.path.abspath(__file__))!r})
import json, numpy as np
from test_devices import AXPB_IR, EXPF_IR, SLOW_IR, run_unary, slow_reference
from tinyjax.devices import cache_stats, compile_cpu
"""

CHILD_RUN_KERNELS = CHILD_PRELUDE + """
a = np.linspace(-3, 3, 100_003, dtype=np.float32)
np.testing.assert_array_equal(run_unary(compile_cpu("axpb", AXPB_IR), a), a * 2 + 1)
np.testing.assert_allclose(run_unary(compile_cpu("expf_kernel", EXPF_IR), a), np.exp(a), rtol=2e-6)
print(json.dumps(cache_stats()))
"""


def run_child(script: str) -> dict:
  """Run `script` in a fresh Python; return the cache_stats it printed as its last line."""
  result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=SUBPROCESS_TIMEOUT_S)
  assert result.returncode == 0, result.stderr
  return json.loads(result.stdout.strip().splitlines()[-1])


def entry_path(name: str, ir: str) -> str:
  return cpu._kernel_cache.path(cpu.object_code_key(name, ir, cpu.default_opt_level()))


def test_warm_process_compiles_nothing(cache_dir):
  cold = run_child(CHILD_RUN_KERNELS)
  assert cold["misses"] == 3 and cold["hits"] == 0  # the runtime and two kernels
  warm = run_child(CHILD_RUN_KERNELS)
  assert warm["misses"] == 0 and warm["hits"] == 3 and warm["rejected"] == 0
  assert warm["compile_seconds"] == 0.0


CHILD_JIT_FIRST = CHILD_PRELUDE + """
import tinyjax, tinyjax.numpy as jnp
from tinyjax.devices import cpu
x = jnp.asarray(np.arange(6.0, dtype=np.float32))
assert cpu._runtime is None
np.testing.assert_allclose(np.asarray(tinyjax.jit(lambda v: jnp.sin(v) * 2)(x)), np.sin(np.arange(6.0)) * 2, rtol=1e-6)
print(json.dumps(cache_stats() | {"worker_compiled_runtime": cpu._runtime_compile is not None}))
"""


def test_the_compile_worker_compiles_the_runtime_while_the_first_program_is_lowered(cache_dir):
  """A fresh process whose first work is a jitted program: the compile worker, started as the lowering begins,
  compiles the runtime module first (no disk-cache entry yet), and the runtime loads that object (counted and cached
  as a compile of this process's); the next process finds it."""
  if cpu._cpu_count() < 2: pytest.skip("one usable core: no compile worker is started")
  cold = run_child(CHILD_JIT_FIRST)
  assert cold["worker_compiled_runtime"] and cold["hits"] == 0 and cold["misses"] >= 2
  warm = run_child(CHILD_JIT_FIRST)
  assert not warm["worker_compiled_runtime"] and warm["misses"] == 0 and warm["hits"] >= 2


def _truncate(path):
  with open(path, "rb") as entry_file: entry = entry_file.read()
  with open(path, "wb") as entry_file: entry_file.write(entry[:len(entry) // 2])


def _flip_bit(path):
  with open(path, "rb") as entry_file: entry = bytearray(entry_file.read())
  entry[len(entry) * 3 // 4] ^= 0x04
  with open(path, "wb") as entry_file: entry_file.write(bytes(entry))


def _swap_in_other_kernel(path):
  shutil.copy(entry_path("axpb", AXPB_IR), path)


@pytest.mark.parametrize("damage", [_truncate, _flip_bit, _swap_in_other_kernel])
def test_damaged_entry_is_recompiled_and_replaced(cache_dir, damage):
  run_child(CHILD_RUN_KERNELS)
  damaged = entry_path("expf_kernel", EXPF_IR)
  damage(damaged)
  survived = run_child(CHILD_RUN_KERNELS)  # asserts correct results inside
  assert survived["rejected"] == 1 and survived["misses"] == 1 and survived["hits"] == 2
  with open(damaged, "rb") as entry_file:
    assert decode_entry(cpu.object_code_key("expf_kernel", EXPF_IR, cpu.default_opt_level()), entry_file.read())
  healed = run_child(CHILD_RUN_KERNELS)
  assert healed["misses"] == 0 and healed["rejected"] == 0


def test_concurrent_writers_leave_valid_entries(cache_dir):
  children = [subprocess.Popen([sys.executable, "-c", CHILD_RUN_KERNELS], stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True) for _ in range(2)]
  for child in children:
    _, stderr = child.communicate(timeout=SUBPROCESS_TIMEOUT_S)
    assert child.returncode == 0, stderr
  after = run_child(CHILD_RUN_KERNELS)
  assert after["misses"] == 0 and after["rejected"] == 0
  for directory, _, files in os.walk(cache_dir):
    assert not [name for name in files if name.startswith(".tmp")], directory


def test_debug_prints_ir_and_noopt_turns_optimisation_off(cache_dir):
  script = CHILD_PRELUDE + """
program = compile_cpu("axpb", AXPB_IR)
a = np.arange(1001, dtype=np.float32)
np.testing.assert_array_equal(run_unary(program, a), a * 2 + 1)
assert program.opt_level == 0
print(json.dumps(cache_stats()))
"""
  result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=SUBPROCESS_TIMEOUT_S,
                          env={**os.environ, "DEBUG": "4", "NOOPT": "1"})
  assert result.returncode == 0, result.stderr
  assert "define void @axpb(ptr noalias %args, i64 %start, i64 %end)" in result.stdout


CHILD_SLOW = CHILD_PRELUDE + """
parallel = sys.argv[1] == "parallel"
program = compile_cpu("slow", SLOW_IR)
a = np.linspace(0, 1, 2000, dtype=np.float32)
out, count = np.zeros_like(a), np.array([10_000_000], dtype=np.int64)  # ~20 ms per outer iteration: ~40 s in all
print("RUNNING", flush=True)
program([a.ctypes.data, out.ctypes.data, count.ctypes.data], a.size, parallel=parallel)
print("FINISHED", flush=True)
"""


@pytest.mark.parametrize("mode", ["serial", "parallel"])
def test_ctrl_c_interrupts_long_kernel(cache_dir, mode):
  child = subprocess.Popen([sys.executable, "-c", CHILD_SLOW, mode], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                           text=True)
  try:
    assert child.stdout.readline().strip() == "RUNNING"
    time.sleep(0.3)
    interrupted_at = time.perf_counter()
    child.send_signal(signal.SIGINT)
    stdout, stderr = child.communicate(timeout=10)
    exit_seconds = time.perf_counter() - interrupted_at
  finally:
    if child.poll() is None: child.kill()
  assert "FINISHED" not in stdout
  assert "KeyboardInterrupt" in stderr and child.returncode in (-signal.SIGINT, 1, 130), (child.returncode, stderr)
  assert exit_seconds < 2.0
  # the next process finds the cache valid: the slow kernel loads (or recompiles cleanly) and computes correctly
  check = CHILD_PRELUDE + """
program = compile_cpu("slow", SLOW_IR)
a = np.linspace(0, 1, 9, dtype=np.float32)
out, count = np.zeros_like(a), np.array([3], dtype=np.int64)
program([a.ctypes.data, out.ctypes.data, count.ctypes.data], a.size)
np.testing.assert_allclose(out, slow_reference(a, 3), rtol=1e-6)
print(json.dumps(cache_stats()))
"""
  stats = run_child(check)
  assert stats["rejected"] == 0 and stats["misses"] == 0


def test_runtime_threads():
  runtime = get_runtime()
  assert runtime.nthreads >= 1 and runtime.parallel_for_address and runtime.serial_for_address


def test_a_kernel_rejected_on_its_way_leaves_no_compile_thread_behind(cache_dir):
  """A kernel refused while a program's kernels are handed over (an unknown function) stops the stream: the thread
  feeding the worker ends instead of waiting for kernels that will not come."""
  import threading
  unknown = unary_kernel("calls_unknown_stream", "%z = call float @tj_no_such_function(float %x)",
                         "declare float @tj_no_such_function(float)")
  before = {t for t in threading.enumerate() if t.name == "tinyjax-compile-worker"}
  with pytest.raises(ValueError, match="tj_no_such_function"):
    compile_cpu_many(_fresh_kernels(3, "stream_before_unknown") + [("calls_unknown_stream", unknown)])
  assert {t for t in threading.enumerate() if t.name == "tinyjax-compile-worker"} == before
  kernels = _fresh_kernels(3, "stream_after")
  _check_adds(compile_cpu_many(kernels), kernels)
