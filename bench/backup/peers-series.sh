#!/usr/bin/env bash
# onecopy, restic and borg backing up a series of releases, pair by pair: each round makes a
# fresh repository per tool (the order turns every round) and backs up every subdirectory of
# RELEASES in name order, each copied first to the same staging path (so the tools see one
# tree changing, as a backed-up directory does), then restores the newest.
#
#   bench/backup/peers-series.sh target/release/onecopy /var/tmp/typescript-releases
#
# Prints, per tool and round, a line per backup and one for the restore, as
# bench/backup/peers-tree.sh does (`TOOL backup-N round=R wall=S cpu=S peak_kib=K rchar=B
# read_bytes=B`), and the repository's size after the first and the last backup
# (`TOOL size-1 ...`, `TOOL size-N ...`). Environment: ROUNDS (default 2), RESTORE_BASE
# (default /dev/shm), WORK (default a new directory under /var/tmp), TOOLS (default
# "onecopy restic borg").
set -euo pipefail
[ $# -eq 2 ] || { echo "usage: $0 ONECOPY RELEASES" >&2; exit 2; }
onecopy=$(realpath "$1")
releases=$(realpath "$2")
ROUNDS=${ROUNDS:-2}
RESTORE_BASE=${RESTORE_BASE:-/dev/shm}
TOOLS=${TOOLS:-onecopy restic borg}
work=${WORK:-$(mktemp -d /var/tmp/peers-series.XXXXXX)}
mkdir -p "$work"
restored=$(mktemp -d "$RESTORE_BASE/peers-series.XXXXXX")
trap 'rm -rf "$work"/repo-* "$work/stage" "$restored"' EXIT
export ONECOPY_PASSWORD=bench RESTIC_PASSWORD=bench BORG_PASSPHRASE=bench
export BORG_UNKNOWN_UNENCRYPTED_REPO_ACCESS_IS_OK=yes BORG_RELOCATED_REPO_ACCESS_IS_OK=yes
export BORG_BASE_DIR=$work/borg-base RESTIC_CACHE_DIR=$work/restic-cache
mapfile -t versions < <(find "$releases" -mindepth 1 -maxdepth 1 -type d -printf '%f\n' | sort -V)
stage=$work/stage/release

measured() {
  local tool=$1 step=$2 round=$3; shift 3
  sh -c '/usr/bin/time -f "%e %U %S %M" -o "$0" "$@" >/dev/null 2>"$0.err" || { cat "$0.err" >&2; exit 1; }
         grep -E "^(rchar|read_bytes):" /proc/$$/io' "$work/time" "$@" >"$work/io"
  read -r wall user system peak <"$work/time"
  echo "$tool $step round=$round wall=$wall cpu=$(echo "$user + $system" | bc) peak_kib=$peak rchar=$(awk '/^rchar:/ {print $2}' "$work/io") read_bytes=$(awk '/^read_bytes:/ {print $2}' "$work/io")"
}

read -r -a tools <<<"$TOOLS"
for round in $(seq 1 "$ROUNDS"); do
  shift_by=$(( (round - 1) % ${#tools[@]} ))
  order=("${tools[@]:$shift_by}" "${tools[@]:0:$shift_by}")
  for tool in "${order[@]}"; do
    repo=$work/repo-$tool
    rm -rf "$repo"
    case $tool in
      onecopy) "$onecopy" --repo "$repo" init >/dev/null 2>&1 ;;
      restic) restic -r "$repo" init >/dev/null 2>&1 ;;
      borg) borg init -e repokey "$repo" >/dev/null 2>&1 ;;
    esac
    number=0
    for version in "${versions[@]}"; do
      number=$((number + 1))
      rm -rf "$work/stage"
      mkdir -p "$work/stage"
      cp -a "$releases/$version" "$stage"
      case $tool in
        onecopy) measured "$tool" "backup-$number" "$round" "$onecopy" --repo "$repo" backup create series "$stage" ;;
        restic) measured "$tool" "backup-$number" "$round" restic -r "$repo" backup -q "$stage" ;;
        borg) (cd "$work/stage" && measured "$tool" "backup-$number" "$round" borg create "$repo::r$number" release) ;;
      esac
      if [ "$number" -eq 1 ] || [ "$number" -eq "${#versions[@]}" ]; then
        echo "$tool size-$number round=$round bytes=$(du -sb "$repo" | cut -f1)"
      fi
    done
    target=$restored/$tool
    rm -rf "$target"
    mkdir "$target"
    case $tool in
      onecopy) measured "$tool" restore "$round" "$onecopy" --repo "$repo" backup restore series "$target" ;;
      restic) measured "$tool" restore "$round" restic -r "$repo" restore latest --target "$target" ;;
      borg) (cd "$target" && measured "$tool" restore "$round" borg extract "$repo::r$number") ;;
    esac
    rm -rf "$target" "$repo"
  done
done
