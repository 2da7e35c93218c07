#!/usr/bin/env bash
# Resident memory of a 3-node cluster's nodes once they hold a large state and have each built
# a Raft snapshot of it: bulk-adds through the leader for a while, a pause for the snapshots,
# then every node's VmRSS (and its peak, VmHWM) beside the size of its kept `raft-snapshot`.
# Run it for two builds to compare them (one after the other, same flags).
#
#   bash benches/cluster/snapshot_memory.sh target/release/sheetd [load=20s]
set -euo pipefail
BIN=$(realpath "$1"); LOAD=${2:-20s}
WORK=$(mktemp -d /tmp/sheetd-snapshot-memory.XXXX)
trap 'kill $(jobs -p) 2>/dev/null || true; pkill -KILL -f "$WORK/cluster" 2>/dev/null || true; wait 2>/dev/null || true; [ -n "${KEEP:-}" ] || rm -rf "$WORK"' EXIT

"$BIN" cluster up --nodes 3 --data-dir "$WORK/cluster" --port 28080 --admin-port 28081 \
  --raft-port 29101 -- --rate-limit-per-minute 100000000 --checkpoint-every-records 200 \
  > "$WORK/up.log" 2>&1 &
until ls "$WORK"/cluster/node*/demo-keys.txt > /dev/null 2>&1; do sleep 0.2; done
KEYS=$(ls "$WORK"/cluster/node*/demo-keys.txt | head -1)
LEADER=$(basename "$(dirname "$KEYS")" | tr -dc 0-9)
KEY=$(awk '$3=="ada-write" {print $4}' "$KEYS")
sleep 1
"$BIN" bench --url "http://127.0.0.$LEADER:28080/api/v1" --key "$KEY" --sheet-ids 10,11 \
  --workload bulk-add --bulk-size 1000 --concurrency 4 --duration "$LOAD" --warmup 0s 2>&1 \
  | grep -E "req/s|^ *[0-9]+ " | head -3
# The leader's maintenance checkpoints and every node snapshots after the load.
sleep "${SETTLE:-15}"
for n in 1 2 3; do
  # The process listening on node n's API address.
  pid=$(ss -ltnpH "src 127.0.0.$n:28080" | grep -o 'pid=[0-9]*' | head -1 | cut -d= -f2)
  rss=$(awk '/VmRSS/ {print $2}' "/proc/$pid/status")
  hwm=$(awk '/VmHWM/ {print $2}' "/proc/$pid/status")
  snap=$(stat -c %s "$WORK/cluster/node$n/raft-snapshot" 2>/dev/null || echo 0)
  role=follower; [ "$n" = "$LEADER" ] && role=leader
  printf 'node %s (%s): VmRSS %d MB (peak VmHWM %d MB), raft-snapshot %d MB\n' "$n" "$role" \
    $((rss / 1024)) $((hwm / 1024)) $((snap / 1048576))
done
