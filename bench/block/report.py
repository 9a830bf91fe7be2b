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
    for row in (r for r in rows if r["kind"] == "page-reporting"):
        print(f"- free page reporting to the host stopped for the run (page_reporting_order "
              f"{row['order_before']} -> {row['order']})")
    for row in (r for r in rows if r["kind"] == "warm-shm"):
        print(f"- tmpfs warmed before the servers (guest memory touched once): "
              f"{row['bytes'] / 1e9:.2f} GB in {row['seconds']:.1f} s, "
              f"{row['bytes'] / row['seconds'] / 1e9:.2f} GB/s")
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
    # A run may measure the empty volume first: the fixed part of a reopened server.
    empty = next((step for step in steps if step["written_bytes"] == 0), None)
    steps = [step for step in steps if step["written_bytes"] > 0]
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
                  f"{step['vm_hwm_bytes'] / 1e6:.1f} MB; RSS of a freshly reopened server {step['reopened_rss_bytes'] / 1e6:.1f} MB"
                  + (f" ({step['reopened_anon_bytes'] / 1e6:.1f} MB anonymous)" if "reopened_anon_bytes" in step else ""))
        if len(steps) >= 2:
            first, last = steps[0], steps[-1]
            keys = [("reopened_rss_bytes", "RSS of a reopened server"),
                    ("reopened_anon_bytes", "anonymous RSS of a reopened server (heap and "
                     "mappings, not the binary's pages)"),
                    ("vm_hwm_bytes", "peak RSS while writing")]
            for key, label in keys:
                if not all(key in step for step in steps):
                    continue
                slope = least_squares_slope([(step["written_bytes"], step[key]) for step in steps])
                print(f"- growth of the {label} from {first['written_bytes'] / 1e9:.2f} GB to "
                      f"{last['written_bytes'] / 1e9:.2f} GB stored ({len(steps)} steps, least-squares "
                      f"slope): {slope * TIB / 1e9:.3f} GB per TiB ({slope * 1e12 / 1e9:.3f} GB per TB)")
            if empty is not None:
                for key, label in keys[:2]:
                    grown = last[key] - empty[key]
                    print(f"- {label} at {last['written_bytes'] / 1e9:.2f} GB stored, less the same "
                          f"with an empty volume ({empty[key] / 1e6:.2f} MB): {grown / 1e6:.2f} MB = "
                          f"{grown / last['written_bytes'] * TIB / 1e9:.3f} GB per TiB "
                          f"({grown / last['written_bytes'] * 1e12 / 1e9:.3f} GB per TB)")
            # The engine's own parts at each step, when the run recorded them.
            if all("stats_path" in step for step in (first, last)):
                before, after = (json.load(open(step["stats_path"]))["engine"]
                                 for step in (first, last))
                chunks = after["store"]["live_chunks"] - before["store"]["live_chunks"]
                parts = [("index_filter_bytes", "filter"),
                         ("index_directory_bytes", "index directory"),
                         ("page_table_bytes", "page tables and free slots")]
                if chunks > 0 and all(key in before["memory"] for key, _ in parts):
                    growth = {label: (after["memory"][key] - before["memory"][key]) / chunks
                              for key, label in parts}
                    total = sum(growth.values())
                    print(f"- growth of the engine's estimate over the same steps: {total:.2f} bytes per "
                          f"chunk = {total * CHUNKS_PER_TIB / 1e9:.3f} GB per TiB "
                          f"({total * CHUNKS_PER_TIB / TIB * 1e12 / 1e9:.3f} GB per TB; "
                          + ", ".join(f"{label} {value:.2f}" for label, value in growth.items()) + ")")
                    for step, engine in ((first, before), (last, after)):
                        areas = ", ".join(f"{area['name']} {area['table_pages']}"
                                          for area in engine["memory"].get("page_areas", []))
                        print(f"- pages by area after {step['written_bytes'] / 1e9:.2f} GB: {areas}")
        print(f"- peak RSS over all stored data at the last step: "
              f"{last['vm_hwm_bytes'] / last['written_bytes'] * TIB / 1e9:.1f} GB per TiB (fixed budgets dominate at this size)")

def least_squares_slope(points):
    """The slope of the least-squares line through (x, y) points (two points: their slope)."""
    n = len(points)
    mean_x = sum(x for x, _ in points) / n
    mean_y = sum(y for _, y in points) / n
    spread = sum((x - mean_x) ** 2 for x, _ in points)
    return sum((x - mean_x) * (y - mean_y) for x, y in points) / spread


if __name__ == "__main__":
    main(sys.argv[1])
