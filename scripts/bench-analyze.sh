#!/usr/bin/env bash
# Throughput of `onecopy analyze` on page-cached data, both cores.
#
# Usage: scripts/bench-analyze.sh [SIZE] [CHUNKER...]   (defaults: 2G fixed:4096)
#
# Makes a file of SIZE random bytes under target/bench-data/ (kept for later runs), reads it
# once so that it is in the page cache, then for each chunker runs `onecopy analyze --json`
# RUNS times (default 3) and prints throughput (total_bytes / seconds of the pass), the CPU
# time the process used (user + system; on a machine shared with other jobs, bytes per CPU
# second shows the cost independently of how much CPU the others left) and its peak memory. As a yardstick in the same run it times reading the file from the page
# cache with dd (8 MiB reads, one core): analyze cannot beat reading its input.
set -euo pipefail
cd "$(dirname "$0")/.."

size=${1:-2G}
shift || true
chunkers=("$@")
[ ${#chunkers[@]} -gt 0 ] || chunkers=(fixed:4096)
runs=${RUNS:-3}

cargo build --release --quiet -p onecopy
binary=target/release/onecopy
data_dir=target/bench-data
file="$data_dir/random-$size.bin"
mkdir -p "$data_dir"
if [ ! -f "$file" ]; then
  head -c "$size" /dev/urandom >"$file.partial"
  mv "$file.partial" "$file"
fi
bytes=$(stat -c %s "$file")
cat "$file" >/dev/null

start=$(date +%s.%N)
dd if="$file" of=/dev/null bs=8M status=none
end=$(date +%s.%N)
python3 -c "import sys; b,s,e=map(float,sys.argv[1:]); print(f'yardstick: page-cache read with dd: {b/(e-s)/1e9:.2f} GB/s')" "$bytes" "$start" "$end"

for chunker in "${chunkers[@]}"; do
  for run in $(seq "$runs"); do
    report=$(/usr/bin/time -f '%M %U %S' -o "$data_dir/resources" "$binary" analyze --json --chunker "$chunker" "$file")
    python3 - "$report" "$(cat "$data_dir/resources")" "$run" <<'PY'
import json, sys
result = json.loads(sys.argv[1])["results"][0]
peak_kib, user, system = sys.argv[2].split()
peak = int(peak_kib) * 1024
cpu = float(user) + float(system)
total = result["total_bytes"]
print(f"{result['chunker']} run {sys.argv[3]}: {total / result['seconds'] / 1e9:.2f} GB/s wall "
      f"({total} bytes in {result['seconds']:.3f} s); {cpu:.2f} CPU s = {total / cpu / 1e9:.2f} GB per CPU second; "
      f"{result['unique_chunks']} unique chunks; peak memory {peak / 2**20:.1f} MiB")
PY
  done
done
