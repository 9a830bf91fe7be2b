#!/usr/bin/env python3
"""Turns bench/fs/run.sh's results.jsonl into the Markdown report: the face against ext4 and
bindfs pair by pair, rank-1 reads after deduplication against the same files plain, RAM per TB
of deduplicated data, the effect of keep_cache, and of the kernel's writeback cache."""

import json
import statistics
import sys

TB = 10**12
GB = 10**9
TESTS = ["seq-write", "seq-read", "untar", "stat"]
SYSTEMS = ["ext4", "bindfs", "bindfs-mt", "onecopy"]


def speed(row):
    """Higher is better: bytes per second for the data tests, entries per second for stat."""
    if row["test"] == "stat":
        return row["files"] / row["seconds"]
    return row["bytes"] / row["seconds"]


def speed_text(test, value):
    if test == "stat":
        return f"{value / 1e3:.1f}k/s"
    if test == "untar":
        return f"{value / 1e6:.0f} MB/s"
    return f"{value / 1e9:.2f} GB/s"


def ratios_text(ratios):
    pairs = ", ".join(f"{r:.2f}" for r in ratios)
    return f"**{statistics.median(ratios):.2f}x** ({pairs})"


def compare(rows, out):
    runs = {}
    for row in rows:
        runs[(row["test"], row["system"], row["pair"])] = row
    pairs = sorted({row["pair"] for row in rows})
    out.append("### The face without deduplication against ext4 and bindfs\n")
    first = rows[0]
    files = next((r["files"] for r in rows if r["test"] == "untar"), None)
    tree_bytes = next((r["bytes"] for r in rows if r["test"] == "untar"), None)
    seq_bytes = next((r["bytes"] for r in rows if r["test"] == "seq-write"), None)
    out.append(f"Sequential {seq_bytes / 2**30:.2f} GiB; the tree: {files} entries, "
               f"{tree_bytes / 1e6:.0f} MB of tar. Medians over {len(pairs)} pairs, then the "
               "ratios of each pair (onecopy / other, higher is better for onecopy).\n")
    out.append("| test | ext4 | bindfs | bindfs --multithreaded | onecopy | onecopy / bindfs (pairs) "
               "| onecopy / bindfs --multithreaded (pairs) | onecopy / ext4 (pairs) |")
    out.append("|---|---|---|---|---|---|---|---|")
    for test in TESTS:
        if not any((test, "onecopy", p) in runs for p in pairs):
            continue
        cells = []
        for system in SYSTEMS:
            values = [speed(runs[(test, system, p)]) for p in pairs if (test, system, p) in runs]
            cells.append(speed_text(test, statistics.median(values)) if values else "-")
        ratio_cells = []
        for other in ["bindfs", "bindfs-mt", "ext4"]:
            ratios = [speed(runs[(test, "onecopy", p)]) / speed(runs[(test, other, p)])
                      for p in pairs if (test, "onecopy", p) in runs and (test, other, p) in runs]
            ratio_cells.append(ratios_text(ratios) if ratios else "-")
        out.append(f"| {test} | " + " | ".join(cells + ratio_cells) + " |")
    loads = [row["load"] for row in rows]
    out.append(f"\nLoad average during the runs: {min(loads):.2f}-{max(loads):.2f}.\n")
    del first


def rank1(rows, states, out):
    out.append("### Rank-1 sequential reads after deduplication\n")
    rounds = sorted({row["round"] for row in rows if row["round"] > 0})
    by_key = {(row["round"], row["variant"], row["file"]): row for row in rows}
    out.append("| file | plain | deduplicated | deduplicated / plain (rounds) | before deduplication, same repository |")
    out.append("|---|---|---|---|---|")
    for file in ["a", "b"]:
        plain = [by_key[(r, "plain", file)] for r in rounds if (r, "plain", file) in by_key]
        dedup = [by_key[(r, "dedup", file)] for r in rounds if (r, "dedup", file) in by_key]
        ratios = [by_key[(r, "dedup", file)]["bytes"] / by_key[(r, "dedup", file)]["seconds"]
                  / (by_key[(r, "plain", file)]["bytes"] / by_key[(r, "plain", file)]["seconds"])
                  for r in rounds if (r, "dedup", file) in by_key and (r, "plain", file) in by_key]
        before = by_key.get((0, "dedup", file))
        before_text = f"{before['bytes'] / before['seconds'] / 1e9:.2f} GB/s" if before else "-"
        out.append(
            f"| {file} | {statistics.median(r['bytes'] / r['seconds'] for r in plain) / 1e9:.2f} GB/s"
            f" | {statistics.median(r['bytes'] / r['seconds'] for r in dedup) / 1e9:.2f} GB/s"
            f" | {ratios_text(ratios)} | {before_text} |")
    for state in states:
        ranks_before = {entry["path"]: entry["rank"] for entry in state["ranks_before"]}
        after = {entry["path"]: (entry["rank"], entry["chunking"], entry["extents"])
                 for entry in state["ranks_after"]}
        stats = state["stats"]
        out.append(f"\nRanks before deduplication: {ranks_before}; after (rank, chunking, "
                   f"extents): {after}. Logical {stats['logical_bytes'] / 1e6:.0f} MB, stored "
                   f"{stats['stored_bytes'] / 1e6:.0f} MB, pending {stats['pending_bytes']}.\n")


def ram(rows, out):
    out.append("### RAM per TB of deduplicated data\n")
    out.append("| small chunk | stored | chunks | peak RSS (writing + dedup) | RSS reopened | anonymous RSS reopened |")
    out.append("|---|---|---|---|---|---|")
    for chunk in dict.fromkeys(row["chunk"] for row in rows):
        steps = sorted((r for r in rows if r["chunk"] == chunk), key=lambda r: r["step"])
        for row in steps:
            out.append(f"| {chunk} | {row['stored_bytes'] / GB:.2f} GB | {row.get('chunks', 0)} "
                       f"| {row['peak_rss'] / 1e6:.1f} MB | {row['reopened_rss'] / 1e6:.1f} MB "
                       f"| {row['reopened_anon'] / 1e6:.1f} MB |")
        empty, last = steps[0], steps[-1]
        if last["stored_bytes"] > 0:
            # The peak while writing and deduplicating holds the fixed budgets (caches filled
            # by the first step), so only the reopened process's RSS is extrapolated.
            for key, name in [("reopened_rss", "RSS reopened"), ("reopened_anon", "anonymous RSS reopened")]:
                xs = [r["stored_bytes"] for r in steps]
                ys = [r[key] for r in steps]
                slope = statistics.linear_regression(xs, ys).slope
                out.append(f"\n{chunk}, {name}: slope {slope * TB / GB:.2f} GB per TB; "
                           f"(last - empty) / stored {(last[key] - empty[key]) / last['stored_bytes'] * TB / GB:.2f} GB per TB.")
        out.append("")


def cache(rows, out):
    out.append("### keep_cache\n")
    out.append("| mount options | first reading (cold) | second and third readings |")
    out.append("|---|---|---|")
    for options in ["default", "keep_cache"]:
        cold = [r["bytes"] / r["seconds"] for r in rows if r["options"] == options and r["reading"] == 1]
        warm = [r["bytes"] / r["seconds"] for r in rows if r["options"] == options and r["reading"] > 1]
        out.append(f"| {options} | {statistics.median(cold) / 1e9:.2f} GB/s "
                   f"({', '.join(f'{v / 1e9:.2f}' for v in cold)}) | {statistics.median(warm) / 1e9:.2f} GB/s "
                   f"({', '.join(f'{v / 1e9:.2f}' for v in warm)}) |")
    out.append("")


def threads(rows, out):
    out.append("### Request threads and cold sequential reads\n")
    rounds = sorted({r["round"] for r in rows})
    by_key = {(r["round"], r["reader"]): r for r in rows}
    readers = list(dict.fromkeys(r["reader"] for r in rows))
    out.append("| reader | cold read | / bindfs --multithreaded (rounds) |")
    out.append("|---|---|---|")
    for reader in readers:
        values = [by_key[(n, reader)]["bytes"] / by_key[(n, reader)]["seconds"] for n in rounds]
        ratios = [by_key[(n, "bindfs-mt")]["seconds"] / by_key[(n, reader)]["seconds"] for n in rounds]
        name = "bindfs --multithreaded" if reader == "bindfs-mt" else f"onecopy, threads={reader}"
        out.append(f"| {name} | {statistics.median(values) / 1e9:.2f} GB/s | {ratios_text(ratios)} |")
    out.append("")


def writeback(rows, out):
    out.append("### The kernel's writeback cache\n")
    pairs = sorted({r["pair"] for r in rows})
    by_key = {(r["test"], r["options"], r["pair"]): r for r in rows}
    out.append(f"Medians over {len(pairs)} pairs, then the ratios of each pair (with / without, "
               "higher is better with the cache).\n")
    out.append("| test | without | with writeback_cache | with / without (pairs) |")
    out.append("|---|---|---|---|")
    for test in ["seq-write", "small-write", "untar"]:
        without = [by_key[(test, "default", p)] for p in pairs if (test, "default", p) in by_key]
        with_cache = [by_key[(test, "writeback_cache", p)] for p in pairs
                      if (test, "writeback_cache", p) in by_key]
        if not without or not with_cache:
            continue
        ratios = [by_key[(test, "default", p)]["seconds"] / by_key[(test, "writeback_cache", p)]["seconds"]
                  for p in pairs if (test, "default", p) in by_key and (test, "writeback_cache", p) in by_key]
        text = lambda rows: f"{statistics.median(r['bytes'] / r['seconds'] for r in rows) / 1e6:.0f} MB/s"
        out.append(f"| {test} | {text(without)} | {text(with_cache)} | {ratios_text(ratios)} |")
    loads = [row["load"] for row in rows]
    out.append(f"\nLoad average during the runs: {min(loads):.2f}-{max(loads):.2f}.\n")


def main(path):
    rows = [json.loads(line) for line in open(path) if line.strip()]
    out = []
    machine = [r for r in rows if r["kind"] == "machine"]
    if machine:
        m = machine[0]
        out.append(f"Code {m['code']}, kernel {m['kernel']}, {m['cores']} cores, load {m['load']} at the start.\n")
    for kind, function in [("compare", compare), ("ram", ram), ("cache", cache), ("threads", threads),
                           ("writeback", writeback)]:
        selected = [r for r in rows if r["kind"] == kind]
        if selected:
            function(selected, out)
        if kind == "compare":
            selected = [r for r in rows if r["kind"] == "rank1"]
            if selected:
                rank1(selected, [r for r in rows if r["kind"] == "rank1-state"], out)
    print("\n".join(out))


if __name__ == "__main__":
    main(sys.argv[1])
