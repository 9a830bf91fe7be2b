#!/usr/bin/env bash
# How fast fio's nbd engine writes 1 MiB blocks when the server does (almost) nothing:
# `nbdkit null` (discards writes) and `nbdkit memory` (keeps them in RAM), one and two fio
# jobs (one NBD connection each), queue depths 8 and 32, over a unix socket in /dev/shm.
#   bench/block/client-ceiling.sh        # RUNTIME=5 seconds per job by default
set -euo pipefail
RUNTIME=${RUNTIME:-5}
work=$(mktemp -d /dev/shm/ceiling.XXXX)
trap 'rm -rf "$work"' EXIT
echo "plugin jobs iodepth GB/s"
for plugin in null memory; do
  socket=$work/socket
  rm -f "$socket"
  nbdkit --exit-with-parent -U "$socket" "$plugin" size=16G &
  server=$!
  for _ in $(seq 50); do [ -S "$socket" ] && break; sleep 0.1; done
  for jobs in 1 2; do
    for depth in 8 32; do
      fio --output-format=json --output="$work/fio.json" --name=ceiling --ioengine=nbd \
        --uri="nbd+unix:///?socket=$socket" --rw=write --bs=1M --iodepth="$depth" \
        --numjobs="$jobs" --group_reporting --size=4G --time_based --runtime="$RUNTIME" \
        >/dev/null 2>&1
      python3 -c "import json,sys; j=json.load(open(sys.argv[1]))['jobs'][0]; print(sys.argv[2], sys.argv[3], sys.argv[4], round(j['write']['bw_bytes']/1e9, 3))" \
        "$work/fio.json" "$plugin" "$jobs" "$depth"
    done
  done
  kill "$server"
  wait "$server" 2>/dev/null || true
done
