#!/usr/bin/env bash
# onecopy, restic and borg backing up one directory tree, pair by pair: each round makes a
# fresh repository per tool and runs, tool after tool (the order turns every round):
#
#   first     the first backup of SOURCE
#   unchanged BACKUPS-1 more backups of the unchanged tree
#   restore   a restore of the newest backup into an empty directory under RESTORE_BASE
#
#   bench/backup/peers-tree.sh target/release/onecopy /usr/share
#
# Every command runs under /usr/bin/time (wall seconds, CPU seconds, peak RSS) inside a shell
# that prints its own /proc/PID/io after waiting for it, which adds the command's `rchar`
# (bytes its read system calls returned) and `read_bytes` (bytes it made the disk read).
# After the backups each repository's size (`du -sb`). Encryption is on for every tool (the
# default): onecopy's default, restic's only mode, borg `repokey`. Prints one line per run:
#   TOOL STEP round=R wall=S cpu=S peak_kib=K rchar=B read_bytes=B
# and per round `TOOL size round=R bytes=B`. Environment: ROUNDS (default 3), BACKUPS
# (default 4), RESTORE_BASE (default /dev/shm), WORK (default a new directory under
# /var/tmp), TOOLS (default "onecopy restic borg").
set -euo pipefail
[ $# -eq 2 ] || { echo "usage: $0 ONECOPY SOURCE" >&2; exit 2; }
onecopy=$(realpath "$1")
source=$(realpath "$2")
ROUNDS=${ROUNDS:-3}
BACKUPS=${BACKUPS:-4}
RESTORE_BASE=${RESTORE_BASE:-/dev/shm}
TOOLS=${TOOLS:-onecopy restic borg}
work=${WORK:-$(mktemp -d /var/tmp/peers-tree.XXXXXX)}
mkdir -p "$work"
restored=$(mktemp -d "$RESTORE_BASE/peers-tree.XXXXXX")
trap 'rm -rf "$work"/repo-* "$restored"' EXIT
export ONECOPY_PASSWORD=bench RESTIC_PASSWORD=bench BORG_PASSPHRASE=bench
export BORG_UNKNOWN_UNENCRYPTED_REPO_ACCESS_IS_OK=yes BORG_RELOCATED_REPO_ACCESS_IS_OK=yes
export BORG_BASE_DIR=$work/borg-base RESTIC_CACHE_DIR=$work/restic-cache

# measured TOOL STEP ROUND COMMAND...: runs COMMAND (in the current directory) and prints
# its line.
measured() {
  local tool=$1 step=$2 round=$3; shift 3
  sh -c '/usr/bin/time -f "%e %U %S %M" -o "$0" "$@" >/dev/null 2>"$0.err" || { cat "$0.err" >&2; exit 1; }
         grep -E "^(rchar|read_bytes):" /proc/$$/io' "$work/time" "$@" >"$work/io"
  read -r wall user system peak <"$work/time"
  local rchar read_bytes
  rchar=$(awk '/^rchar:/ {print $2}' "$work/io")
  read_bytes=$(awk '/^read_bytes:/ {print $2}' "$work/io")
  echo "$tool $step round=$round wall=$wall cpu=$(echo "$user + $system" | bc) peak_kib=$peak rchar=$rchar read_bytes=$read_bytes"
}

init() { # TOOL REPO
  case $1 in
    onecopy) "$onecopy" --repo "$2" init >/dev/null 2>&1 ;;
    restic) restic -r "$2" init >/dev/null 2>&1 ;;
    borg) borg init -e repokey "$2" >/dev/null 2>&1 ;;
  esac
}

backup() { # TOOL REPO STEP ROUND NUMBER
  case $1 in
    onecopy) measured "$1" "$3" "$4" "$onecopy" --repo "$2" backup create tree "$source" ;;
    restic) measured "$1" "$3" "$4" restic -r "$2" backup -q "$source" ;;
    borg) measured "$1" "$3" "$4" borg create "$2::b$5" "$source" ;;
  esac
}

restore() { # TOOL REPO ROUND TARGET
  case $1 in
    onecopy) measured "$1" restore "$3" "$onecopy" --repo "$2" backup restore tree "$4" ;;
    restic) measured "$1" restore "$3" restic -r "$2" restore latest --target "$4" ;;
    borg)
      local last
      last=$(borg list --short "$2" | tail -1)
      (cd "$4" && measured "$1" restore "$3" borg extract "$2::$last")
      ;;
  esac
}

read -r -a tools <<<"$TOOLS"
for round in $(seq 1 "$ROUNDS"); do
  # Turn the order every round, so that no tool always runs right after another.
  shift_by=$(( (round - 1) % ${#tools[@]} ))
  order=("${tools[@]:$shift_by}" "${tools[@]:0:$shift_by}")
  for tool in "${order[@]}"; do
    repo=$work/repo-$tool
    rm -rf "$repo"
    init "$tool" "$repo"
    backup "$tool" "$repo" first "$round" 1
    for number in $(seq 2 "$BACKUPS"); do
      backup "$tool" "$repo" unchanged "$round" "$number"
    done
    echo "$tool size round=$round bytes=$(du -sb "$repo" | cut -f1)"
    target=$restored/$tool
    rm -rf "$target"
    mkdir "$target"
    restore "$tool" "$repo" "$round" "$target"
    rm -rf "$target" "$repo"
  done
done
