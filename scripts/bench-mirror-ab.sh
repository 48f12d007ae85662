#!/usr/bin/env bash
# A/B of mirrored writes between two builds: one `weft up` each (2 storage servers x 2
# targets, paired into mirror groups, a mirrored directory), both running at once, and a
# 4 KiB write+fsync job (QD 1) through each mount in alternated rounds (ABBA).
# Usage: scripts/bench-mirror-ab.sh OLD_WEFT_BINARY [NEW_WEFT_BINARY]
set -u
cd "$(dirname "$0")/.."
OLD=${1:?usage: scripts/bench-mirror-ab.sh OLD_WEFT_BINARY [NEW_WEFT_BINARY]}
NEW=${2:-$PWD/target/release/weft}
PIDS=()
for which in old new; do
  BIN=$NEW; [ $which = old ] && BIN=$OLD
  D=/tmp/abf-$which; rm -rf $D; mkdir -p $D
  $BIN up --data-dir $D/data --mountpoint $D/mnt --storage-servers 2 --targets-per-server 2 > $D/up.log 2>&1 &
  PIDS+=($!)
  for i in $(seq 1 60); do grep -q "Weft is up" $D/up.log && break; sleep 1; done
  MGMT=$(grep "web page" $D/up.log | sed 's#.*http://##; s#/.*##')
  KEY=$(grep "cluster key" $D/up.log | awk '{print $3}')
  $BIN mirror autocreate storage --mgmt $MGMT --key-file $KEY > /dev/null
  mkdir $D/mnt/m
  $BIN entry set --pattern mirrored $D/mnt/m --mgmt $MGMT --key-file $KEY > /dev/null
done
sleep 3
for round in 1 2 3 4 5 6; do
  if [ $((round % 2)) = 1 ]; then order="old new"; else order="new old"; fi
  for which in $order; do
    D=/tmp/abf-$which
    fs=$(fio --name=fs --directory=$D/mnt/m --rw=randwrite --bs=4k --iodepth=1 --ioengine=psync --fsync=1 --size=32M --runtime=8 --time_based --output-format=json 2>/dev/null | python3 -c 'import json,sys; j=json.load(sys.stdin)["jobs"][0]; print(round(j["write"]["iops"]), round(j["sync"]["lat_ns"]["mean"]/1000), round(j["write"]["clat_ns"]["mean"]/1000))')
    echo "$which fsync_iops,sync_us,write_us= $fs"
  done
done
for p in "${PIDS[@]}"; do kill -INT $p; done; wait
