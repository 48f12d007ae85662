#!/usr/bin/env bash
# TLS against plain TCP in one run: two `weft up` clusters side by side, one with --tls, and
# the native client's data path measured against each in alternated pairs: `weft bench net`
# (the storage servers skip their disks, so the network path and its encryption are what is
# measured) and `weft bench io --mgmt` (with the disks). Sequential throughput and 4 KiB
# random IOPS; the table gives TLS as a ratio to plain TCP, each the mean over the rounds.
# JSON lines go to $OUT/tls.jsonl.
# Usage: scripts/bench-tls.sh [SIZE_PER_THREAD (default 256M)] [THREADS (default 1,4)] [ROUNDS (default 2)]
set -euo pipefail
cd "$(dirname "$0")/.."
SIZE=${1:-256M}
THREADS=${2:-1,4}
ROUNDS=${3:-2}
WORK=$(mktemp -d /tmp/weft-bench-tls.XXXXXX)
OUT=${OUT:-$WORK}
mkdir -p "$OUT"
cargo build --release --quiet
WEFT=target/release/weft

start() {
  local name=$1; shift
  "$WEFT" up --data-dir "$WORK/data-$name" --mountpoint "$WORK/mnt-$name" "$@" \
    > "$WORK/up-$name.log" 2>&1 &
  echo $! > "$WORK/up-$name.pid"
  for _ in $(seq 1 300); do grep -q "Press Ctrl-C" "$WORK/up-$name.log" && break; sleep 0.2; done
}
stop() {
  for name in plain tls; do
    [ -f "$WORK/up-$name.pid" ] && kill -INT "$(cat "$WORK/up-$name.pid")" 2>/dev/null || true
  done
  wait 2>/dev/null || true
}
trap stop EXIT
start plain
start tls --tls
mgmt() { sed -n 's/^  management *//p' "$WORK/up-$1.log"; }

# The admin commands find each cluster's key (and its TLS files beside it) through the link
# its `weft up` leaves for its management address.
for round in $(seq 1 "$ROUNDS"); do
  for variant in plain tls; do
    sync; sleep 2
    "$WEFT" bench net --size "$SIZE" --threads "$THREADS" --random-ops 2000 \
      --label "net-$variant" --json "$OUT/tls.jsonl" --mgmt "$(mgmt "$variant")" > /dev/null
    sync; sleep 2
    "$WEFT" bench io --size "$SIZE" --threads "$THREADS" --random-ops 2000 \
      --label "io-$variant" --json "$OUT/tls.jsonl" --mgmt "$(mgmt "$variant")" > /dev/null
  done
  echo "round $round of $ROUNDS done" >&2
done

python3 - "$OUT/tls.jsonl" <<'PY'
import json, sys
from collections import defaultdict
runs = defaultdict(list)
for line in open(sys.argv[1]):
    row = json.loads(line)
    result = row["result"]
    value = result["iops"] if result["phase"].startswith("rand") else result["mb_per_second"]
    runs[(row["target"], result["phase"], result["threads"])].append(value)
mean = lambda values: sum(values) / len(values) if values else 0
print(f"{'path':>4} {'threads':>7} {'phase':>9} {'plain':>9} {'TLS':>9} {'TLS/plain':>9}  (MB/s; IOPS for rand*)")
for path in ("net", "io"):
    for threads in sorted({k[2] for k in runs}):
        for phase in ("write", "read", "randwrite", "randread"):
            plain = mean(runs.get((f"{path}-plain", phase, threads), []))
            tls = mean(runs.get((f"{path}-tls", phase, threads), []))
            if plain:
                print(f"{path:>4} {threads:>7} {phase:>9} {plain:9.0f} {tls:9.0f} {tls / plain:9.2f}")
PY
echo "results: $OUT"
