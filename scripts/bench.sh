#!/usr/bin/env bash
# Measures Weft against the local disk in one run, with the standard fio job set from
# ../shared/bench/fio-bench.sh: a local directory, then a `weft up` mount whose targets live
# on the same disk. Prints one line per job and the Weft/local ratios.
# Usage: scripts/bench.sh [SIZE (default 256M)] [WORKDIR (default a temp dir)]
set -euo pipefail
cd "$(dirname "$0")/.."
SIZE=${1:-256M}
WORK=${2:-$(mktemp -d /tmp/weft-bench.XXXXXX)}
FIO_BENCH=${FIO_BENCH:-../shared/bench/fio-bench.sh}
export OUT=$WORK/results
mkdir -p "$WORK/local" "$OUT"

. scripts/bench-tools.sh
need fio
cargo build --release --quiet
target/release/weft up --data-dir "$WORK/data" --mountpoint "$WORK/mnt" > "$WORK/up.log" 2>&1 &
UP=$!
trap 'kill -INT $UP 2>/dev/null; wait $UP 2>/dev/null || true' EXIT
for _ in $(seq 1 300); do grep -q "Press Ctrl-C" "$WORK/up.log" && break; sleep 0.2; done
grep -q "Press Ctrl-C" "$WORK/up.log" || { cat "$WORK/up.log"; exit 1; }

bash "$FIO_BENCH" "$WORK/local" local 1 "$SIZE" | tee "$WORK/local.txt"
bash "$FIO_BENCH" "$WORK/mnt" weft 1 "$SIZE" | tee "$WORK/weft.txt"

python3 - "$WORK/local.txt" "$WORK/weft.txt" <<'PY'
import sys
def load(path):
    rows = {}
    for line in open(path):
        parts = line.split()
        if len(parts) >= 5 and parts[3] == "MB/s":
            rows[parts[1]] = (float(parts[2]), float(parts[4]))
    return rows
local, weft = load(sys.argv[1]), load(sys.argv[2])
print(f"\n{'job':16s} {'local MB/s':>11s} {'weft MB/s':>10s} {'ratio':>6s}   {'local IOPS':>10s} {'weft IOPS':>10s}")
for job in local:
    if job in weft:
        (lb, li), (wb, wi) = local[job], weft[job]
        print(f"{job:16s} {lb:11.1f} {wb:10.1f} {wb / lb if lb else 0:6.2f}   {li:10.0f} {wi:10.0f}")
PY
