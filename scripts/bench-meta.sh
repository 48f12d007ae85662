#!/usr/bin/env bash
# Metadata benchmark in one run: a local directory, a bindfs passthrough of it, and `weft up`
# with 1, 2 and 4 metadata servers, each through the FUSE mount and through the native client
# library; GlusterFS and MooseFS through their FUSE clients. Results go to $OUT/meta.jsonl and
# the tables to stdout.
# Usage: scripts/bench-meta.sh [FILES_PER_THREAD (default 500)] [THREADS (default 1,2,4)]
set -euo pipefail
cd "$(dirname "$0")/.."
FILES=${1:-500}
THREADS=${2:-1,2,4}
WORK=$(mktemp -d /tmp/weft-bench-meta.XXXXXX)
OUT=${OUT:-$WORK}
JSON=$OUT/meta.jsonl
. scripts/bench-tools.sh
need bindfs
cargo build --release --quiet
WEFT=target/release/weft
bench() { settle; "$WEFT" bench meta --files "$FILES" --dirs $((FILES / 10)) --threads "$THREADS" --json "$JSON" "$@"; }

mkdir -p "$WORK/local" "$WORK/bindfs"
bench --path "$WORK/local" --label ext4-local
bindfs "$WORK/local" "$WORK/bindfs"
bench --path "$WORK/bindfs" --label bindfs
umount "$WORK/bindfs"

# Peers from Debian's packages, single node, through their FUSE clients (the shared scripts
# install them on first use). PEERS= (empty) skips them.
PEERS=${PEERS-gluster,moosefs}
chmod a+rx "$WORK"   # the peers' daemons run as their own users
peer_bench() { bench --path "$1" --label "$2"; }
each_peer "$WORK" "$PEERS" peer_bench

for META in 1 2 4; do
  "$WEFT" up --meta-servers "$META" --data-dir "$WORK/data-$META" --mountpoint "$WORK/mnt-$META" > "$WORK/up-$META.log" 2>&1 &
  UP=$!
  for _ in $(seq 1 300); do grep -q "Press Ctrl-C" "$WORK/up-$META.log" && break; sleep 0.2; done
  MGMT=$(sed -n 's/^  management *//p' "$WORK/up-$META.log")
  bench --path "$WORK/mnt-$META" --label "weft-mount-${META}md"
  bench --mgmt "$MGMT" --label "weft-native-${META}md"
  kill -INT "$UP"; wait "$UP" || true
done
echo "results: $JSON"
