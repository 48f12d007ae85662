#!/usr/bin/env bash
# What mirroring costs and how long I/O pauses at a failover, in one run, with default settings.
#
# Starts management, two metadata servers and two storage servers (two targets each) as
# separate processes, pairs the targets into two mirror groups, mounts, and then:
# 1. runs the same fio jobs (O_DIRECT) in a plain directory (RAID0 over the 4 targets) and in a
#    mirrored one (striped over the 2 groups), and prints the mirrored/plain ratio per job;
# 2. runs a writer that writes 4 KiB and fsyncs in a loop in the mirrored directory, kills the
#    primary's storage server (kill -9) and reports the longest time one write+fsync took:
#    the pause the application saw.
# 3. runs `weft bench meta` (native client) on one metadata server, then pairs the two
#    metadata servers into a mirror group (meta-2 becomes a copy of meta-1's namespace) and
#    runs it again: the mirrored/plain ratio of metadata operations;
# 4. runs a loop of mkdir + create + fsync, kills the primary metadata server (kill -9) and
#    reports the longest iteration: the pause of the namespace at a metadata failover.
# Usage: scripts/bench-mirror.sh [SIZE]   (SIZE of each fio file, default 256M)
set -euo pipefail
cd "$(dirname "$0")/.."
SIZE=${1:-256M}
. scripts/bench-tools.sh
need fio
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
mkdir -p "$WORK"/{mgmt,meta,meta2,s1/t1,s1/t2,s2/t1,s2/t2,mnt,logs}
# One cluster key for every service; the mount and the admin commands find it in WEFT_KEY_FILE.
export WEFT_KEY_FILE="$WORK/cluster.key"
"$WEFT" keygen "$WEFT_KEY_FILE" > /dev/null
KEY=(--set "auth_key_file=\"$WEFT_KEY_FILE\"")
"$WEFT" serve mgmt "${KEY[@]}" --data-dir "$WORK/mgmt" --listen "$MGMT" > "$WORK/logs/mgmt.log" 2>&1 &
PIDS+=($!)
sleep 0.5
"$WEFT" serve meta "${KEY[@]}" --data-dir "$WORK/meta" --listen 127.0.0.1:0 --mgmt "$MGMT" \
  --set alias=\"meta-1\" > "$WORK/logs/meta.log" 2>&1 &
PIDS+=($!)
META_1=$!
for _ in $(seq 1 100); do grep -q "metadata server serving" "$WORK/logs/meta.log" && break; sleep 0.1; done
for s in 1 2; do
  "$WEFT" serve storage "${KEY[@]}" --data-dir "$WORK/s$s" --listen 127.0.0.1:0 --mgmt "$MGMT" \
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

echo "== cost of metadata mirroring (weft bench meta, native client) =="
bench_meta() {
  "$WEFT" bench meta --mgmt "$MGMT" --files 2000 --dirs 100 --threads 1,4 --label "$1" \
    --json "$WORK/meta-$1.json" > "$WORK/logs/bench-meta-$1.txt"
}
bench_meta plain
"$WEFT" serve meta "${KEY[@]}" --data-dir "$WORK/meta2" --listen 127.0.0.1:0 --mgmt "$MGMT" \
  --set alias=\"meta-2\" > "$WORK/logs/meta-2.log" 2>&1 &
PIDS+=($!)
for _ in $(seq 1 100); do grep -q "metadata server serving" "$WORK/logs/meta-2.log" && break; sleep 0.1; done
sleep 1
"$WEFT" mirror autocreate meta --mgmt "$MGMT"
for _ in $(seq 1 300); do
  "$WEFT" mirror list --mgmt "$MGMT" | grep " meta " | grep -q "needs-resync" || break
  sleep 0.2
done
bench_meta mirrored
python3 - "$WORK/meta-plain.json" "$WORK/meta-mirrored.json" <<'PY'
import json, sys
def load(path):
    rates = {}
    for line in open(path):
        row = json.loads(line)
        result = row["result"]
        rates[(result["threads"], result["phase"])] = result["ops_per_second"]
    return rates
plain, mirrored = load(sys.argv[1]), load(sys.argv[2])
print(f"{'phase':18} {'threads':>7} {'plain':>10} {'mirrored':>10} {'ratio':>7}")
for key in sorted(plain):
    if key in mirrored:
        print(f"{key[1]:18} {key[0]:7} {plain[key]:10.0f} {mirrored[key]:10.0f} {mirrored[key] / plain[key]:6.2f}x")
PY

echo "== namespace pause at failover (kill -9 of the primary metadata server, default timeouts) =="
python3 - "$WORK/mnt/namespace" "$WORK/meta-pause.txt" <<'PY' &
import os, sys, time
root, out = sys.argv[1], sys.argv[2]
os.mkdir(root)
longest, stop_at, i = 0.0, None, 0
while stop_at is None or time.monotonic() < stop_at:
    started = time.monotonic()
    d = os.path.join(root, f"d{i}")
    os.mkdir(d)
    fd = os.open(os.path.join(d, "f"), os.O_CREAT | os.O_WRONLY, 0o644)
    os.write(fd, b"x" * 100)
    os.fsync(fd)
    os.close(fd)
    longest = max(longest, time.monotonic() - started)
    i += 1
    if os.path.exists(out + ".go") and stop_at is None:
        stop_at = time.monotonic() + 20
open(out, "w").write(f"{longest:.2f} {i}\n")
PY
WRITER=$!
sleep 2
touch "$WORK/meta-pause.txt.go"
kill -9 "$META_1"
wait "$WRITER"
read -r longest iterations < "$WORK/meta-pause.txt"
echo "longest mkdir+create+fsync while the primary metadata server died: $longest s ($iterations iterations)"
"$WEFT" mirror list --mgmt "$MGMT" | grep -E "GROUP| meta "

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
