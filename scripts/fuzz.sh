#!/usr/bin/env bash
# Runs every libFuzzer target of a -DKVSERVE_FUZZ=ON build for a bounded time,
# KVSERVE_FUZZ_JOBS (default 2) at a time, each starting from its seed corpus
# tests/fuzz/corpus/<target>/ (left untouched: new inputs go to the run folder).
#   usage: scripts/fuzz.sh BUILD_DIR [SECONDS_PER_TARGET (default 60)] [TARGET...]
# Exits non-zero if any target found a crash, hang, leak or out-of-memory; the
# input that did it is BUILD_DIR/fuzz-runs/<target>-crash-* (or -timeout-*,
# -oom-*, -leak-*). docs/reliability.md says how to turn it into a test.
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:?usage: scripts/fuzz.sh BUILD_DIR [SECONDS_PER_TARGET] [TARGET...]}
seconds=${2:-60}
shift $(($# < 2 ? $# : 2))
jobs=${KVSERVE_FUZZ_JOBS:-2}
runs="$build/fuzz-runs"
rm -rf "$runs"
mkdir -p "$runs"

targets=("$@")
if [ ${#targets[@]} -eq 0 ]; then
  for bin in "$build"/fuzz_*; do
    name=$(basename "$bin")
    [ -x "$bin" ] && [ "$name" != fuzz_write_seeds ] && targets+=("$name")
  done
fi
[ ${#targets[@]} -gt 0 ] || { echo "no fuzz targets in $build (configure with -DKVSERVE_FUZZ=ON)" >&2; exit 1; }

run_target() {
  local name=$1 seeds="tests/fuzz/corpus/${1#fuzz_}" dict="tests/fuzz/${1#fuzz_}.dict" options=()
  mkdir -p "$runs/$name.corpus"
  [ -f "$dict" ] && options+=(-dict="$dict")
  # -timeout: one input running longer is a hang; -rss_limit_mb: more memory is an OOM.
  if "$build/$name" "$runs/$name.corpus" "$seeds" ${options[@]+"${options[@]}"} -max_total_time="$seconds" \
       -timeout=10 -rss_limit_mb=2048 -print_final_stats=1 -artifact_prefix="$runs/$name-" >"$runs/$name.log" 2>&1; then
    echo ok >"$runs/$name.status"
  else
    echo failed >"$runs/$name.status"
  fi
}

for name in "${targets[@]}"; do
  run_target "$name" &
  while [ "$(jobs -rp | wc -l)" -ge "$jobs" ]; do wait -n || true; done
done
wait

failed=0
for name in "${targets[@]}"; do
  executions=$(sed -n 's/^stat::number_of_executed_units: *//p' "$runs/$name.log" | tail -1)
  echo "$name: $(cat "$runs/$name.status"), ${executions:-?} executions in ${seconds}s" >&2
  if [ "$(cat "$runs/$name.status")" != ok ]; then
    failed=1
    tail -40 "$runs/$name.log" >&2
    ls "$runs/$name"-* >&2 2>/dev/null || true
  fi
done
exit $failed
