#!/usr/bin/env python3
"""Run the keyed COUNT+SUM benchmark matrix of BENCHMARKS.md and print medians and ratios.

Usage: scripts/bench-matrix.py [--events N] [--keys K] [--reps R] [--parallelism 1,2] [--intervals off,1s,100ms] [--max-concurrent 1,2,4]

Runs `target/release/cutline bench` (build it first: cargo build --release -p cutline-cli) for every
parallelism and interval, interleaving the intervals within each repetition so that drift in the
machine's load hits them alike. With several --max-concurrent values, every periodic interval runs once
per value (`off` once). Prints every raw line, then one summary row per configuration: the
median events/s, its ratio to `off` at the same parallelism (from the same run), and the medians of the
checkpoint statistics (each run's median and maximum duration and maximum alignment: with a handful of
checkpoints per run a high percentile is the maximum). A run whose work does not check out (`cutline
bench` exits non-zero: its sink or keyed state disagree with --events) stops the matrix.
"""
import argparse, os, statistics, subprocess, sys

ap = argparse.ArgumentParser()
ap.add_argument("--events", default="50000000")
ap.add_argument("--keys", default="100000")
ap.add_argument("--reps", type=int, default=5)
ap.add_argument("--parallelism", default="1,2")
ap.add_argument("--intervals", default="off,1s,100ms")
ap.add_argument("--max-concurrent", default="1")
a = ap.parse_args()
exe = os.path.join(os.environ.get("CARGO_TARGET_DIR", "target"), "release", "cutline")
rows = []
configs = [(i, mc) for i in a.intervals.split(",") for mc in (["1"] if i == "off" else a.max_concurrent.split(","))]
for p in a.parallelism.split(","):
    for _ in range(a.reps):
        for i, mc in configs:
            out = subprocess.run([exe, "bench", "--events", a.events, "--keys", a.keys, "--parallelism", p,
                                  "--checkpoint-interval", i, "--max-concurrent", mc], check=True, capture_output=True, text=True).stdout
            line = next(l for l in out.splitlines() if l.startswith("events="))
            print(line, flush=True)
            rows.append(dict(kv.split("=", 1) for kv in line.split()))
med = lambda xs: statistics.median(xs) if xs else 0
print()
print(f"{'par':>3} {'interval':>8} {'conc':>4} {'Mevents/s':>10} {'vs off':>7} {'ckpts':>6} {'dur p50':>8} {'dur max':>8} {'align max':>9}  (medians over {a.reps} runs)")
for p in a.parallelism.split(","):
    base = None
    for i, mc in configs:
        rs = [r for r in rows if r["parallelism"] == p and r["interval"] == i and r["max_concurrent"] == mc]
        eps = med([float(r["events_per_s"]) for r in rs])
        base = eps if i == "off" else base
        ck = [r for r in rs if int(r["checkpoints"]) > 0]
        m = lambda k: med([int(r[k]) for r in ck])
        ratio = f"{eps / base:.3f}" if base else "-"
        print(f"{p:>3} {i:>8} {mc:>4} {eps / 1e6:>10.1f} {ratio:>7} {med([int(r['checkpoints']) for r in rs]):>6} "
              f"{m('duration_p50_ms'):>8} {m('duration_max_ms'):>8} {m('alignment_max_ms'):>9}")
