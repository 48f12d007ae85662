#!/usr/bin/env bash
# `weft bench io` in one run: a local directory on the same disk, a bindfs passthrough of it,
# a `weft up` mount (O_DIRECT), and the native client library; then `weft bench net` (the
# same client path with the storage servers skipping their disks) against loopback TCP
# measured with iperf3. JSON lines go to $OUT/io.jsonl, one SVG plot per target to
# $OUT/io-<label>.svg, tables to stdout.
# Usage: scripts/bench-io.sh [SIZE_PER_THREAD (default 256M)] [THREADS (default 1,2,4)]
set -euo pipefail
cd "$(dirname "$0")/.."
SIZE=${1:-256M}
THREADS=${2:-1,2,4}
WORK=$(mktemp -d /tmp/weft-bench-io.XXXXXX)
OUT=${OUT:-$WORK}
mkdir -p "$OUT" "$WORK/local" "$WORK/bindfs"
cargo build --release --quiet
WEFT=target/release/weft
bench() {
  local label=$1; shift
  "$WEFT" bench io --size "$SIZE" --threads "$THREADS" --random-ops 2000 --label "$label" \
    --json "$OUT/io.jsonl" --svg "$OUT/io-$label.svg" "$@"
}

bench local-direct --path "$WORK/local" --direct
bindfs "$WORK/local" "$WORK/bindfs"
bench bindfs-direct --path "$WORK/bindfs" --direct
umount "$WORK/bindfs"

"$WEFT" up --data-dir "$WORK/data" --mountpoint "$WORK/mnt" > "$WORK/up.log" 2>&1 &
UP=$!
trap 'kill -INT $UP 2>/dev/null; wait $UP 2>/dev/null || true' EXIT
for _ in $(seq 1 300); do grep -q "Press Ctrl-C" "$WORK/up.log" && break; sleep 0.2; done
MGMT=$(sed -n 's/^  management *//p' "$WORK/up.log")
bench weft-mount-direct --path "$WORK/mnt" --direct
bench weft-native --mgmt "$MGMT"
"$WEFT" bench net --size "$SIZE" --threads "$THREADS" --random-ops 2000 --label weft-net \
  --json "$OUT/io.jsonl" --svg "$OUT/io-weft-net.svg" --mgmt "$MGMT"

command -v iperf3 >/dev/null || DEBIAN_FRONTEND=noninteractive apt-get install -y -qq iperf3 >/dev/null
iperf3 -s -B 127.0.0.1 -p 5299 -D --pidfile "$WORK/iperf3.pid"
sleep 1
for STREAMS in ${THREADS//,/ }; do
  iperf3 -c 127.0.0.1 -p 5299 -t 5 -P "$STREAMS" -J |
    python3 -c 'import json,sys; print("loopback-tcp streams=%s %.1f MB/s" % (sys.argv[1], json.load(sys.stdin)["end"]["sum_received"]["bits_per_second"]/8e6))' "$STREAMS"
done
kill "$(cat "$WORK/iperf3.pid")" 2>/dev/null || true
echo "results: $OUT"
