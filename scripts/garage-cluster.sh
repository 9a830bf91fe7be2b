#!/usr/bin/env bash
# A real Garage cluster on loopback for onecopy's object-storage tests and benchmarks: three
# `garage server` processes, one zone each (dc1, dc2, dc3), replication factor 3 and the
# "consistent" mode, so every object lives on all three nodes and reads and writes need a
# quorum of two. Killing one node therefore leaves the cluster readable and writable, which is
# what the fault tests rely on.
#
# Usage:
#   garage-cluster.sh start DIR [--bucket NAME] [--owner-pid PID]
#       Makes DIR (mode 0700), starts the cluster there and waits until it is healthy, creates
#       an access key and bucket NAME (default onecopy) the key may read, write and own, and
#       writes DIR/env for `source`:
#         AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_DEFAULT_REGION (garage),
#         GARAGE_S3_ENDPOINT (node 1), GARAGE_S3_ENDPOINTS (all three, space separated),
#         GARAGE_BUCKET, GARAGE_DIR, GARAGE_ADMIN_ENDPOINT, GARAGE_ADMIN_TOKEN.
#       DIR must be absent or empty, or hold a stopped cluster: `start` then restarts that
#       cluster on its old ports with its data and buckets (--bucket is ignored), and fails if
#       any of its nodes still runs. A start that fails stops the nodes it started.
#       With --owner-pid, a watchdog stops the cluster once process PID exits, so a test that
#       dies without cleaning up leaves no servers behind.
#   garage-cluster.sh bucket DIR NAME      another bucket for the same key
#   garage-cluster.sh bucket-usage DIR NAME   prints "bytes=B objects=N" of bucket NAME
#   garage-cluster.sh kill-node DIR N      SIGKILL node N (1-3) and wait until it is gone; the
#                                          other nodes notice later (a request may stall ~8 s)
#   garage-cluster.sh start-node DIR N     restart node N with its configuration and data and
#                                          wait until it has rejoined the running nodes
#   garage-cluster.sh stop DIR             stop every node and wait (safe when stopped)
#
# DIR layout: nodeN.toml (configuration), nodeN/meta and nodeN/data, nodeN.log, nodeN.pid,
# nodeN.id (node id@rpc address), env.
# Every wait is bounded by GARAGE_CLUSTER_TIMEOUT seconds (default 60); a failure prints the
# tails of the node logs. Each cluster gets its own ports, so clusters run in parallel.
set -euo pipefail

NODES=(1 2 3)
timeout_seconds=${GARAGE_CLUSTER_TIMEOUT:-60}
# Port reservations of every cluster on this machine (see pick_ports).
registry="${TMPDIR:-/tmp}/onecopy-garage-ports"

fail() {
  echo "garage-cluster: $*" >&2
  exit 1
}

usage() {
  sed -n '/^# Usage:/,/^# DIR layout/p' "$0" | sed 's/^# \{0,1\}//' >&2
  exit 2
}

find_garage() {
  if command -v garage >/dev/null 2>&1; then
    garage_binary=$(command -v garage)
  elif [ -x "$HOME/.cargo/bin/garage" ]; then
    garage_binary="$HOME/.cargo/bin/garage"
  else
    fail "garage is not installed (neither on PATH nor in ~/.cargo/bin): run scripts/setup.sh"
  fi
}

random_hex() { # BYTES
  od -An -tx1 -N"$1" /dev/urandom | tr -d ' \n'
}

# Resolves DIR to an absolute path: the node configurations name their directories by it.
absolute_dir() { # DIR
  local parent
  parent=$(cd "$(dirname "$1")" && pwd -P) || fail "the parent directory of $1 does not exist"
  echo "$parent/$(basename "$1")"
}

config() { # N
  echo "$dir/node$1.toml"
}

garage_cli() { # N ARGUMENTS...
  local node=$1
  shift
  "$garage_binary" -c "$(config "$node")" "$@"
}

# The pid of node N when that process still runs: the pid file alone is not enough, because a
# pid may be reused, and a killed node nobody has reaped yet stays a zombie.
node_pid() { # N
  local pid
  [ -f "$dir/node$1.pid" ] || return 1
  pid=$(cat "$dir/node$1.pid")
  [ -r "/proc/$pid/cmdline" ] || return 1
  tr '\0' ' ' <"/proc/$pid/cmdline" | grep -qF -- "$(config "$1")" || return 1
  [ "$(awk '{print $3}' "/proc/$pid/stat" 2>/dev/null)" != Z ] || return 1
  echo "$pid"
}

running_nodes() {
  local node
  for node in "${NODES[@]}"; do
    if node_pid "$node" >/dev/null; then echo "$node"; fi
  done
}

print_log_tails() {
  local node
  for node in "${NODES[@]}"; do
    if [ -f "$dir/node$node.log" ]; then
      echo "--- last lines of $dir/node$node.log" >&2
      tail -n 20 "$dir/node$node.log" >&2
    fi
  done
}

fail_with_logs() {
  echo "garage-cluster: $*" >&2
  print_log_tails
  exit 1
}

# Ports in use on this machine, in any TCP state, IPv4 and IPv6, one decimal number a line.
ports_in_use() {
  local table
  for table in /proc/net/tcp /proc/net/tcp6; do
    [ -r "$table" ] || continue
    awk 'NR > 1 { split($2, local_address, ":"); print local_address[2] }' "$table"
  done | while read -r hex; do echo $((16#$hex)); done
}

# Picks 9 free ports (rpc, s3, admin for each node) into the array `ports`. Ports come from below
# the kernel's ephemeral range, so outgoing connections (the nodes connect to each other) never
# take them. A registry file per cluster records its ports for as long as its DIR exists, so a
# killed node's ports are not handed to another cluster before it restarts. The caller holds the
# registry lock from here until the servers listen, so parallel starts never pick the same port.
pick_ports() {
  local ephemeral_low high low used file owner candidate
  ephemeral_low=$(awk '{print $1}' /proc/sys/net/ipv4/ip_local_port_range)
  high=$((ephemeral_low - 1))
  low=$((high > 20000 ? high - 12000 : 10000))
  [ "$high" -gt $((low + 100)) ] || fail "no port range below the ephemeral ports ($ephemeral_low)"
  used=$(mktemp)
  ports_in_use >"$used"
  for file in "$registry"/cluster-*; do
    [ -f "$file" ] || continue
    owner=$(head -n 1 "$file")
    if [ -d "$owner" ]; then
      tail -n +2 "$file" >>"$used"
    else
      rm -f "$file"
    fi
  done
  ports=()
  while [ ${#ports[@]} -lt 9 ]; do
    candidate=$((low + RANDOM % (high - low)))
    if ! grep -qx "$candidate" "$used"; then
      ports+=("$candidate")
      echo "$candidate" >>"$used"
    fi
  done
  rm -f "$used"
  { echo "$dir"; printf '%s\n' "${ports[@]}"; } >"$registry/cluster-$(printf %s "$dir" | md5sum | cut -c1-16)"
}

write_config() { # N RPC_PORT S3_PORT ADMIN_PORT RPC_SECRET ADMIN_TOKEN
  local node=$1
  mkdir -p "$dir/node$node/meta" "$dir/node$node/data"
  # fsync stays off (Garage's default): the tests kill processes, not machines, and the page
  # cache survives a killed process.
  (
    umask 077
    cat >"$(config "$node")" <<EOF
metadata_dir = "$dir/node$node/meta"
data_dir = "$dir/node$node/data"
db_engine = "lmdb"
replication_factor = 3
consistency_mode = "consistent"
rpc_secret = "$5"
rpc_bind_addr = "127.0.0.1:$2"
rpc_public_addr = "127.0.0.1:$2"

[s3_api]
api_bind_addr = "127.0.0.1:$3"
s3_region = "garage"

[admin]
api_bind_addr = "127.0.0.1:$4"
admin_token = "$6"
EOF
  )
}

# Garage saves the peers it learns only now and then, so a node restarted soon after the
# cluster formed may know nobody. Naming the other nodes in bootstrap_peers makes every restart
# (start-node, start of a stopped cluster) connect at once. The running nodes never reread it.
write_bootstrap_peers() {
  local node other peers configuration
  for node in "${NODES[@]}"; do
    peers=""
    for other in "${NODES[@]}"; do
      [ "$other" = "$node" ] || peers="$peers\"$(cat "$dir/node$other.id")\", "
    done
    configuration=$(config "$node")
    # The key must stay above the first [section] to be a top-level setting.
    sed -i "/^\[s3_api\]/i bootstrap_peers = [ ${peers%, } ]\n" "$configuration"
  done
}

# A port of node N from its configuration: rpc_bind_addr, or api_bind_addr of [s3_api]/[admin].
config_port() { # N rpc|s3|admin
  awk -v want="$2" '
    /^\[/ { section = $0 }
    (want == "rpc" && section == "" && /^rpc_bind_addr/) ||
    (want == "s3" && section == "[s3_api]" && /^api_bind_addr/) ||
    (want == "admin" && section == "[admin]" && /^api_bind_addr/) {
      gsub(/.*:|"/, ""); print
    }' "$(config "$1")"
}

port_listens() { # PORT
  (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null
}

launch_node() { # N
  local node=$1
  # The server gets none of our pipes (a test reading this script's output must see end of file
  # when the script exits, not when the servers do) nor the registry lock (fd 9). It stays in the
  # caller's process group, so Ctrl-C on a test run stops it too.
  NO_COLOR=1 "$garage_binary" -c "$(config "$node")" server \
    </dev/null >>"$dir/node$node.log" 2>&1 9>&- &
  echo $! >"$dir/node$node.pid"
}

wait_listening() { # N
  local node=$1 deadline=$((SECONDS + timeout_seconds)) kind
  for kind in rpc s3 admin; do
    until port_listens "$(config_port "$node" "$kind")"; do
      node_pid "$node" >/dev/null || fail_with_logs "node $node exited while starting (port in use?)"
      [ $SECONDS -lt $deadline ] || fail_with_logs "node $node does not listen on its $kind port after ${timeout_seconds}s"
      sleep 0.1
    done
  done
}

# The value of a number or string field in the pretty-printed JSON of `garage json-api`.
json_field() { # JSON NAME
  sed -n "s/^ *\"$2\": \"\{0,1\}\([^\",]*\)\"\{0,1\},\{0,1\}$/\1/p" <<<"$1" | head -n 1
}

# True when every running node sees all running nodes connected, and the cluster, as node N
# sees it, has a quorum for every partition; with all three running that is "healthy".
cluster_ready() {
  local running count node health
  running=$(running_nodes)
  count=$(wc -w <<<"$running")
  [ "$count" -gt 0 ] || return 1
  for node in $running; do
    health=$(garage_cli "$node" json-api GetClusterHealth null 2>/dev/null) || return 1
    [ "$(json_field "$health" connectedNodes)" = "$count" ] || return 1
    [ "$(json_field "$health" partitionsQuorum)" = "$(json_field "$health" partitions)" ] || return 1
    if [ "$count" -eq ${#NODES[@]} ]; then
      [ "$(json_field "$health" status)" = healthy ] || return 1
    fi
  done
}

wait_ready() {
  local deadline=$((SECONDS + timeout_seconds))
  until cluster_ready; do
    [ $SECONDS -lt $deadline ] || fail_with_logs "the cluster in $dir is not healthy after ${timeout_seconds}s"
    sleep 0.2
  done
}

# Node 1 answers administration commands unless it is down.
admin_node() {
  local node
  node=$(running_nodes | head -n 1)
  [ -n "$node" ] || fail "no node of the cluster in $dir is running"
  echo "$node"
}

key_id() {
  sed -n "s/^AWS_ACCESS_KEY_ID='\(.*\)'$/\1/p" "$dir/env"
}

create_bucket() { # NAME KEY_ID
  local node
  node=$(admin_node)
  garage_cli "$node" bucket create "$1" >/dev/null || fail_with_logs "cannot create bucket $1"
  garage_cli "$node" bucket allow --read --write --owner "$1" --key "$2" >/dev/null \
    || fail_with_logs "cannot allow bucket $1 for key $2"
}

start_watchdog() { # OWNER_PID
  [ -d "/proc/$1" ] || fail "--owner-pid $1: no such process"
  "$0" watch "$dir" "$1" </dev/null >/dev/null 2>&1 9>&- &
  echo $! >"$dir/watchdog.pid"
}

stop_watchdog() {
  local pid
  [ -f "$dir/watchdog.pid" ] || return 0
  pid=$(cat "$dir/watchdog.pid")
  # The watchdog itself calls `stop` once its owner exits; it must not kill itself there.
  if [ "$pid" != "${WATCHDOG_PID:-}" ] && [ -r "/proc/$pid/cmdline" ] \
    && tr '\0' ' ' <"/proc/$pid/cmdline" | grep -qF -- " watch $dir "; then
    kill "$pid" 2>/dev/null || true
  fi
  rm -f "$dir/watchdog.pid"
}

wait_gone() { # N SIGNAL_AFTER_TIMEOUT
  local node=$1 deadline=$((SECONDS + timeout_seconds)) pid
  while pid=$(node_pid "$node"); do
    if [ $SECONDS -ge $deadline ]; then
      [ "$2" = KILL ] || fail_with_logs "node $node (pid $pid) does not exit"
      kill -KILL "$pid" 2>/dev/null || true
      deadline=$((SECONDS + timeout_seconds))
      set -- "$node" none
    fi
    sleep 0.1
  done
}

# A start that fails, or is interrupted (Ctrl-C, a reader of its output that went away), leaves
# no servers behind.
stop_after_failed_start() {
  local status=$?
  # Cleaning up must not be cut short by the signal that brought us here.
  trap - EXIT
  trap "" HUP INT PIPE TERM
  if [ "$status" -ne 0 ]; then command_stop >/dev/null 2>&1 || true; fi
  exit "$status"
}

guard_start() {
  trap stop_after_failed_start EXIT
  trap 'exit 129' HUP
  trap 'exit 130' INT
  trap 'exit 141' PIPE
  trap 'exit 143' TERM
}

unguard_start() {
  trap - EXIT HUP INT PIPE TERM
}

command_start() {
  local bucket=onecopy owner="" node rpc_secret admin_token access_key secret_key running
  while [ $# -gt 0 ]; do
    case $1 in
      --bucket) bucket=${2:?--bucket needs a name}; shift 2 ;;
      --owner-pid) owner=${2:?--owner-pid needs a pid}; shift 2 ;;
      *) usage ;;
    esac
  done
  mkdir -p "$registry"
  if [ -f "$dir/env" ]; then
    running=$(running_nodes | tr '\n' ' ')
    [ -z "$running" ] || fail "a cluster is running in $dir (nodes $running); stop it first"
    guard_start
    [ -z "$owner" ] || start_watchdog "$owner"
    for node in "${NODES[@]}"; do launch_node "$node"; done
    for node in "${NODES[@]}"; do wait_listening "$node"; done
    for node in "${NODES[@]}"; do connect_to "$node"; done
    wait_ready
    unguard_start
    echo "garage-cluster: restarted the cluster in $dir"
    return
  fi
  if [ -e "$dir" ] && [ -n "$(ls -A "$dir")" ]; then
    fail "$dir is neither empty nor a stopped cluster (no $dir/env)"
  fi
  (umask 077 && mkdir -p "$dir")
  chmod 0700 "$dir"
  guard_start
  [ -z "$owner" ] || start_watchdog "$owner"

  rpc_secret=$(random_hex 32)
  admin_token=$(random_hex 32)
  # Hold the registry lock from choosing ports until every server listens on them.
  exec 9>"$registry/lock"
  flock -w "$timeout_seconds" 9 || fail "another cluster start holds $registry/lock for ${timeout_seconds}s"
  pick_ports
  for node in "${NODES[@]}"; do
    local base=$(((node - 1) * 3))
    write_config "$node" "${ports[base]}" "${ports[base + 1]}" "${ports[base + 2]}" \
      "$rpc_secret" "$admin_token"
    launch_node "$node"
  done
  for node in "${NODES[@]}"; do wait_listening "$node"; done
  flock -u 9
  exec 9>&-

  # A node makes its identity (node_key) when it first starts. Each node only knows itself until
  # told of the others: connecting every pair directly saves waiting for the peer exchange.
  for node in "${NODES[@]}"; do
    garage_cli "$node" node id -q >"$dir/node$node.id" || fail_with_logs "node $node has no id"
  done
  garage_cli 1 node connect "$(cat "$dir/node2.id")" >/dev/null || fail_with_logs "cannot connect node 1 to node 2"
  garage_cli 1 node connect "$(cat "$dir/node3.id")" >/dev/null || fail_with_logs "cannot connect node 1 to node 3"
  garage_cli 2 node connect "$(cat "$dir/node3.id")" >/dev/null || fail_with_logs "cannot connect node 2 to node 3"
  write_bootstrap_peers
  for node in "${NODES[@]}"; do
    garage_cli 1 layout assign --zone "dc$node" --capacity 1G "$(cut -d@ -f1 "$dir/node$node.id")" >/dev/null
  done
  garage_cli 1 layout apply --version 1 >/dev/null || fail_with_logs "cannot apply the layout"
  wait_ready

  # Garage accepts keys made elsewhere: ids are GK and 24 hex digits, secrets 64 hex digits.
  access_key="GK$(random_hex 12)"
  secret_key=$(random_hex 32)
  garage_cli 1 key import --yes -n onecopy "$access_key" "$secret_key" >/dev/null \
    || fail_with_logs "cannot import the access key"
  create_bucket "$bucket" "$access_key"
  local endpoints=()
  for node in "${NODES[@]}"; do endpoints+=("http://127.0.0.1:$(config_port "$node" s3)"); done
  # DIR/env comes last: its presence marks a complete cluster that `start` may restart.
  (
    umask 077
    cat >"$dir/env.partial" <<EOF
AWS_ACCESS_KEY_ID='$access_key'
AWS_SECRET_ACCESS_KEY='$secret_key'
AWS_DEFAULT_REGION='garage'
GARAGE_S3_ENDPOINT='${endpoints[0]}'
GARAGE_S3_ENDPOINTS='${endpoints[*]}'
GARAGE_BUCKET='$bucket'
GARAGE_DIR='$dir'
GARAGE_ADMIN_ENDPOINT='http://127.0.0.1:$(config_port 1 admin)'
GARAGE_ADMIN_TOKEN='$admin_token'
EOF
  )
  mv "$dir/env.partial" "$dir/env"
  unguard_start
  echo "garage-cluster: started in $dir; S3 at ${endpoints[*]}; source $dir/env"
}

# A node that lost a peer retries it with a growing delay (tens of seconds), so a restarted
# node would count for its own view at once but for the others' only later. Asking each running
# node to connect to it makes the rejoin immediate.
connect_to() { # N
  local node=$1 other
  for other in $(running_nodes); do
    [ "$other" = "$node" ] && continue
    garage_cli "$other" node connect "$(cat "$dir/node$node.id")" >/dev/null \
      || fail_with_logs "node $other cannot connect to node $node"
  done
}

command_start_node() { # N
  local node=$1 pid
  if pid=$(node_pid "$node"); then fail "node $node of $dir is running (pid $pid)"; fi
  launch_node "$node"
  wait_listening "$node"
  connect_to "$node"
  wait_ready
  echo "garage-cluster: node $node of $dir is back"
}

command_kill_node() { # N
  local node=$1 pid
  pid=$(node_pid "$node") || fail "node $node of $dir is not running"
  kill -KILL "$pid"
  wait_gone "$node" none
}

command_stop() {
  local node pid
  stop_watchdog
  for node in "${NODES[@]}"; do
    if pid=$(node_pid "$node"); then kill -TERM "$pid" 2>/dev/null || true; fi
  done
  # Garage shuts down within a second or two; a node that hangs gets SIGKILL after the timeout.
  for node in "${NODES[@]}"; do wait_gone "$node" KILL; done
}

# Internal: stops the cluster once the owner process exits.
command_watch() { # OWNER_PID
  while [ -d "/proc/$1" ] && [ "$(awk '{print $3}' "/proc/$1/stat" 2>/dev/null)" != Z ]; do
    sleep 1
  done
  if [ -d "$dir" ]; then WATCHDOG_PID=$$ command_stop; fi
}

node_argument() { # N
  case ${1:-} in
    1 | 2 | 3) echo "$1" ;;
    *) fail "node must be 1, 2 or 3, not '${1:-}'" ;;
  esac
}

[ $# -ge 2 ] || usage
command=$1
dir=$(absolute_dir "$2")
shift 2
case $command in
  start)
    find_garage
    command_start "$@"
    ;;
  bucket)
    [ $# -eq 1 ] || usage
    [ -f "$dir/env" ] || fail "no cluster in $dir (no $dir/env)"
    find_garage
    create_bucket "$1" "$(key_id)"
    ;;
  bucket-usage)
    [ $# -eq 1 ] || usage
    [ -f "$dir/env" ] || fail "no cluster in $dir (no $dir/env)"
    find_garage
    info=$(garage_cli 1 json-api GetBucketInfo "{\"globalAlias\": \"$1\"}") \
      || fail "no bucket $1 in $dir"
    echo "bytes=$(json_field "$info" bytes) objects=$(json_field "$info" objects)"
    ;;
  kill-node)
    [ $# -eq 1 ] || usage
    command_kill_node "$(node_argument "$1")"
    ;;
  start-node)
    [ $# -eq 1 ] || usage
    [ -f "$dir/env" ] || fail "no cluster in $dir (no $dir/env)"
    find_garage
    command_start_node "$(node_argument "$1")"
    ;;
  stop)
    [ $# -eq 0 ] || usage
    command_stop
    ;;
  watch)
    [ $# -eq 1 ] || usage
    command_watch "$1"
    ;;
  *) usage ;;
esac
