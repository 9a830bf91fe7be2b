#!/usr/bin/env bash
# onecopy against restic (its S3 backend) and rustic (opendal's S3 service) on one three-node
# Garage cluster (scripts/garage-cluster.sh, replication factor 3), in one run, on a real
# series of releases: the typescript package, RELEASES successive stable versions (default 16)
# from the npm registry, unpacked (about 23-40 MB each).
#
#   bench/backup/s3-peers.sh target/release/onecopy [OUT]
#
# Each tool has its own bucket. The tools take turns at every step, so that a machine whose
# load changes during the run weighs on all of them alike: release by release, each tool
# backs it up; then each restores the newest into /dev/shm; then each deletes the oldest
# backup with what frees its space (onecopy `backup delete`; restic and rustic `forget
# --prune`). Per step: wall and CPU seconds (user + system) and peak memory from
# /usr/bin/time, and the S3 requests the cluster served (node 1's api_s3_request_counter;
# every client talks to node 1); per tool the bucket's bytes and objects after the backups and
# after the deletion. Writes OUT/results.tsv (default /var/tmp/onecopy-s3-peers) and
# OUT/summary.md (totals per tool and onecopy's ratios against each peer), and prints both.
# restic comes from scripts/setup.sh; rustic is built with `cargo install rustic-rs --locked`
# when missing (about 25 minutes on 2 cores; INSTALL_PEERS=0 skips it instead).
set -euo pipefail
[ $# -ge 1 ] || { echo "usage: $0 ONECOPY [OUT]" >&2; exit 2; }
onecopy=$(realpath "$1")
out=${2:-/var/tmp/onecopy-s3-peers}
RELEASES=${RELEASES:-16}
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

if ! command -v rustic >/dev/null && [ "${INSTALL_PEERS:-1}" = 1 ]; then
  cargo install rustic-rs --locked >&2
fi
tools=(onecopy)
for peer in restic rustic; do
  if command -v "$peer" >/dev/null; then
    tools+=("$peer")
  else
    echo "s3-peers: $peer is not installed; skipped" >&2
  fi
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
bucket_bytes() { # BUCKET -> "bytes=B objects=N"
  "$root/scripts/garage-cluster.sh" bucket-usage "$cluster/c" "$1"
}
results=$out/results.tsv
printf 'tool\tstep\twall_s\tcpu_s\tpeak_kib\trequests\tnote\n' >"$results"

environment() { # TOOL: the variables its commands read
  case $1 in
    onecopy)
      export ONECOPY_REPO=s3:$endpoint/onecopy-bench/repo ONECOPY_PASSWORD=bench
      export ONECOPY_CACHE_DIR=$work/onecopy-cache ;;
    restic)
      export RESTIC_REPOSITORY=s3:$endpoint/restic-bench RESTIC_PASSWORD=bench
      export RESTIC_CACHE_DIR=$work/restic-cache ;;
    rustic)
      export RUSTIC_PASSWORD=bench ;;
  esac
}
timed() { # TOOL STEP COMMAND...
  local tool=$1 step=$2 before after; shift 2
  environment "$tool"
  sync
  before=$(requests)
  if ! /usr/bin/time -f "%e %U %S %M" -o "$work/time" "$@" >"$work/out" 2>&1; then
    echo "$tool $step failed:" >&2; tail -5 "$work/out" >&2; exit 1
  fi
  after=$(requests)
  read -r wall user system peak <"$work/time"
  printf '%s\t%s\t%s\t%s\t%s\t%s\t\n' "$tool" "$step" "$wall" \
    "$(echo "$user + $system" | bc)" "$peak" "$((after - before))" >>"$results"
}
note() { printf '%s\t%s\t\t\t\t\t%s\n' "$1" "$2" "$3" >>"$results"; }

for tool in "${tools[@]}"; do
  "$root/scripts/garage-cluster.sh" bucket "$cluster/c" "$tool-bench" >/dev/null
  environment "$tool"
  case $tool in
    onecopy) "$onecopy" init >/dev/null 2>&1 ;;
    restic) restic init >/dev/null 2>&1 ;;
    rustic)
      cat >"$work/rustic.toml" <<EOF
[repository]
repository = "opendal:s3"
password = "bench"
cache-dir = "$work/rustic-cache"
[repository.options]
endpoint = "$endpoint"
bucket = "rustic-bench"
root = "/"
region = "$AWS_DEFAULT_REGION"
access_key_id = "$AWS_ACCESS_KEY_ID"
secret_access_key = "$AWS_SECRET_ACCESS_KEY"
EOF
      rustic -P "$work/rustic" init >/dev/null 2>&1 ;;
  esac
done

for version in "${versions[@]}"; do
  for tool in "${tools[@]}"; do
    case $tool in
      onecopy) timed "$tool" backup "$onecopy" backup create ts "$data/$version" ;;
      restic) timed "$tool" backup restic backup --host bench "$data/$version" ;;
      rustic) timed "$tool" backup rustic -P "$work/rustic" backup --host bench "$data/$version" ;;
    esac
  done
done
for tool in "${tools[@]}"; do
  note "$tool" bucket "$(bucket_bytes "$tool-bench")"
done
for tool in "${tools[@]}"; do
  rm -rf "${restored:?}"/*
  case $tool in
    onecopy) timed "$tool" restore-newest "$onecopy" backup restore ts "$restored/t" ;;
    restic) timed "$tool" restore-newest restic restore latest --target "$restored/t" ;;
    rustic) timed "$tool" restore-newest rustic -P "$work/rustic" restore latest "$restored/t" ;;
  esac
done
rm -rf "${restored:?}"/*
for tool in "${tools[@]}"; do
  environment "$tool"
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
  note "$tool" bucket-after-delete "$(bucket_bytes "$tool-bench")"
done

python3 - "$results" "$logical" "${#versions[@]}" >"$out/summary.md" <<'EOF'
import csv, sys
rows = list(csv.DictReader(open(sys.argv[1]), delimiter="\t"))
logical, releases = int(sys.argv[2]), int(sys.argv[3])
tools = list(dict.fromkeys(row["tool"] for row in rows))
def steps(tool, step):
    return [row for row in rows if row["tool"] == tool and row["step"] == step]
def total(tool, step, field):
    return sum(float(row[field]) for row in steps(tool, step))
def noted(tool, step, key):
    for row in steps(tool, step):
        for part in row["note"].split():
            name, _, value = part.partition("=")
            if name == key:
                return int(value)
    return 0
figures = {}
for tool in tools:
    figures[tool] = {
        "backups, wall s": total(tool, "backup", "wall_s"),
        "backups, CPU s": total(tool, "backup", "cpu_s"),
        "restore of the newest, wall s": total(tool, "restore-newest", "wall_s"),
        "delete the oldest, wall s": total(tool, "delete-oldest", "wall_s"),
        "bucket after the backups, MB": noted(tool, "bucket", "bytes") / 1e6,
        "objects after the backups": noted(tool, "bucket", "objects"),
        "S3 requests of the backups": total(tool, "backup", "requests"),
        "peak memory of a backup, MiB": max(float(r["peak_kib"]) for r in steps(tool, "backup")) / 1024,
    }
print(f"{releases} typescript releases, {logical / 1e6:.1f} MB in all; tools in turn at every step.\n")
print("| | " + " | ".join(tools) + " | " + " | ".join(f"onecopy / {p}" for p in tools[1:]) + " |")
print("|---" * (1 + 2 * len(tools) - 1) + "|")
for name in figures[tools[0]]:
    values = [figures[tool][name] for tool in tools]
    ratios = [values[0] / value if value else float("nan") for value in values[1:]]
    cells = [f"{value:.2f}" if isinstance(value, float) else str(value) for value in values]
    print(f"| {name} | " + " | ".join(cells) + " | " + " | ".join(f"{r:.2f}" for r in ratios) + " |")
EOF
column -t -s $'\t' "$results"
cat "$out/summary.md"
