#!/usr/bin/env bash
# Installs what Weft's tests need if it is missing, then runs them: the format check, clippy
# with warnings as errors, every unit and integration test, and a short fuzzing of every
# decoder. This is README's test command
# and all of .ci/run.
set -euo pipefail
cd "$(dirname "$0")/.."

missing=()
command -v fio >/dev/null 2>&1 || missing+=(fio)
command -v runuser >/dev/null 2>&1 || missing+=(util-linux)
command -v umount >/dev/null 2>&1 || missing+=(mount)
command -v nsenter >/dev/null 2>&1 || missing+=(util-linux)
command -v ip >/dev/null 2>&1 || missing+=(iproute2)
command -v setfacl >/dev/null 2>&1 || missing+=(acl)
command -v getfattr >/dev/null 2>&1 || missing+=(attr)
command -v python3 >/dev/null 2>&1 || missing+=(python3)
command -v prometheus >/dev/null 2>&1 || missing+=(prometheus)
command -v chromium >/dev/null 2>&1 || missing+=(chromium)
command -v influxd >/dev/null 2>&1 || missing+=(influxdb)
if [ ${#missing[@]} -gt 0 ]; then
  echo "installing: ${missing[*]}"
  if [ "$(id -u)" -ne 0 ]; then
    echo "the tests need root (FUSE mounts, runuser) to install ${missing[*]}" >&2
    exit 1
  fi
  apt-get update -qq
  # The tests start Prometheus and InfluxDB themselves, on their own ports: keep the packages
  # from starting system services while they install.
  policy=/usr/sbin/policy-rc.d
  own_policy=false
  if [ ! -e "$policy" ]; then
    printf '#!/bin/sh\nexit 101\n' > "$policy"
    chmod +x "$policy"
    own_policy=true
  fi
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
  if $own_policy; then rm -f "$policy"; fi
fi
if [ ! -c /dev/fuse ]; then
  echo "/dev/fuse is missing: the integration tests mount Weft with FUSE" >&2
  exit 1
fi
if [ "$(id -u)" -ne 0 ]; then
  echo "run the tests as root: they mount FUSE file systems through mount(2)" >&2
  exit 1
fi

cargo fmt --all --check
cargo clippy --workspace --all-targets --quiet -- -D warnings
# Cluster tests start several processes each; two at a time suit a 2-core machine.
cargo test --workspace -- --test-threads=2
# Every decoder under a coverage-guided fuzzer for a while, from the corpus in fuzz/corpus.
scripts/fuzz.sh --seconds 15
