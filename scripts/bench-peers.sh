#!/usr/bin/env bash
# The standard fio job set (../shared/bench/fio-bench.sh, O_DIRECT) in one run on: the local
# disk, a bindfs passthrough of it, a `weft up` mount (default layout: 512 KiB chunks over 4
# targets; default settings, then with every write through the servers' page cache),
# single-node GlusterFS and MooseFS through their FUSE clients. One summary line per job and
# target, then each Weft variant's ratios against bindfs and the best peer.
# Usage: scripts/bench-peers.sh [SIZE per job (default 256M)]
set -euo pipefail
cd "$(dirname "$0")/.."
SIZE=${1:-256M}
SHARED=${SHARED_BENCH:-../shared/bench}
WORK=$(mktemp -d /tmp/weft-bench-peers.XXXXXX)
chmod a+rx "$WORK"   # the peers' daemons run as their own users
export OUT=$WORK/results
mkdir -p "$OUT" "$WORK/local" "$WORK/bindfs"
. scripts/bench-tools.sh
need fio bindfs
cargo build --release --quiet
fio_set() { bash "$SHARED/fio-bench.sh" "$1" "$2" 1 "$SIZE" | tee -a "$WORK/summary.txt"; }

fio_set "$WORK/local" local
bindfs "$WORK/local" "$WORK/bindfs"
fio_set "$WORK/bindfs" bindfs
umount "$WORK/bindfs"

# Weft as configured by default, then with every write through the storage servers' page
# cache (direct_write_min_bytes = 0), the trade-off between cached reads and streaming writes.
for VARIANT in weft weft-pagecache; do
  EXTRA=()
  [ "$VARIANT" = weft-pagecache ] && EXTRA=(--direct-write-min-bytes 0)
  target/release/weft up "${EXTRA[@]}" --data-dir "$WORK/data-$VARIANT" --mountpoint "$WORK/mnt-$VARIANT" > "$WORK/up-$VARIANT.log" 2>&1 &
  UP=$!
  trap 'kill -INT $UP 2>/dev/null; wait $UP 2>/dev/null || true' EXIT
  for _ in $(seq 1 300); do grep -q "Press Ctrl-C" "$WORK/up-$VARIANT.log" && break; sleep 0.2; done
  fio_set "$WORK/mnt-$VARIANT" "$VARIANT"
  kill -INT $UP; wait $UP || true
  trap - EXIT
done

each_peer "$WORK" gluster,moosefs fio_set

python3 - "$WORK/summary.txt" <<'PY'
import sys
rows = {}
for line in open(sys.argv[1]):
    parts = line.split()
    if len(parts) >= 5 and parts[3] == "MB/s":
        rows.setdefault(parts[1], {})[parts[0]] = (float(parts[2]), float(parts[4]))
for variant in ("weft", "weft-pagecache"):
    print(f"\n{'job':14s} {variant + '/bindfs':>22s} {variant + '/best peer':>25s}  (MB/s; IOPS for random jobs)")
    for job, by in rows.items():
        if variant not in by:
            continue
        index = 1 if job.startswith("rand") else 0
        weft = by[variant][index]
        bindfs = by.get("bindfs", (0, 0))[index]
        peers = [by[p][index] for p in ("gluster", "moosefs") if p in by]
        best = max(peers) if peers else 0
        print(f"{job:14s} {weft / bindfs if bindfs else 0:22.2f} {weft / best if best else 0:25.2f}")
PY
echo "results: $OUT"
