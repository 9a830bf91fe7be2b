#!/usr/bin/env bash
# File system face benchmarks, in one run, on one disk (DISK_DIR, the machine's root file system):
#
#   compare  the face without deduplication (`onecopy mount`) against the kernel's file system
#            directly (a directory of DISK_DIR) and against bindfs (a FUSE passthrough over a
#            directory of DISK_DIR): sequential write, sequential read after dropping caches,
#            untar of a real tree, lstat of every file of that tree after dropping caches.
#            bindfs runs with its defaults (one request thread) and with --multithreaded
#            (bindfs-mt); onecopy with its defaults (4 request threads, no keep_cache).
#            Each pair runs the four systems in turn (ext4, bindfs, bindfs-mt, onecopy), fresh
#            each time, so the ratios compare runs that shared the machine's load.
#   rank1    sequential reads of rank-1 files after `onecopy fs dedup` against the same files
#            never deduplicated: two repositories with the same files, both ranked, one
#            deduplicated, then read in alternation, each file after dropping caches, each
#            round on a fresh mount.
#   ram      the mounting process's RSS against stored bytes after deduplication, in steps of
#            unique data (every file cold, so cut into SMALL_CHUNK chunks), per TB.
#   cache    re-reading a file through the mount without and with `-o keep_cache`, alternated.
#   threads  cold sequential reads of one file through bindfs --multithreaded and through the
#            face with THREADS request threads each, alternated.
#   writeback the face without and with the kernel's writeback cache (`-o writeback_cache`),
#            alternated pair by pair, each on a fresh repository: sequential write (1 MiB
#            writes, then fsync), small writes (SMALL_SIZE in 4 KiB writes, then fsync), untar
#            of TREE then syncfs (so that the cached data has reached the face).
#
# FUSE caches are emptied before every cold read by unmounting and mounting again, the kernel's
# by `echo 3 >/proc/sys/vm/drop_caches`. Run as root (drop_caches, mounts).
#
# Usage: bench/fs/run.sh    (environment: PAIRS=3 SEQ_SIZE=1G TREE=/usr/include
#                            RANK_FILE_SIZE=512M RANK_ROUNDS=3 RAM_STEPS=3 RAM_STEP=1G
#                            RAM_CHUNKS="4KiB 256KiB" CACHE_ROUNDS=3 THREADS="1 4"
#                            THREADS_ROUNDS=3 SMALL_SIZE=64M
#                            DISK_DIR=/var/tmp SHM_DIR=/dev/shm OUT=target/bench-fs
#                            PHASES="compare rank1 ram cache threads writeback")
# Prints the report (also OUT/report.md); every measurement is a JSON line in OUT/results.jsonl.
set -euo pipefail

root=$(cd "$(dirname "$0")/../.." && pwd)
PAIRS=${PAIRS:-3}
SEQ_SIZE=${SEQ_SIZE:-1G}
TREE=${TREE:-/usr/include}
RANK_FILE_SIZE=${RANK_FILE_SIZE:-512M}
RANK_ROUNDS=${RANK_ROUNDS:-3}
RAM_STEPS=${RAM_STEPS:-3}
RAM_STEP=${RAM_STEP:-1G}
RAM_CHUNKS=${RAM_CHUNKS:-4KiB 256KiB}
CACHE_ROUNDS=${CACHE_ROUNDS:-3}
DISK_DIR=${DISK_DIR:-/var/tmp}
SHM_DIR=${SHM_DIR:-/dev/shm}
OUT=${OUT:-$root/target/bench-fs}
THREADS=${THREADS:-1 4}
THREADS_ROUNDS=${THREADS_ROUNDS:-3}
SMALL_SIZE=${SMALL_SIZE:-64M}
PHASES=${PHASES:-compare rank1 ram cache threads writeback}
phase() { [[ " $PHASES " == *" $1 "* ]]; }

[ "$(id -u)" -eq 0 ] || { echo "run as root: the benchmark drops the kernel's caches" >&2; exit 1; }
for tool in bindfs fusermount3 fio python3 dd tar; do
  command -v "$tool" >/dev/null || { echo "$tool is missing: run scripts/setup.sh" >&2; exit 1; }
done

echo "building onecopy (release)" >&2
(cd "$root" && cargo build --release -q -p onecopy)
onecopy=$root/target/release/onecopy

mkdir -p "$OUT"
results=$OUT/results.jsonl
: >"$results"
work=$(mktemp -d "$DISK_DIR/onecopy-fs-bench.XXXXXX")
shm=$(mktemp -d "$SHM_DIR/onecopy-fs-bench.XXXXXX")
mnt=$work/mnt
mkdir -p "$mnt"
mount_pid=""
mounted=""

cleanup() {
  if [ -n "$mounted" ]; then fusermount3 -u -z "$mounted" 2>/dev/null || true; fi
  if [ -n "$mount_pid" ]; then
    for _ in $(seq 1 100); do kill -0 "$mount_pid" 2>/dev/null || break; sleep 0.1; done
  fi
  rm -rf "$work" "$shm"
}
trap cleanup EXIT

to_bytes() {
  case $1 in
    *K) echo $(( ${1%K} << 10 )) ;; *M) echo $(( ${1%M} << 20 )) ;;
    *G) echo $(( ${1%G} << 30 )) ;; *) echo $(( $1 )) ;;
  esac
}
record() { echo "$1" >>"$results"; }
now() { date +%s.%N; }
elapsed() { python3 -c "import sys; print(f'{float(sys.argv[2]) - float(sys.argv[1]):.6f}')" "$1" "$2"; }
load() { cut -d' ' -f1 /proc/loadavg; }
drop_caches() { sync; echo 3 >/proc/sys/vm/drop_caches; }
# The mounting process's status field ($2, e.g. VmHWM) in bytes.
status_bytes() { awk -v k="$2:" '$1 == k { print $2 * 1024 }' "/proc/$1/status"; }

# onecopy_mount REPO NAME [OPTIONS]: mounts and sets mount_pid from the command's message.
onecopy_mount() {
  local line
  line=$(ONECOPY_REPO=$1 "$onecopy" mount "$2" "$mnt" ${3:+-o "$3"})
  mount_pid=$(sed -n 's/.*(pid \([0-9]*\);.*/\1/p' <<<"$line")
  [ -n "$mount_pid" ] || { echo "no pid in: $line" >&2; exit 1; }
  mounted=$mnt
}

# onecopy_umount REPO: unmounts and waits until the mounting process has checkpointed and left.
onecopy_umount() {
  ONECOPY_REPO=$1 "$onecopy" umount "$mnt" >/dev/null
  for _ in $(seq 1 600); do kill -0 "$mount_pid" 2>/dev/null || break; sleep 0.1; done
  if kill -0 "$mount_pid" 2>/dev/null; then echo "mount process $mount_pid did not exit" >&2; exit 1; fi
  mount_pid=""
  mounted=""
}

# --- the systems of the comparison: fresh, mount (the directory to use), unmount ---

system_fresh() {
  case $1 in
    ext4) rm -rf "$work/ext4"; mkdir "$work/ext4" ;;
    bindfs | bindfs-mt) rm -rf "$work/bindfs"; mkdir "$work/bindfs" ;;
    onecopy)
      rm -rf "$work/repository"
      ONECOPY_REPO=$work/repository "$onecopy" init >/dev/null
      # --idle 0: no deduplication runs by itself, so this is the face without deduplication.
      ONECOPY_REPO=$work/repository "$onecopy" fs create bench --idle 0 >/dev/null ;;
  esac
}

system_mount() {
  case $1 in
    ext4) dir=$work/ext4 ;;
    bindfs) bindfs "$work/bindfs" "$mnt"; mounted=$mnt; dir=$mnt ;;
    bindfs-mt) bindfs --multithreaded "$work/bindfs" "$mnt"; mounted=$mnt; dir=$mnt ;;
    onecopy) onecopy_mount "$work/repository" bench; dir=$mnt ;;
  esac
}

system_umount() {
  case $1 in
    ext4) ;;
    bindfs | bindfs-mt) fusermount3 -u "$mnt"; mounted="" ;;
    onecopy) onecopy_umount "$work/repository" ;;
  esac
}

# ---------------------------------------------------------------------------------------------

seq_bytes=$(to_bytes "$SEQ_SIZE")
echo "machine: $(nproc) cores, load $(load), kernel $(uname -r), $(bindfs --version | head -1)" >&2
record "{\"kind\":\"machine\",\"cores\":$(nproc),\"load\":$(load),\"kernel\":\"$(uname -r)\",\"code\":\"$(cd "$root" && git rev-parse --short HEAD)\"}"

if phase compare; then
  echo "preparing $SEQ_SIZE of random data and a tarball of $TREE in $shm" >&2
  head -c "$seq_bytes" /dev/urandom >"$shm/seq.bin"
  tar -cf "$shm/tree.tar" -C "$(dirname "$TREE")" "$(basename "$TREE")"
  tree_files=$(tar -tf "$shm/tree.tar" | wc -l)
  tree_bytes=$(stat -c %s "$shm/tree.tar")
  for ((pair = 1; pair <= PAIRS; pair++)); do
    for system in ext4 bindfs bindfs-mt onecopy; do
      system_fresh "$system"
      drop_caches
      system_mount "$system"
      # Sequential write: 1 MiB writes from tmpfs, then fsync (dd conv=fsync), all timed.
      start=$(now)
      dd if="$shm/seq.bin" of="$dir/seq.bin" bs=1M conv=fsync status=none
      seconds=$(elapsed "$start" "$(now)")
      record "{\"kind\":\"compare\",\"pair\":$pair,\"system\":\"$system\",\"test\":\"seq-write\",\"seconds\":$seconds,\"bytes\":$seq_bytes,\"load\":$(load)}"
      # Untar of a real tree (no sync: each system as an application sees it).
      start=$(now)
      tar -xf "$shm/tree.tar" -C "$dir"
      seconds=$(elapsed "$start" "$(now)")
      record "{\"kind\":\"compare\",\"pair\":$pair,\"system\":\"$system\",\"test\":\"untar\",\"seconds\":$seconds,\"bytes\":$tree_bytes,\"files\":$tree_files,\"load\":$(load)}"
      # Cold caches: unmount (FUSE's caches), then the kernel's.
      system_umount "$system"
      drop_caches
      system_mount "$system"
      start=$(now)
      dd if="$dir/seq.bin" of=/dev/null bs=1M status=none
      seconds=$(elapsed "$start" "$(now)")
      record "{\"kind\":\"compare\",\"pair\":$pair,\"system\":\"$system\",\"test\":\"seq-read\",\"seconds\":$seconds,\"bytes\":$seq_bytes,\"load\":$(load)}"
      system_umount "$system"
      drop_caches
      system_mount "$system"
      # lstat of every entry of the untarred tree, cold, walked by os.scandir (one readdir per
      # directory, one lstat per entry).
      python3 - "$dir/$(basename "$TREE")" "$pair" "$system" >>"$results" <<'PY'
import json, os, sys, time
top, pair, system = sys.argv[1], int(sys.argv[2]), sys.argv[3]
start = time.monotonic()
count, stack = 0, [top]
while stack:
    with os.scandir(stack.pop()) as entries:
        for entry in entries:
            os.lstat(entry.path)
            count += 1
            if entry.is_dir(follow_symlinks=False):
                stack.append(entry.path)
seconds = time.monotonic() - start
load = float(open("/proc/loadavg").read().split()[0])
print(json.dumps({"kind": "compare", "pair": pair, "system": system, "test": "stat",
                  "seconds": seconds, "files": count, "load": load}))
PY
      system_umount "$system"
      echo "pair $pair $system done (load $(load))" >&2
    done
  done
  rm -f "$shm/seq.bin" "$shm/tree.tar"
  rm -rf "$work/ext4" "$work/bindfs" "$work/repository"
fi

if phase rank1; then
  rank_bytes=$(to_bytes "$RANK_FILE_SIZE")
  # a: unique random data. b: a with every fourth MiB replaced by other random data, so that
  # after deduplication three quarters of b's chunks are a's.
  head -c "$((2 * rank_bytes))" /dev/urandom >"$shm/random.bin"
  head -c "$rank_bytes" "$shm/random.bin" >"$shm/a.bin"
  python3 - "$shm/random.bin" "$shm/b.bin" "$rank_bytes" <<'PY'
import sys
source, target, size = sys.argv[1], sys.argv[2], int(sys.argv[3])
mib = 1 << 20
with open(source, "rb") as random, open(target, "wb") as out:
    for index in range(size // mib):
        random.seek(index * mib + (size if index % 4 == 3 else 0))
        out.write(random.read(mib))
PY
  rm -f "$shm/random.bin"
  for variant in plain dedup; do
    repository=$work/rank-$variant
    ONECOPY_REPO=$repository "$onecopy" init >/dev/null
    # Ranks settle in seconds: modified more than 1 s ago and 3 reads make a hot file rank 1.
    ONECOPY_REPO=$repository "$onecopy" fs create rank --idle 0 --min-evaluation-interval 1s \
      --max-hot-interval 1h --min-evaluation-count 3 >/dev/null
    onecopy_mount "$repository" rank
    for file in a b; do dd if="$shm/$file.bin" of="$mnt/$file.bin" bs=1M conv=fsync status=none; done
    sleep 2
    # Two sequential passes over each file: every read request but the first of each pass
    # starts where the previous one ended.
    for _ in 1 2; do
      for file in a b; do dd if="$mnt/$file.bin" of=/dev/null bs=1M status=none; done
    done
    onecopy_umount "$repository"
  done
  # One cold read of the repository to be deduplicated, before its deduplication.
  for variant in plain dedup; do
    repository=$work/rank-$variant
    drop_caches
    onecopy_mount "$repository" rank
    for file in a b; do
      drop_caches
      start=$(now)
      dd if="$mnt/$file.bin" of=/dev/null bs=1M status=none
      seconds=$(elapsed "$start" "$(now)")
      record "{\"kind\":\"rank1\",\"round\":0,\"variant\":\"$variant\",\"file\":\"$file\",\"seconds\":$seconds,\"bytes\":$rank_bytes,\"load\":$(load)}"
    done
    onecopy_umount "$repository"
  done
  repository=$work/rank-dedup
  onecopy_mount "$repository" rank
  ONECOPY_REPO=$repository "$onecopy" fs ranks rank --json >"$OUT/rank1-ranks-before.json"
  ONECOPY_REPO=$repository "$onecopy" fs dedup rank --json >"$OUT/rank1-dedup.json"
  ONECOPY_REPO=$repository "$onecopy" fs ranks rank --json >"$OUT/rank1-ranks-after.json"
  ONECOPY_REPO=$repository "$onecopy" fs stats rank --json >"$OUT/rank1-stats.json"
  record "{\"kind\":\"rank1-state\",\"ranks_before\":$(cat "$OUT/rank1-ranks-before.json" | tr -d '\n'),\"ranks_after\":$(cat "$OUT/rank1-ranks-after.json" | tr -d '\n'),\"stats\":$(cat "$OUT/rank1-stats.json" | tr -d '\n')}"
  onecopy_umount "$repository"
  for ((round = 1; round <= RANK_ROUNDS; round++)); do
    for variant in plain dedup; do
      repository=$work/rank-$variant
      drop_caches
      onecopy_mount "$repository" rank
      for file in a b; do
        # Each file cold: b's shared chunks are a's, which a's reading would leave cached.
        drop_caches
        start=$(now)
        dd if="$mnt/$file.bin" of=/dev/null bs=1M status=none
        seconds=$(elapsed "$start" "$(now)")
        record "{\"kind\":\"rank1\",\"round\":$round,\"variant\":\"$variant\",\"file\":\"$file\",\"seconds\":$seconds,\"bytes\":$rank_bytes,\"load\":$(load)}"
        # The bytes read are the bytes written.
        cmp -s "$mnt/$file.bin" "$shm/$file.bin" || { echo "rank1: $variant $file differs" >&2; exit 1; }
      done
      onecopy_umount "$repository"
    done
    echo "rank1 round $round done (load $(load))" >&2
  done
  rm -rf "$work/rank-plain" "$work/rank-dedup" "$shm/a.bin" "$shm/b.bin"
fi

if phase ram; then
  step_bytes=$(to_bytes "$RAM_STEP")
  for chunk in $RAM_CHUNKS; do
    repository=$work/ram
    rm -rf "$repository"
    ONECOPY_REPO=$repository "$onecopy" init >/dev/null
    # Every file is cold 1 s after its last access (rank 3), so `fs dedup` cuts all of it into
    # small chunks of the size under test.
    ONECOPY_REPO=$repository "$onecopy" fs create ram --idle 0 --min-evaluation-interval 1s \
      --max-hot-interval 1s --small-chunk "$chunk" >/dev/null
    # The empty file system, reopened: the fixed part.
    onecopy_mount "$repository" ram
    stat "$mnt" >/dev/null
    record "{\"kind\":\"ram\",\"chunk\":\"$chunk\",\"step\":0,\"stored_bytes\":0,\"logical_bytes\":0,\"reopened_rss\":$(status_bytes "$mount_pid" VmRSS),\"reopened_anon\":$(status_bytes "$mount_pid" RssAnon),\"peak_rss\":$(status_bytes "$mount_pid" VmHWM)}"
    for ((step = 1; step <= RAM_STEPS; step++)); do
      fio --name=step --filename="$mnt/step$step" --rw=write --bs=1M --size="$step_bytes" \
        --refill_buffers --randrepeat=0 --end_fsync=1 --output=/dev/null
      sleep 2
      ONECOPY_REPO=$repository "$onecopy" fs dedup ram --json >"$OUT/ram-$chunk-dedup-$step.json"
      ONECOPY_REPO=$repository "$onecopy" fs stats ram --json >"$OUT/ram-$chunk-stats-$step.json"
      peak=$(status_bytes "$mount_pid" VmHWM)
      onecopy_umount "$repository"
      # Reopened: the memory that stays with the data, after one read of each file's first bytes.
      onecopy_mount "$repository" ram
      for ((file = 1; file <= step; file++)); do head -c 4096 "$mnt/step$file" >/dev/null; done
      python3 - "$OUT/ram-$chunk-stats-$step.json" "$chunk" "$step" "$peak" \
        "$(status_bytes "$mount_pid" VmRSS)" "$(status_bytes "$mount_pid" RssAnon)" >>"$results" <<'PY'
import json, sys
stats = json.load(open(sys.argv[1]))
print(json.dumps({"kind": "ram", "chunk": sys.argv[2], "step": int(sys.argv[3]),
                  "stored_bytes": stats["stored_bytes"], "logical_bytes": stats["logical_bytes"],
                  "pending_bytes": stats["pending_bytes"], "chunks": stats["face"]["live_chunks"],
                  "peak_rss": int(sys.argv[4]), "reopened_rss": int(sys.argv[5]),
                  "reopened_anon": int(sys.argv[6])}))
PY
      echo "ram $chunk step $step done (load $(load))" >&2
    done
    onecopy_umount "$repository"
    rm -rf "$repository"
  done
fi

if phase cache; then
  repository=$work/cache
  ONECOPY_REPO=$repository "$onecopy" init >/dev/null
  ONECOPY_REPO=$repository "$onecopy" fs create cache --idle 0 >/dev/null
  onecopy_mount "$repository" cache
  head -c "$seq_bytes" /dev/urandom >"$mnt/file.bin"
  onecopy_umount "$repository"
  # Alternated: each round mounts without, then with keep_cache, reads the file cold once
  # (after dropping caches), then twice more, each a new open.
  for ((round = 1; round <= CACHE_ROUNDS; round++)); do
    for options in default keep_cache; do
      drop_caches
      onecopy_mount "$repository" cache "$([ "$options" = keep_cache ] && echo keep_cache)"
      for reading in 1 2 3; do
        start=$(now)
        dd if="$mnt/file.bin" of=/dev/null bs=1M status=none
        seconds=$(elapsed "$start" "$(now)")
        record "{\"kind\":\"cache\",\"round\":$round,\"options\":\"$options\",\"reading\":$reading,\"seconds\":$seconds,\"bytes\":$seq_bytes,\"load\":$(load)}"
      done
      onecopy_umount "$repository"
    done
  done
  rm -rf "$repository"
fi

if phase threads; then
  repository=$work/threads
  ONECOPY_REPO=$repository "$onecopy" init >/dev/null
  ONECOPY_REPO=$repository "$onecopy" fs create threads --idle 0 >/dev/null
  head -c "$seq_bytes" /dev/urandom >"$shm/file.bin"
  onecopy_mount "$repository" threads
  dd if="$shm/file.bin" of="$mnt/file.bin" bs=1M conv=fsync status=none
  onecopy_umount "$repository"
  mkdir -p "$work/bindfs"
  cp "$shm/file.bin" "$work/bindfs/file.bin"
  rm -f "$shm/file.bin"
  # Round 0 is not recorded: the disk's host may still cache what was just written (dropping
  # the guest's caches does not reach it), which made the first reading up to 2.7x faster.
  for ((round = 0; round <= THREADS_ROUNDS; round++)); do
    for reader in bindfs-mt $THREADS; do
      drop_caches
      if [ "$reader" = bindfs-mt ]; then
        bindfs --multithreaded "$work/bindfs" "$mnt"
        mounted=$mnt
      else
        onecopy_mount "$repository" threads "threads=$reader"
      fi
      start=$(now)
      dd if="$mnt/file.bin" of=/dev/null bs=1M status=none
      seconds=$(elapsed "$start" "$(now)")
      [ "$round" -eq 0 ] || record "{\"kind\":\"threads\",\"round\":$round,\"reader\":\"$reader\",\"seconds\":$seconds,\"bytes\":$seq_bytes,\"load\":$(load)}"
      if [ "$reader" = bindfs-mt ]; then
        fusermount3 -u "$mnt"
        mounted=""
      else
        onecopy_umount "$repository"
      fi
    done
  done
  rm -rf "$repository" "$work/bindfs"
fi

if phase writeback; then
  seq_bytes=$(to_bytes "$SEQ_SIZE")
  small_bytes=$(to_bytes "$SMALL_SIZE")
  head -c "$seq_bytes" /dev/urandom >"$shm/seq.bin"
  head -c "$small_bytes" /dev/urandom >"$shm/small.bin"
  tar -cf "$shm/tree.tar" -C "$(dirname "$TREE")" "$(basename "$TREE")"
  tree_bytes=$(stat -c %s "$shm/tree.tar")
  tree_files=$(tar -tf "$shm/tree.tar" | wc -l)
  repository=$work/writeback
  for ((pair = 1; pair <= PAIRS; pair++)); do
    for options in default writeback_cache; do
      rm -rf "$repository"
      ONECOPY_REPO=$repository "$onecopy" init >/dev/null
      ONECOPY_REPO=$repository "$onecopy" fs create writeback --idle 0 >/dev/null
      drop_caches
      if [ "$options" = default ]; then
        onecopy_mount "$repository" writeback no_writeback_cache
      else
        onecopy_mount "$repository" writeback writeback_cache
      fi
      start=$(now)
      dd if="$shm/seq.bin" of="$mnt/seq.bin" bs=1M conv=fsync status=none
      seconds=$(elapsed "$start" "$(now)")
      record "{\"kind\":\"writeback\",\"pair\":$pair,\"options\":\"$options\",\"test\":\"seq-write\",\"seconds\":$seconds,\"bytes\":$seq_bytes,\"load\":$(load)}"
      start=$(now)
      dd if="$shm/small.bin" of="$mnt/small.bin" bs=4k conv=fsync status=none
      seconds=$(elapsed "$start" "$(now)")
      record "{\"kind\":\"writeback\",\"pair\":$pair,\"options\":\"$options\",\"test\":\"small-write\",\"seconds\":$seconds,\"bytes\":$small_bytes,\"load\":$(load)}"
      start=$(now)
      tar -xf "$shm/tree.tar" -C "$mnt"
      sync -f "$mnt"
      seconds=$(elapsed "$start" "$(now)")
      record "{\"kind\":\"writeback\",\"pair\":$pair,\"options\":\"$options\",\"test\":\"untar\",\"seconds\":$seconds,\"bytes\":$tree_bytes,\"files\":$tree_files,\"load\":$(load)}"
      onecopy_umount "$repository"
      echo "writeback pair $pair $options done (load $(load))" >&2
    done
  done
  rm -rf "$repository" "$shm/seq.bin" "$shm/small.bin" "$shm/tree.tar"
fi

python3 "$root/bench/fs/report.py" "$results" | tee "$OUT/report.md"
