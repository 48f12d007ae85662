#!/usr/bin/env bash
# What mirroring costs and how long I/O pauses at a failover, in one run, with default settings.
#
# Starts management, one metadata server and two storage servers (two targets each) as
# separate processes, pairs the targets into two mirror groups, mounts, and then:
# 1. runs the same fio jobs (O_DIRECT) in a plain directory (RAID0 over the 4 targets) and in a
#    mirrored one (striped over the 2 groups), and prints the mirrored/plain ratio per job;
# 2. runs a writer that writes 4 KiB and fsyncs in a loop in the mirrored directory, kills the
#    primary's storage server (kill -9) and reports the longest time one write+fsync took:
#    the pause the application saw.
# Usage: scripts/bench-mirror.sh [SIZE]   (SIZE of each fio file, default 256M)
set -euo pipefail
cd "$(dirname "$0")/.."
SIZE=${1:-256M}
cargo build --release --quiet
WEFT=$PWD/target/release/weft
WORK=$(mktemp -d /tmp/weft-bench-mirror.XXXXXX)
PIDS=()
cleanup() {
  umount "$WORK/mnt" 2>/dev/null || true
  for pid in "${PIDS[@]}"; do kill -9 "$pid" 2>/dev/null || true; done
  wait 2>/dev/null || true
}
trap cleanup EXIT
port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
MGMT=127.0.0.1:$(port)
mkdir -p "$WORK"/{mgmt,meta,s1/t1,s1/t2,s2/t1,s2/t2,mnt,logs}
"$WEFT" serve mgmt --data-dir "$WORK/mgmt" --listen "$MGMT" > "$WORK/logs/mgmt.log" 2>&1 &
PIDS+=($!)
sleep 0.5
"$WEFT" serve meta --data-dir "$WORK/meta" --listen 127.0.0.1:0 --mgmt "$MGMT" > "$WORK/logs/meta.log" 2>&1 &
PIDS+=($!)
for s in 1 2; do
  "$WEFT" serve storage --data-dir "$WORK/s$s" --listen 127.0.0.1:0 --mgmt "$MGMT" \
    --target "$WORK/s$s/t1" --target "$WORK/s$s/t2" --set alias=\"storage-$s\" \
    > "$WORK/logs/storage-$s.log" 2>&1 &
  PIDS+=($!)
  eval "STORAGE_$s=$!"
  for _ in $(seq 1 100); do grep -q "storage server serving" "$WORK/logs/storage-$s.log" && break; sleep 0.1; done
done
"$WEFT" mirror autocreate storage --mgmt "$MGMT"
"$WEFT" mount --mgmt "$MGMT" "$WORK/mnt" > "$WORK/logs/mount.log" 2>&1 &
PIDS+=($!)
for _ in $(seq 1 100); do mountpoint -q "$WORK/mnt" && break; sleep 0.1; done
mkdir "$WORK/mnt/plain" "$WORK/mnt/mirrored"
"$WEFT" entry set --num-targets 4 "$WORK/mnt/plain" --mgmt "$MGMT" > /dev/null
"$WEFT" entry set --pattern mirrored --num-targets 2 "$WORK/mnt/mirrored" --mgmt "$MGMT" > /dev/null

echo "== write cost of mirroring (fio, O_DIRECT, $SIZE per job) =="
printf "%-22s %14s %14s %8s\n" job plain mirrored ratio
job() {
  local name=$1 metric=$2; shift 2
  local results=()
  for dir in plain mirrored; do
    rm -f "$WORK/mnt/$dir"/"$name"*
    local value
    value=$(fio --name="$name" --directory="$WORK/mnt/$dir" --direct=1 --size="$SIZE" "$@" \
      --output-format=json 2>/dev/null | python3 -c "
import json, sys
job = json.load(sys.stdin)['jobs'][0]['write']
print(job['$metric'])")
    results+=("$value")
  done
  python3 - "$name" "$metric" "${results[@]}" <<'PY'
import sys
name, metric, plain, mirrored = sys.argv[1], sys.argv[2], float(sys.argv[3]), float(sys.argv[4])
unit = "MB/s" if metric == "bw" else "IOPS"
scale = 1 / 1024 if metric == "bw" else 1
print(f"{name:22} {plain * scale:9.0f} {unit:4} {mirrored * scale:9.0f} {unit:4} {mirrored / plain:7.2f}x")
PY
}
job seqwrite-1M bw --rw=write --bs=1M --ioengine=psync --end_fsync=1
job seqwrite-1M-j4 bw --rw=write --bs=1M --ioengine=psync --numjobs=4 --group_reporting --end_fsync=1
job randwrite-4K-qd32 iops --rw=randwrite --bs=4k --ioengine=libaio --iodepth=32 --runtime=15 --time_based

echo "== pause at failover (kill -9 of the primary's storage server, default timeouts) =="
python3 - "$WORK/mnt/mirrored/pause" "$WORK/pause.txt" <<'PY' &
import os, sys, time
path, out = sys.argv[1], sys.argv[2]
fd = os.open(path, os.O_CREAT | os.O_WRONLY, 0o644)
block = os.urandom(4096)
longest, stop_at = 0.0, None
offset = 0
while stop_at is None or time.monotonic() < stop_at:
    started = time.monotonic()
    os.pwrite(fd, block, offset)
    os.fsync(fd)
    took = time.monotonic() - started
    longest = max(longest, took)
    offset = (offset + 4096) % (64 << 20)
    if os.path.exists(out + ".go") and stop_at is None:
        stop_at = time.monotonic() + 20
open(out, "w").write(f"{longest:.2f}\n")
PY
WRITER=$!
sleep 2
touch "$WORK/pause.txt.go"
kill -9 "$STORAGE_1"
wait "$WRITER"
echo "longest write+fsync while the primary's server died: $(cat "$WORK/pause.txt") s"
"$WEFT" mirror list --mgmt "$MGMT"
