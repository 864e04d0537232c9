"""The CPU runtime, written in LLVM IR: a thread pool that runs kernel chunks, and Ctrl-C handling.

Python makes one ctypes call per program run (ctypes releases the GIL); everything after that runs here:

  tj_run_launches(launches, count, launched) -> aborted  runs `count` records in order, each five i64: a kernel
      launch {fn, args, n, grain, mode} (mode 1: as tj_parallel_for (PARALLEL_GRAINS); 0: as tj_serial_for
      (first chunk n / SERIAL_CHUNKS); 2: one call of the kernel, for kernels too small to need chunks), or the
      header of a loop over the records after it (a counted loop, which may write its pass number into an int32
      counter buffer before each pass, or a while loop whose condition kernels leave a flag in a buffer: lax.scan /
      while_loop run here, not in Python). Sets *launched to the number of kernel launches it made.
      Clears the abort flag once, then stops at the first launch or loop pass that Ctrl-C cut short. A jitted
      program is one call of this, whatever its number of kernels and loop iterations.
  tj_parallel_for(fn, args, n, max_grains, grain) -> aborted  splits [0, n) into grains of a multiple of `grain`
      iterations (the kernel's own unit: a register tile of rows, a stream tile of columns, which a chunk must not
      cut), at most `max_grains` of them, each starting at a multiple of `grain`; the caller thread and the worker
      threads (one per extra core, started by pthread_create on the first parallel launch) claim runs of
      consecutive grains from one atomic counter until none are left, then the caller waits for the last run to
      finish. A thread's first claim is one grain; later claims grow while runs take well under CHUNK_TARGET_NS and
      shrink when over it, and never exceed 1/(2*threads) of what is left (guided scheduling), so cheap kernels make
      a handful of claims and long ones check the abort flag every few ms. One grain in all runs on the caller alone.
      Idle workers spin briefly (so back-to-back launches start fast), then sleep on a futex (so they burn no CPU).
  tj_serial_for(fn, args, n, first_chunk, grain) -> aborted  runs [0, n) on the calling thread in chunks (multiples of
      `grain`) that start at `first_chunk` iterations and grow the same way, so even a serial kernel checks the abort
      flag at least every outer iteration once iterations are slow, without slicing fast kernels thin.
  tj_install_sigint()  installs a SIGINT handler that sets the abort flag and chains to the previous handler
      (Python's, which then raises KeyboardInterrupt when the ctypes call returns). Chunks are skipped once the
      flag is set, so a launch ends within one chunk's time; it then returns 1 (else 0). The flag is cleared at the
      start of each launch. The new action copies the old one's flags and mask (Python's: no SA_RESTART), so
      blocking calls elsewhere in Python still see EINTR as before.
  tj_init(nworkers)  sets the pool size before the first parallel launch; tj_after_fork() (registered with
      os.register_at_fork) lets a forked child start its own workers.

`fn` is a kernel with the ABI `void fn(ptr args, i64 start, i64 end)`. One launch runs at a time on the pool; a
second thread launching meanwhile runs its kernel serially instead of waiting. Workers block all signals, so
signals reach the Python threads. Targets: glibc Linux on x86-64 and aarch64.
"""
from __future__ import annotations

import platform

SPIN_ITERATIONS = 8192  # pause instructions an idle thread spins for before sleeping on a futex (~0.1-0.3 ms)
CHUNK_TARGET_NS = 2_000_000  # chunks grow while they run faster than this, and shrink when slower (Ctrl-C latency)
MAX_THREADS = 256  # size of the pthread_t table; more cores than this get no extra workers
PARALLEL_GRAINS = 65536  # a parallel launch splits [0, n) into at most this many grains, claimed in adaptive runs
SERIAL_CHUNKS = 1024  # a serial launch starts with n // SERIAL_CHUNKS iterations per chunk (then adapts)
LAUNCH_FIELDS = ("fn", "args", "n", "grain", "mode")  # one record of tj_run_launches: that many i64
MODE_SERIAL, MODE_PARALLEL, MODE_WHOLE = 0, 1, 2  # how a record's kernel runs (see tj_run_launches)
_FUTEX_SYSCALL = {"x86_64": 202, "amd64": 202, "aarch64": 98, "arm64": 98}
_SPIN_HINT = {"x86_64": "pause", "amd64": "pause", "aarch64": "yield", "arm64": "yield"}
# Kernels run with subnormal floats flushed to zero, inputs and results, as XLA runs JAX's CPU programs (x86: MXCSR's
# FTZ and DAZ bits; aarch64: FPCR.FZ). Subnormal arithmetic is slow on x86 (an Adam moment decaying through the
# subnormals made a training step ~1.6x slower). The entries set it around their work and restore the caller's mode,
# so Python and numpy on the calling thread keep IEEE subnormals; the workers set it once.
_X86_FLOAT_MODE = r"""
declare void @llvm.x86.sse.stmxcsr(ptr)
declare void @llvm.x86.sse.ldmxcsr(ptr)

define internal i64 @tj_flush_subnormals() {{
  %slot = alloca i32, align 4
  call void @llvm.x86.sse.stmxcsr(ptr %slot)
  %old = load i32, ptr %slot
  %new = or i32 %old, 32832
  store i32 %new, ptr %slot
  call void @llvm.x86.sse.ldmxcsr(ptr %slot)
  %saved = zext i32 %old to i64
  ret i64 %saved
}}

define internal void @tj_restore_float_mode(i64 %saved) {{
  %slot = alloca i32, align 4
  %old = trunc i64 %saved to i32
  store i32 %old, ptr %slot
  call void @llvm.x86.sse.ldmxcsr(ptr %slot)
  ret void
}}
"""
_AARCH64_FLOAT_MODE = r"""
declare i64 @llvm.aarch64.get.fpcr()
declare void @llvm.aarch64.set.fpcr(i64)

define internal i64 @tj_flush_subnormals() {{
  %old = call i64 @llvm.aarch64.get.fpcr()
  %new = or i64 %old, 16777216
  call void @llvm.aarch64.set.fpcr(i64 %new)
  ret i64 %old
}}

define internal void @tj_restore_float_mode(i64 %saved) {{
  call void @llvm.aarch64.set.fpcr(i64 %saved)
  ret void
}}
"""
_FLOAT_MODE = {"x86_64": _X86_FLOAT_MODE, "amd64": _X86_FLOAT_MODE, "aarch64": _AARCH64_FLOAT_MODE,
               "arm64": _AARCH64_FLOAT_MODE}
FUTEX_WAIT_PRIVATE, FUTEX_WAKE_PRIVATE, SIGINT, SIG_BLOCK, CLOCK_MONOTONIC = 128, 129, 2, 0, 1

RUNTIME_SYMBOLS = ("tj_run_launches", "tj_parallel_for", "tj_serial_for", "tj_init", "tj_install_sigint",
                   "tj_after_fork", "tj_abort")


def runtime_ir(triple: str, data_layout: str, machine: str | None = None) -> str:
  """Return the LLVM IR text of the runtime module for the given target."""
  machine = (machine or platform.machine()).lower()
  if machine not in _FUTEX_SYSCALL: raise NotImplementedError(f"tinyjax CPU runtime: unsupported machine {machine}")
  return (_RUNTIME_TEMPLATE + _FLOAT_MODE[machine]).format(
    triple=triple, data_layout=data_layout, futex=_FUTEX_SYSCALL[machine], spin_hint=_SPIN_HINT[machine],
    spin=SPIN_ITERATIONS, chunk_target_ns=CHUNK_TARGET_NS, max_threads=MAX_THREADS, wait=FUTEX_WAIT_PRIVATE,
    wake=FUTEX_WAKE_PRIVATE, sigint=SIGINT, sig_block=SIG_BLOCK, clock=CLOCK_MONOTONIC,
    parallel_grains=PARALLEL_GRAINS, serial_chunks=SERIAL_CHUNKS, launch_fields=len(LAUNCH_FIELDS))


# Globals that threads write are each aligned to a 64-byte cache line so they don't share one.
# Job fields are read while a later job may be writing them, so they use atomic loads and stores; a worker only acts
# on what it read after a successful claim (cmpxchg on the counter, whose top 32 bits are the job's generation),
# which proves the job it read is still the current one. The grain count is read before the claim, so a launcher
# closes the finished job's counter (its grain field all ones) before it writes the next job's fields, and writes
# them with release stores that the workers' acquire load of the count pairs with: a worker that read the finished
# job's counter and then the next job's count fails its claim. (Without the close, such a worker claimed grains past
# the finished job's end, ran them with the next job's fields and counted them into the next job's `tj_done`, which
# then passed the grain count, and the launcher waited forever; or, in-place kernels, added twice. A worker is that
# late when it wakes from its futex sleep or starts while the launcher runs short launches alone: about 2% of fresh
# processes hung on their first launches, most bursts of launches after a pause on three threads.)
_RUNTIME_TEMPLATE = r"""
target triple = "{triple}"
target datalayout = "{data_layout}"

@tj_abort = global i32 0, align 64
@tj_busy = global i32 0, align 64
@tj_counter = global i64 0, align 64
@tj_job_gen = global i32 0, align 64
@tj_sleepers = global i32 0, align 64
@tj_done = global i32 0, align 64
@tj_launcher_sleeping = global i32 0, align 64
@tj_job_fn = global ptr null, align 64
@tj_job_args = global ptr null, align 8
@tj_job_n = global i64 0, align 8
@tj_job_nchunks = global i64 0, align 8
@tj_job_grain_size = global i64 0, align 8
@tj_nworkers = global i64 0, align 64
@tj_started = global i32 0, align 8
@tj_threads = global [{max_threads} x i64] zeroinitializer, align 64
@tj_sigint_installed = global i32 0, align 64
@tj_prev_action = global [64 x i64] zeroinitializer, align 64
@tj_new_action = global [64 x i64] zeroinitializer, align 64

declare i64 @syscall(i64, ...)
declare i32 @pthread_create(ptr, ptr, ptr, ptr)
declare i32 @pthread_sigmask(i32, ptr, ptr)
declare i32 @sigaction(i32, ptr, ptr)
declare i32 @clock_gettime(i32, ptr)
declare void @llvm.memcpy.p0.p0.i64(ptr, ptr, i64, i1)
declare void @llvm.memset.p0.i64(ptr, i8, i64, i1)

define internal void @tj_spin_hint() alwaysinline {{
  call void asm sideeffect "{spin_hint}", "~{{memory}}"()
  ret void
}}

define internal void @tj_futex_wait(ptr %word, i32 %expected) {{
  %value = zext i32 %expected to i64
  %ignored = call i64 (i64, ...) @syscall(i64 {futex}, ptr %word, i64 {wait}, i64 %value, ptr null, ptr null, i64 0)
  ret void
}}

define internal void @tj_futex_wake_all(ptr %word) {{
  %ignored = call i64 (i64, ...) @syscall(i64 {futex}, ptr %word, i64 {wake}, i64 2147483647, ptr null, ptr null, i64 0)
  ret void
}}

define internal i64 @tj_now_ns() {{
  %timespec = alloca [2 x i64], align 8
  %ignored = call i32 @clock_gettime(i32 {clock}, ptr %timespec)
  %seconds = load i64, ptr %timespec, align 8
  %nanoseconds_ptr = getelementptr [2 x i64], ptr %timespec, i64 0, i64 1
  %nanoseconds = load i64, ptr %nanoseconds_ptr, align 8
  %scaled = mul i64 %seconds, 1000000000
  %total = add i64 %scaled, %nanoseconds
  ret i64 %total
}}

; first iteration of grain g when [0, n) is cut into grains of `grain_size` iterations (the last may be shorter)
define internal i64 @tj_grain_start(i64 %n, i64 %grain_size, i64 %grain) {{
  %offset = mul i64 %grain, %grain_size
  %start = call i64 @llvm.umin.i64(i64 %offset, i64 %n)
  ret i64 %start
}}

; the smallest multiple of `unit` (at least 1) that is >= max(value, 1)
define internal i64 @tj_round_up(i64 %value, i64 %unit) {{
  %unit_positive = call i64 @llvm.smax.i64(i64 %unit, i64 1)
  %value_positive = call i64 @llvm.smax.i64(i64 %value, i64 1)
  %biased = add i64 %value_positive, %unit_positive
  %biased_less_one = sub i64 %biased, 1
  %units = udiv i64 %biased_less_one, %unit_positive
  %rounded = mul i64 %units, %unit_positive
  ret i64 %rounded
}}

; how many grains the next claim takes, from how long the last claim of `take` grains ran: grow fast while far
; under the time target (so cheap kernels make few claims), shrink when over it (so Ctrl-C is seen quickly)
define internal i64 @tj_next_take(i64 %take, i64 %elapsed_ns) {{
entry:
  %elapsed8 = mul i64 %elapsed_ns, 8
  %far_under = icmp slt i64 %elapsed8, {chunk_target_ns}
  br i1 %far_under, label %grow8, label %check_under
grow8:
  %times8 = mul i64 %take, 8
  ret i64 %times8
check_under:
  %elapsed2 = mul i64 %elapsed_ns, 2
  %under = icmp slt i64 %elapsed2, {chunk_target_ns}
  br i1 %under, label %grow2, label %check_over
grow2:
  %times2 = mul i64 %take, 2
  ret i64 %times2
check_over:
  %over = icmp sgt i64 %elapsed_ns, {chunk_target_ns}
  %halved = lshr i64 %take, 1
  %at_least_one = call i64 @llvm.umax.i64(i64 %halved, i64 1)
  %next = select i1 %over, i64 %at_least_one, i64 %take
  ret i64 %next
}}
declare i64 @llvm.umax.i64(i64, i64)

; Claim and run grains of job generation %gen until none are left (or the job is no longer current). A claim takes
; consecutive grains, as many as the time target allows (tj_next_take) but at most a 1/(2*threads) share of what
; is left (guided scheduling, so the threads finish together), and runs them as one call of the kernel.
define internal void @tj_work(i32 %gen) {{
entry:
  %gen64 = zext i32 %gen to i64
  %nworkers = load i64, ptr @tj_nworkers, align 8
  %nthreads = add i64 %nworkers, 1
  %share_divisor = mul i64 %nthreads, 2
  br label %claim
claim:
  %take_wanted = phi i64 [ 1, %entry ], [ %take_wanted, %try_claim ], [ %take_wanted, %skipped ], [ %take_next, %ran ]
  %counter = load atomic i64, ptr @tj_counter seq_cst, align 8
  %counter_gen = lshr i64 %counter, 32
  %same_job = icmp eq i64 %counter_gen, %gen64
  br i1 %same_job, label %check, label %exit
check:
  %grain = and i64 %counter, 4294967295
  %ngrains = load atomic i64, ptr @tj_job_nchunks acquire, align 8
  %left = icmp ult i64 %grain, %ngrains
  br i1 %left, label %try_claim, label %exit
try_claim:
  %remaining = sub i64 %ngrains, %grain
  %share = udiv i64 %remaining, %share_divisor
  %share_at_least_one = call i64 @llvm.umax.i64(i64 %share, i64 1)
  %take = call i64 @llvm.umin.i64(i64 %take_wanted, i64 %share_at_least_one)
  %next = add i64 %counter, %take
  %pair = cmpxchg ptr @tj_counter, i64 %counter, i64 %next seq_cst seq_cst
  %claimed = extractvalue {{ i64, i1 }} %pair, 1
  br i1 %claimed, label %run, label %claim
run:
  %abort = load atomic i32, ptr @tj_abort monotonic, align 4
  %aborted = icmp ne i32 %abort, 0
  br i1 %aborted, label %skipped, label %call
skipped:
  %done_skipped = call i1 @tj_finish_grains(i64 %take, i64 %ngrains)
  br i1 %done_skipped, label %exit, label %claim
call:
  %fn = load atomic ptr, ptr @tj_job_fn monotonic, align 8
  %args = load atomic ptr, ptr @tj_job_args monotonic, align 8
  %n = load atomic i64, ptr @tj_job_n monotonic, align 8
  %grain_size = load atomic i64, ptr @tj_job_grain_size monotonic, align 8
  %start = call i64 @tj_grain_start(i64 %n, i64 %grain_size, i64 %grain)
  %grain_end = add i64 %grain, %take
  %end = call i64 @tj_grain_start(i64 %n, i64 %grain_size, i64 %grain_end)
  %time_before = call i64 @tj_now_ns()
  call void %fn(ptr %args, i64 %start, i64 %end)
  %time_after = call i64 @tj_now_ns()
  %elapsed = sub i64 %time_after, %time_before
  %take_next = call i64 @tj_next_take(i64 %take, i64 %elapsed)
  %done_ran = call i1 @tj_finish_grains(i64 %take, i64 %ngrains)
  br label %ran
ran:
  br i1 %done_ran, label %exit, label %claim
exit:
  ret void
}}

; count `take` grains as done; the thread finishing the last one wakes the launcher if it sleeps. Returns whether
; the job is complete.
define internal i1 @tj_finish_grains(i64 %take, i64 %ngrains) {{
entry:
  %take32 = trunc i64 %take to i32
  %done_before = atomicrmw add ptr @tj_done, i32 %take32 seq_cst
  %done = add i32 %done_before, %take32
  %done64 = zext i32 %done to i64
  %all_done = icmp eq i64 %done64, %ngrains
  br i1 %all_done, label %maybe_wake, label %not_done
maybe_wake:
  %sleeping = load atomic i32, ptr @tj_launcher_sleeping seq_cst, align 4
  %is_sleeping = icmp ne i32 %sleeping, 0
  br i1 %is_sleeping, label %wake, label %complete
wake:
  call void @tj_futex_wake_all(ptr @tj_done)
  br label %complete
complete:
  ret i1 true
not_done:
  ret i1 false
}}

define internal ptr @tj_worker_main(ptr %unused) {{
entry:
  %all_signals = alloca [32 x i64], align 16
  call void @llvm.memset.p0.i64(ptr %all_signals, i8 -1, i64 256, i1 false)
  %ignored = call i32 @pthread_sigmask(i32 {sig_block}, ptr %all_signals, ptr null)
  %float_mode = call i64 @tj_flush_subnormals()
  br label %wait
wait:
  %last_gen = phi i32 [ 0, %entry ], [ %gen, %got_job ], [ %last_gen, %slept ]
  br label %spin
spin:
  %spins = phi i32 [ 0, %wait ], [ %spins_next, %spin_more ]
  %gen = load atomic i32, ptr @tj_job_gen seq_cst, align 4
  %new_job = icmp ne i32 %gen, %last_gen
  br i1 %new_job, label %got_job, label %spin_more
spin_more:
  call void @tj_spin_hint()
  %spins_next = add i32 %spins, 1
  %keep_spinning = icmp ult i32 %spins_next, {spin}
  br i1 %keep_spinning, label %spin, label %sleep
sleep:
  %sleepers_before = atomicrmw add ptr @tj_sleepers, i32 1 seq_cst
  %gen_now = load atomic i32, ptr @tj_job_gen seq_cst, align 4
  %still_idle = icmp eq i32 %gen_now, %last_gen
  br i1 %still_idle, label %futex_sleep, label %woke
futex_sleep:
  call void @tj_futex_wait(ptr @tj_job_gen, i32 %last_gen)
  br label %woke
woke:
  %sleepers_after = atomicrmw sub ptr @tj_sleepers, i32 1 seq_cst
  br label %slept
slept:
  br label %wait
got_job:
  call void @tj_work(i32 %gen)
  br label %wait
}}

define internal void @tj_start_workers() {{
entry:
  %nworkers = load i64, ptr @tj_nworkers, align 8
  br label %loop
loop:
  %index = phi i64 [ 0, %entry ], [ %index_next, %loop_body ]
  %more = icmp slt i64 %index, %nworkers
  br i1 %more, label %loop_body, label %exit
loop_body:
  %slot = getelementptr [{max_threads} x i64], ptr @tj_threads, i64 0, i64 %index
  %status = call i32 @pthread_create(ptr %slot, ptr null, ptr @tj_worker_main, ptr null)
  %index_next = add i64 %index, 1
  br label %loop
exit:
  store i32 1, ptr @tj_started, align 4
  ret void
}}

; in a child process after fork(): no workers exist and no launch is running there
define void @tj_after_fork() {{
  store i32 0, ptr @tj_started, align 4
  store i32 0, ptr @tj_busy, align 4
  store i32 0, ptr @tj_sleepers, align 4
  store i32 0, ptr @tj_launcher_sleeping, align 4
  store i64 0, ptr @tj_counter, align 8
  store i32 0, ptr @tj_job_gen, align 4
  ret void
}}

; set the number of worker threads (cores - 1); takes effect before the first parallel launch only
define void @tj_init(i64 %nworkers) {{
  %clamped_low = call i64 @llvm.smax.i64(i64 %nworkers, i64 0)
  %clamped = call i64 @llvm.smin.i64(i64 %clamped_low, i64 {max_threads})
  %started = load i32, ptr @tj_started, align 4
  %can_set = icmp eq i32 %started, 0
  br i1 %can_set, label %set, label %exit
set:
  store i64 %clamped, ptr @tj_nworkers, align 8
  br label %exit
exit:
  ret void
}}
declare i64 @llvm.smax.i64(i64, i64)
declare i64 @llvm.smin.i64(i64, i64)
declare i64 @llvm.umin.i64(i64, i64)

; the exported entries clear the abort flag first; inside a program run (tj_run_launches) it is cleared once, at
; the start, so that a Ctrl-C during any launch or loop pass stops the whole run
define i32 @tj_serial_for(ptr %fn, ptr %args, i64 %n, i64 %first_chunk, i64 %grain) {{
  store atomic i32 0, ptr @tj_abort seq_cst, align 4
  %float_mode = call i64 @tj_flush_subnormals()
  %aborted = call i32 @tj_serial_run(ptr %fn, ptr %args, i64 %n, i64 %first_chunk, i64 %grain)
  call void @tj_restore_float_mode(i64 %float_mode)
  ret i32 %aborted
}}

define i32 @tj_parallel_for(ptr %fn, ptr %args, i64 %n, i64 %max_grains, i64 %grain) {{
  store atomic i32 0, ptr @tj_abort seq_cst, align 4
  %float_mode = call i64 @tj_flush_subnormals()
  %aborted = call i32 @tj_parallel_run(ptr %fn, ptr %args, i64 %n, i64 %max_grains, i64 %grain)
  call void @tj_restore_float_mode(i64 %float_mode)
  ret i32 %aborted
}}

define internal i32 @tj_serial_run(ptr %fn, ptr %args, i64 %n, i64 %first_chunk, i64 %grain) {{
entry:
  %first = call i64 @tj_round_up(i64 %first_chunk, i64 %grain)
  br label %loop
loop:
  %start = phi i64 [ 0, %entry ], [ %end, %ran ]
  %size = phi i64 [ %first, %entry ], [ %size_next, %ran ]
  %more = icmp slt i64 %start, %n
  br i1 %more, label %check_abort, label %exit
check_abort:
  %abort = load atomic i32, ptr @tj_abort monotonic, align 4
  %aborted = icmp ne i32 %abort, 0
  br i1 %aborted, label %exit, label %body
body:
  %remaining = sub i64 %n, %start
  %length = call i64 @llvm.umin.i64(i64 %size, i64 %remaining)
  %end = add i64 %start, %length
  %time_before = call i64 @tj_now_ns()
  call void %fn(ptr %args, i64 %start, i64 %end)
  %time_after = call i64 @tj_now_ns()
  %elapsed = sub i64 %time_after, %time_before
  %size_adapted = call i64 @tj_next_take(i64 %size, i64 %elapsed)
  %size_capped = call i64 @llvm.umin.i64(i64 %size_adapted, i64 %n)
  %size_next = call i64 @tj_round_up(i64 %size_capped, i64 %grain)
  br label %ran
ran:
  br label %loop
exit:
  %aborted_at_exit = load atomic i32, ptr @tj_abort seq_cst, align 4
  ret i32 %aborted_at_exit
}}

define internal i32 @tj_parallel_run(ptr %fn, ptr %args, i64 %n, i64 %max_grains, i64 %grain) {{
entry:
  %empty = icmp sle i64 %n, 0
  br i1 %empty, label %exit, label %split
split:
  ; grains of a multiple of `grain` iterations, at most max_grains (and 2**30, the counter's width) of them
  %grains_wanted = call i64 @llvm.smin.i64(i64 %max_grains, i64 1073741824)
  %grains_at_least_one = call i64 @llvm.smax.i64(i64 %grains_wanted, i64 1)
  %fair_size = add i64 %n, %grains_at_least_one
  %fair_size_less_one = sub i64 %fair_size, 1
  %smallest_size = udiv i64 %fair_size_less_one, %grains_at_least_one
  %grain_size = call i64 @tj_round_up(i64 %smallest_size, i64 %grain)
  %n_biased = add i64 %n, %grain_size
  %n_biased_less_one = sub i64 %n_biased, 1
  %nchunks = udiv i64 %n_biased_less_one, %grain_size
  %nchunks32 = trunc i64 %nchunks to i32
  %one_grain = icmp eq i64 %nchunks, 1
  br i1 %one_grain, label %serial, label %check_workers
check_workers:
  %nworkers = load i64, ptr @tj_nworkers, align 8
  %no_workers = icmp eq i64 %nworkers, 0
  br i1 %no_workers, label %serial, label %lock
lock:
  %lock_pair = cmpxchg ptr @tj_busy, i32 0, i32 1 seq_cst seq_cst
  %locked = extractvalue {{ i32, i1 }} %lock_pair, 1
  br i1 %locked, label %ensure_started, label %serial
serial:
  %first_chunk = udiv i64 %n, {serial_chunks}
  %serial_aborted = call i32 @tj_serial_run(ptr %fn, ptr %args, i64 %n, i64 %first_chunk, i64 %grain)
  ret i32 %serial_aborted
ensure_started:
  %started = load i32, ptr @tj_started, align 4
  %not_started = icmp eq i32 %started, 0
  br i1 %not_started, label %start, label %publish
start:
  call void @tj_start_workers()
  br label %publish
publish:
  %old_gen = load atomic i32, ptr @tj_job_gen seq_cst, align 4
  %old_gen64 = zext i32 %old_gen to i64
  %old_gen_shifted = shl i64 %old_gen64, 32
  %closed = or i64 %old_gen_shifted, 4294967295
  store atomic i64 %closed, ptr @tj_counter seq_cst, align 8
  store atomic i64 %grain_size, ptr @tj_job_grain_size release, align 8
  store atomic ptr %fn, ptr @tj_job_fn release, align 8
  store atomic ptr %args, ptr @tj_job_args release, align 8
  store atomic i64 %n, ptr @tj_job_n release, align 8
  store atomic i64 %nchunks, ptr @tj_job_nchunks release, align 8
  store atomic i32 0, ptr @tj_done seq_cst, align 4
  %gen = add i32 %old_gen, 1
  %gen64 = zext i32 %gen to i64
  %counter = shl i64 %gen64, 32
  store atomic i64 %counter, ptr @tj_counter seq_cst, align 8
  store atomic i32 %gen, ptr @tj_job_gen seq_cst, align 4
  %sleepers = load atomic i32, ptr @tj_sleepers seq_cst, align 4
  %any_sleeping = icmp ne i32 %sleepers, 0
  br i1 %any_sleeping, label %wake_workers, label %work
wake_workers:
  call void @tj_futex_wake_all(ptr @tj_job_gen)
  br label %work
work:
  call void @tj_work(i32 %gen)
  br label %wait
wait:
  %spins = phi i32 [ 0, %work ], [ %spins_next, %spin_more ], [ 0, %slept ]
  %done = load atomic i32, ptr @tj_done seq_cst, align 4
  %all_done = icmp eq i32 %done, %nchunks32
  br i1 %all_done, label %unlock, label %spin_more
spin_more:
  call void @tj_spin_hint()
  %spins_next = add i32 %spins, 1
  %keep_spinning = icmp ult i32 %spins_next, {spin}
  br i1 %keep_spinning, label %wait, label %sleep
sleep:
  store atomic i32 1, ptr @tj_launcher_sleeping seq_cst, align 4
  %done_now = load atomic i32, ptr @tj_done seq_cst, align 4
  %still_running = icmp ne i32 %done_now, %nchunks32
  br i1 %still_running, label %futex_sleep, label %slept
futex_sleep:
  call void @tj_futex_wait(ptr @tj_done, i32 %done_now)
  br label %slept
slept:
  store atomic i32 0, ptr @tj_launcher_sleeping seq_cst, align 4
  br label %wait
unlock:
  store atomic i32 0, ptr @tj_busy seq_cst, align 4
  br label %exit
exit:
  %aborted_at_exit = load atomic i32, ptr @tj_abort seq_cst, align 4
  ret i32 %aborted_at_exit
}}

; run `count` records of {launch_fields} i64 in order; stop at one cut short. A record is a kernel launch
; {{fn, args, n, grain, mode}} (mode 1: parallel; 0: serial in adaptive chunks; 2: serial in one call, for kernels too
; small to need chunks), or (fn = 0) the header of a block of the records after it: n >= 0 runs the next
; `grain` records n times; n = -1 runs the next `parallel` records (a condition), then, while the i8 flag at the buffer
; whose address is at `args` is non-zero, the `grain` records after them and the condition again; n = -2 is a switch:
; `grain` one-pass blocks (`parallel` records in all) follow, and the one the i32 at the buffer at `args` picks runs.
; The i64 at %launched is set to the number of kernel launches (each adds 1 to it).
define i32 @tj_run_launches(ptr %launches, i64 %count, ptr %launched) {{
  store atomic i32 0, ptr @tj_abort seq_cst, align 4
  store i64 0, ptr %launched, align 8
  %float_mode = call i64 @tj_flush_subnormals()
  %aborted = call i32 @tj_run_records(ptr %launches, i64 %count, ptr %launched)
  call void @tj_restore_float_mode(i64 %float_mode)
  ret i32 %aborted
}}

define internal i32 @tj_run_records(ptr %launches, i64 %count, ptr %launched) {{
entry:
  br label %loop
loop:
  %index = phi i64 [ 0, %entry ], [ %index_next, %next ], [ %after_block, %block_done ]
  %more = icmp slt i64 %index, %count
  br i1 %more, label %body, label %done
body:
  %record_offset = mul i64 %index, {launch_fields}
  %record = getelementptr i64, ptr %launches, i64 %record_offset
  %fn_int = load i64, ptr %record, align 8
  %fn = inttoptr i64 %fn_int to ptr
  %args_field = getelementptr i64, ptr %record, i64 1
  %args_int = load i64, ptr %args_field, align 8
  %args = inttoptr i64 %args_int to ptr
  %n_field = getelementptr i64, ptr %record, i64 2
  %n = load i64, ptr %n_field, align 8
  %grain_field = getelementptr i64, ptr %record, i64 3
  %grain = load i64, ptr %grain_field, align 8
  %parallel_field = getelementptr i64, ptr %record, i64 4
  %parallel = load i64, ptr %parallel_field, align 8
  %is_header = icmp eq i64 %fn_int, 0
  br i1 %is_header, label %header, label %launch
launch:
  %launched_before = load i64, ptr %launched, align 8
  %launched_after = add i64 %launched_before, 1
  store i64 %launched_after, ptr %launched, align 8
  %is_parallel = icmp eq i64 %parallel, 1
  br i1 %is_parallel, label %run_parallel, label %check_whole
check_whole:
  %is_whole = icmp eq i64 %parallel, 2
  br i1 %is_whole, label %run_whole, label %run_serial
run_parallel:
  %parallel_aborted = call i32 @tj_parallel_run(ptr %fn, ptr %args, i64 %n, i64 {parallel_grains}, i64 %grain)
  br label %ran
run_serial:
  %first_chunk = udiv i64 %n, {serial_chunks}
  %serial_aborted = call i32 @tj_serial_run(ptr %fn, ptr %args, i64 %n, i64 %first_chunk, i64 %grain)
  br label %ran
run_whole:
  call void %fn(ptr %args, i64 0, i64 %n)
  %whole_abort = load atomic i32, ptr @tj_abort monotonic, align 4
  br label %ran
ran:
  %aborted = phi i32 [ %parallel_aborted, %run_parallel ], [ %serial_aborted, %run_serial ],
                     [ %whole_abort, %run_whole ]
  %was_aborted = icmp ne i32 %aborted, 0
  br i1 %was_aborted, label %stopped, label %next
next:
  %index_next = add i64 %index, 1
  br label %loop
header:
  %block = getelementptr i64, ptr %record, i64 {launch_fields}
  %block_aborted = call i32 @tj_run_block(ptr %block, ptr %args, i64 %n, i64 %grain, i64 %parallel, ptr %launched)
  %is_while = icmp eq i64 %n, -1
  %is_switch = icmp eq i64 %n, -2
  %while_records = add i64 %grain, %parallel
  %loop_records = select i1 %is_while, i64 %while_records, i64 %grain
  %block_records = select i1 %is_switch, i64 %parallel, i64 %loop_records
  %block_span = add i64 %block_records, 1
  %after_block = add i64 %index, %block_span
  %block_stopped = icmp ne i32 %block_aborted, 0
  br i1 %block_stopped, label %stopped, label %block_done
block_done:
  br label %loop
stopped:
  ret i32 1
done:
  ret i32 0
}}

; the block after a header record (see tj_run_launches): a counted loop or a while loop over records
define internal i32 @tj_run_block(ptr %block, ptr %flag_entry, i64 %n, i64 %body_count, i64 %cond_count,
                                  ptr %launched) {{
entry:
  %is_while = icmp eq i64 %n, -1
  br i1 %is_while, label %while_cond, label %check_switch
check_switch:
  %is_switch = icmp eq i64 %n, -2
  br i1 %is_switch, label %switch, label %repeat
switch:
  ; %body_count branches follow, each a one-pass block (header and records); run the one the i32 index picks
  %index_buffer = load ptr, ptr %flag_entry, align 8
  %index32 = load volatile i32, ptr %index_buffer, align 4
  %index64 = sext i32 %index32 to i64
  %last_branch = sub i64 %body_count, 1
  %index_low = call i64 @llvm.smax.i64(i64 %index64, i64 0)
  %chosen = call i64 @llvm.smin.i64(i64 %index_low, i64 %last_branch)
  br label %find
find:
  %branch = phi i64 [ 0, %switch ], [ %branch_next, %find_next ]
  %branch_header = phi ptr [ %block, %switch ], [ %next_header, %find_next ]
  %found = icmp eq i64 %branch, %chosen
  br i1 %found, label %run_branch, label %find_next
find_next:
  %branch_count_field = getelementptr i64, ptr %branch_header, i64 3
  %branch_count = load i64, ptr %branch_count_field, align 8
  %branch_span = add i64 %branch_count, 1
  %branch_words = mul i64 %branch_span, {launch_fields}
  %next_header = getelementptr i64, ptr %branch_header, i64 %branch_words
  %branch_next = add i64 %branch, 1
  br label %find
run_branch:
  %branch_status = call i32 @tj_run_records(ptr %branch_header, i64 1, ptr %launched)
  ret i32 %branch_status
repeat:
  %trip = phi i64 [ 0, %check_switch ], [ %trip_next, %repeat_next ]
  %more = icmp slt i64 %trip, %n
  br i1 %more, label %repeat_body, label %finished
repeat_body:
  ; a counted loop with a counter buffer (its table entry in place of a flag's) gets the pass number written there
  %has_counter = icmp ne ptr %flag_entry, null
  br i1 %has_counter, label %write_counter, label %repeat_run
write_counter:
  %counter_buffer = load ptr, ptr %flag_entry, align 8
  %pass32 = trunc i64 %trip to i32
  store volatile i32 %pass32, ptr %counter_buffer, align 4
  br label %repeat_run
repeat_run:
  %repeat_status = call i32 @tj_run_records(ptr %block, i64 %body_count, ptr %launched)
  %repeat_stopped = icmp ne i32 %repeat_status, 0
  br i1 %repeat_stopped, label %aborted, label %repeat_next
repeat_next:
  %trip_next = add i64 %trip, 1
  %repeat_abort = load atomic i32, ptr @tj_abort monotonic, align 4
  %repeat_interrupted = icmp ne i32 %repeat_abort, 0
  br i1 %repeat_interrupted, label %aborted, label %repeat
while_cond:
  %cond_status = call i32 @tj_run_records(ptr %block, i64 %cond_count, ptr %launched)
  %cond_stopped = icmp ne i32 %cond_status, 0
  br i1 %cond_stopped, label %aborted, label %while_test
while_test:
  %flag_buffer = load ptr, ptr %flag_entry, align 8
  %flag = load volatile i8, ptr %flag_buffer, align 1
  %go_on = icmp ne i8 %flag, 0
  br i1 %go_on, label %while_body, label %finished
while_body:
  %body_offset = mul i64 %cond_count, {launch_fields}
  %body_records = getelementptr i64, ptr %block, i64 %body_offset
  %body_status = call i32 @tj_run_records(ptr %body_records, i64 %body_count, ptr %launched)
  %body_stopped = icmp ne i32 %body_status, 0
  br i1 %body_stopped, label %aborted, label %while_check
while_check:
  %while_abort = load atomic i32, ptr @tj_abort monotonic, align 4
  %while_interrupted = icmp ne i32 %while_abort, 0
  br i1 %while_interrupted, label %aborted, label %while_cond
finished:
  ret i32 0
aborted:
  ret i32 1
}}

; SIGINT: set the abort flag, then chain to the previous handler (Python's C handler)
define internal void @tj_on_sigint(i32 %signal, ptr %info, ptr %context) {{
entry:
  store atomic volatile i32 1, ptr @tj_abort seq_cst, align 4
  %previous = load ptr, ptr @tj_prev_action, align 8
  %previous_int = ptrtoint ptr %previous to i64
  %is_special = icmp ule i64 %previous_int, 1
  br i1 %is_special, label %exit, label %chain
chain:
  call void %previous(i32 %signal, ptr %info, ptr %context)
  br label %exit
exit:
  ret void
}}

; returns 1 if installed (now or before), -1 on failure, 0 if the previous handler was SIG_DFL/SIG_IGN (left alone)
define i32 @tj_install_sigint() {{
entry:
  %installed = load i32, ptr @tj_sigint_installed, align 4
  %already = icmp ne i32 %installed, 0
  br i1 %already, label %done, label %query
query:
  %query_status = call i32 @sigaction(i32 {sigint}, ptr null, ptr @tj_prev_action)
  %query_failed = icmp ne i32 %query_status, 0
  br i1 %query_failed, label %failed, label %check_previous
check_previous:
  %previous = load ptr, ptr @tj_prev_action, align 8
  %previous_int = ptrtoint ptr %previous to i64
  %is_special = icmp ule i64 %previous_int, 1
  br i1 %is_special, label %left_alone, label %install
install:
  call void @llvm.memcpy.p0.p0.i64(ptr @tj_new_action, ptr @tj_prev_action, i64 512, i1 false)
  store ptr @tj_on_sigint, ptr @tj_new_action, align 8
  %install_status = call i32 @sigaction(i32 {sigint}, ptr @tj_new_action, ptr null)
  %install_failed = icmp ne i32 %install_status, 0
  br i1 %install_failed, label %failed, label %mark
mark:
  store i32 1, ptr @tj_sigint_installed, align 4
  br label %done
done:
  ret i32 1
left_alone:
  ret i32 0
failed:
  ret i32 -1
}}
"""
