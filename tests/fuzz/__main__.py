"""`python -m tests.fuzz --seed S --minutes M` (or `--count N`): check random programs, print each
failure as a minimal repro, a summary by kind, and the throughput. Exits 1 when anything failed (names not built
yet only count with --strict)."""
from __future__ import annotations

import argparse
import collections
import sys

from tests.fuzz.programs import search


def main(argv: list[str] | None = None) -> int:
  parser = argparse.ArgumentParser(prog="python -m tests.fuzz", description=__doc__)
  parser.add_argument("--seed", type=int, default=1)
  parser.add_argument("--minutes", type=float, default=None, help="how long to search (default: 1 unless --count)")
  parser.add_argument("--count", type=int, default=None, help="how many programs to check")
  parser.add_argument("--no-shrink", action="store_true", help="print failing programs as found, unminimised")
  parser.add_argument("--strict", action="store_true", help="count 'not built' (NotImplementedError) as failures")
  args = parser.parse_args(argv)
  seconds = None if args.minutes is None and args.count is not None else 60 * (args.minutes or 1)
  report = search(args.seed, count=args.count, seconds=seconds, shrink=not args.no_shrink)

  seen = set()
  for failure in report.failures:
    key = (failure.kind, failure.program.source())
    if key in seen: continue
    seen.add(key)
    print(f"--- {failure.summary()}\n{failure.program.source()}\n")
  kinds = collections.Counter(f.kind for f in report.failures)
  print(f"checked {report.checked} programs in {report.seconds:.1f} s ({report.per_minute:.0f} per minute; each "
        f"eagerly, under jit, under vmap and fused), seed {args.seed}")
  print("failures: " + (", ".join(f"{count} {kind}" for kind, count in sorted(kinds.items())) or "none"))
  counted = [f for f in report.failures if args.strict or f.kind != "not built"]
  return 1 if counted else 0


if __name__ == "__main__":
  sys.exit(main())
