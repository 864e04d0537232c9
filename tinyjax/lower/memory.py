"""Memory planning: where each buffer slot of a schedule lives during a run, decided once per compiled program.

A program's intermediate slots (neither inputs nor outputs) live in one arena allocated per run. Each is live from the
step that first touches it (its writer: nothing reads a slot before it is written) to the last step that touches it,
both included, so a kernel's outputs never share memory with its own inputs; a slot touched anywhere inside a loop
or a switch is live across that whole step, since its kernels run repeatedly or in an order known only at run time.
Slots whose intervals do not overlap share memory: the largest are placed first, each at the lowest 64-byte aligned
offset free over its interval (first fit by size), so a chain of N same-sized intermediates takes two of them, not N.
Outputs get buffers of their own, because they escape to the caller.

Donation (`jit(..., donate_argnums=...)`) lets an output be written into a donated input's buffer. That is safe when
the kernel that first writes the output runs after every other read of the input, and reads the input, if at all,
only at the element it is writing, before writing it (an optimizer's `p - lr * m / ...`); `donation_aliases` decides
which input goes to which output, once per compiled program. Steps inside loops and switches are never used.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

import numpy as np

from tinyjax.lower.schedule import HostCall, Kernel, Loop, Schedule, Switch, kernels_of
from tinyjax.uop import Ops

ALIGNMENT = 64  # bytes: a cache line, and every vector width the codegen uses


def _aligned(nbytes: int) -> int: return -(-nbytes // ALIGNMENT) * ALIGNMENT


def step_slots(step: Kernel | HostCall | Loop | Switch) -> set[int]:
  """Every slot a step touches: a kernel's (or host call's) buffers, or everything the steps of a loop or switch
  touch with its flag, its counter (which the runtime writes) or branch index."""
  if isinstance(step, (Kernel, HostCall)): return set(step.slots)
  slots = {slot for slot in (step.flag_slot, step.counter_slot) if slot >= 0} if isinstance(step, Loop) else set()
  if isinstance(step, Switch): slots.add(step.index_slot)
  inner = (*step.cond, *step.body) if isinstance(step, Loop) else tuple(s for branch in step.branches for s in branch)
  for kernel in kernels_of(inner): slots.update(kernel.slots)
  for nested in inner:
    if not isinstance(nested, Kernel): slots |= step_slots(nested)
  return slots


def liveness(schedule: Schedule) -> dict[int, tuple[int, int]]:
  """(first step, last step) touching each slot, over the schedule's top-level steps (slots never touched: none)."""
  intervals: dict[int, tuple[int, int]] = {}
  for position, step in enumerate(schedule.kernels):
    for slot in step_slots(step):
      first, _ = intervals.get(slot, (position, position))
      intervals[slot] = (first, position)
  return intervals


@dataclass(frozen=True)
class MemoryPlan:
  """Where a run's non-input slots live. `offsets[k]` is slot n_inputs + k's byte offset in the arena (-1 for an output,
  which gets its own buffer, and for a slot no step reads or writes: a scan's carry that its loop updates in another
  slot); `output_slots` are the distinct non-input output slots, allocated with `output_specs`
  (shape, dtype, nbytes), and output k of the program is entry `output_index[k]` of inputs[:n_inputs] + those buffers.
  `intermediate_bytes` is what allocating each intermediate on its own would take."""
  arena_bytes: int
  offsets: tuple[int, ...]
  output_slots: tuple[int, ...]
  output_specs: tuple[tuple[tuple[int, ...], np.dtype, int], ...]
  output_index: tuple[int, ...]
  intermediate_bytes: int
  # every non-input slot is an output, in slot order: a run's addresses are the inputs' then the outputs'
  outputs_in_order: bool = False


def plan_memory(schedule: Schedule, share: bool = True) -> MemoryPlan:
  """The memory plan of a schedule (see the module docstring). With `share` False every intermediate gets memory of
  its own (what the plan is tested against)."""
  n_inputs = schedule.n_inputs
  output_slots = tuple(dict.fromkeys(slot for slot in schedule.outputs if slot >= n_inputs))
  specs = [(shape, dtype, math.prod(shape) * dtype.itemsize) for shape, dtype in schedule.slot_specs]
  intervals = liveness(schedule)
  # the intermediates, largest first (ties: earliest first), each placed at the lowest offset free over its interval
  intermediates = [slot for slot in range(n_inputs, n_inputs + len(specs))
                   if slot not in output_slots and slot in intervals and specs[slot - n_inputs][2] > 0]
  intermediates.sort(key=lambda slot: (-specs[slot - n_inputs][2], intervals[slot][0]))
  offsets = [0 if slot in intervals else -1 for slot in range(n_inputs, n_inputs + len(specs))]
  placed: list[tuple[int, int, int, int]] = []  # (first step, last step, offset, end)
  for slot in intermediates:
    first, last = intervals[slot]
    size = _aligned(specs[slot - n_inputs][2])
    busy = sorted((offset, end) for start, stop, offset, end in placed if not share or start <= last and first <= stop)
    offset = 0
    for busy_offset, busy_end in busy:
      if offset + size <= busy_offset: break
      offset = max(offset, busy_end)
    placed.append((first, last, offset, offset + size))
    offsets[slot - n_inputs] = offset
  for slot in output_slots: offsets[slot - n_inputs] = -1
  position = {slot: n_inputs + k for k, slot in enumerate(output_slots)}
  arena_bytes = max((end for *_, end in placed), default=0)
  if len(output_slots) < len(specs):  # empty intermediates too point into an arena (a valid address, never read)
    arena_bytes = max(arena_bytes, ALIGNMENT)
  return MemoryPlan(arena_bytes, tuple(offsets), output_slots,
                    tuple(specs[slot - n_inputs] for slot in output_slots),
                    tuple(slot if slot < n_inputs else position[slot] for slot in schedule.outputs),
                    sum(specs[slot - n_inputs][2] for slot in intermediates),
                    arena_bytes == 0 and list(output_slots) == sorted(output_slots))


def _stores(kernel: Kernel) -> dict[int, list]:
  """The STORE nodes of a kernel by the slot they write."""
  stores: dict[int, list] = {}
  for node in kernel.ast.toposort:
    if node.op is Ops.STORE: stores.setdefault(kernel.slots[node.src[0].arg], []).append(node)
  return stores


def _reads_in_place(kernel: Kernel, source: int, target: int) -> bool:
  """Whether `kernel`, writing slot `target` with one STORE, reads slot `source` (if at all) only at the element that
  STORE writes and only for its value, so that each element of `source` is read before `target`'s is written over it
  (the codegen computes a node once per element, the STORE after its operands)."""
  stores = _stores(kernel).get(target, [])
  if kernel.sequential or len(stores) != 1: return False
  store = stores[0]
  feeding = set(store.toposort)
  for node in kernel.ast.toposort:
    if node.op is Ops.LOAD and kernel.slots[node.src[0].arg] == source:
      if len(node.src) > 2 or node.src[1] is not store.src[1] or node not in feeding: return False
  return True


def donation_aliases(schedule: Schedule, donated: Sequence[int],
                     input_specs: Sequence[tuple[tuple[int, ...], np.dtype]]) -> dict[int, int]:
  """Which donated input slot each output slot may be written into: {input slot: output slot}. An input that is
  itself an output (returned unchanged) maps to itself. `input_specs` are the inputs' (shape, dtype).

  An output qualifies when its first writer is a top-level kernel (not inside a loop or switch) that runs after
  every other step reading the input, and reads the input only in place (`_reads_in_place`). Outputs whose writer
  reads the donated input are tried first (an update of that input), then any other of the same shape and dtype."""
  n_inputs, steps = schedule.n_inputs, schedule.kernels
  in_control_flow: set[int] = set()
  last_touch: dict[int, int] = {}
  first_writer: dict[int, int] = {}
  for position, step in enumerate(steps):
    slots = step_slots(step)
    for slot in slots: last_touch[slot] = position
    if not isinstance(step, Kernel):
      in_control_flow |= slots
      continue
    for slot in _stores(step): first_writer.setdefault(slot, position)
  candidates = [slot for slot in dict.fromkeys(schedule.outputs) if slot >= n_inputs and slot not in in_control_flow
                and slot in first_writer]
  aliases: dict[int, int] = {}
  usable: dict[int, list[int]] = {}
  for source in dict.fromkeys(donated):
    if source >= n_inputs: continue  # an argument the program never reads has no slot
    if source in schedule.outputs:  # returned as it is: the output is the donated buffer
      aliases[source] = source
      continue
    shape, dtype = input_specs[source]
    # the input's other readers must all run before the output's writer, which may read it only in place
    usable[source] = [slot for slot in candidates
                      if schedule.slot_specs[slot - n_inputs] == (tuple(shape), np.dtype(dtype))
                      and last_touch.get(source, -1) <= first_writer[slot]
                      and (source not in steps[first_writer[slot]].slots
                           or _reads_in_place(steps[first_writer[slot]], source, slot))]
  # inputs with the fewest choices first, each taking the output fewest others could take (Adam's new moment and new
  # parameter both read the old moment: the moment gets the new moment, leaving the new parameter to the parameter),
  # then one whose writer reads it (an update of it)
  wanted = {slot: sum(slot in slots for slots in usable.values()) for slot in candidates}
  taken: set[int] = set()
  for source in sorted(usable, key=lambda source: len(usable[source])):
    choices = [slot for slot in usable[source] if slot not in taken]
    if not choices: continue
    chosen = min(choices, key=lambda slot: (wanted[slot], source not in steps[first_writer[slot]].slots))
    aliases[source] = chosen
    taken.add(chosen)
  return aliases
