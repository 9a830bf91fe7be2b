#!/usr/bin/env python3
"""Summarises the output of bench/backup/peers-tree.sh: per round, each tool's figures and
onecopy's ratio to each other tool (pair by pair), then the range of each ratio.

    bench/backup/peers-tree.sh target/release/onecopy /usr/share | tee run.txt
    bench/backup/peers-tree-summary.py run.txt
"""
import collections
import re
import sys

runs = collections.defaultdict(lambda: collections.defaultdict(list))
for line in open(sys.argv[1]):
    fields = line.split()
    if len(fields) < 3 or not fields[2].startswith("round="):
        continue
    tool, step = fields[0], fields[1]
    values = dict(field.split("=", 1) for field in fields[2:])
    runs[int(values.pop("round"))][(tool, step)].append(
        {key: float(value) for key, value in values.items()}
    )


def figures(rows, tool):
    """The figures of one tool in one round: first backup, the unchanged ones (mean and
    largest reads), restore, size, peak memory over every command."""
    first = rows[(tool, "first")][0]
    unchanged = rows[(tool, "unchanged")]
    restore = rows[(tool, "restore")][0]
    size = rows[(tool, "size")][0]["bytes"]
    return {
        "first_s": first["wall"],
        "first_cpu_s": first["cpu"],
        "unchanged_s": sum(row["wall"] for row in unchanged) / len(unchanged),
        "unchanged_rchar_mb": max(row["rchar"] for row in unchanged) / 1e6,
        "restore_s": restore["wall"],
        "size_mb": size / 1e6,
        "peak_mib": max(
            row["peak_kib"] for rows_of_step in (rows[(tool, "first")], unchanged, [restore])
            for row in rows_of_step
        ) / 1024,
        "unchanged_peak_mib": max(row["peak_kib"] for row in unchanged) / 1024,
    }


ratios = collections.defaultdict(list)
for round_number in sorted(runs):
    rows = runs[round_number]
    tools = sorted({tool for tool, _ in rows})
    table = {tool: figures(rows, tool) for tool in tools}
    print(f"round {round_number}")
    for tool in tools:
        print("  " + tool.ljust(8) + " ".join(f"{key}={value:.2f}" for key, value in table[tool].items()))
    if "onecopy" not in table:
        continue
    for other in tools:
        if other == "onecopy":
            continue
        mine, theirs = table["onecopy"], table[other]
        # Speed as how many times faster; size and memory as onecopy's share.
        for key in ("first_s", "unchanged_s", "restore_s"):
            ratios[(other, key + " (x faster)")].append(theirs[key] / mine[key])
        for key in ("size_mb", "peak_mib", "unchanged_peak_mib", "unchanged_rchar_mb"):
            ratios[(other, key + " (onecopy/" + other + ")")].append(mine[key] / theirs[key])

print("ratios, pair by pair (median, then every round)")
for (other, key), values in sorted(ratios.items()):
    ordered = sorted(values)
    median = ordered[len(ordered) // 2]
    print(f"  vs {other:7} {key:40} {median:.2f}  ({', '.join(f'{v:.2f}' for v in values)})")
