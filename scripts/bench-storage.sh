#!/usr/bin/env bash
# StorageBench (`weft bench storage`) against fio on the same target directories, in one run:
# a `weft up --direct-io` cluster (so StorageBench moves data with O_DIRECT, as fio
# --direct=1 does); for 1 and 2 threads per target, StorageBench writes and reads, then fio
# writes and reads with as many jobs over the same `bench/` directories (fio's defaults
# otherwise). StorageBench's buffers are huge pages (one block-layer segment per transfer),
# fio's come from its heap: the docs say what each gives. Ends with each phase's StorageBench / fio ratio (target: at least 0.9).
# JSON lines in $OUT: storage-{write,read}-T.jsonl (StorageBench), fio-{write,read}-T.json.
# Usage: scripts/bench-storage.sh [SIZE per thread (default 256M)]
set -euo pipefail
cd "$(dirname "$0")/.."
SIZE=${1:-256M}
WORK=$(mktemp -d /tmp/weft-bench-storage.XXXXXX)
OUT=${OUT:-$WORK}
mkdir -p "$OUT"
. scripts/bench-tools.sh
need fio
cargo build --release --quiet
WEFT=target/release/weft

"$WEFT" up --direct-io --data-dir "$WORK/data" --mountpoint "$WORK/mnt" > "$WORK/up.log" 2>&1 &
UP=$!
trap 'kill -INT $UP 2>/dev/null; wait $UP 2>/dev/null || true' EXIT
for _ in $(seq 1 300); do grep -q "Press Ctrl-C" "$WORK/up.log" && break; sleep 0.2; done
MGMT=$(sed -n 's/^  management *//p' "$WORK/up.log")
settle() { sync; echo 3 > /proc/sys/vm/drop_caches; sleep 3; }
storage() { "$WEFT" bench storage "$@" --mgmt "$MGMT"; }

for T in 1 2; do
  # Each reads right after its own write: this virtual disk reads recently written data
  # faster, so the two are measured in the same order.
  settle
  storage start --size "$SIZE" --threads "$T" --wait --json "$OUT/storage-write-$T.jsonl"
  settle
  storage start --read --size "$SIZE" --threads "$T" --wait --json "$OUT/storage-read-$T.jsonl"
  storage cleanup > /dev/null
  # fio's jobs spread over the same directories StorageBench used.
  mkdir -p "$WORK"/data/storage-*/target-*/bench
  DIRS=$(ls -d "$WORK"/data/storage-*/target-*/bench | paste -sd:)
  JOBS=$((T * $(ls -d "$WORK"/data/storage-*/target-* | wc -l)))
  FIO=(fio --name=fio --directory="$DIRS" --bs=1M --size="$SIZE" --numjobs="$JOBS" --direct=1
       --ioengine=psync --group_reporting --output-format=json)
  settle
  "${FIO[@]}" --rw=write --end_fsync=1 --output="$OUT/fio-write-$T.json" > /dev/null
  settle
  "${FIO[@]}" --rw=read --output="$OUT/fio-read-$T.json" > /dev/null
  rm -rf "$WORK"/data/storage-*/target-*/bench
done

python3 - "$OUT" <<'PY'
import json, sys
out = sys.argv[1]
print(f"\n{'threads/target':>14} {'phase':>6} {'StorageBench MB/s':>18} {'fio MB/s':>9} {'ratio':>6}")
for threads in (1, 2):
    for phase in ("write", "read"):
        rows = [json.loads(line)["result"] for line in open(f"{out}/storage-{phase}-{threads}.jsonl")]
        seconds = max(r["elapsed_micros"] for r in rows) / 1e6
        storage = sum(r["bytes"] for r in rows) / seconds / 1e6
        job = json.load(open(f"{out}/fio-{phase}-{threads}.json"))["jobs"][0]
        fio = job[phase]["bw_bytes"] / 1e6
        print(f"{threads:>14} {phase:>6} {storage:18.0f} {fio:9.0f} {storage / fio:6.2f}")
        print(json.dumps({"storagebench": phase, "threads": threads, "mb_per_second": storage, "fio_mb_per_second": fio}), file=open(f"{out}/storage-vs-fio.jsonl", "a"))
PY
echo "results: $OUT"
