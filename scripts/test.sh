#!/usr/bin/env bash
# Runs every test: the full suite on the Release build (real models included),
# then the fast suite again under AddressSanitizer + UndefinedBehaviorSanitizer.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/setup.sh
# The real OpenAI client for the server's compatibility test (tests/openai_client_test.py).
python3 -c "import openai" 2>/dev/null || python3 -m pip install --quiet --disable-pip-version-check openai || \
  echo "warning: could not install the openai package; its test will be skipped" >&2

echo "== tests (Release) ==" >&2
ctest --test-dir build --output-on-failure -j2

echo "== fast tests under ASan + UBSan ==" >&2
cmake -S . -B build-asan -G Ninja -DCMAKE_BUILD_TYPE=Debug -DKVSERVE_SANITIZE=ON >/dev/null
cmake --build build-asan -j"$(nproc)" --target kvserve_tests kvserve
# The real-model tests are slow without optimization; they ran above.
KVSERVE_SKIP_SLOW=1 ctest --test-dir build-asan --output-on-failure -j2 -E 'RealModel|openai_client'
