#!/usr/bin/env python3
"""Turns bench/block/run.sh's results.jsonl into the Markdown report: medians over repeats,
onecopy against the plain servers measured in the same run, the media limits and RAM per TiB."""

import json
import statistics
import sys

TIB = 1 << 40
CHUNKS_PER_TIB = TIB // 4096
GOALS = {
    # job: (goal, how it is judged)
    "rand-write-4K-unique": (0.6, "ratio"),
    "rand-write-4K-duplicate": (0.9, "ratio"),
    "rand-read-4K": (0.8, "ratio"),
    "seq-write-1M": (1.5e9, "bytes_per_second"),
}
JOBS = ["rand-write-4K-unique", "rand-write-4K-duplicate", "rand-read-4K", "seq-write-1M"]


def main(path):
    rows = [json.loads(line) for line in open(path) if line.strip()]
    fio = {}
    for row in (r for r in rows if r["kind"] == "fio"):
        assert row["error"] == 0, row
        fio.setdefault((row["server"], row["job"]), []).append(row)

    def figure(server, job):
        runs = fio.get((server, job), [])
        if not runs:
            return None
        key = "bytes_per_second" if job.startswith("seq") else "iops"
        values = [run[key] for run in runs]
        return statistics.median(values), min(values), max(values)

    def text(value, job):
        if value is None:
            return "-"
        median, low, high = value
        if job.startswith("seq"):
            return f"{median / 1e9:.2f} GB/s ({low / 1e9:.2f}-{high / 1e9:.2f})"
        return f"{median / 1e3:.1f}k ({low / 1e3:.1f}-{high / 1e3:.1f})"

    def paired_ratios(numerator, denominator, job):
        """onecopy / baseline within each repeat (the servers of one repeat run minutes apart,
        so they share the machine's load), then summarised over repeats."""
        key = "bytes_per_second" if job.startswith("seq") else "iops"
        tops = {run["repeat"]: run[key] for run in fio.get((numerator, job), [])}
        bottoms = {run["repeat"]: run[key] for run in fio.get((denominator, job), [])}
        return [tops[r] / bottoms[r] for r in sorted(tops) if r in bottoms and bottoms[r] > 0]

    def ratio_text(ratios):
        if not ratios:
            return "-"
        return f"{statistics.median(ratios):.2f}x ({min(ratios):.2f}-{max(ratios):.2f})"

    loads = [r for r in rows if r["kind"] == "load"]
    repeats = max((r["repeat"] for r in rows if r["kind"] == "fio"), default=0)
    print("## Block device benchmarks\n")
    print(f"Median of {repeats} repeats (min-max in parentheses); 4 KiB jobs in IOPS, the 1 MiB job in GB/s; "
          "ratios are taken within each repeat, then the median over repeats.")
    print("Load average (1, 5, 15 min): " + "; ".join(f"{r['when']} {r['load']}" for r in loads) + "\n")
    print("| job | nbdkit memory | nbdkit file, disk | onecopy, disk | onecopy / file, disk "
          "| nbdkit file, tmpfs | onecopy, tmpfs | onecopy / file, tmpfs | onecopy / memory, tmpfs | goal |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for job in JOBS:
        memory = figure("nbdkit-memory", job)
        cells = [job, text(memory, job)]
        for medium in ["disk", "shm"]:
            file = figure(f"nbdkit-file-{medium}", job)
            onecopy = figure(f"onecopy-{medium}", job)
            cells += [text(file, job), text(onecopy, job),
                      ratio_text(paired_ratios(f"onecopy-{medium}", f"nbdkit-file-{medium}", job))]
        cells.append(ratio_text(paired_ratios("onecopy-shm", "nbdkit-memory", job)))
        goal, judged = GOALS[job]
        cells.append(f">= {goal}x of the plain server" if judged == "ratio" else f">= {goal / 1e9:.1f} GB/s")
        print("| " + " | ".join(cells) + " |")

    print("\nPhysical limits measured in the same run:\n")
    for row in (r for r in rows if r["kind"] == "limit"):
        iops = f", {row['iops'] / 1e3:.1f}k IOPS" if "iops" in row else ""
        print(f"- {row['what']}: {row['bytes_per_second'] / 1e9:.3f} GB/s{iops}")
    memory_seq = figure("nbdkit-memory", "seq-write-1M")
    if memory_seq:
        print(f"- fio nbd engine against nbdkit memory, 1 MiB writes: {memory_seq[0] / 1e9:.2f} GB/s")

    checks = [r for r in rows if r["kind"] == "data-check"]
    if checks:
        print("\nData check (each write job alone for 3 s on a fresh onecopy volume on tmpfs):\n")
        for row in checks:
            print(f"- {row['job']}: {row['mapped_bytes'] / 1e6:.1f} MB mapped, "
                  f"{row['stored_bytes'] / 1e6:.3f} MB stored, {row['distinct_chunks']} distinct chunks")

    steps = [r for r in rows if r["kind"] == "ram-step"]
    stats_rows = [r for r in rows if r["kind"] == "ram-stats"]
    if steps and stats_rows:
        stats = json.load(open(stats_rows[-1]["path"]))
        memory = stats["engine"]["memory"]
        store = stats["engine"]["store"]
        print("\nRAM per TiB of stored 4 KiB chunks (unique data written with 1 MiB sequential writes):\n")
        print(f"- stored: {store['live_chunks']} chunks, {store['live_raw_bytes'] / 1e9:.2f} GB")
        per_chunk = memory["proportional_bytes_per_chunk"]
        print(f"- engine estimate: {per_chunk:.2f} bytes per chunk that grow with the data "
              f"= {per_chunk * CHUNKS_PER_TIB / 1e9:.3f} GB per TiB "
              f"(projected_bytes_per_tib with the fixed cache budgets: {memory['projected_bytes_per_tib'] / 1e9:.3f} GB)")
        for step in steps:
            print(f"- after {step['written_bytes'] / 1e9:.2f} GB written: peak RSS (VmHWM) while writing "
                  f"{step['vm_hwm_bytes'] / 1e6:.1f} MB; RSS of a freshly reopened server {step['reopened_rss_bytes'] / 1e6:.1f} MB")
        if len(steps) >= 2:
            first, last = steps[0], steps[-1]
            grown = last["written_bytes"] - first["written_bytes"]
            for key, label in [("reopened_rss_bytes", "RSS of a reopened server"),
                               ("vm_hwm_bytes", "peak RSS while writing")]:
                slope = (last[key] - first[key]) / grown
                print(f"- growth of the {label} from {first['written_bytes'] / 1e9:.2f} GB to "
                      f"{last['written_bytes'] / 1e9:.2f} GB stored: {slope * TIB / 1e9:.3f} GB per TiB")
        print(f"- peak RSS over all stored data at the last step: "
              f"{last['vm_hwm_bytes'] / last['written_bytes'] * TIB / 1e9:.1f} GB per TiB (fixed budgets dominate at this size)")

if __name__ == "__main__":
    main(sys.argv[1])
