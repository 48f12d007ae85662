#!/bin/bash
# What hard quotas cost (docs/benchmarks.md, "Hard quotas"): eight rounds, alternating
# without a rule for user nobody and with a hard limit on it, of a 1 GiB dd and 3,000 empty
# and 3,000 4 KiB files made as nobody through the mount of one `weft up`. Needs a release
# build (cargo build --release) and root (runuser, the mount).
set -u
BIN=$(cd "$(dirname "$0")/.." && pwd)/target/release/weft
D=${WEFT_BENCH_DIR:-/tmp/weft-bench-quota}
rm -rf $D; mkdir -p $D
cd $D
$BIN up --data-dir $D/data --mountpoint $D/mnt > $D/up.log 2>&1 &
UP=$!
for i in $(seq 1 60); do grep -q "Weft is up" $D/up.log && break; sleep 1; done
MGMT=$(grep "web page" $D/up.log | sed 's#.*http://##; s#/.*##')
KEY=$(grep "cluster key" $D/up.log | awk '{print $3}')
mkdir $D/mnt/q; chmod 1777 $D/mnt/q
cat > $D/small.py <<'PY'
import os, sys, time
d = sys.argv[1]; n = int(sys.argv[2]); size = int(sys.argv[3])
os.makedirs(d)
data = b"x" * size
t = time.time()
for i in range(n):
    fd = os.open(f"{d}/f{i}", os.O_CREAT | os.O_WRONLY, 0o644)
    if size:
        os.write(fd, data)
    os.close(fd)
print(f"{n / (time.time() - t):.0f}")
PY
chmod 755 $D/small.py
rule() {
  if [ "$1" = with ]; then
    $BIN quota set --user 65534 --hard-bytes 64G --hard-inodes 10000000 --mgmt $MGMT --key-file $KEY
  else
    $BIN quota set --user 65534 --mgmt $MGMT --key-file $KEY
  fi
  sleep 3
  # The rule as management holds it (none in the rounds without).
  rules=$($BIN quota list --mgmt $MGMT --key-file $KEY | grep -c "65534" || true)
}
n=0
for which in without with with without without with with without; do
  n=$((n+1))
  rule $which
  sync; sleep 2
  seq=$(cd $D/mnt/q && runuser -u nobody -- dd if=/dev/zero of=seq bs=1M count=1024 conv=fsync 2>&1 | tail -1 | awk '{print $(NF-1)}')
  rm -f $D/mnt/q/seq
  sync; sleep 2
  empty=$(cd $D/mnt/q && runuser -u nobody -- python3 $D/small.py $D/mnt/q/e$n 3000 0)
  small=$(cd $D/mnt/q && runuser -u nobody -- python3 $D/small.py $D/mnt/q/s$n 3000 4096)
  rm -rf $D/mnt/q/e$n $D/mnt/q/s$n
  echo "round $n $which rules=$rules seq_MBps=$seq empty_creates_per_s=$empty small_4k_files_per_s=$small"
done
kill -INT $UP; wait $UP
