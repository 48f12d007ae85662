#!/usr/bin/env bash
# `weft bench io` in one run: a local directory on the same disk, a bindfs passthrough of it,
# a `weft up` mount (O_DIRECT), and the native client library; then `weft bench net` (the
# same client path with the storage servers skipping their disks) against loopback TCP
# measured with iperf3. The disk and loopback are measured before and after Weft, and the
# closing table gives the native client against the smaller of the two limits and the net
# benchmark against loopback. JSON lines go to $OUT/io.jsonl and $OUT/loopback.jsonl, one
# SVG plot per target to $OUT/io-<label>.svg, tables to stdout.
# Usage: scripts/bench-io.sh [SIZE_PER_THREAD (default 256M)] [THREADS (default 1,2,4)]
set -euo pipefail
cd "$(dirname "$0")/.."
SIZE=${1:-256M}
THREADS=${2:-1,2,4}
WORK=$(mktemp -d /tmp/weft-bench-io.XXXXXX)
OUT=${OUT:-$WORK}
mkdir -p "$OUT" "$WORK/local" "$WORK/bindfs"
. scripts/bench-tools.sh
need bindfs iperf3
cargo build --release --quiet
WEFT=target/release/weft
# Each target starts on a settled disk: what the one before wrote is on the disk, and the
# host behind this virtual disk has had a moment to absorb it (writes right after several
# GB of writes measured up to a third slower).
settle() { sync; sleep 3; }
bench() {
  local label=$1; shift
  settle
  "$WEFT" bench io --size "$SIZE" --threads "$THREADS" --random-ops 2000 --label "$label" \
    --json "$OUT/io.jsonl" --svg "$OUT/io-$label.svg" "$@"
}

# The disk and loopback move from minute to minute on a shared machine: each baseline is
# measured before and after the Weft runs, and the ratios use their mean.
loopback() {
  for STREAMS in ${THREADS//,/ }; do
    iperf3 -c 127.0.0.1 -p 5299 -t 5 -P "$STREAMS" -J |
      python3 -c 'import json,sys; print(json.dumps({"target": sys.argv[1], "streams": int(sys.argv[2]), "mb_per_second": json.load(sys.stdin)["end"]["sum_received"]["bits_per_second"]/8e6}))' "$1" "$STREAMS" |
      tee -a "$OUT/loopback.jsonl"
  done
}
iperf3 -s -B 127.0.0.1 -p 5299 -D --pidfile "$WORK/iperf3.pid"
trap 'kill "$(cat "$WORK/iperf3.pid")" 2>/dev/null || true' EXIT
sleep 1

bench local-direct --path "$WORK/local" --direct
loopback loopback-before
bindfs "$WORK/local" "$WORK/bindfs"
bench bindfs-direct --path "$WORK/bindfs" --direct
umount "$WORK/bindfs"

"$WEFT" up --data-dir "$WORK/data" --mountpoint "$WORK/mnt" > "$WORK/up.log" 2>&1 &
UP=$!
trap 'kill -INT $UP 2>/dev/null; wait $UP 2>/dev/null || true; kill "$(cat "$WORK/iperf3.pid")" 2>/dev/null || true' EXIT
for _ in $(seq 1 300); do grep -q "Press Ctrl-C" "$WORK/up.log" && break; sleep 0.2; done
MGMT=$(sed -n 's/^  management *//p' "$WORK/up.log")
bench weft-mount-direct --path "$WORK/mnt" --direct
bench weft-native --mgmt "$MGMT"
settle
"$WEFT" bench net --size "$SIZE" --threads "$THREADS" --random-ops 2000 --label weft-net \
  --json "$OUT/io.jsonl" --svg "$OUT/io-weft-net.svg" --mgmt "$MGMT"
loopback loopback-after
bench local-direct-after --path "$WORK/local" --direct

python3 - "$OUT/io.jsonl" "$OUT/loopback.jsonl" <<'PY'
import json, sys
rate = {}
for line in open(sys.argv[1]):
    row = json.loads(line)
    result = row["result"]
    rate[(row["target"], result["phase"], result["threads"])] = result["mb_per_second"]
for line in open(sys.argv[2]):
    row = json.loads(line)
    rate[(row["target"], "tcp", row["streams"])] = row["mb_per_second"]
def mean(*keys):
    values = [rate[k] for k in keys if k in rate]
    return sum(values) / len(values) if values else 0
print("\nratios against the mean of each baseline's two measurements (before and after Weft)")
print(f"{'threads':>7} {'phase':>6} {'loopback':>9} {'disk':>8} {'native':>8} {'/min':>6} {'net':>8} {'/loop':>6}")
for threads in sorted({k[2] for k in rate if k[0] == "weft-native"}):
    loop = mean(("loopback-before", "tcp", threads), ("loopback-after", "tcp", threads))
    for phase in ("write", "read"):
        disk = mean(("local-direct", phase, threads), ("local-direct-after", phase, threads))
        native = rate.get(("weft-native", phase, threads), 0)
        net = rate.get(("weft-net", phase, threads), 0)
        limit = min(loop, disk)
        print(f"{threads:>7} {phase:>6} {loop:9.0f} {disk:8.0f} {native:8.0f} {native / limit if limit else 0:6.2f} {net:8.0f} {net / loop if loop else 0:6.2f}")
PY
echo "results: $OUT"
