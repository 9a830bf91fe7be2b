#!/usr/bin/env bash
# Block device benchmarks: fio's nbd engine over a unix socket against onecopy and, in the
# same run, the plain-server baselines `nbdkit memory` and `nbdkit file`, plus the physical
# limits of the media and onecopy's RAM per TiB of stored 4 KiB chunks.
#
# Servers, each fresh for every repeat:
#   nbdkit-memory           nbdkit's memory plugin (the protocol's and this machine's ceiling)
#   nbdkit-file-disk/-shm   nbdkit's file plugin on a sparse file on the local disk / on tmpfs
#   onecopy-disk/-shm       `onecopy serve` with its repository on the local disk / on tmpfs
# Jobs, in this order on each server (one NBD connection each):
#   seq-write-1M            1 MiB sequential writes, queue depth 8, unique data, SEQ_SIZE bytes
#   rand-read-4K            4 KiB random reads, queue depth 32, over the first REGION written above
#   rand-write-4K-unique    4 KiB random writes, queue depth 32, fresh random data (refill_buffers)
#   rand-write-4K-duplicate 4 KiB random writes, queue depth 32, every block the same 4 KiB
# Random jobs run RUNTIME seconds after 2 seconds of ramp; the sequential job stops after
# SEQ_SIZE bytes or RUNTIME seconds. Nothing issues FLUSH, so writes to the disk land in the
# page cache for onecopy and nbdkit file alike.
#
# Usage: bench/block/run.sh            (environment: RUNTIME=15 REPEATS=3 REGION=1G
#                                       SEQ_SIZE=3G RAM_SIZES="4G 4G 4G 4G" RAM_REOPENS=3
#                                       WARM_SHM=8G
#                                       DISK_DIR=/var/tmp SHM_DIR=/dev/shm
#                                       RAM_DIR=<disk work dir>
#                                       OUT=target/bench-block
#                                       PHASES="limits servers data ram"
#                                       SERVERS="nbdkit-memory nbdkit-file-disk ...")
# Prints a table (also OUT/report.md); raw fio JSON stays in OUT/raw.
set -euo pipefail

root=$(cd "$(dirname "$0")/../.." && pwd)
RUNTIME=${RUNTIME:-15}
REPEATS=${REPEATS:-3}
REGION=${REGION:-1G}
SEQ_SIZE=${SEQ_SIZE:-3G}
VOLUME_SIZE=${VOLUME_SIZE:-16G}
RAM_SIZES=${RAM_SIZES:-4G 4G 4G 4G}
RAM_REOPENS=${RAM_REOPENS:-3}
WARM_SHM=${WARM_SHM:-8G}
DISK_DIR=${DISK_DIR:-/var/tmp}
SHM_DIR=${SHM_DIR:-/dev/shm}
OUT=${OUT:-$root/target/bench-block}
SERVERS=${SERVERS:-nbdkit-memory nbdkit-file-disk onecopy-disk nbdkit-file-shm onecopy-shm}
JOBS=${JOBS:-seq-write-1M rand-read-4K rand-write-4K-unique rand-write-4K-duplicate}
# Parts to run: media limits, the server comparison, the data check, RAM per TiB.
PHASES=${PHASES:-limits servers data ram}
phase() { [[ " $PHASES " == *" $1 "* ]]; }

for tool in fio nbdkit python3 dd; do
  command -v "$tool" >/dev/null || { echo "$tool is missing: run scripts/setup.sh" >&2; exit 1; }
done

echo "building onecopy (release)" >&2
(cd "$root" && cargo build --release -q -p onecopy)
onecopy=$root/target/release/onecopy

mkdir -p "$OUT/raw"
results=$OUT/results.jsonl
: >"$results"
work_disk=$(mktemp -d "$DISK_DIR/onecopy-bench.XXXXXX")
work_shm=$(mktemp -d "$SHM_DIR/onecopy-bench.XXXXXX")
# The RAM measurement stores RAM_SIZES in total; on the disk by default to spare tmpfs.
RAM_DIR=${RAM_DIR:-$work_disk}
server_pid=""

# The kernel's setting for handing free guest memory back to the host (see the warm-up below)
# and its value before this run, restored at exit.
reporting=/sys/module/page_reporting/parameters/page_reporting_order
reporting_before=""

cleanup() {
  if [ -n "$reporting_before" ]; then
    echo "$reporting_before" >"$reporting" || echo "could not restore $reporting" >&2
  fi
  if [ -n "$server_pid" ] && kill -0 "$server_pid" 2>/dev/null; then
    kill -TERM "$server_pid" 2>/dev/null || true
    wait "$server_pid" 2>/dev/null || true
  fi
  rm -rf "$work_disk" "$work_shm"
}
trap cleanup EXIT

load() { cut -d' ' -f1-3 /proc/loadavg; }

# Bytes of a size such as 4G, 512M, 64K or 4096.
to_bytes() {
  case $1 in
    *K) echo $(( ${1%K} << 10 )) ;; *M) echo $(( ${1%M} << 20 )) ;;
    *G) echo $(( ${1%G} << 30 )) ;; *) echo $(( $1 )) ;;
  esac
}

# Appends one JSON line to the results.
record() { echo "$1" >>"$results"; }

wait_for_socket() {
  local socket=$1 log=$2 ready=$3
  for _ in $(seq 1 600); do
    if [ -S "$socket" ] && { [ -z "$ready" ] || grep -q "$ready" "$log"; }; then return 0; fi
    kill -0 "$server_pid" 2>/dev/null || { cat "$log" >&2; echo "server died" >&2; exit 1; }
    sleep 0.1
  done
  echo "server did not start: $(cat "$log")" >&2
  exit 1
}

# start_server NAME WORKDIR: starts NAME with its data under WORKDIR; sets server_pid, socket.
start_server() {
  local name=$1 dir=$2
  socket=$dir/nbd.sock
  rm -f "$socket"
  case $name in
    nbdkit-memory)
      nbdkit -U "$socket" -f memory size="$VOLUME_SIZE" >"$dir/server.log" 2>&1 &
      server_pid=$!
      wait_for_socket "$socket" "$dir/server.log" "" ;;
    nbdkit-file-*)
      rm -f "$dir/disk.img"
      truncate -s "$VOLUME_SIZE" "$dir/disk.img"
      nbdkit -U "$socket" -f file file="$dir/disk.img" >"$dir/server.log" 2>&1 &
      server_pid=$!
      wait_for_socket "$socket" "$dir/server.log" "" ;;
    onecopy-*)
      rm -rf "$dir/repository"
      ONECOPY_REPO=$dir/repository "$onecopy" init >/dev/null
      ONECOPY_REPO=$dir/repository "$onecopy" volume create disk --size "$VOLUME_SIZE" >/dev/null
      ONECOPY_REPO=$dir/repository "$onecopy" serve --socket "$socket" >"$dir/server.log" 2>&1 &
      server_pid=$!
      wait_for_socket "$socket" "$dir/server.log" "press Ctrl-C to stop" ;;
  esac
}

stop_server() {
  kill -TERM "$server_pid"
  wait "$server_pid" || { echo "server exited with $?: $(cat "$1/server.log")" >&2; exit 1; }
  server_pid=""
}

job_arguments() {
  case $1 in
    seq-write-1M)
      echo "--rw=write --bs=1M --iodepth=8 --size=$SEQ_SIZE --runtime=$RUNTIME --refill_buffers --randrepeat=0" ;;
    rand-read-4K)
      echo "--rw=randread --bs=4k --iodepth=32 --size=$REGION --time_based --runtime=$RUNTIME --ramp_time=2 --norandommap --randrepeat=0" ;;
    rand-write-4K-unique)
      echo "--rw=randwrite --bs=4k --iodepth=32 --size=$REGION --time_based --runtime=$RUNTIME --ramp_time=2 --norandommap --randrepeat=0 --refill_buffers" ;;
    rand-write-4K-duplicate)
      # Every block is the same 4 KiB: a duplicate at the engine's 4 KiB granularity.
      echo "--rw=randwrite --bs=4k --iodepth=32 --size=$REGION --time_based --runtime=$RUNTIME --ramp_time=2 --norandommap --randrepeat=0 --scramble_buffers=0 --buffer_pattern=0x6f6e65636f7079" ;;
  esac
}

# run_job SERVER MEDIUM JOB REPEAT
run_job() {
  local server=$1 job=$3 repeat=$4 before
  local raw="$OUT/raw/$server-$job-$repeat.json"
  before=$(load)
  # shellcheck disable=SC2046
  fio --output-format=json --output="$raw" --name="$job" --ioengine=nbd \
    --uri="nbd+unix:///disk?socket=$socket" $(job_arguments "$job")
  python3 - "$raw" "$server" "$job" "$repeat" "$before" >>"$results" <<'PY'
import json, sys
raw, server, job, repeat, load = sys.argv[1:]
result = json.load(open(raw))["jobs"][0]
side = result["read"] if result["read"]["io_bytes"] > 0 else result["write"]
print(json.dumps({"kind": "fio", "server": server, "job": job, "repeat": int(repeat),
                  "iops": side["iops"], "bytes_per_second": side["bw_bytes"],
                  "error": result["error"], "load_before": load}))
PY
  echo "  $server $job #$repeat: $(tail -1 "$results")" >&2
}

echo "load at start: $(load)" >&2
record "{\"kind\": \"load\", \"when\": \"start\", \"load\": \"$(load)\"}"

# Physical limits of the media, measured in this run.
if phase limits; then
for medium in disk shm; do
  dir=$work_disk; [ $medium = shm ] && dir=$work_shm
  text=$(dd if=/dev/zero of="$dir/dd.bin" bs=1M count=2048 conv=fdatasync 2>&1 | tail -1)
  rm -f "$dir/dd.bin"
  bytes_per_second=$(python3 -c "
import re, sys
bytes_, seconds = re.search(r'^(\d+) bytes.*copied, ([\d.]+) s', sys.argv[1]).groups()
print(int(int(bytes_) / float(seconds)))" "$text")
  record "{\"kind\": \"limit\", \"what\": \"dd 2 GiB bs=1M conv=fdatasync to $medium\", \"bytes_per_second\": $bytes_per_second}"
  echo "  dd to $medium: $text" >&2
done
# Random data and a size past the host's write cache: what the disk sustains.
raw="$OUT/raw/disk-seqwrite-fsync.json"
fio --output-format=json --output="$raw" --name=disk --filename="$work_disk/fio.bin" \
  --size=8G --rw=write --bs=1M --iodepth=1 --ioengine=psync --end_fsync=1 --refill_buffers \
  >/dev/null
rm -f "$work_disk/fio.bin"
record "$(python3 -c "
import json, sys
w = json.load(open(sys.argv[1]))['jobs'][0]['write']
print(json.dumps({'kind': 'limit', 'what': 'disk 8 GiB of 1 MiB sequential random-data writes, then fsync (fio psync)', 'bytes_per_second': w['bw_bytes']}))" "$raw")"
raw="$OUT/raw/disk-randwrite-direct.json"
fio --output-format=json --output="$raw" --name=disk --filename="$work_disk/fio.bin" \
  --size=1G --rw=randwrite --bs=4k --iodepth=32 --ioengine=libaio --direct=1 \
  --time_based --runtime="$RUNTIME" --ramp_time=2 --refill_buffers >/dev/null
rm -f "$work_disk/fio.bin"
record "$(python3 -c "
import json, sys
w = json.load(open(sys.argv[1]))['jobs'][0]['write']
print(json.dumps({'kind': 'limit', 'what': 'disk 4 KiB random writes O_DIRECT qd32 (fio libaio)', 'iops': w['iops'], 'bytes_per_second': w['bw_bytes']}))" "$raw")"
fi

# This machine is a VM whose host backs guest memory when the guest first touches it, and
# takes it back when the guest frees it: the balloon driver reports free 2 MiB blocks to the
# host about two seconds after they are freed (free page reporting). Writing such pages runs
# at a fraction of the speed of pages the guest holds (docs/BENCHMARKS.md gives the dd
# figures). Every
# server that takes new tmpfs pages pays it (onecopy appends to containers; nbdkit file fills
# its sparse file in the 1 MiB job), by amounts that depend on timing. So the servers phase
# stops the reporting for the run (order 11: no free block is that large; restored at exit)
# and first writes and removes WARM_SHM of tmpfs (0: skip both), so that the guest holds that
# much memory backed. The rate is recorded. Without root, or on a kernel without the
# setting, only the warm-up runs.
if phase servers && [ "$WARM_SHM" != 0 ]; then
  if [ -w "$reporting" ]; then
    reporting_before=$(cat "$reporting")
    echo 11 >"$reporting"
    record "{\"kind\": \"page-reporting\", \"order_before\": $reporting_before, \"order\": 11}"
  fi
  warm=$SHM_DIR/onecopy-bench-warm.$$
  start=$(date +%s%N)
  # A tmpfs smaller than WARM_SHM is warmed as far as it goes.
  dd if=/dev/zero of="$warm" bs=1M count="$(( $(to_bytes "$WARM_SHM") >> 20 ))" status=none ||
    echo "  warming stopped at $(du -h "$warm" | cut -f1): $SHM_DIR is full" >&2
  end=$(date +%s%N)
  warmed=$(stat -c %s "$warm")
  rm -f "$warm"
  record "{\"kind\": \"warm-shm\", \"bytes\": $warmed, \"seconds\": $(( (end - start) / 1000 ))e-6}"
  echo "  warmed $warmed bytes of tmpfs in $(( (end - start) / 1000000 )) ms" >&2
fi

phase servers && for repeat in $(seq 1 "$REPEATS"); do
  for server in $SERVERS; do
    dir=$work_disk; case $server in *-shm|nbdkit-memory) dir=$work_shm ;; esac
    start_server "$server" "$dir"
    for job in $JOBS; do run_job "$server" "$dir" "$job" "$repeat"; done
    stop_server "$dir"
    rm -rf "$dir/repository"
    rm -f "$dir/disk.img"
  done
done

# Is the data what the job names say, at the engine's 4 KiB granularity? Each write job alone
# on a fresh volume, then the volume's mapped and stored bytes.
phase data && for job in rand-write-4K-unique rand-write-4K-duplicate; do
  dir=$work_shm
  start_server onecopy-shm "$dir"
  # shellcheck disable=SC2046
  fio --output-format=json --output="$OUT/raw/data-check-$job.json" --name="$job" \
    --ioengine=nbd --uri="nbd+unix:///disk?socket=$socket" $(job_arguments "$job") \
    --runtime=3 --ramp_time=0
  stop_server "$dir"
  ONECOPY_REPO=$dir/repository "$onecopy" volume stats disk --json \
    >"$OUT/raw/data-check-$job-stats.json"
  python3 - "$OUT/raw/data-check-$job-stats.json" "$job" >>"$results" <<'PY'
import json, sys
stats = json.load(open(sys.argv[1]))
print(json.dumps({"kind": "data-check", "job": sys.argv[2], "mapped_bytes": stats["mapped_bytes"],
                  "stored_bytes": stats["stored_bytes"], "distinct_chunks": stats["distinct_chunks"]}))
PY
  echo "  data check $job: $(tail -1 "$results")" >&2
  rm -rf "$dir/repository"
done

# RAM per TiB: unique 4 KiB chunks written sequentially in steps. After each step: the
# server's peak RSS (VmHWM: fixed budgets, dirty metadata pages and what grows with the data),
# then the RSS of the same repository reopened by a fresh server that has read one block (what
# an idle server needs to serve the data: filter, index directory, page tables). The growth
# between the steps, divided by the growth of stored data, leaves out the fixed parts; so does
# subtracting what a reopened server needs for the empty volume, measured first.
if phase ram; then
# The median of whitespace-separated numbers on standard input.
median() { tr ' ' '\n' | grep . | sort -n | awk '{v[NR] = $1} END {print v[int((NR + 1) / 2)]}'; }
# Stops the running server, then records what the repository needs at $offset bytes written:
# the engine's own account and the RSS of RAM_REOPENS fresh servers that have read one block.
# hwm: the stopped server's peak RSS while writing.
measure_reopened() {
  local hwm=$1
  stop_server "$dir"
  # The engine's own account of its memory at this size (the server holds the repository's
  # lock, so only between servers).
  stats="$OUT/raw/ram-stats-$offset.json"
  ONECOPY_REPO=$dir/repository "$onecopy" volume stats disk --json >"$stats"
  # Restart on the same repository (start_server would make a new one) RAM_REOPENS times
  # and keep the median: what an idle server touches varies by a few hundred KB from one
  # start to the next (pages cached at open, heap layout).
  rss_values=""
  anon_values=""
  for reopen in $(seq "$RAM_REOPENS"); do
    (( reopen > 1 )) && stop_server "$dir"
    ONECOPY_REPO=$dir/repository "$onecopy" serve --socket "$socket" >"$dir/server.log" 2>&1 &
    server_pid=$!
    wait_for_socket "$socket" "$dir/server.log" "press Ctrl-C to stop"
    fio --name=touch --ioengine=nbd --uri="nbd+unix:///disk?socket=$socket" --rw=read \
      --bs=4k --size=4k >/dev/null
    rss_values="$rss_values $(awk '/VmRSS/ {print $2 * 1024}' "/proc/$server_pid/status")"
    # Anonymous memory only: VmRSS also counts the pages of the binary and libraries that
    # happened to be touched (about 5.4 MB, varying by a few hundred KB with the code run).
    anon_values="$anon_values $(awk '/RssAnon/ {print $2 * 1024}' "/proc/$server_pid/status")"
  done
  reopened=$(echo "$rss_values" | median)
  reopened_anon=$(echo "$anon_values" | median)
  record "{\"kind\": \"ram-step\", \"written_bytes\": $offset, \"vm_hwm_bytes\": $hwm, \"reopened_rss_bytes\": $reopened, \"reopened_anon_bytes\": $reopened_anon, \"reopened_anon_all\": [$(echo $anon_values | tr ' ' ',')], \"stats_path\": \"$stats\"}"
  echo "  ram step: written $offset, VmHWM $hwm, RSS after reopening (median of $RAM_REOPENS) $reopened, anonymous:$anon_values" >&2
}
dir=$RAM_DIR
start_server onecopy-ram "$dir"
offset=0
# Step 0, the empty volume: the fixed part every later step is measured against.
measure_reopened "$(awk '/VmHWM/ {print $2 * 1024}' "/proc/$server_pid/status")"
for size in $RAM_SIZES; do
  # A new random seed per step, or fio would repeat the previous step's buffers.
  fio --output-format=json --output="$OUT/raw/ram-$size.json" --name=ram --ioengine=nbd \
    --uri="nbd+unix:///disk?socket=$socket" --rw=write --bs=1M --iodepth=8 \
    --offset="$offset" --size="$size" --refill_buffers --randrepeat=0
  offset=$(( offset + $(to_bytes "$size") ))
  measure_reopened "$(awk '/VmHWM/ {print $2 * 1024}' "/proc/$server_pid/status")"
done
stop_server "$dir"
ONECOPY_REPO=$dir/repository "$onecopy" volume stats disk --json >"$OUT/raw/ram-stats.json"
record "{\"kind\": \"ram-stats\", \"path\": \"$OUT/raw/ram-stats.json\"}"
rm -rf "$dir/repository"
fi

echo "load at end: $(load)" >&2
record "{\"kind\": \"load\", \"when\": \"end\", \"load\": \"$(load)\"}"
python3 "$root/bench/block/report.py" "$results" | tee "$OUT/report.md"
