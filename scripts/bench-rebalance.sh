#!/usr/bin/env bash
# What background rebalancing costs foreground I/O, in one run, in alternated pairs.
#
# Starts management, one metadata server and two storage servers with three targets each
# (ids 1-3 on storage-1, 4-6 on storage-2, every target CAPACITY bytes), mounts, and:
# - fills pool `full` (targets 1 and 4) with FILL bytes of files;
# - gives the foreground its own pool `fg` (targets 3 and 6), on the same two servers and disk;
# - then, PAIRS times: runs fio (sequential 1 MiB writes, then reads, each for SECONDS) in
#   `fg` with rebalancing idle (targets 2 and 5 in the default pool), and again while it runs
#   (targets 2 and 5 added to `full`, whose targets are then further than the margin from the
#   pool's mean: the metadata server moves objects onto them at rebalance_bytes_per_second),
#   then takes 2 and 5 out again.
# Prints per pair the busy/idle ratio of the foreground's throughput and the bytes moved.
# Usage: scripts/bench-rebalance.sh [SECONDS] [PAIRS]   (default 10 s, 2 pairs)
set -euo pipefail
cd "$(dirname "$0")/.."
SECONDS_PER_RUN=${1:-10}
PAIRS=${2:-2}
CAPACITY=$((4 << 30))
FILL_FILES=80
FILE_SIZE=32M
. scripts/bench-tools.sh
need fio
cargo build --release --quiet
WEFT=$PWD/target/release/weft
WORK=$(mktemp -d /tmp/weft-bench-rebalance.XXXXXX)
PIDS=()
cleanup() {
  umount "$WORK/mnt" 2>/dev/null || true
  for pid in "${PIDS[@]}"; do kill -9 "$pid" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$WORK"
}
trap cleanup EXIT
port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
MGMT=127.0.0.1:$(port)
META=127.0.0.1:$(port)
mkdir -p "$WORK"/{mgmt,meta,s1/t1,s1/t2,s1/t3,s2/t1,s2/t2,s2/t3,mnt,logs}
export WEFT_KEY_FILE="$WORK/cluster.key"
"$WEFT" keygen "$WEFT_KEY_FILE" > /dev/null
KEY=(--set "auth_key_file=\"$WEFT_KEY_FILE\"")
"$WEFT" serve mgmt "${KEY[@]}" --data-dir "$WORK/mgmt" --listen "$MGMT" > "$WORK/logs/mgmt.log" 2>&1 &
PIDS+=($!)
sleep 0.5
"$WEFT" serve meta "${KEY[@]}" --data-dir "$WORK/meta" --listen "$META" --mgmt "$MGMT" \
  > "$WORK/logs/meta.log" 2>&1 &
PIDS+=($!)
for _ in $(seq 1 100); do grep -q "metadata server serving" "$WORK/logs/meta.log" && break; sleep 0.1; done
for s in 1 2; do
  # Targets register in --target order, one server after the other: ids 1-3, then 4-6.
  "$WEFT" serve storage "${KEY[@]}" --data-dir "$WORK/s$s" --listen 127.0.0.1:0 --mgmt "$MGMT" \
    --target "$WORK/s$s/t1" --target "$WORK/s$s/t2" --target "$WORK/s$s/t3" \
    --set "target_capacity_bytes=$CAPACITY" > "$WORK/logs/storage-$s.log" 2>&1 &
  PIDS+=($!)
  for _ in $(seq 1 100); do grep -q "storage server serving" "$WORK/logs/storage-$s.log" && break; sleep 0.1; done
done
"$WEFT" pool create full --targets 1,4 --mgmt "$MGMT" > /dev/null
"$WEFT" pool create fg --targets 3,6 --mgmt "$MGMT" > /dev/null
"$WEFT" mount --mgmt "$MGMT" "$WORK/mnt" > "$WORK/logs/mount.log" 2>&1 &
PIDS+=($!)
for _ in $(seq 1 100); do mountpoint -q "$WORK/mnt" && break; sleep 0.1; done
mkdir "$WORK/mnt/full" "$WORK/mnt/fg"
"$WEFT" entry set --pool full --num-targets 2 "$WORK/mnt/full" --mgmt "$MGMT" > /dev/null
"$WEFT" entry set --pool fg --num-targets 2 "$WORK/mnt/fg" --mgmt "$MGMT" > /dev/null
echo "filling pool full with $FILL_FILES files of $FILE_SIZE"
for i in $(seq 1 "$FILL_FILES"); do
  head -c "$FILE_SIZE" /dev/urandom > "$WORK/mnt/full/f$i"
done
sync

moved() {
  curl -s "http://$META/metrics" | awk '/^weft_meta_rebalanced_bytes_total/ {print $2}'
}
fg_run() {
  local rw=$1
  fio --name=fg --directory="$WORK/mnt/fg" --rw="$rw" --bs=1M --size=2G --ioengine=psync \
    --runtime="$SECONDS_PER_RUN" --time_based --end_fsync=1 --output-format=json 2>/dev/null |
    python3 -c "
import json, sys
job = json.load(sys.stdin)['jobs'][0]
print(job['$( [ "$rw" = write ] && echo write || echo read )']['bw'] / 1024)"
}
measure() {
  local write read
  write=$(fg_run write)
  read=$(fg_run read)
  echo "$write $read"
}

printf "%-6s %-12s %12s %12s %14s\n" pair state "write MB/s" "read MB/s" "moved MiB"
for pair in $(seq 1 "$PAIRS"); do
  before=$(moved)
  read -r idle_w idle_r <<< "$(measure)"
  idle_moved=$(( ($(moved) - before) >> 20 ))
  printf "%-6s %-12s %12.0f %12.0f %14s\n" "$pair" idle "$idle_w" "$idle_r" "$idle_moved"
  "$WEFT" pool add-target full --targets 2,5 --mgmt "$MGMT" > /dev/null
  before=$(moved)
  read -r busy_w busy_r <<< "$(measure)"
  busy_moved=$(( ($(moved) - before) >> 20 ))
  printf "%-6s %-12s %12.0f %12.0f %14s\n" "$pair" rebalancing "$busy_w" "$busy_r" "$busy_moved"
  python3 -c "print(f'{\"\":6} {\"ratio\":12} {$busy_w / $idle_w:11.2f}x {$busy_r / $idle_r:11.2f}x')"
  "$WEFT" pool remove-target full --targets 2,5 --mgmt "$MGMT" > /dev/null
  # The move in flight finishes before the next idle run.
  sleep 3
done
"$WEFT" pool list --mgmt "$MGMT"
