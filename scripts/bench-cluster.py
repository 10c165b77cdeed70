#!/usr/bin/env python3
"""Benchmarks of issue 4, interleaved so that machine noise hits every configuration alike.

  scripts/bench-cluster.py [--reps 5] [--events 200000000] [--bin target/release/cutline]

1. Throughput of the keyed benchmark in one process against a local cluster of 2 worker processes.
2. Checkpoint duration with a local directory against an S3-compatible store (needs the variables
   of `eval "$(scripts/s3-test-server)"`; skipped with a note otherwise).
3. Recovery time after a SIGKILLed worker (from the kill until the restored job runs again).
4. The cost of frame protection: 2 worker processes with sealed frames (`--frame-protection on`;
   `auto` does not seal on loopback) against unsealed ones. `--protection-only` runs just this pair.

Prints every run's line and then the medians. Build first:
  cargo build --release -p cutline-cli --features s3
"""
import argparse
import os
import re
import statistics
import subprocess
import sys


def run(binary, args):
    out = subprocess.run([binary, "bench", *args], capture_output=True, text=True)
    if out.returncode != 0:
        sys.exit(f"cutline bench {' '.join(args)} failed: {out.stderr}")
    line = out.stdout.strip().splitlines()[-1]
    print(line, flush=True)
    return {k: v for k, v in re.findall(r"(\w+)=(\S+)", line)}


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--events", type=int, default=200_000_000)
    p.add_argument("--bin", default="target/release/cutline")
    p.add_argument("--protection-only", action="store_true")
    a = p.parse_args()
    ev = str(a.events)
    results = {}

    def add(name, r):
        results.setdefault(name, []).append(r)

    s3 = os.environ.get("CUTLINE_S3_ENDPOINT")
    bucket = os.environ.get("CUTLINE_S3_BUCKET", "cutline-test")
    for rep in range(a.reps):
        common = ["--events", ev, "--parallelism", "2", "--checkpoint-interval", "1s"]
        two = common + ["--workers", "2"]
        if a.protection_only:
            add("2 worker processes, frames not sealed", run(a.bin, two + ["--frame-protection", "off"]))
            add("2 worker processes, frames sealed", run(a.bin, two + ["--frame-protection", "on"]))
            continue
        add("1 process", run(a.bin, common))
        add("2 worker processes", run(a.bin, two))
        add("2 worker processes, frames sealed", run(a.bin, two + ["--frame-protection", "on"]))
        ck = ["--events", str(a.events // 2), "--parallelism", "2", "--checkpoint-interval", "200ms"]
        add("checkpoints: local directory", run(a.bin, ck))
        if s3:
            add("checkpoints: S3 (moto on loopback)", run(a.bin, ck + ["--state", f"s3://{bucket}/bench-{os.getpid()}-{rep}"]))
        add("recovery after a killed worker", run(a.bin, common + ["--workers", "2", "--kill-worker-after", "2s"]))

    print()
    med = lambda name, key: statistics.median(float(r[key]) for r in results[name])
    print("| configuration | runs | events/s (median) | checkpoint p50 ms (median) | checkpoint max ms (median) |")
    print("|---|---|---|---|---|")
    for name in results:
        if name.startswith("recovery"):
            continue
        print(f"| {name} | {len(results[name])} | {med(name, 'events_per_s'):,.0f} | {med(name, 'duration_p50_ms'):.0f} | {med(name, 'duration_max_ms'):.0f} |")
    if a.protection_only:
        return
    rec = [int(r["recovery_ms"]) for r in results["recovery after a killed worker"]]
    print(f"\nrecovery after a killed worker: median {statistics.median(rec):.0f} ms, all {sorted(rec)}")
    if not s3:
        print("(S3 skipped: CUTLINE_S3_ENDPOINT not set; eval \"$(scripts/s3-test-server)\" first)")


if __name__ == "__main__":
    main()
