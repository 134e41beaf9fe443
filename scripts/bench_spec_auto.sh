#!/usr/bin/env bash
# `--spec auto` against no speculation and fixed modes inside the batching
# engine (docs/speculative.md, issue 19): greedy `kvserve run -f` over three
# workloads (copy: repeat a list from the prompt; story: free text; code) at
# 1, 4 and 16 concurrent requests. Every row runs in this one invocation, so
# rows share the host's load; "x none" is tokens/s over the same workload and
# concurrency without speculation, "same" compares the text with it.
#   scripts/bench_spec_auto.sh [N_TOKENS] [K] [THREADS]
# Environment: KVSERVE_MODEL (default SmolLM2), KVSERVE_DRAFT (a draft model:
# adds "draft" and "auto+draft" rows), KVSERVE_SPECS (default "none ngram auto"),
# KVSERVE_PARALLEL (default "1 4 16"), KVSERVE_WORKLOADS (default "copy story code"),
# KVSERVE_PROMPTS (prompts per workload, default 16), KVSERVE_REPEATS (default 2:
# the modes of a row group run in turn that many times; each row keeps its best).
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${KVSERVE_BIN:-./build/kvserve}
MODEL=${KVSERVE_MODEL:-models/smollm2-135m-instruct-q4_1.gguf}
DRAFT=${KVSERVE_DRAFT:-}
N=${1:-48}
K=${2:-6}
THREADS=${3:-2}
SPECS=${KVSERVE_SPECS:-none ngram auto}
if [ -n "$DRAFT" ]; then SPECS="$SPECS draft auto+draft"; fi
PROMPTS=${KVSERVE_PROMPTS:-16}
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT

fruits=(apples bananas cherries dates figs grapes lemons mangoes)
for i in $(seq 0 15); do
  list=$(printf '%s, ' "${fruits[@]:$((i % 8))}" "${fruits[@]:0:$((i % 8))}")
  echo "Repeat this list exactly, three times: ${list%, }. ${list}${list}"
done | sed -n "1,${PROMPTS}p" > "$dir/copy.txt"
cat <<'PROMPTS' | sed -n "1,${PROMPTS}p" > "$dir/story.txt"
Once upon a time, in a small village by the sea, there lived
The most important invention of the twentieth century was
Here is a short explanation of how photosynthesis works:
My favourite recipe for a rainy Sunday afternoon is
The history of the Roman Empire can be summarised as
To learn a new language quickly, you should
The best way to start a morning is
Scientists recently discovered that
The old lighthouse keeper looked at the storm and
A good friend is someone who
In the year 2150, cities will
The secret to a happy garden is
When the train finally stopped, she
The first rule of good writing is
Deep in the forest, the children found
If I could travel anywhere, I would go to
PROMPTS
cat <<'PROMPTS' | sed -n "1,${PROMPTS}p" > "$dir/code.txt"
def fibonacci(n):
class Stack:
def quicksort(items):
def is_prime(n):
class LinkedList:
def binary_search(items, target):
def read_csv(path):
class Matrix:
def merge_sort(items):
def flatten(nested):
class Queue:
def word_count(text):
def gcd(a, b):
class BinaryTree:
def transpose(matrix):
def parse_date(text):
PROMPTS

run_one() {  # workload parallel spec -> "tokens/s|verifications|accepted of proposed"
  local workload=$1 parallel=$2 spec=$3 out="$dir/$1-$2-$3" flags=()
  case "$spec" in
    none|ngram|auto) flags=(--spec "$spec") ;;
    draft) flags=(--spec draft --draft "$DRAFT") ;;
    auto+draft) flags=(--spec auto --draft "$DRAFT") ;;
  esac
  "$BIN" run -m "$MODEL" -f "$dir/$workload.txt" --parallel "$parallel" "${flags[@]}" --draft-k "$K" \
    -n "$N" --temp 0 -t "$THREADS" --no-echo > "$out.txt" 2> "$out.err"
  local line specline
  line=$(grep 'prompts, parallel' "$out.err")
  specline=$(grep '^speculative:' "$out.err" || true)
  echo "$(sed -E 's/.* s, ([0-9.]+) tokens\/s.*/\1/' <<< "$line")|$(sed -nE 's/.*verifications: ([0-9]+).*/\1/p' <<< "$specline")|$(sed -nE 's/.*drafts accepted: ([0-9]+ of [0-9]+).*/\1/p' <<< "$specline")"
}

echo "model: $MODEL${DRAFT:+ | draft: $DRAFT} | $N greedy tokens per request | k up to $K | threads $THREADS | $(date -u +%F)"
echo
echo "| workload | concurrent | spec | tokens/s | x none | verifications | drafts accepted | same text |"
echo "|---|---:|---|---:|---:|---:|---|---|"
for workload in ${KVSERVE_WORKLOADS:-copy story code}; do
  for parallel in ${KVSERVE_PARALLEL:-1 4 16}; do
    declare -A best=() rounds=() acc=()
    for _ in $(seq "${KVSERVE_REPEATS:-2}"); do
      for spec in $SPECS; do
        IFS='|' read -r t r a <<< "$(run_one "$workload" "$parallel" "$spec")"
        if awk -v a="$t" -v b="${best[$spec]:-0}" 'BEGIN { exit !(a > b) }'; then best[$spec]=$t; fi
        rounds[$spec]=$r
        acc[$spec]=$a
      done
    done
    for spec in $SPECS; do
      ratio=$(awk -v a="${best[$spec]}" -v b="${best[none]:-0}" 'BEGIN { if (b > 0) printf "%.2fx", a / b; else print "-" }')
      same=-
      if [ "$spec" != none ] && [ -f "$dir/$workload-$parallel-none.txt" ]; then
        cmp -s "$dir/$workload-$parallel-$spec.txt" "$dir/$workload-$parallel-none.txt" && same=yes || same=NO
      fi
      echo "| $workload | $parallel | $spec | ${best[$spec]} | $ratio | ${rounds[$spec]:--} | ${acc[$spec]:--} | $same |"
    done
    unset best rounds acc
  done
done
