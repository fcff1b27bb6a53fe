#!/usr/bin/env python3
"""Replay a pyalloc trace through the engine on the simulated device, with any options.

Reports peak reserved, utilization, external fragmentation, retries and failures, beside
the live run's own figures. The ground for every fragmentation benchmark.

Usage::

    python tools/replay.py TRACE [--option KEY:VALUE ...] [--json]
    python tools/replay.py demo-trace.json --option max_split_size:8MiB
"""
from __future__ import annotations

import argparse
import json
import sys

from pyalloc import files
from pyalloc.replay import replay


def _fmt(n: float) -> str:
    return f"{n / 2**20:,.1f} MiB"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("trace", help="a pyalloc trace (pyalloc.record_trace)")
    parser.add_argument("--option", "-o", action="append", default=[], metavar="KEY:VALUE",
                        help="engine option for the replay (repeatable), e.g. budget:2GiB")
    parser.add_argument("--check-every", type=int, default=0,
                        help="check every invariant each N events (slow; default: at the end)")
    parser.add_argument("--json", action="store_true", help="print JSON only")
    args = parser.parse_args(argv)
    try:
        trace = files.load(args.trace, expect=files.TRACE)
        overrides = {}
        for item in args.option:
            key, sep, value = item.partition(":")
            if not sep:
                raise ValueError(f"--option {item!r}: expected KEY:VALUE, e.g. budget:2GiB")
            overrides[key.strip()] = value.strip()
        result = replay(trace, overrides, check_every=args.check_every)
    except (files.FileFormatError, ValueError) as e:
        print(f"replay: error: {e}", file=sys.stderr)
        return 2
    out = result.as_dict()
    out["trace"] = args.trace
    if args.json:
        print(json.dumps(out, indent=2))
        return 0
    live = result.live
    rows = [
        ("peak reserved", _fmt(result.peak_reserved), _fmt(live.get("reserved_bytes.all.peak", 0))),
        ("peak allocated", _fmt(result.peak_allocated), _fmt(live.get("allocated_bytes.all.peak", 0))),
        ("utilization", f"{result.utilization:.1%}", f"{live.get('utilization', 0):.1%}"),
        ("external fragmentation (end)", f"{result.external_fragmentation:.1%}",
         f"{live.get('external_fragmentation', 0):.1%}"),
        ("alloc retries", str(result.num_alloc_retries), str(live.get("num_alloc_retries", "?"))),
        ("failed allocations", str(result.failures), str(live.get("num_ooms", "?"))),
    ]
    print(f"replay of {args.trace}: {result.events} events, {result.allocs} allocs, "
          f"{result.frees} frees, {result.skipped_frees} frees of earlier blocks skipped")
    print(f"options: {result.options}")
    print(f"{'':30}{'replay':>16}{'live run':>16}")
    for name, mine, theirs in rows:
        print(f"{name:30}{mine:>16}{theirs:>16}")
    if trace.get("dropped_events"):
        print(f"warning: the trace dropped {trace['dropped_events']} events (ring full); "
              "the replay starts mid-run", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
