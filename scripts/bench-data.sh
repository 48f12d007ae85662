#!/usr/bin/env bash
# Every data benchmark in one run, against the machine's limits and the peers, ending with the
# performance targets as ratios of numbers taken in this run and whether each is met:
#   1. scripts/bench-peers.sh: the standard fio job set on the local disk, a bindfs
#      passthrough, Weft (default layout: 512 KiB chunks over 4 targets), GlusterFS, MooseFS;
#   2. scripts/bench-io.sh: `weft bench io` through the mount and the native client and
#      `weft bench net`, against the disk and loopback TCP (iperf3);
#   3. scripts/bench-storage.sh: StorageBench against fio on the same target directories.
# Results under $OUT (default a new temporary directory): peers.txt, io/, storage/.
# Usage: scripts/bench-data.sh [SIZE per job or thread (default 256M)]
set -euo pipefail
cd "$(dirname "$0")/.."
SIZE=${1:-256M}
OUT=${OUT:-$(mktemp -d /tmp/weft-bench-data.XXXXXX)}
mkdir -p "$OUT/io" "$OUT/storage"
scripts/bench-peers.sh "$SIZE" | tee "$OUT/peers.txt"
OUT=$OUT/io scripts/bench-io.sh "$SIZE" 1,2,4 | tee "$OUT/io.txt"
OUT=$OUT/storage scripts/bench-storage.sh "$SIZE" | tee "$OUT/storage.txt"

python3 - "$OUT" <<'PY'
import json, sys
out = sys.argv[1]
fio = {}
for line in open(f"{out}/peers.txt"):
    parts = line.split()
    if len(parts) >= 5 and parts[3] == "MB/s":
        fio[(parts[0], parts[1])] = float(parts[4] if parts[1].startswith("rand") else parts[2])
rate = {}
for line in open(f"{out}/io/io.jsonl"):
    row = json.loads(line)
    rate[(row["target"], row["result"]["phase"], row["result"]["threads"])] = row["result"]["mb_per_second"]
for line in open(f"{out}/io/loopback.jsonl"):
    row = json.loads(line)
    rate[(row["target"], "tcp", row["streams"])] = row["mb_per_second"]
def mean(*keys):
    values = [rate[k] for k in keys if k in rate]
    return sum(values) / len(values) if values else 0.0
rows = []
for job in ("seqwrite-j1", "seqread-j1", "seqwrite-j4", "seqread-j4"):
    weft, bindfs = fio.get(("weft", job), 0), fio.get(("bindfs", job), 0)
    best = max(fio.get(("gluster", job), 0), fio.get(("moosefs", job), 0))
    rows.append((f"fio {job}, Weft / bindfs", weft / bindfs if bindfs else 0, 1.0))
    rows.append((f"fio {job}, Weft / best peer", weft / best if best else 0, 1.5))
for job in ("randwrite-4k", "randread-4k"):
    weft = fio.get(("weft", job), 0)
    best = max(fio.get(("gluster", job), 0), fio.get(("moosefs", job), 0))
    rows.append((f"fio {job} IOPS, Weft / best peer", weft / best if best else 0, 2.0))
for threads in (1, 2, 4):
    loop = mean(("loopback-before", "tcp", threads), ("loopback-after", "tcp", threads))
    for phase in ("write", "read"):
        disk = mean(("local-direct", phase, threads), ("local-direct-after", phase, threads))
        net = rate.get(("weft-net", phase, threads), 0)
        native = rate.get(("weft-native", phase, threads), 0)
        rows.append((f"bench net {phase}, {threads} threads / loopback", net / loop if loop else 0, 0.8))
        limit = min(loop, disk)
        rows.append((f"native {phase}, {threads} threads / min(loopback, disk)", native / limit if limit else 0, 0.8))
for line in open(f"{out}/storage/storage-vs-fio.jsonl"):
    row = json.loads(line)
    rows.append((f"StorageBench {row['storagebench']}, {row['threads']} threads per target / fio",
                 row["mb_per_second"] / row["fio_mb_per_second"], 0.9))
print(f"\n{'target':58} {'ratio':>6} {'goal':>5}  met")
for name, ratio, goal in rows:
    print(f"{name:58} {ratio:6.2f} {goal:5.1f}  {'yes' if ratio >= goal else 'NO'}")
PY
echo "results: $OUT"
