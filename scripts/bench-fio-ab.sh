#!/usr/bin/env bash
# fio A/B through the mount: 4 KiB random write/read at QD 32, 1 MiB sequential write/read.
# Usage: scripts/bench-fio-ab.sh LABEL=WEFT_BINARY ...   (alternate them: A B B A); one fresh
# `weft up` per round, each printing IOPS and MiB/s per job.
set -u
for pair in "$@"; do
  label=${pair%%=*}; bin=${pair#*=}
  D=$(mktemp -d /tmp/fioab.XXXXXX); mkdir -p $D/mnt
  $bin up --data-dir $D/data --mountpoint $D/mnt --log warn > $D/up.log 2>&1 &
  UP=$!
  for _ in $(seq 1 100); do mountpoint -q $D/mnt && break; sleep 0.2; done
  sleep 2
  out="$label:"
  for job in "randwrite 4k 32" "randread 4k 32" "write 1M 4" "read 1M 4"; do
    set -- $job
    r=$(fio --name=j --filename=$D/mnt/f --rw=$1 --bs=$2 --iodepth=$3 --ioengine=libaio --direct=1 --size=256M --runtime=8 --time_based --output-format=json 2>/dev/null | python3 -c 'import json,sys; j=json.load(sys.stdin)["jobs"][0]; k="write" if j["write"]["io_bytes"] else "read"; print(round(j[k]["iops"]), round(j[k]["bw"]/1024))')
    out="$out $1-$2 ${r}"
  done
  echo "$out"
  kill -INT $UP; wait $UP 2>/dev/null
  mountpoint -q $D/mnt && umount -l $D/mnt
  rm -rf $D
done
