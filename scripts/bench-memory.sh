#!/usr/bin/env bash
# Memory of a `weft up` (every role and the mount in one process) under 64 fio jobs of mixed
# random I/O for 40 s: resident memory and threads at the start, at the peak, and 30 s after
# the load (docs/benchmarks.md, "Memory under load"). BS sets fio's block size (64k).
#
#   BS=1m scripts/bench-memory.sh [target/release/weft]
set -u
cd "$(dirname "$0")/.."
BIN=${1:-target/release/weft}
W=$(mktemp -d /tmp/memtest.XXXX)
$BIN up --data-dir $W/data --mountpoint $W/mnt > $W/up.log 2>&1 &
UP=$!
for i in $(seq 60); do mountpoint -q $W/mnt && break; sleep 1; done
rss() { awk '/VmRSS/{print int($2/1024)}' /proc/$UP/status; }
threads() { awk '/Threads/{print $2}' /proc/$UP/status; }
echo "idle at start: $(rss) MiB, $(threads) threads"
timeout 120 fio --name=mixed --directory=$W/mnt --numjobs=64 --rw=randrw --rwmixread=50 --bs=${BS:-64k} --size=16m --time_based --runtime=40 --ioengine=psync --group_reporting > $W/fio.log 2>&1 &
FIO=$!
peak=0; peakt=0
while kill -0 $FIO 2>/dev/null; do r=$(rss); t=$(threads); [ "$r" -gt "$peak" ] && peak=$r; [ "$t" -gt "$peakt" ] && peakt=$t; sleep 1; done
echo "peak under 64 jobs: $peak MiB, $peakt threads"
grep -E "READ:|WRITE:" $W/fio.log
sleep 30
echo "30 s after the load: $(rss) MiB, $(threads) threads"
kill -INT $UP; wait $UP 2>/dev/null
umount -l $W/mnt 2>/dev/null; rm -rf $W
