#!/usr/bin/env bash
# A/B of sequential writes: binaries A B ... each serve a fresh volume on tmpfs, in
# alternation, and fio's nbd engine writes SIZE bytes at depth 8 in requests of BS.
#
#   BS=1M ROUNDS=3 bench/block/ab-seq-write.sh /tmp/onecopy-before target/release/onecopy
#
# Prints one line per run: binary, request size, GB/s.
set -euo pipefail
[ $# -ge 1 ] || { echo "usage: $0 BINARY..." >&2; exit 2; }
BS=${BS:-1M}
SIZE=${SIZE:-3G}
ROUNDS=${ROUNDS:-3}
work=$(mktemp -d "${SHM_DIR:-/dev/shm}/onecopy-ab.XXXXXX")
server=""
cleanup() {
  [ -n "$server" ] && kill -TERM "$server" 2>/dev/null && wait "$server" || true
  rm -rf "$work"
}
trap cleanup EXIT
for ((round = 0; round < ROUNDS; round++)); do
  for binary in "$@"; do
    export ONECOPY_REPO=$work/repository
    rm -rf "$ONECOPY_REPO" "$work/nbd.sock"
    "$binary" init >/dev/null
    "$binary" volume create disk --size 16G >/dev/null
    "$binary" serve --socket "$work/nbd.sock" >"$work/server.log" 2>&1 &
    server=$!
    until grep -q 'Ctrl-C' "$work/server.log"; do
      kill -0 "$server" 2>/dev/null || { cat "$work/server.log" >&2; exit 1; }
      sleep 0.01
    done
    fio --output-format=json --output="$work/fio.json" --name=write --ioengine=nbd \
      --uri="nbd+unix:///disk?socket=$work/nbd.sock" --rw=write --bs="$BS" --iodepth=8 \
      --size="$SIZE" --refill_buffers >/dev/null
    kill -TERM "$server"
    wait "$server"
    server=""
    python3 - "$binary" "$BS" "$work/fio.json" <<'PY'
import json, sys
write = json.load(open(sys.argv[3]))["jobs"][0]["write"]
print(sys.argv[1], sys.argv[2], f"{write['bw_bytes'] / 1e9:.3f} GB/s")
PY
  done
done
