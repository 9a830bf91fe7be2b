#!/usr/bin/env bash
# The cost of encryption: the same backup into an encrypted and an unencrypted
# (`init --insecure-no-encryption`) store, in alternation, ROUNDS rounds (default 5).
#
#   bench/backup/ab-encryption.sh target/release/onecopy /usr/share
#
# Each round, for each store: a fresh repository (init outside the timing), a first backup
# of SOURCE, then a restore of it into an empty directory under RESTORE_BASE (default
# /dev/shm: memory, so that the disk's writeback does not drown the cipher's cost). Prints one line per run: mode,
# step, wall seconds, CPU seconds (user + system), peak RSS in KiB, from /usr/bin/time; then
# the store's bytes and the catalog's bytes.
set -euo pipefail
[ $# -eq 2 ] || { echo "usage: $0 BINARY SOURCE" >&2; exit 2; }
binary=$(realpath "$1")
source=$2
ROUNDS=${ROUNDS:-5}
RESTORE_BASE=${RESTORE_BASE:-/dev/shm}
work=$(mktemp -d /var/tmp/onecopy-ab-encryption.XXXXXX)
restored=$(mktemp -d "$RESTORE_BASE/onecopy-ab-encryption.XXXXXX")
trap 'rm -rf "$work" "$restored"' EXIT
export ONECOPY_PASSWORD=bench
timed() { # MODE STEP COMMAND...
  local mode=$1 step=$2; shift 2
  /usr/bin/time -f "%e %U %S %M" -o "$work/time" "$@" >/dev/null 2>&1
  read -r wall user system peak <"$work/time"
  echo "$mode $step wall=$wall cpu=$(echo "$user + $system" | bc) peak_kib=$peak"
}
for round in $(seq 1 "$ROUNDS"); do
  for mode in encrypted plain; do
    repo=$work/$mode
    rm -rf "$repo" "$restored/tree"
    if [ "$mode" = plain ]; then
      "$binary" --repo "$repo" init --insecure-no-encryption >/dev/null 2>&1
    else
      "$binary" --repo "$repo" init >/dev/null 2>&1
    fi
    timed "$mode" create "$binary" --repo "$repo" backup create s "$source"
    mkdir "$restored/tree"
    timed "$mode" restore "$binary" --repo "$repo" backup restore s "$restored/tree"
    echo "$mode store_bytes=$(du -sb "$repo/backup" | cut -f1) catalog_bytes=$(stat -c %s "$repo/backup/catalog.redb")"
  done
done
