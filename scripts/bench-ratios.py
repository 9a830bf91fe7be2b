#!/usr/bin/env python3
"""Prints criterion results as throughput and as a ratio to the `memcpy` benchmark of the same
group (measured in the same run, on the same bytes), from target/criterion/.

Usage: scripts/bench-ratios.py [CRITERION_DIR]

Single-threaded groups of onecopy's benches measure the thread's CPU time (see
crates/core/benches/thread_time.rs); groups named *_two_cores measure wall-clock time.
A result's age is shown so that leftovers from older runs stand out.
"""
import json
import os
import sys
import time
from collections import defaultdict


def main():
    root = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "..", "target", "criterion")
    groups = defaultdict(dict)
    for directory, _, files in os.walk(root):
        if os.path.basename(directory) != "new" or "benchmark.json" not in files:
            continue
        with open(os.path.join(directory, "benchmark.json")) as file:
            benchmark = json.load(file)
        with open(os.path.join(directory, "estimates.json")) as file:
            nanoseconds = json.load(file)["mean"]["point_estimate"]
        throughput = benchmark.get("throughput") or {}
        data_bytes = throughput.get("Bytes") or throughput.get("BytesDecimal")
        if not data_bytes:
            continue
        age_minutes = (time.time() - os.path.getmtime(os.path.join(directory, "estimates.json"))) / 60
        name = "/".join(part for part in (benchmark.get("function_id"), benchmark.get("value_str")) if part)
        groups[benchmark["group_id"]][name] = (data_bytes / nanoseconds, age_minutes)
    for group, results in sorted(groups.items()):
        memcpy = results.get("memcpy", (None, None))[0]
        print(f"{group}:")
        for name, (gigabytes_per_second, age) in sorted(results.items(), key=lambda item: -item[1][0]):
            ratio = f"{gigabytes_per_second / memcpy:6.3f} x memcpy" if memcpy else "no memcpy in group"
            print(f"  {name:40} {gigabytes_per_second:7.2f} GB/s  {ratio}  ({age:.0f} min ago)")


if __name__ == "__main__":
    main()
