#!/usr/bin/env bash
# A 3-node cluster on 127.0.0.1–.3 with the cluster link plain, then over mutual TLS
# (`--cluster-tls-dir`, certificates from a throwaway CA made with `openssl`), alternated:
# durable single-row patches on the leader at 64 connections and pages read through a
# follower (forwarded over the link) at 32, through `sheetd bench --url`.
#
#   bash benches/cluster/tls.sh target/release/sheetd [rounds=2] [duration=5s]
#
# Needs `openssl` (Debian: openssl). KEEP=1 keeps the work dir.
set -euo pipefail
BIN=$(realpath "$1"); ROUNDS=${2:-2}; DUR=${3:-5s}
WORK=$(mktemp -d /tmp/sheetd-tls-bench.XXXX)
trap 'kill $(jobs -p) 2>/dev/null || true; wait 2>/dev/null || true; [ -n "${KEEP:-}" ] || rm -rf "$WORK"' EXIT

# The CA, and each node's certificate naming its raft host (IP SAN), good for both ends.
cd "$WORK"
openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -keyout ca.key \
  -out ca.crt -days 2 -subj "/CN=sheetd bench CA" \
  -addext "basicConstraints=critical,CA:TRUE" \
  -addext "keyUsage=critical,keyCertSign,digitalSignature" 2>/dev/null
for i in 1 2 3; do
  mkdir -p "tls$i"
  openssl req -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -keyout "tls$i/node.key" \
    -out "tls$i/node.csr" -subj "/CN=node$i" 2>/dev/null
  printf "subjectAltName=IP:127.0.0.%s\nextendedKeyUsage=serverAuth,clientAuth\n" "$i" \
    > "tls$i/ext.cnf"
  openssl x509 -req -in "tls$i/node.csr" -CA ca.crt -CAkey ca.key -CAcreateserial \
    -out "tls$i/node.crt" -days 2 -extfile "tls$i/ext.cnf" 2>/dev/null
  cp ca.crt "tls$i/"
done
head -c 48 /dev/urandom | base64 > secret

run() { # plain|tls
  local mode=$1 dir="$WORK/run-$1" pids=() i
  rm -rf "$dir"; mkdir -p "$dir"
  for i in 1 2 3; do
    local extra=()
    [ "$mode" = tls ] && extra=(--cluster-tls-dir "$WORK/tls$i")
    "$BIN" serve --addr "127.0.0.$i:28180" --admin-addr "127.0.0.$i:28181" \
      --data-dir "$dir/node$i" --admin-token tok --node-id "$i" --raft-addr "127.0.0.$i:29201" \
      --initial-cluster "1=127.0.0.1:29201,2=127.0.0.2:29201,3=127.0.0.3:29201" \
      --cluster-secret-file "$WORK/secret" --rate-limit-per-minute 100000000 "${extra[@]}" \
      > "$dir/node$i.log" 2>&1 &
    pids+=($!)
  done
  until ls "$dir"/node*/demo-keys.txt > /dev/null 2>&1; do sleep 0.2; done
  local keys leader follower key
  keys=$(ls "$dir"/node*/demo-keys.txt | head -1)
  leader=$(basename "$(dirname "$keys")" | tr -dc 0-9)
  follower=$(( leader % 3 + 1 ))
  key=$(awk '$3=="ada-write" {print $4}' "$keys")
  sleep 1
  echo "== $mode: leader (node $leader) patch at 64 connections"
  "$BIN" bench --url "http://127.0.0.$leader:28180/api/v1" --key "$key" --sheet-ids 10,11 \
    --workload patch --concurrency 64 --duration "$DUR" --warmup 1s 2>&1 | grep -E "^ *64 "
  echo "== $mode: follower (node $follower) read-page at 32 connections, forwarded"
  "$BIN" bench --url "http://127.0.0.$follower:28180/api/v1" --key "$key" --sheet-ids 10,11 \
    --workload read-page --concurrency 32 --duration "$DUR" --warmup 1s 2>&1 | grep -E "^ *32 "
  kill -9 "${pids[@]}" 2>/dev/null || true
  wait "${pids[@]}" 2>/dev/null || true
}

for _ in $(seq "$ROUNDS"); do
  run plain
  run tls
done
