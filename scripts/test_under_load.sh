#!/usr/bin/env bash
# `make test` beside N busy-loop processes (default 2: one per core on the 2-core CI machine), the
# check of issue 22 item 6 that the suite holds on a busy machine. Prints the busy loops' CPU share
# and the suite's exit status; the loops stop with the script, however it ends.
#   scripts/test_under_load.sh [N] [make target, default test]
set -uo pipefail
cd "$(dirname "$0")/.."
n=${1:-2}; target=${2:-test}
pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null; done; }
trap cleanup EXIT INT TERM
for _ in $(seq "$n"); do
  ( while :; do :; done ) &
  pids+=("$!")
done
echo "busy loops: ${pids[*]} (load before: $(cut -d' ' -f1-3 /proc/loadavg))"
start=$(date +%s)
make "$target"
rc=$?
echo "make $target exited $rc after $(( $(date +%s) - start )) s beside $n busy loops (load now: $(cut -d' ' -f1-3 /proc/loadavg))"
for p in "${pids[@]}"; do
  echo "busy loop $p used $(ps -o times= -p "$p" 2>/dev/null | tr -d ' ') s of CPU"
done
exit $rc
