#!/usr/bin/env bash
# One node against a 3-node cluster on this machine, in one run: durable single-row patches at
# 64 connections and pages of 100 rows at 32 connections, through `sheetd bench --url`.
# The cluster is measured through its leader and through a follower (which forwards), then
# pages read with `Sheetd-Consistency: local` from a follower's and the leader's own state.
#
#   bash benches/cluster/compare.sh target/release/sheetd [duration=5s]
set -euo pipefail
BIN=$(realpath "$1"); DUR=${2:-5s}
WORK=$(mktemp -d /tmp/sheetd-cluster-bench.XXXX)
# The nodes' data dirs hold about 150 MB after a run; KEEP=1 keeps them to look at.
trap 'kill $(jobs -p) 2>/dev/null || true; wait 2>/dev/null || true; [ -n "${KEEP:-}" ] || rm -rf "$WORK"' EXIT

bench() { # url key admin label
  for w in "patch 64" "read-page 32"; do
    set -- "$1" "$2" "$3" "$4" $w
    echo "== $4: $5 at $6 connections"
    "$BIN" bench --url "$1" --key "$2" --sheet-ids 10,11 --workload "$5" --concurrency "$6" \
      --duration "$DUR" --warmup 1s 2>&1 | grep -E "^ *[0-9]+ |conc|req/s" | head -4
  done
}
local_reads() { # url key label: pages read from the receiving node's own state
  echo "== $3: read-page at 32 connections, Sheetd-Consistency: local"
  "$BIN" bench --url "$1" --key "$2" --sheet-ids 10,11 --workload read-page --concurrency 32 \
    --duration "$DUR" --warmup 1s --header "Sheetd-Consistency: local" 2>&1 \
    | grep -E "^ *[0-9]+ |conc|req/s" | head -4
}
key_of() { awk '$3=="ada-write" {print $4}' "$1"; }

# One node.
"$BIN" serve --data-dir "$WORK/single" --addr 127.0.0.1:18080 --admin-addr 127.0.0.1:18081 \
  --admin-token tok --rate-limit-per-minute 100000000 > "$WORK/single.log" 2>&1 &
SINGLE=$!
until [ -s "$WORK/single/demo-keys.txt" ]; do sleep 0.2; done
bench http://127.0.0.1:18080/api/v1 "$(key_of "$WORK/single/demo-keys.txt")" x "one node"
kill -TERM $SINGLE; wait $SINGLE || true

# Three nodes.
"$BIN" cluster up --nodes 3 --data-dir "$WORK/cluster" --port 28080 --admin-port 28081 \
  --raft-port 29101 -- --rate-limit-per-minute 100000000 > "$WORK/up.log" 2>&1 &
UP=$!
until ls "$WORK"/cluster/node*/demo-keys.txt > /dev/null 2>&1; do sleep 0.2; done
KEYS=$(ls "$WORK"/cluster/node*/demo-keys.txt | head -1)
LEADER=$(basename "$(dirname "$KEYS")" | tr -dc 0-9)
FOLLOWER=$(( LEADER % 3 + 1 ))
TOKEN=$(cat "$WORK/cluster/admin-token")
sleep 1
bench "http://127.0.0.$LEADER:28080/api/v1" "$(key_of "$KEYS")" x "cluster leader (node $LEADER)"
bench "http://127.0.0.$FOLLOWER:28080/api/v1" "$(key_of "$KEYS")" x "cluster follower (node $FOLLOWER)"
local_reads "http://127.0.0.$FOLLOWER:28080/api/v1" "$(key_of "$KEYS")" "cluster follower (node $FOLLOWER)"
local_reads "http://127.0.0.$LEADER:28080/api/v1" "$(key_of "$KEYS")" "cluster leader (node $LEADER)"
kill -TERM $UP
# A build whose leader started itself again on SIGTERM would hold the run: 10 s, then kill.
for _ in $(seq 100); do kill -0 $UP 2>/dev/null || break; sleep 0.1; done
pkill -KILL -f "$WORK/cluster" 2>/dev/null || true; wait $UP 2>/dev/null || true
