#!/usr/bin/env bash
# A/B of the file system face's write path: binaries A and B each mount a fresh repository
# (default mount options) and time a sequential write (`dd bs=1M conv=fsync` of SEQ_SIZE of
# random data from tmpfs) and an untar of TREE followed by `sync -f`, in alternation, pair by
# pair, with the page cache dropped before each run.
#
#   bench/fs/ab-write.sh /tmp/onecopy-before target/release/onecopy
#
# Needs root (drop_caches, mounts). Prints one line per run: pair, binary (A or B), seconds of
# the write, seconds of the untar, load average; then per test the median of B's speed over
# A's and every pair's ratio. Environment: PAIRS=6 SEQ_SIZE=512M TREE=/usr/include
# DISK_DIR=/var/tmp SHM_DIR=/dev/shm.
set -euo pipefail
[ $# -eq 2 ] || { echo "usage: $0 BINARY_A BINARY_B" >&2; exit 2; }
A=$1
B=$2
PAIRS=${PAIRS:-6}
SEQ_SIZE=${SEQ_SIZE:-512M}
TREE=${TREE:-/usr/include}
work=$(mktemp -d "${DISK_DIR:-/var/tmp}/onecopy-ab-write.XXXXXX")
shm=$(mktemp -d "${SHM_DIR:-/dev/shm}/onecopy-ab-write.XXXXXX")
mnt=$work/mnt
mkdir -p "$mnt"
trap 'fusermount3 -u -z "$mnt" 2>/dev/null || true; rm -rf "$work" "$shm"' EXIT
head -c "$SEQ_SIZE" /dev/urandom >"$shm/seq.bin"
tar -cf "$shm/tree.tar" -C "$(dirname "$TREE")" "$(basename "$TREE")"
now() { date +%s.%N; }
seconds() { python3 -c "import sys; print(f'{float(sys.argv[2]) - float(sys.argv[1]):.3f}')" "$1" "$2"; }
results=$work/results
for ((pair = 1; pair <= PAIRS; pair++)); do
  for which in A B; do
    binary=${!which}
    export ONECOPY_REPO=$work/repository
    rm -rf "$ONECOPY_REPO"
    "$binary" init >/dev/null
    "$binary" fs create ab --idle 0 >/dev/null
    sync
    echo 3 >/proc/sys/vm/drop_caches
    "$binary" mount ab "$mnt" >/dev/null
    start=$(now)
    dd if="$shm/seq.bin" of="$mnt/seq.bin" bs=1M conv=fsync status=none
    write=$(seconds "$start" "$(now)")
    start=$(now)
    tar -xf "$shm/tree.tar" -C "$mnt"
    sync -f "$mnt"
    untar=$(seconds "$start" "$(now)")
    "$binary" umount "$mnt"
    echo "$pair $which $write $untar $(cut -d' ' -f1 /proc/loadavg)" | tee -a "$results"
  done
done
python3 - "$results" <<'PY'
import statistics, sys
runs = {}
for line in open(sys.argv[1]):
    pair, which, write, untar, _ = line.split()
    runs[(int(pair), which)] = (float(write), float(untar))
pairs = sorted({pair for pair, _ in runs})
for index, test in enumerate(["seq-write", "untar"]):
    ratios = [runs[(p, "A")][index] / runs[(p, "B")][index] for p in pairs]
    listed = ", ".join(f"{ratio:.2f}" for ratio in ratios)
    print(f"{test}: B / A speed {statistics.median(ratios):.2f}x ({listed})")
PY
