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
# Each target starts on a quiet machine: the peers' daemons have exited (they go on for a
# while after their stop script returns, and measurably slowed the next rows) and what the
# target before left dirty is written back.
settle() {
  for _ in $(seq 1 60); do pgrep -f 'glusterd|glusterfs|mfsmaster|mfschunkserver|mfsmount' > /dev/null || break; sleep 0.5; done
  sync; sleep 2
}
bench() { settle; "$WEFT" bench meta --files "$FILES" --dirs $((FILES / 10)) --threads "$THREADS" --json "$JSON" "$@"; }

mkdir -p "$WORK/local" "$WORK/bindfs"
bench --path "$WORK/local" --label ext4-local
bindfs "$WORK/local" "$WORK/bindfs"
bench --path "$WORK/bindfs" --label bindfs
umount "$WORK/bindfs"

# Peers from Debian's packages, single node, through their FUSE clients (the shared scripts
# install them on first use). PEERS= (empty) skips them.
PEERS=${PEERS-gluster,moosefs}
SHARED=${SHARED_BENCH:-../shared/bench}
chmod a+rx "$WORK"   # the peers' daemons run as their own users
for PEER in ${PEERS//,/ }; do
  if "$SHARED/peers/$PEER.sh" up "$WORK/$PEER-mnt" "$WORK/$PEER-base" > "$WORK/$PEER.log" 2>&1; then
    bench --path "$WORK/$PEER-mnt" --label "$PEER"
  else
    echo "$PEER did not start; see $WORK/$PEER.log" >&2
  fi
  "$SHARED/peers/$PEER.sh" down "$WORK/$PEER-mnt" "$WORK/$PEER-base" >> "$WORK/$PEER.log" 2>&1 || true
done

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
