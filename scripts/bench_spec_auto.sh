#!/usr/bin/env bash
# `--spec auto` against no speculation and fixed modes inside the batching
# engine (docs/speculative.md, issue 19): greedy `kvserve run -f` over three
# workloads (copy: repeat a list from the prompt; story: free text; code) at
# 1, 4 and 16 concurrent requests. Every row runs in this one invocation, so
# rows share the host's load; "x none" is tokens/s over the same workload and
# concurrency without speculation, "same" compares the text with it.
#   scripts/bench_spec_auto.sh [N_TOKENS] [K] [THREADS]
# Environment: KVSERVE_MODEL (default SmolLM2), KVSERVE_DRAFT (a draft model:
# adds "draft" and "auto+draft" rows to the default modes), KVSERVE_DRAFT_ARGS
# (more draft flags, e.g. "--draft-vocab 16384"), KVSERVE_CHAT=1 (each prompt as a
# user turn through the model's chat template, as serve's chat endpoint sends it), KVSERVE_SPECS (default
# "none ngram auto"; given, it is the whole list, "draft" and "auto+draft" included),
# KVSERVE_PARALLEL (default "1 4 16"), KVSERVE_WORKLOADS (default "copy story code"),
# KVSERVE_PROMPTS (prompts per workload, default 16), KVSERVE_REPEATS (default 2:
# the modes of a row group run in turn that many times, so each round pairs every
# mode with a run of "none" minutes apart). A row shows its median tokens/s and,
# as "x none", the median over rounds of its ratio to that round's "none" run,
# then the lowest and highest of those ratios: on a shared host one run moves
# +-10%, and pairing within a round cancels the slower drifts.
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${KVSERVE_BIN:-./build/kvserve}
MODEL=${KVSERVE_MODEL:-models/smollm2-135m-instruct-q4_1.gguf}
DRAFT=${KVSERVE_DRAFT:-}
read -r -a DRAFT_ARGS <<< "${KVSERVE_DRAFT_ARGS:-}"
N=${1:-48}
K=${2:-6}
THREADS=${3:-2}
SPECS=${KVSERVE_SPECS:-none ngram auto}
if [ -n "$DRAFT" ] && [ -z "${KVSERVE_SPECS:-}" ]; then SPECS="$SPECS draft auto+draft"; fi
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
    draft) flags=(--spec draft --draft "$DRAFT" "${DRAFT_ARGS[@]}") ;;
    auto+draft) flags=(--spec auto --draft "$DRAFT" "${DRAFT_ARGS[@]}") ;;
  esac
  [ -z "${KVSERVE_CHAT:-}" ] || flags+=(--chat)
  "$BIN" run -m "$MODEL" -f "$dir/$workload.txt" --parallel "$parallel" "${flags[@]}" --draft-k "$K" \
    -n "$N" --temp 0 -t "$THREADS" --no-echo > "$out.txt" 2> "$out.err"
  local line specline
  line=$(grep 'prompts, parallel' "$out.err")
  specline=$(grep '^speculative:' "$out.err" || true)
  echo "$(sed -E 's/.* s, ([0-9.]+) tokens\/s.*/\1/' <<< "$line")|$(sed -nE 's/.*verifications: ([0-9]+).*/\1/p' <<< "$specline")|$(sed -nE 's/.*drafts accepted: ([0-9]+ of [0-9]+).*/\1/p' <<< "$specline")"
}

median() {  # the median of a space-separated list (the mean of the middle two for an even count)
  tr ' ' '\n' <<< "$1" | sed '/^$/d' | sort -g | awk '{ v[NR] = $1 } END { if (NR % 2) print v[(NR + 1) / 2]; else printf "%.4f\n", (v[NR / 2] + v[NR / 2 + 1]) / 2 }'
}

echo "model: $MODEL${DRAFT:+ | draft: $DRAFT ${KVSERVE_DRAFT_ARGS:-}}${KVSERVE_CHAT:+ | chat template} | $N greedy tokens per request | k up to $K | threads $THREADS | $(date -u +%F)"
echo
echo "| workload | concurrent | spec | tokens/s | x none | x none, rounds | verifications | drafts accepted | same text |"
echo "|---|---:|---|---:|---:|---|---:|---|---|"
for workload in ${KVSERVE_WORKLOADS:-copy story code}; do
  for parallel in ${KVSERVE_PARALLEL:-1 4 16}; do
    declare -A speeds=() ratios=() rounds=() acc=()
    for round in $(seq "${KVSERVE_REPEATS:-2}"); do
      declare -A this=()
      order=$SPECS  # every other round in reverse, so no mode always runs first
      [ $((round % 2)) -eq 1 ] || order=$(tr ' ' '\n' <<< "$SPECS" | tac | tr '\n' ' ')
      for spec in $order; do
        IFS='|' read -r t r a <<< "$(run_one "$workload" "$parallel" "$spec")"
        this[$spec]=$t
        speeds[$spec]="${speeds[$spec]:-} $t"
        rounds[$spec]=$r
        acc[$spec]=$a
      done
      for spec in $SPECS; do
        [ -n "${this[none]:-}" ] || continue
        ratios[$spec]="${ratios[$spec]:-} $(awk -v a="${this[$spec]}" -v b="${this[none]}" 'BEGIN { printf "%.4f", a / b }')"
      done
      unset this
    done
    for spec in $SPECS; do
      speed=$(median "${speeds[$spec]}")
      ratio=- spread=-
      if [ -n "${ratios[$spec]:-}" ]; then
        ratio=$(printf '%.2fx' "$(median "${ratios[$spec]}")")
        spread=$(tr ' ' '\n' <<< "${ratios[$spec]}" | sed '/^$/d' | sort -g | awk 'NR == 1 { lo = $1 } { hi = $1 } END { printf "%.2f-%.2f", lo, hi }')
      fi
      same=-
      if [ "$spec" != none ] && [ -f "$dir/$workload-$parallel-none.txt" ]; then
        cmp -s "$dir/$workload-$parallel-$spec.txt" "$dir/$workload-$parallel-none.txt" && same=yes || same=NO
      fi
      echo "| $workload | $parallel | $spec | $speed | $ratio | $spread | ${rounds[$spec]:--} | ${acc[$spec]:--} | $same |"
    done
    unset speeds ratios rounds acc
  done
done
