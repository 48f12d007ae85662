#!/usr/bin/env bash
# A/B of creates, stats and removals through the mount between builds: one fresh `weft up`
# per round, in the order given (alternate them: old new new old new old). Each round runs
# one Python process making N empty files (open O_CREAT, close), stat-ing and unlinking them,
# then four processes making and removing N/4 each in a directory of their own (their rate:
# all their operations over the time from the first one's start to the last one's end), with
# the CPU time the weft process spent per operation over each of these two phases.
# Also: scripts/bench-meta-ab.sh --sync-cost, what one sync of 13 scattered 4 KiB pages costs
# on this disk against 52 KiB and 4 KiB appended (the store's journal, crash-consistency.md).
# With --bytes B, each file created is written B bytes before its close (mdtest's hard shape:
# --bytes 3901).
# With --listing, each round instead untars /usr/include and /usr/share/doc (a tarball made
# once) into the mount, with the requests the untar made by operation, and times `ls -lR`,
# `find` and `du -s` of it, each with the kernel's caches dropped first.
# With --threads, each round instead runs one Python process's creates, stats and unlinks
# apart, and prints for each phase where the weft process's CPU time and context switches
# went, per operation and per kind of thread (the runtime's workers and blocking threads,
# named `weft`; the metadata commit thread; the store's flusher; the FUSE threads), counted
# from /proc over the phase and the 3 s after it.
# Usage: scripts/bench-meta-ab.sh [--files N] [--bytes B] [--listing|--threads] LABEL=WEFT_BINARY ...
set -u
cd "$(dirname "$0")/.."
N=2000
BYTES=0
if [ "${1:-}" = --files ]; then N=$2; shift 2; fi
if [ "${1:-}" = --bytes ]; then BYTES=$2; shift 2; fi
LISTING=0
if [ "${1:-}" = --listing ]; then LISTING=1; shift; fi
THREADS=0
if [ "${1:-}" = --threads ]; then THREADS=1; shift; fi
export BYTES
DIR=$(mktemp -d /tmp/weft-meta-ab.XXXXXX)
trap 'mountpoint -q $DIR/mnt && umount -l $DIR/mnt; rm -rf $DIR' EXIT
cat > $DIR/meta.py <<'PY'
import os, sys, time
d, n, phase = sys.argv[1], int(sys.argv[2]), sys.argv[3]
data = b"x" * int(os.environ.get("BYTES", "0"))
os.makedirs(d, exist_ok=True)
def create(f):
    fd = os.open(f, os.O_CREAT | os.O_WRONLY, 0o644)
    if data:
        os.write(fd, data)
    os.close(fd)
def timed(name, step):
    started, wall = time.perf_counter(), time.time()
    for i in range(n):
        step(f"{d}/f{i}")
    print(f"{name} {n / (time.perf_counter() - started):.0f} {wall:.6f} {time.time():.6f}", flush=True)
if phase in ("all", "create"):
    timed("create", create)
if phase in ("all", "stat"):
    timed("stat", os.stat)
if phase in ("all", "unlink"):
    timed("unlink", os.unlink)
PY
if [ "${1:-}" = --sync-cost ]; then
  python3 - "$DIR" <<'PY'
import os, random, sys, time
d = sys.argv[1]
def cost(name, step, rounds=300):
    started = time.perf_counter()
    for i in range(rounds):
        step(i)
    print(f"{name}: {(time.perf_counter() - started) / rounds * 1e6:.0f} us per sync")
scattered = os.open(f"{d}/scattered", os.O_RDWR | os.O_CREAT)
appended = os.open(f"{d}/appended", os.O_RDWR | os.O_CREAT)
for fd, size in ((scattered, 8 << 20), (appended, 64 << 20)):
    for at in range(0, size, 1 << 20):
        os.pwrite(fd, b"\0" * (1 << 20), at)
    os.fsync(fd)
page, record, small = os.urandom(4096), os.urandom(13 * 4096), os.urandom(4096)
def pages(i):
    for _ in range(13):
        os.pwrite(scattered, page, random.randrange(0, 2048) * 4096)
    os.fdatasync(scattered)
def append(blob):
    return lambda i: (os.pwrite(appended, blob, (i * len(blob)) % (60 << 20)), os.fdatasync(appended))
for _ in range(2):
    cost("13 scattered 4 KiB pages", pages)
    cost("52 KiB appended", append(record))
    cost("4 KiB appended", append(small))
PY
  exit 0
fi
for spec in "$@"; do
  label=${spec%%=*}; bin=${spec#*=}
  rm -rf $DIR/data; mkdir -p $DIR/mnt
  $bin up --data-dir $DIR/data --mountpoint $DIR/mnt --log warn > $DIR/up.log 2>&1 &
  pid=$!
  for i in $(seq 1 100); do mountpoint -q $DIR/mnt && break; sleep 0.2; done
  if [ $LISTING = 1 ]; then
    [ -f $DIR/tree.tar ] || tar cf $DIR/tree.tar -C /usr include share/doc 2> /dev/null || true
    timed() {
      sync; echo 3 > /proc/sys/vm/drop_caches
      local started=$(date +%s.%N)
      "$@" > /dev/null
      echo "$(echo "$(date +%s.%N) - $started" | bc)"
    }
    # The metadata requests the untar made, by operation, from every service's metrics.
    requests() {
      for endpoint in $(grep -o 'http://[^ ]*/metrics' $DIR/up.log); do curl -s "$endpoint"; done |
        awk -F'[{}"]' '/^weft_requests_total\{/ {for (i = 1; i < NF; i++) if ($i ~ /op=$/) n[$(i + 1)] += $NF}
          END {for (op in n) print op, n[op]}' | sort
    }
    requests > $DIR/requests.before
    untar=$(timed tar xf $DIR/tree.tar -C $DIR/mnt)
    requests > $DIR/requests.after
    printf "%s: %d files: untar %.2f s, ls -lR %.2f s, find %.2f s, du -s %.2f s\n" "$label" \
      "$(tar tf $DIR/tree.tar | wc -l)" "$untar" "$(timed ls -lR $DIR/mnt)" \
      "$(timed find $DIR/mnt)" "$(timed du -s $DIR/mnt)"
    echo "  untar's requests: $(join -a 2 $DIR/requests.before $DIR/requests.after |
      awk '{d = (NF == 3 ? $3 - $2 : $2); if (d > 0) printf "%s %d, ", $1, d}')"
    kill -INT $pid; wait $pid 2>/dev/null
    continue
  fi
  if [ $THREADS = 1 ]; then
    # Per thread: its name (numbers dropped), context switches, CPU ticks.
    threads() {
      for task in /proc/$pid/task/*; do
        # A thread that ended meanwhile (the blocking pool's) is left out.
        stat=$(cat $task/stat 2> /dev/null) || continue
        printf "%s %s %s\n" "$(tr -d '0-9' < $task/comm | sed 's/-*$//')" \
          "$(awk '/ctxt_switches/ {s += $2} END {print s + 0}' $task/status 2> /dev/null)" \
          "$(echo "$stat" | awk '{print $14 + $15}')"
      done | awk '{switches[$1] += $2; ticks[$1] += $3}
        END {for (name in switches) print name, switches[name], ticks[name]}' | sort
    }
    line="$label:"
    for phase in create stat unlink; do
      threads > $DIR/before
      rate=$(python3 $DIR/meta.py $DIR/mnt/one $N $phase | awk '{print $2}')
      sleep 3
      threads > $DIR/after
      line="$line $phase $rate/s ["$(join $DIR/before $DIR/after | awk -v n=$N -v hz=$(getconf CLK_TCK) \
        '$5 > $3 || $4 > $2 + n / 10 {
          printf " %s %.0f us %.1f sw", $1, ($5 - $3) * 1e6 / hz / n, ($4 - $2) / n}')" ]"
    done
    echo "$line"
    kill -INT $pid; wait $pid 2>/dev/null
    continue
  fi
  one=$(python3 $DIR/meta.py $DIR/mnt/one $N all | awk '{printf "%s %s ", $1, $2}')
  # The process's CPU time over each four-process phase and the 3 s after it (an unlink's
  # disposal of the file's objects runs after its answer), per operation.
  ticks() { awk '{print $14 + $15}' /proc/$pid/stat; }
  cpu=""
  for phase in create unlink; do
    before=$(ticks)
    workers=()
    for p in 1 2 3 4; do
      python3 $DIR/meta.py $DIR/mnt/p$p $((N / 4)) $phase > $DIR/$phase$p &
      workers+=($!)
    done
    wait "${workers[@]}"
    sleep 3
    cpu="$cpu $phase $(( ($(ticks) - before) * 1000000 / $(getconf CLK_TCK) / N )) us"
  done
  # Operations of all four over the time from the first's start to the last's end: a sum of
  # each process's own rate would count one running alone at the end as if the others ran.
  overall() {
    cat $DIR/$1? | awk -v n=$N -v phase=$1 '{if (!s || $3 < s) s = $3; if ($4 > e) e = $4}
      END {printf "%s %d", phase, n / (e - s)}'
  }
  four="$(overall create) $(overall unlink)"
  echo "$label: one process: $one| four processes: $four | CPU per operation:$cpu"
  kill -INT $pid; wait $pid 2>/dev/null
done
