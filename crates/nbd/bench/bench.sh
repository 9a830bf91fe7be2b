#!/usr/bin/env bash
# Measures the NBD protocol overhead of onecopy-nbd against nbdkit with fio's nbd engine over
# unix sockets, in one run:
#   ours            crates/nbd/examples/memory_server (MemoryExport)
#   nbdkit-memory   nbdkit memory plugin (in-memory sparse array)
#   nbdkit-file     nbdkit file plugin on a sparse file in $BENCH_DIR
# Workloads: 1 MiB sequential write (iodepth 8, also fills the exports), 4 KiB random write and
# 4 KiB random read (iodepth 32). Each workload runs ROUNDS times per server, servers
# interleaved, and the median is reported, which keeps the ratios meaningful on a machine
# shared with other jobs. Also reports the server's CPU time per I/O (user + system, from
# /proc/PID/stat), which is less sensitive to such noise than throughput.
#
# Usage: crates/nbd/bench/bench.sh            (environment: RUNTIME seconds per run [5],
#                                              ROUNDS [3], SIZE export bytes [1G],
#                                              WORKERS per connection [server default],
#                                              BENCH_DIR scratch directory [mktemp])
set -euo pipefail

cd "$(dirname "$0")/../../.."
RUNTIME=${RUNTIME:-5}
ROUNDS=${ROUNDS:-3}
SIZE=${SIZE:-1G}
BENCH_DIR=${BENCH_DIR:-$(mktemp -d /tmp/onecopy-nbd-bench.XXXXXX)}
mkdir -p "$BENCH_DIR"

for tool in fio nbdkit python3; do
  command -v "$tool" >/dev/null || { echo "bench: $tool missing; run scripts/setup.sh" >&2; exit 1; }
done

cargo build --quiet --release -p onecopy-nbd --example memory_server
server_binary=target/release/examples/memory_server

pids=()
cleanup() {
  for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$BENCH_DIR"
}
trap cleanup EXIT

wait_for_socket() {
  for _ in $(seq 100); do [ -S "$1" ] && return 0; sleep 0.05; done
  echo "bench: $1 did not appear" >&2; exit 1
}

worker_arguments=()
[ -n "${WORKERS:-}" ] && worker_arguments=(--workers "$WORKERS")
"$server_binary" --socket "$BENCH_DIR/ours.sock" --size "$SIZE" --name disk "${worker_arguments[@]}" \
  >/dev/null 2>"$BENCH_DIR/ours.log" &
pids+=($!); ours_pid=$!
nbdkit -f -U "$BENCH_DIR/memory.sock" memory "$SIZE" 2>"$BENCH_DIR/nbdkit-memory.log" &
pids+=($!); memory_pid=$!
truncate -s "$SIZE" "$BENCH_DIR/disk.img"
nbdkit -f -U "$BENCH_DIR/file.sock" file "$BENCH_DIR/disk.img" 2>"$BENCH_DIR/nbdkit-file.log" &
pids+=($!); file_pid=$!
for socket in ours memory file; do wait_for_socket "$BENCH_DIR/$socket.sock"; done

declare -A uri=(
  [ours]="nbd+unix:///disk?socket=$BENCH_DIR/ours.sock"
  [nbdkit-memory]="nbd+unix:///?socket=$BENCH_DIR/memory.sock"
  [nbdkit-file]="nbd+unix:///?socket=$BENCH_DIR/file.sock"
)
declare -A pid=([ours]=$ours_pid [nbdkit-memory]=$memory_pid [nbdkit-file]=$file_pid)
servers=(ours nbdkit-memory nbdkit-file)
workloads=(seqwrite-1M randwrite-4k randread-4k)
declare -A fio_arguments=(
  [seqwrite-1M]="--rw=write --bs=1M --iodepth=8"
  [randwrite-4k]="--rw=randwrite --bs=4k --iodepth=32"
  [randread-4k]="--rw=randread --bs=4k --iodepth=32"
)

cpu_ticks() {
  if [ ! -r "/proc/$1/stat" ]; then
    status=0; wait "$1" || status=$?
    echo "bench: server process $1 exited with status $status; logs:" >&2
    tail -n 20 "$BENCH_DIR"/*.log >&2
    exit 1
  fi
  awk '{print $14 + $15}' "/proc/$1/stat"
}

results="$BENCH_DIR/results.tsv"
: > "$results"
for workload in "${workloads[@]}"; do
  for round in $(seq "$ROUNDS"); do
    for server in "${servers[@]}"; do
      before=$(cpu_ticks "${pid[$server]}")
      # shellcheck disable=SC2086
      fio --name="$workload" --ioengine=nbd --uri="${uri[$server]}" ${fio_arguments[$workload]} \
        --size="$SIZE" --runtime="$RUNTIME" --time_based --output-format=json \
        --output="$BENCH_DIR/fio.json" >/dev/null
      after=$(cpu_ticks "${pid[$server]}")
      python3 - "$BENCH_DIR/fio.json" "$workload" "$server" "$round" "$((after - before))" \
        >> "$results" <<'PY'
import json, os, sys
path, workload, server, round_, ticks = sys.argv[1:]
job = json.load(open(path))["jobs"][0]
assert job["error"] == 0, f"fio failed: {job['error']}"
ios = sum(job[d]["total_ios"] for d in ("read", "write"))
iops = sum(job[d]["iops"] for d in ("read", "write"))
bytes_per_second = sum(job[d]["bw_bytes"] for d in ("read", "write"))
cpu_us = int(ticks) * 1e6 / os.sysconf("SC_CLK_TCK") / max(ios, 1)
print(f"{workload}\t{server}\t{round_}\t{iops:.0f}\t{bytes_per_second}\t{cpu_us:.2f}")
PY
    done
  done
done

python3 - "$results" "$RUNTIME" "$ROUNDS" <<'PY'
import statistics, sys
from collections import defaultdict
path, runtime, rounds = sys.argv[1:]
runs = defaultdict(list)
for line in open(path):
    workload, server, _, iops, bandwidth, cpu = line.split("\t")
    runs[(workload, server)].append((float(iops), float(bandwidth), float(cpu)))
def median(workload, server, index):
    return statistics.median(run[index] for run in runs[(workload, server)])
print(f"fio nbd engine over unix sockets; median of {rounds} runs of {runtime} s each")
print(f"{'workload':<14}{'metric':<8}{'ours':>10}{'nbdkit-mem':>12}{'nbdkit-file':>13}"
      f"{'ours/mem':>10}{'ours/file':>11}")
for workload in ("seqwrite-1M", "randwrite-4k", "randread-4k"):
    if workload.endswith("1M"):
        metric, index, scale, fmt = "GB/s", 1, 1e-9, "{:.2f}"
    else:
        metric, index, scale, fmt = "kIOPS", 0, 1e-3, "{:.1f}"
    values = [median(workload, s, index) for s in ("ours", "nbdkit-memory", "nbdkit-file")]
    cells = [fmt.format(v * scale) for v in values]
    print(f"{workload:<14}{metric:<8}{cells[0]:>10}{cells[1]:>12}{cells[2]:>13}"
          f"{values[0] / values[1]:>10.2f}{values[0] / values[2]:>11.2f}")
    cpu = [median(workload, s, 2) for s in ("ours", "nbdkit-memory", "nbdkit-file")]
    print(f"{'':<14}{'cpu us':<8}{cpu[0]:>10.2f}{cpu[1]:>12.2f}{cpu[2]:>13.2f}"
          f"{cpu[0] / cpu[1]:>10.2f}{cpu[0] / cpu[2]:>11.2f}")
print("cpu us: server CPU time (user + system) per I/O; lower is better.")
PY
