#!/usr/bin/env bash
# onecopy against restic (its S3 backend) and rustic (opendal's S3 service) on one three-node
# Garage cluster (scripts/garage-cluster.sh, replication factor 3), in one run, on a real
# series of releases: the typescript package, RELEASES successive stable versions (default 12)
# from the npm registry, unpacked (about 23 MB each).
#
#   bench/backup/s3-peers.sh target/release/onecopy [OUT]
#
# Per tool, each in its own bucket: the backups of every release in order (wall time of all,
# and of the last one), a restore of the newest into /dev/shm (wall time), the deletion of
# the oldest backup with what frees its space (onecopy `backup delete`; restic and rustic
# `forget --prune`), the bucket's bytes and objects after the backups, and the S3 requests the
# cluster served for the backups (node 1's api_s3_request_counter; every client talks to node
# 1). Peak memory per step from /usr/bin/time. Writes OUT/results.tsv (default
# /var/tmp/onecopy-s3-peers) and prints it. restic comes from scripts/setup.sh; rustic is
# built with `cargo install rustic-rs --locked` when missing (about 25 minutes on 2 cores; set
# INSTALL_PEERS=0 to skip it instead).
set -euo pipefail
[ $# -ge 1 ] || { echo "usage: $0 ONECOPY [OUT]" >&2; exit 2; }
onecopy=$(realpath "$1")
out=${2:-/var/tmp/onecopy-s3-peers}
RELEASES=${RELEASES:-12}
root=$(cd "$(dirname "$0")/../.." && pwd)
versions=(5.0.2 5.0.3 5.0.4 5.1.3 5.1.5 5.1.6 5.2.2 5.3.2 5.3.3 5.4.2 5.4.3 5.4.4 5.4.5 5.5.2 5.5.3 5.5.4)
[ "$RELEASES" -le ${#versions[@]} ] || { echo "at most ${#versions[@]} releases" >&2; exit 2; }
versions=("${versions[@]:0:$RELEASES}")

mkdir -p "$out"
data=${DATA:-/var/tmp/onecopy-s3-peers-data}
mkdir -p "$data"
for version in "${versions[@]}"; do
  [ -d "$data/$version" ] && continue
  scratch=$(mktemp -d "$data/.fetch.XXXXXX")
  curl --fail --silent --show-error --location --retry 3 \
    -o "$scratch/t.tgz" "https://registry.npmjs.org/typescript/-/typescript-$version.tgz"
  mkdir "$scratch/tree" && tar -xzf "$scratch/t.tgz" -C "$scratch/tree"
  mv "$scratch/tree" "$data/$version" && rm -rf "$scratch"
done
logical=0
for version in "${versions[@]}"; do
  logical=$((logical + $(du -sb "$data/$version" | cut -f1)))
done

cluster=$(mktemp -d /var/tmp/onecopy-s3-cluster.XXXXXX)
work=$(mktemp -d /var/tmp/onecopy-s3-work.XXXXXX)
restored=$(mktemp -d /dev/shm/onecopy-s3-restore.XXXXXX)
cleanup() {
  "$root/scripts/garage-cluster.sh" stop "$cluster/c" >/dev/null 2>&1 || true
  rm -rf "$cluster" "$work" "$restored"
}
trap cleanup EXIT
"$root/scripts/garage-cluster.sh" start "$cluster/c" >/dev/null
# shellcheck disable=SC1091
. "$cluster/c/env"
export AWS_ACCESS_KEY_ID AWS_SECRET_ACCESS_KEY AWS_DEFAULT_REGION
endpoint=$GARAGE_S3_ENDPOINT

requests() { # S3 requests node 1 has served
  curl -s "$GARAGE_ADMIN_ENDPOINT/metrics" \
    | awk '/^api_s3_request_counter/{sum += $NF} END {printf "%d\n", sum}'
}
bucket_bytes() { # BUCKET -> "bytes objects"
  "$root/scripts/garage-cluster.sh" bucket-usage "$cluster/c" "$1"
}
results=$out/results.tsv
printf 'tool\tstep\twall_s\tpeak_kib\trequests\tnote\n' >"$results"
timed() { # TOOL STEP COMMAND...
  local tool=$1 step=$2 before after; shift 2
  before=$(requests)
  if ! /usr/bin/time -f "%e %M" -o "$work/time" "$@" >"$work/out" 2>&1; then
    echo "$tool $step failed:" >&2; tail -5 "$work/out" >&2; exit 1
  fi
  after=$(requests)
  read -r wall peak <"$work/time"
  printf '%s\t%s\t%s\t%s\t%s\t\n' "$tool" "$step" "$wall" "$peak" "$((after - before))" >>"$results"
}
note() { printf '%s\t%s\t\t\t\t%s\n' "$1" "$2" "$3" >>"$results"; }

run_tool() { # TOOL: init, back up, measure, restore, delete
  local tool=$1 bucket=$1-bench start end
  "$root/scripts/garage-cluster.sh" bucket "$cluster/c" "$bucket" >/dev/null
  case $tool in
    onecopy)
      export ONECOPY_REPO=s3:$endpoint/$bucket/repo ONECOPY_PASSWORD=bench
      export ONECOPY_CACHE_DIR=$work/onecopy-cache
      "$onecopy" init >/dev/null 2>&1 ;;
    restic)
      export RESTIC_REPOSITORY=s3:$endpoint/$bucket RESTIC_PASSWORD=bench
      export RESTIC_CACHE_DIR=$work/restic-cache
      restic init >/dev/null 2>&1 ;;
    rustic)
      export RUSTIC_PASSWORD=bench
      cat >"$work/rustic.toml" <<EOF
[repository]
repository = "opendal:s3"
password = "bench"
cache-dir = "$work/rustic-cache"
[repository.options]
endpoint = "$endpoint"
bucket = "$bucket"
root = "/"
region = "$AWS_DEFAULT_REGION"
access_key_id = "$AWS_ACCESS_KEY_ID"
secret_access_key = "$AWS_SECRET_ACCESS_KEY"
EOF
      rustic -P "$work/rustic" init >/dev/null 2>&1 ;;
  esac
  start=$(requests)
  local first=1 began=$SECONDS
  for version in "${versions[@]}"; do
    local step=backup
    [ "$version" = "${versions[-1]}" ] && step=backup-last
    [ $first = 1 ] && step=backup-first && first=0
    case $tool in
      onecopy) timed "$tool" "$step" "$onecopy" backup create ts "$data/$version" ;;
      restic) timed "$tool" "$step" restic backup --host bench "$data/$version" ;;
      rustic) timed "$tool" "$step" rustic -P "$work/rustic" backup --host bench "$data/$version" ;;
    esac
  done
  end=$(requests)
  note "$tool" backups-total "wall_s=$((SECONDS - began)) requests=$((end - start)) logical_bytes=$logical"
  note "$tool" bucket "$(bucket_bytes "$bucket")"
  rm -rf "${restored:?}"/*
  case $tool in
    onecopy) timed "$tool" restore-newest "$onecopy" backup restore ts "$restored/t" ;;
    restic) timed "$tool" restore-newest restic restore latest --target "$restored/t" ;;
    rustic) timed "$tool" restore-newest rustic -P "$work/rustic" restore latest "$restored/t" ;;
  esac
  rm -rf "${restored:?}"/*
  case $tool in
    onecopy) timed "$tool" delete-oldest "$onecopy" backup delete ts@1 ;;
    restic)
      oldest=$(restic snapshots --json | python3 -c 'import json,sys; print(json.load(sys.stdin)[0]["short_id"])')
      timed "$tool" delete-oldest restic forget --prune "$oldest" ;;
    rustic)
      oldest=$(rustic -P "$work/rustic" snapshots --json | python3 -c '
import json, sys
groups = json.load(sys.stdin)
snapshots = [s for group in groups for s in (group[1] if isinstance(group, list) else group["snapshots"])]
print(sorted(snapshots, key=lambda s: s["time"])[0]["id"][:8])')
      timed "$tool" delete-oldest rustic -P "$work/rustic" forget --prune "$oldest" ;;
  esac
  note "$tool" bucket-after-delete "$(bucket_bytes "$bucket")"
}

if ! command -v rustic >/dev/null && [ "${INSTALL_PEERS:-1}" = 1 ]; then
  cargo install rustic-rs --locked >&2
fi
run_tool onecopy
for peer in restic rustic; do
  if command -v "$peer" >/dev/null; then
    run_tool "$peer"
  else
    echo "s3-peers: $peer is not installed; skipped" >&2
    note "$peer" skipped "not installed"
  fi
done
column -t -s $'\t' "$results"
