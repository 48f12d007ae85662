#!/usr/bin/env bash
# Kills a metadata server answering before its sync under the public mdtest (IOR project) and
# checks that mdtest finishes without an error and fsck is clean: the test
# `a_server_killed_under_mdtest_loses_nothing_answered_before_its_sync` of
# crates/cli/tests/durability.rs. mdtest and mpirun come from no package of this system: build
# mdtest from the IOR sources (autotools, with Open MPI's libopenmpi-dev and openmpi-bin) and
# name the binary. Needs root (FUSE).
# Usage: scripts/mdtest-kill.sh /path/to/mdtest
set -euo pipefail
cd "$(dirname "$0")/.."
if [ $# -ne 1 ] || [ ! -x "$1" ]; then
  echo "usage: $0 /path/to/mdtest   (an mdtest binary of the IOR project; mpirun on PATH)" >&2
  exit 2
fi
command -v mpirun >/dev/null || { echo "$0: mpirun is not on PATH (Debian: openmpi-bin)" >&2; exit 2; }
export WEFT_MDTEST=$(realpath "$1")
cargo test --release -p weft --test durability a_server_killed_under_mdtest -- --ignored --nocapture
