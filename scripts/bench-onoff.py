#!/usr/bin/env python3
"""Checkpoints on against off on the keyed benchmark, interleaved in one sitting.

Usage: scripts/bench-onoff.py KEYS HOT_KEYS EVENTS REPS OFF_BINARY NAME=BINARY [NAME=BINARY ...]

Each repetition runs `OFF_BINARY` with checkpoints off and every named binary with checkpoints every
1 s (`cutline bench --events EVENTS --keys KEYS --hot-keys HOT_KEYS`), in turn, the order reversed
every other repetition. Every run must verify its output. Prints each run, then per run name the
medians of its figures, on/off (median events/s over the off runs' median) and peak RSS over off's.
"""
import re, statistics, subprocess, sys
keys, hot, events, reps, off = sys.argv[1:6]
bins = [("off", off, ["--checkpoint-interval", "off"])] + [
    (nb.split("=")[0], nb.split("=")[1], ["--checkpoint-interval", "1s"]) for nb in sys.argv[6:]]
fields = ["events_per_s", "peak_rss_mb", "duration_p50_ms", "duration_max_ms", "encode_p50_us", "page_copies_p50", "saved_entries_p50", "sync_p50_us", "sync_max_us", "checkpoints"]
res = {n: {f: [] for f in fields} for n, _, _ in bins}
for rep in range(int(reps)):
    order = bins if rep % 2 == 0 else bins[::-1]
    for name, exe, extra in order:
        out = subprocess.run([exe, "bench", "--events", events, "--keys", keys, "--hot-keys", hot] + extra,
                             check=True, capture_output=True, text=True).stdout
        line = [l for l in out.splitlines() if "events_per_s=" in l][-1]
        assert "verified=sink+state" in line, line
        for f in fields:
            found = re.search(rf"\b{f}=(\d+)", line)  # (older binaries lack some fields: 0)
            res[name][f].append(int(found.group(1)) if found else 0)
        print(f"rep {rep} {name}: {line}", flush=True)
m = lambda n, f: statistics.median(res[n][f])
print(f"\nkeys={keys} hot={hot} events={events} reps={reps}")
for name, _, _ in bins:
    print(name, " ".join(f"{f}={m(name, f)}" for f in fields), f"on/off={m(name,'events_per_s')/m('off','events_per_s'):.3f}",
          f"peak/off={m(name,'peak_rss_mb')/m('off','peak_rss_mb'):.3f}", "rates=", res[name]["events_per_s"])
