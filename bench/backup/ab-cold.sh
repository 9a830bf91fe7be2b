#!/usr/bin/env bash
# A/B of one cold `backup create`: binaries A B ... back up the same typescript release into
# copies of one repository, in alternation, with the page cache dropped before each run.
#
#   bench/backup/ab-cold.sh target/release/onecopy /tmp/onecopy-before
#
# Needs root (drop_caches) and the releases the lab downloads (`onecopy lab paper2 --series
# typescript` fills ~/.cache/onecopy-lab/typescript/trees). Prints one line per run: binary,
# wall ms, then from `--json` the chunker thread's busy ms, fingerprint, compress, inline and
# whole-command ms. ROUNDS (default 6) rounds; HISTORY (default 3) releases are backed up
# into the template repository first, and release HISTORY+1 is timed.
set -euo pipefail
[ $# -ge 1 ] || { echo "usage: $0 BINARY..." >&2; exit 2; }
TREES=${TREES:-$HOME/.cache/onecopy-lab/typescript/trees}
ROUNDS=${ROUNDS:-6}
HISTORY=${HISTORY:-3}
mapfile -t releases < <(ls "$TREES")
[ "${#releases[@]}" -gt "$HISTORY" ] || { echo "need more than $HISTORY releases in $TREES" >&2; exit 1; }
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
# The repositories are encrypted (the default); INIT_ARGS=--insecure-no-encryption times
# without encryption.
export ONECOPY_PASSWORD=${ONECOPY_PASSWORD:-bench}
"$1" --repo "$work/template" init ${INIT_ARGS:-} >/dev/null
for ((i = 0; i < HISTORY; i++)); do
  "$1" --repo "$work/template" backup create ts "$TREES/${releases[$i]}" >/dev/null
done
timed="$TREES/${releases[$HISTORY]}"
echo "binary wall_ms chunk_ms fingerprint_ms compress_ms inline_ms create_ms"
for ((round = 0; round < ROUNDS; round++)); do
  for binary in "$@"; do
    rm -rf "$work/repo"
    cp -a "$work/template" "$work/repo"
    sync
    echo 3 >/proc/sys/vm/drop_caches
    start=$(date +%s%N)
    "$binary" --repo "$work/repo" backup create ts "$timed" --json >"$work/report.json"
    end=$(date +%s%N)
    python3 - "$binary" $(((end - start) / 1000)) "$work/report.json" <<'EOF'
import json, sys
binary, wall_us, path = sys.argv[1], int(sys.argv[2]), sys.argv[3]
report = json.load(open(path))
inline = report["inline"]
ms = lambda seconds: f"{seconds * 1000:.1f}"
print(binary, f"{wall_us / 1000:.1f}", ms(inline["chunk_seconds"]), ms(inline["fingerprint_seconds"]),
      ms(inline["compress_seconds"]), ms(inline["seconds"]), ms(report["seconds"]))
EOF
  done
done
