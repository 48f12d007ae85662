#!/usr/bin/env bash
# Fuzzes every Weft decoder with libFuzzer (cargo-fuzz, installed if missing): the frame, every
# message body in each protocol version, every stored record, the handshake from both sides.
#
#   scripts/fuzz.sh                     every target for 15 s each, debug build (scripts/test.sh)
#   scripts/fuzz.sh --release --seconds 300 [TARGET...]    the long run of docs/benchmarks.md
#
# Inputs that find new coverage are added to fuzz/corpus/TARGET (committed after
# `cargo fuzz cmin`); a crash stops the run with its input in fuzz/artifacts/TARGET.
set -euo pipefail
cd "$(dirname "$0")/../fuzz"

seconds=15
profile=(--dev)
targets=()
while [ $# -gt 0 ]; do
  case "$1" in
    --seconds) seconds="$2"; shift 2 ;;
    --release) profile=(); shift ;;
    -*) echo "unknown option $1" >&2; exit 2 ;;
    *) targets+=("$1"); shift ;;
  esac
done
[ ${#targets[@]} -gt 0 ] || targets=(frame bodies records handshake)

if ! command -v cargo-fuzz >/dev/null 2>&1; then
  echo "installing cargo-fuzz"
  cargo install cargo-fuzz --locked --version 0.13.2 --quiet
fi
# libFuzzer's instrumentation needs unstable compiler flags; the stable toolchain accepts them
# with RUSTC_BOOTSTRAP.
export RUSTC_BOOTSTRAP=1
# Rust code is memory safe: the fuzzers look for panics and hangs, without a sanitizer.
cargo fuzz build --sanitizer none "${profile[@]}"
for target in "${targets[@]}"; do
  mkdir -p "corpus/$target"
  echo "fuzzing $target for ${seconds} s"
  cargo fuzz run --sanitizer none "${profile[@]}" "$target" -- \
    -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 -print_final_stats=1 2>&1 \
    | grep -E "^(Done|stat::number_of_executed_units|stat::peak_rss_mb)|panicked|SUMMARY|ERROR" || true
  if [ -n "$(ls -A "artifacts/$target" 2>/dev/null)" ]; then
    echo "fuzzing $target found a failing input: fuzz/artifacts/$target" >&2
    exit 1
  fi
done
