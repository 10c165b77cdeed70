#!/usr/bin/env python3
"""Compare two `cutline` binaries on the keyed benchmark, interleaved in one sitting.

Usage: scripts/bench-ab.py OLD_BINARY NEW_BINARY [--events N] [--keys K] [--reps R] [--configs p1,p2,w2]
                           [--new-args "--scrape-every 1s"] [--args "--hot-keys 10000 --state-backend disk"]

Each repetition runs every configuration once with each binary, alternating which goes first, so
that the machine's load hits both alike. Configurations: `p1` / `p2` (parallelism 1 / 2 in one
process), `w2` (parallelism 2 on 2 worker processes); all with checkpoints every 1 s. Prints every
run, then per configuration the median events/s of each binary and the ratio NEW/OLD, with the
ratio of each pair. (Older binaries discard the records instead of tallying them: the tally costs
the new one about 3 % more instructions.)
"""
import argparse, re, statistics, subprocess

ap = argparse.ArgumentParser()
ap.add_argument("old")
ap.add_argument("new")
ap.add_argument("--events", default="300000000")
ap.add_argument("--reps", type=int, default=5)
ap.add_argument("--configs", default="p1,p2,w2")
ap.add_argument("--keys", default="100000")
ap.add_argument("--new-args", default="", help="extra arguments of the new binary's runs only")
ap.add_argument("--args", default="", help="extra arguments of both binaries' runs")
a = ap.parse_args()
flags = {"p1": ["--parallelism", "1"], "p2": ["--parallelism", "2"], "w2": ["--parallelism", "2", "--workers", "2"]}
configs = a.configs.split(",")
rates = {(c, b): [] for c in configs for b in ("old", "new")}
for rep in range(a.reps):
    for c in configs:
        order = [("old", a.old), ("new", a.new)] if rep % 2 == 0 else [("new", a.new), ("old", a.old)]
        for name, exe in order:
            events = a.events if c != "w2" else str(int(a.events) * 2 // 3)
            extra = a.args.split() + (a.new_args.split() if name == "new" else [])
            out = subprocess.run([exe, "bench", "--events", events, "--keys", a.keys, "--checkpoint-interval", "1s"]
                                 + flags[c] + extra, check=True, capture_output=True, text=True).stdout
            line = [l for l in out.splitlines() if "events_per_s=" in l][-1]
            if name == "new" and "verified=" in line and "verified=sink+state" not in line:
                raise SystemExit(f"run not verified: {line}")
            rate = int(re.search(r"events_per_s=(\d+)", line).group(1))
            rates[(c, name)].append(rate)
            print(f"rep {rep} {c} {name}: {line}", flush=True)
print()
print("| configuration | old Mevents/s (median) | new Mevents/s (median) | new/old | pair ratios |")
print("|---|---|---|---|---|")
for c in configs:
    o, n = rates[(c, "old")], rates[(c, "new")]
    pairs = " ".join(f"{y / x:.2f}" for x, y in zip(o, n))
    print(f"| {c} | {statistics.median(o) / 1e6:.1f} | {statistics.median(n) / 1e6:.1f} | "
          f"{statistics.median(n) / statistics.median(o):.3f} | {pairs} |")
