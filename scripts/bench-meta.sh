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
# while after their stop script returns, and measurably slowed the next rows), what the
# target before left dirty is written back, and the files it deleted no longer slow new ones.
# The last matters on an ext4 without a journal (as this machine's): it will not reuse an
# inode freed in the last 60 s and reads each such inode on the way to a free one, so every
# file created within a minute of mass deletes costs a scan past all of them — a whole row
# measured the row before it instead of itself. SETTLE_SECONDS=0 skips the wait.
SETTLE_SECONDS=${SETTLE_SECONDS:-65}
settle() {
  for _ in $(seq 1 60); do pgrep -f 'glusterd|glusterfs|mfsmaster|mfschunkserver|mfsmount' > /dev/null || break; sleep 0.5; done
  sync; sleep 2
  if [ "$(findmnt -no FSTYPE -T "$WORK")" = ext4 ] && ! has_journal "$WORK"; then
    sleep "$SETTLE_SECONDS"
  fi
}
# Whether the ext4 file system holding $1 has a journal (jbd2 lists the devices it serves).
has_journal() {
  local dev
  dev=$(basename "$(findmnt -no SOURCE -T "$1")")
  compgen -G "/proc/fs/jbd2/$dev-*" > /dev/null
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
