#!/usr/bin/env bash
# The nemesis: a randomized fault test of a cluster of separate processes in network
# namespaces (two mirrored metadata servers, three storage servers in three mirror groups), with
# a workload that writes, overwrites, truncates, punches, renames, deletes and reads back files
# in a mirrored and a plain directory, while one server at a time is killed (SIGKILL) and
# restarted, or cut off the network and reconnected. At the end every recorded file must hold
# exactly its bytes, nothing deleted may be back, and fsck must be clean. See
# crates/cli/tests/nemesis.rs. Needs root (namespaces, FUSE).
# With --replayed, the metadata servers are not mirrored and answer changes before their sync
# (sync_every_change = false): what a killed one lost, the mount replays.
# Usage: scripts/nemesis.sh [--minutes N] [--seed S] [--replayed]   (default: 30 minutes, a new seed)
set -euo pipefail
cd "$(dirname "$0")/.."
MINUTES=30
SEED=
while [ $# -gt 0 ]; do
  case "$1" in
    --minutes) MINUTES=$2; shift 2 ;;
    --seed) SEED=$2; shift 2 ;;
    --replayed) export WEFT_NEMESIS_META=replayed; shift ;;
    *) echo "usage: $0 [--minutes N] [--seed S] [--replayed]" >&2; exit 2 ;;
  esac
done
export WEFT_NEMESIS_MINUTES=$MINUTES
if [ -n "$SEED" ]; then export WEFT_NEMESIS_SEED=$SEED; fi
cargo test --release -p weft --test nemesis nemesis_long -- --ignored --nocapture
