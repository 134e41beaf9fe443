#!/usr/bin/env bash
# Speculation inside the batching engine (docs/speculative.md): greedy
# SmolLM2 through `kvserve run -f`, a copy-heavy and a normal workload of 8
# prompts each, 1 and 8 concurrent requests, without and with --spec ngram
# (fixed k, and adaptive k).
# Every configuration runs in this one invocation, so that they share the
# machine's load; prints a markdown table.
#   scripts/bench_engine_spec.sh [N_TOKENS] [K] [THREADS]
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${KVSERVE_BIN:-./build/kvserve}
MODEL=${KVSERVE_MODEL:-models/smollm2-135m-instruct-q4_1.gguf}
N=${1:-48}
K=${2:-4}
THREADS=${3:-1}
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT

fruits=(apples bananas cherries dates figs grapes lemons mangoes)
for i in $(seq 0 7); do
  list=$(printf '%s, ' "${fruits[@]:$i}" "${fruits[@]:0:$i}")
  echo "Repeat this list exactly, three times: ${list%, }. ${list}${list}"
done > "$dir/copy.txt"
cat > "$dir/normal.txt" <<'PROMPTS'
Once upon a time, in a small village by the sea, there lived
The most important invention of the twentieth century was
Here is a short explanation of how photosynthesis works:
My favourite recipe for a rainy Sunday afternoon is
The history of the Roman Empire can be summarised as
To learn a new language quickly, you should
The best way to start a morning is
Scientists recently discovered that
PROMPTS

echo "| workload | concurrent | spec | tokens/s | generated | forward steps | verifications | drafts accepted / proposed | accepted per verification | same text |"
echo "|---|---:|---|---:|---:|---:|---:|---|---:|---|"
for workload in copy normal; do
  for parallel in 1 8; do
    for spec in none ngram ngram-adaptive; do
      out="$dir/$workload-$parallel-$spec"
      flags=(--spec "${spec%-adaptive}")
      [ "$spec" = ngram-adaptive ] && flags+=(--adaptive-k)
      "$BIN" run -m "$MODEL" -f "$dir/$workload.txt" --parallel "$parallel" "${flags[@]}" --draft-k "$K" \
        -n "$N" --temp 0 -t "$THREADS" --no-echo > "$out.txt" 2> "$out.err"
      line=$(grep 'prompts, parallel' "$out.err")
      tps=$(sed -E 's/.* s, ([0-9.]+) tokens\/s.*/\1/' <<< "$line")
      gen=$(sed -E 's/.*generation: ([0-9]+) tokens.*/\1/' <<< "$line")
      steps=$(sed -E 's/.*forward steps: ([0-9]+).*/\1/' <<< "$line")
      specline=$(grep '^speculative:' "$out.err" || true)
      rounds=$(sed -nE 's/.*verifications: ([0-9]+).*/\1/p' <<< "$specline")
      acc=$(sed -nE 's/.*drafts accepted: ([0-9]+ of [0-9]+ \([0-9.]+%\)).*/\1/p' <<< "$specline")
      per=$(sed -nE 's/.*accepted per verification: ([0-9.]+).*/\1/p' <<< "$specline")
      same=-
      if [ "$spec" != none ]; then cmp -s "$out.txt" "$dir/$workload-$parallel-none.txt" && same=yes || same=NO; fi
      echo "| $workload | $parallel | $spec | $tps | $gen | $steps | ${rounds:--} | ${acc:--} | ${per:--} | $same |"
    done
  done
done
