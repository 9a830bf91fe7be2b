#!/usr/bin/env bash
# Server CPU time and context switches per request, beside fio's own figures: one server
# (`onecopy serve` on a fresh 16 GiB volume, or `nbdkit file` on a 16 GiB sparse file), its
# repository or file and socket in /dev/shm, 1 GiB written first, then one 10 s fio job over
# the nbd engine. CPU and switches are sampled from /proc over 7 s in the middle of the job;
# the per-thread switch counts (voluntary, nonvoluntary) over the run are printed after it.
#   bench/block/cpu-per-request.sh onecopy JOB        # JOB: read | read1 | overwrite | seq
#   bench/block/cpu-per-request.sh nbdkit JOB
# Environment: ONECOPY (binary, default target/release/onecopy), SERVE_ARGS (extra
# `onecopy serve` arguments, e.g. --no-batch-scheduling).
set -euo pipefail
server=$1
job=$2
onecopy=${ONECOPY:-target/release/onecopy}
work=$(mktemp -d /dev/shm/cpu-per-request.XXXX)
pid=
cleanup() {
  [ -n "$pid" ] && kill "$pid" 2>/dev/null && wait "$pid" 2>/dev/null
  rm -rf "$work"
}
trap cleanup EXIT
socket=$work/socket
case $server in
  nbdkit)
    truncate -s 16G "$work/disk.img"
    nbdkit -U "$socket" -f file file="$work/disk.img" >"$work/server.log" 2>&1 &
    pid=$!
    uri="nbd+unix:///?socket=$socket"
    ;;
  onecopy)
    export ONECOPY_REPO=$work/repository
    "$onecopy" init >/dev/null
    "$onecopy" volume create disk --size 16G >/dev/null
    # shellcheck disable=SC2086 # SERVE_ARGS is a list of arguments
    "$onecopy" serve --socket "$socket" ${SERVE_ARGS:-} >"$work/server.log" 2>&1 &
    pid=$!
    uri="nbd+unix:///disk?socket=$socket"
    ;;
  *) echo "usage: $0 onecopy|nbdkit read|read1|overwrite|seq" >&2; exit 2 ;;
esac
for _ in $(seq 100); do [ -S "$socket" ] && break; sleep 0.05; done
[ -S "$socket" ] || { echo "server did not start: $(cat "$work/server.log")" >&2; exit 1; }
fio --name=fill --ioengine=nbd --uri="$uri" --rw=write --bs=1M --iodepth=8 --size=1G \
  --refill_buffers >/dev/null 2>&1
case $job in
  read1) arguments="--rw=randread --bs=4k --iodepth=1 --size=1G" ;;
  read) arguments="--rw=randread --bs=4k --iodepth=32 --size=1G" ;;
  overwrite) arguments="--rw=randwrite --bs=4k --iodepth=32 --size=1G --refill_buffers" ;;
  seq) arguments="--rw=write --bs=1M --iodepth=8 --offset=2G --size=8G --refill_buffers" ;;
  *) echo "unknown job $job" >&2; exit 2 ;;
esac
cpu_ticks() { awk '{print $14 + $15}' "/proc/$pid/stat"; }
# fio's processes (the parent and its job), for the client's share of the two cores.
client_ticks() {
  local sum=0 pid
  for pid in $(pgrep -x fio); do
    sum=$((sum + $(awk '{print $14 + $15}' "/proc/$pid/stat" 2>/dev/null || echo 0)))
  done
  echo "$sum"
}
switches() { awk '/ctxt/ {sum += $2} END {print sum}' /proc/"$pid"/task/*/status; }
threads() {
  for task in /proc/"$pid"/task/*; do
    echo "$(cat "$task/comm") $(awk '/ctxt/ {printf "%s ", $2}' "$task/status")"
  done
}
(
  sleep 2
  ticks0=$(cpu_ticks); client0=$(client_ticks); switches0=$(switches); threads >"$work/threads0"
  sleep 7
  echo "$ticks0 $(cpu_ticks) $switches0 $(switches) $client0 $(client_ticks)" >"$work/sample"
  threads >"$work/threads1"
) &
sampler=$!
# shellcheck disable=SC2086 # arguments is a list
fio --output-format=json --output="$work/fio.json" --name=measure --ioengine=nbd --uri="$uri" \
  $arguments --time_based --runtime=10 --norandommap --randrepeat=0 >/dev/null 2>&1
wait "$sampler"
python3 - "$work" "$job" "$(getconf CLK_TCK)" <<'EOF'
import json, sys
work, job, ticks_per_second = sys.argv[1], sys.argv[2], int(sys.argv[3])
result = json.load(open(work + "/fio.json"))["jobs"][0]
side = result["read"] if job.startswith("read") else result["write"]
ticks0, ticks1, switches0, switches1, client0, client1 = map(
    int, open(work + "/sample").read().split())
client_cores = (client1 - client0) / ticks_per_second / 7
cores = (ticks1 - ticks0) / ticks_per_second / 7
iops = side["iops"]
print(f"{job}: {iops:.0f} IOPS, {side['bw_bytes'] / 1e9:.2f} GB/s, server CPU {cores:.2f} cores"
      f" = {cores / iops * 1e6:.1f} us/request, {(switches1 - switches0) / 7 / iops:.2f}"
      f" context switches/request, mean latency {side['clat_ns']['mean'] / 1e3:.1f} us;"
      f" client (fio) CPU {client_cores:.2f} cores")
EOF
echo "thread: voluntary nonvoluntary switches at 2 s | at 9 s"
paste "$work/threads0" "$work/threads1" | grep -v " 0 0 " || true
