#!/usr/bin/env bash
# Side by side: llama.cpp's llama-bench and `kvserve bench` on the same GGUF files, same tests and threads,
# back to back per model (the host may be shared: compare rows of one run only). A benchmark, not a test:
# CI never calls it. Build llama.cpp first with ../shared/peers/llama-cpp.sh (it prints BIN_DIR).
#   scripts/compare_llama_cpp.sh BIN_DIR [model.gguf ...]
# Models: by default whichever of models/smollm2-135m-instruct-q4_1.gguf, qwen2.5-coder-{0.5b,1.5b}-instruct.gguf
# exist. Environment: KVSERVE_EXTRA_ARGS: a second kvserve run per model with these arguments ("" for none;
# default --activations q8, or --activations f32 where q8 is kvserve's default); THREADS (2), REPS (3),
# PP (512), TG (128), KVSERVE (./build/kvserve); RAW_DIR keeps each run's JSON, logs and /usr/bin/time output.
# Prints one markdown table (ratio = kvserve / llama.cpp; t/s as mean ± stddev) and the commands it ran.
# Peak RSS: llama-bench under /usr/bin/time -v (without it: VmHWM polled from /proc); kvserve reports its own
# getrusage peak, taken before its 1 GiB bandwidth probe (which /usr/bin/time would count).
set -euo pipefail
cd "$(dirname "$0")/.."
if [ $# -lt 1 ] || [ ! -x "$1/llama-bench" ]; then sed -n '2,12p' "$0" >&2; exit 2; fi
BIN=$1; shift
KVSERVE=${KVSERVE:-./build/kvserve} THREADS=${THREADS:-2} REPS=${REPS:-3} PP=${PP:-512} TG=${TG:-128}
# kvserve's default activations (its --help says which is "the default"); the second run takes the other one
DEFAULT_ACT=$("$KVSERVE" bench --help | grep -oE '(f32|q8) \((exact; )?the default' | cut -d' ' -f1 | head -1 || true)
EXTRA=${KVSERVE_EXTRA_ARGS-"--activations $([ "$DEFAULT_ACT" = q8 ] && echo f32 || echo q8)"}
MODELS=("$@")
if [ ${#MODELS[@]} -eq 0 ]; then
  for m in models/smollm2-135m-instruct-q4_1.gguf models/qwen2.5-coder-{0.5b,1.5b}-instruct.gguf; do
    [ -f "$m" ] && MODELS+=("$m")
  done
fi
if [ -n "${RAW_DIR:-}" ]; then out=$RAW_DIR; mkdir -p "$out"; rm -rf "$out"/[0-9]* "$out/commands"; else
  out=$(mktemp -d); trap 'rm -rf "$out"' EXIT; fi

# bench NAME CMD...: runs CMD with stdout to $d/NAME.json, stderr to $d/NAME.log, its peak RSS (KiB) to $d/NAME.rss
bench() {
  local name=$1; shift
  echo "$*" | tee -a "$out/commands" >&2
  if [ -x "${TIME_BIN:-/usr/bin/time}" ]; then
    "${TIME_BIN:-/usr/bin/time}" -v -o "$d/$name.time" "$@" > "$d/$name.json" 2> "$d/$name.log" ||
      { cat "$d/$name.log" >&2; exit 1; }
    sed -n 's/.*Maximum resident set size (kbytes): //p' "$d/$name.time" > "$d/$name.rss"
  else
    "$@" > "$d/$name.json" 2> "$d/$name.log" & local pid=$! hwm=0 v
    while kill -0 "$pid" 2>/dev/null; do
      v=$(awk '/^VmHWM/ {print $2}' "/proc/$pid/status" 2>/dev/null) && [ -n "$v" ] && hwm=$v
      sleep 0.1
    done
    wait "$pid" || { cat "$d/$name.log" >&2; exit 1; }
    echo "$hwm" > "$d/$name.rss"
  fi
}

i=0
for m in "${MODELS[@]}"; do
  d=$out/$i; mkdir -p "$d"; echo "$m" > "$d/model"; i=$((i + 1)); cut -d' ' -f1 /proc/loadavg > "$d/load"
  # -v: the log says where the weights went (CPU_REPACK buffers: repacked for this CPU's kernels) and whether
  # the graph has FLASH_ATTN_EXT nodes (fa_used; flash_attn -1 is "auto")
  bench llama "$BIN/llama-bench" -m "$m" -p "$PP" -n "$TG" -r "$REPS" -t "$THREADS" -o json -v
  bench kv0 "$KVSERVE" bench -m "$m" -p "$PP" -n "$TG" -r "$REPS" -t "$THREADS" -o json
  # shellcheck disable=SC2086 # KVSERVE_EXTRA_ARGS is a list of words
  [ -z "$EXTRA" ] || bench kv1 "$KVSERVE" bench -m "$m" -p "$PP" -n "$TG" -r "$REPS" -t "$THREADS" -o json $EXTRA
done

echo "- CPU: $(lscpu | sed -n 's/^Model name: *//p'), $(nproc) CPUs; load average now $(cut -d' ' -f1-3 /proc/loadavg)"
flags=" $(grep -m1 '^flags' /proc/cpuinfo) "
has() { for f in "$@"; do [[ $flags == *" $f "* ]] || return 1; done; }
if has avx512f avx512bw avx512vl avx512dq avx512_vnni; then isa=avx512; elif has avx2 fma f16c; then isa=avx2; else isa=scalar; fi
dirty=$(git status --porcelain --untracked-files=no | wc -l)
echo "- kvserve: $KVSERVE at commit $(git rev-parse --short HEAD)$([ "$dirty" = 0 ] || echo " + $dirty uncommitted tracked files"),"\
  "kernel ISA ${KVSERVE_ISA:-$isa} (${KVSERVE_ISA:+set by KVSERVE_ISA}${KVSERVE_ISA:-the best this CPU has, as src/kernels/dispatch.cpp picks})"
echo "- date: $(date -u '+%Y-%m-%d %H:%M UTC'); threads $THREADS, $REPS repetitions"
python3 - "$out" "$PP" "$TG" "$EXTRA" "${KVSERVE_ACTIVATIONS:-$DEFAULT_ACT}" <<'PY'
import glob, json, os, re, sys
out, pp, tg, extra, act = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4], sys.argv[5]
ts = lambda mean, sd: f"{mean:.1f} ± {sd:.1f}"
ratio = lambda a, b: f"{a / b:.2f}x" if b else "-"
rows, info = [], None
for d in sorted(glob.glob(f"{out}/[0-9]*"), key=lambda p: int(os.path.basename(p))):
    model = os.path.basename(open(f"{d}/model").read().strip())
    llama = json.load(open(f"{d}/llama.json"))
    lp = next(r for r in llama if r["n_prompt"] == pp and r["n_gen"] == 0)
    lt = next(r for r in llama if r["n_prompt"] == 0 and r["n_gen"] == tg)
    log = open(f"{d}/llama.log", errors="replace").read()
    repack = re.findall(r"CPU_REPACK model buffer size =\s*([\d.]+) MiB", log)
    info = info or dict(lp, fa_used="yes" if "(FLASH_ATTN_EXT)" in log else "no")
    load = open(f"{d}/load").read().strip()
    lrss = int(open(f"{d}/llama.rss").read().strip() or 0) / 1024
    for k, args in ((0, f"(default: {act or '?'} activations)"), (1, extra)):
        if not os.path.exists(f"{d}/kv{k}.json"):
            continue
        kv = {r["test"]: r for r in json.load(open(f"{d}/kv{k}.json"))}
        kp, kt = kv[f"pp{pp}"], kv[f"tg{tg}"]
        rows.append(f"| {model} | {lp['model_type']} | {args} | {ts(lp['avg_ts'], lp['stddev_ts'])} | "
                    f"{ts(kp['tokens_per_s'], kp['stddev'])} | {ratio(kp['tokens_per_s'], lp['avg_ts'])} | "
                    f"{ts(lt['avg_ts'], lt['stddev_ts'])} | {ts(kt['tokens_per_s'], kt['stddev'])} | "
                    f"{ratio(kt['tokens_per_s'], lt['avg_ts'])} | {lrss:.0f} / {kp['peak_rss_mib']:.0f} MiB | "
                    f"{'yes, ' + str(round(sum(map(float, repack)))) + ' MiB' if repack else 'no'} | {load} |")
print(f"- llama.cpp: build {info['build_commit']} ({info['build_number']}), backends {info['backends']}, "
      f"cpu_info \"{info['cpu_info']}\", " + ", ".join(f"{k} {info[k]}" for k in
      ("flash_attn", "fa_used", "n_batch", "n_ubatch", "type_k", "poll", "repack", "use_mmap", "load_mode") if k in info) + "\n")
print(f"| model | llama.cpp type | kvserve args | pp{pp} llama.cpp | pp{pp} kvserve | ratio | tg{tg} llama.cpp | "
      f"tg{tg} kvserve | ratio | peak RSS llama.cpp / kvserve | llama.cpp repacked weights | load avg at start |")
print("|---|---|---|---:|---:|---:|---:|---:|---:|---:|---|---:|")
print("\n".join(rows))
print("\ncommands, in order:\n```sh\n" + open(f"{out}/commands").read() + "```")
PY
