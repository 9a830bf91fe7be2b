#!/usr/bin/env bash
# Where the server's time goes: `perf record` of `onecopy serve` (a fresh 16 GiB volume, its
# repository on tmpfs or the local disk, its socket in /dev/shm) while fio runs one job over
# the nbd engine, then perf's report of the hottest symbols.
#   bench/block/profile.sh JOB [shm|disk]
# JOB: seq        1 GiB filled, then 1 MiB sequential writes at depth 8 from 2 GiB, 10 s
#      seq-fresh  3 GiB of 1 MiB sequential writes at depth 8 on the fresh volume (the
#                 benchmark's seq-write-1M job)
#      overwrite  1 GiB filled, then unique 4 KiB random writes at depth 32 over it, 10 s
#      read       1 GiB filled, then 4 KiB random reads at depth 32 over it, 10 s
# Environment: ONECOPY (binary, default target/release/onecopy), SECONDS_RECORDED (6),
# PERF_ARGS (default "-F 2000 -g"; "--call-graph dwarf,16384 -F 300" resolves Rust callers),
# OUT (perf data file, default /tmp/onecopy-profile.data).
set -euo pipefail
job=${1:?usage: $0 seq|seq-fresh|overwrite|read [shm|disk]}
medium=${2:-shm}
onecopy=${ONECOPY:-target/release/onecopy}
out=${OUT:-/tmp/onecopy-profile.data}
case $medium in
  shm) work=$(mktemp -d /dev/shm/onecopy-profile.XXXX) ;;
  disk) work=$(mktemp -d /var/tmp/onecopy-profile.XXXX) ;;
  *) echo "medium: shm or disk" >&2; exit 2 ;;
esac
socket=$(mktemp -u /dev/shm/onecopy-profile-socket.XXXX)
pid=
cleanup() {
  [ -n "$pid" ] && kill "$pid" 2>/dev/null && wait "$pid" 2>/dev/null
  rm -rf "$work" "$socket"
}
trap cleanup EXIT
export ONECOPY_REPO=$work/repository
"$onecopy" init >/dev/null
"$onecopy" volume create disk --size 16G >/dev/null
"$onecopy" serve --socket "$socket" >"$work/server.log" 2>&1 &
pid=$!
for _ in $(seq 100); do [ -S "$socket" ] && break; sleep 0.05; done
[ -S "$socket" ] || { echo "server did not start: $(cat "$work/server.log")" >&2; exit 1; }
uri="nbd+unix:///disk?socket=$socket"
fill() {
  fio --name=fill --ioengine=nbd --uri="$uri" --rw=write --bs=1M --iodepth=8 --size=1G \
    --refill_buffers >/dev/null 2>&1
}
timed="--time_based --runtime=10"
case $job in
  seq) fill; arguments="--rw=write --bs=1M --iodepth=8 --offset=2G --size=8G --refill_buffers $timed" ;;
  seq-fresh) arguments="--rw=write --bs=1M --iodepth=8 --size=3G --refill_buffers" ;;
  overwrite) fill; arguments="--rw=randwrite --bs=4k --iodepth=32 --size=1G --refill_buffers --norandommap --randrepeat=0 $timed" ;;
  read) fill; arguments="--rw=randread --bs=4k --iodepth=32 --size=1G --norandommap --randrepeat=0 $timed" ;;
  *) echo "unknown job $job" >&2; exit 2 ;;
esac
# shellcheck disable=SC2086 # arguments is a list
fio --output-format=json --output="$work/fio.json" --name=measure --ioengine=nbd --uri="$uri" \
  $arguments >/dev/null 2>&1 &
client=$!
# The fresh job lasts about 2 s: start recording at once; the others after their ramp.
[ "$job" = seq-fresh ] && sleep 0.3 || sleep 2
# shellcheck disable=SC2086 # PERF_ARGS is a list
perf record ${PERF_ARGS:--F 2000 -g} -p "$pid" -o "$out" -- sleep "${SECONDS_RECORDED:-6}" \
  >/dev/null 2>&1
wait "$client"
python3 - "$work/fio.json" <<'EOF'
import json, sys
job = json.load(open(sys.argv[1]))["jobs"][0]
side = job["read"] if job["read"]["io_bytes"] else job["write"]
print(f"fio: {side['iops']:.0f} IOPS, {side['bw_bytes'] / 1e9:.2f} GB/s (under perf)")
EOF
perf report -i "$out" --no-children --sort symbol 2>/dev/null | grep -E '^ +[0-9]' | head -30
echo "perf data: $out (perf report -i $out --children for callers)"
