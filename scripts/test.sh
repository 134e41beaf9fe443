#!/usr/bin/env bash
# Runs every test: the full suite on the Release build (real models included),
# then the fast suite again under AddressSanitizer + UndefinedBehaviorSanitizer,
# then every fuzz target for a bounded time (docs/reliability.md).
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/setup.sh
# The real OpenAI, Anthropic and Ollama clients for the server's compatibility tests (tests/*_client_test.py).
python3 -c "import openai, jsonschema, anthropic, ollama" 2>/dev/null ||
  python3 -m pip install --quiet --disable-pip-version-check openai jsonschema anthropic ollama || \
  echo "warning: could not install the openai, jsonschema, anthropic and ollama packages; their tests will be skipped" >&2
# The chat page in a real browser (tests/webui_browser_test.py): headless Chromium and its driver from Debian,
# Selenium from PyPI; the test is skipped, with a message, without them.
if ! command -v chromium >/dev/null || ! command -v chromedriver >/dev/null; then
  SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO="sudo -n"  # optional: never stop to ask for a password
  { $SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq chromium chromium-driver >/dev/null; } ||
    echo "warning: could not install chromium and chromium-driver; the chat page's browser test will be skipped" >&2
fi
python3 -c "import selenium" 2>/dev/null || python3 -m pip install --quiet --disable-pip-version-check selenium ||
  echo "warning: could not install the selenium package; the chat page's browser test will be skipped" >&2
# The agent loop of tests/responses_client_test.py (skipped, with a message, without it).
python3 -c "import agents" 2>/dev/null || python3 -m pip install --quiet --disable-pip-version-check openai-agents || \
  echo "warning: could not install the openai-agents package; the agent loop test will be skipped" >&2
# SGLang's router (PyPI `smg`, a prebuilt Rust binary) for the replicas test (tests/cluster_test.py, docs/scaling.md).
python3 -c "import smg" 2>/dev/null || python3 -m pip install --quiet --disable-pip-version-check smg || \
  echo "warning: could not install the smg package (SGLang's router); the cluster test will be skipped" >&2

# ctest -j2 runs two test processes on the two cores: OpenMP threads that spin
# while they wait would take the core the other process needs (a test's 7.6 s
# -> 0.69 s with passive waits, docs/reliability.md "CI time").
export OMP_WAIT_POLICY=passive

# One clang build serves both sanitizer stages: the tests and the fuzz targets
# (libFuzzer is clang's), so CI compiles the project twice, not three times.
# It compiles beside the Release tests at the lowest priority: those tests spend
# part of their time waiting on sockets, child processes and sleeps, and the
# build takes that time instead of running after them (docs/reliability.md, "CI time").
echo "== the sanitizer build (clang, in the background) and the tests (Release), ${SECONDS} s after the start ==" >&2
sanitizer_log=$(mktemp)
# (setsid: the build is a process group of its own, stopped whole if the Release tests fail.)
setsid nice -n 19 bash -c 'CC=clang CXX=clang++ cmake -S . -B build-sanitize -G Ninja -DCMAKE_BUILD_TYPE=Debug \
    -DKVSERVE_SANITIZE=ON -DKVSERVE_FUZZ=ON >/dev/null &&
  cmake --build build-sanitize -j"$(nproc)" --target kvserve_tests kvserve fuzz_targets' >"$sanitizer_log" 2>&1 &
sanitizer_build=$!
if ! ctest --test-dir build --output-on-failure -j2; then
  kill -- -"$sanitizer_build" 2>/dev/null || true
  exit 1
fi
echo "== Release tests passed, ${SECONDS} s after the start; waiting for the sanitizer build ==" >&2
if ! wait "$sanitizer_build"; then
  cat "$sanitizer_log" >&2
  echo "the sanitizer build failed" >&2
  exit 1
fi
cat "$sanitizer_log"
rm -f "$sanitizer_log"

# The real-model tests are slow without optimization, and the client, browser and cluster tests drive the same
# server code through processes; they ran above. This build has no MPI (KVSERVE_MPI is off): the mpirun
# tests (pipeline_mpi, pipeline_failure) ran above, the in-process pipeline tests run here.
# Three at a time on two cores: these tests wait on sockets, threads and child
# processes for a quarter of their time (603 -> 551 s, docs/reliability.md).
echo "== fast tests under ASan + UBSan (clang), ${SECONDS} s after the start ==" >&2
KVSERVE_SKIP_SLOW=1 ctest --test-dir build-sanitize --output-on-failure -j3 \
  -E 'RealModel|_client$|tool_calls_qwen|^cluster$|^webui_browser$'

echo "== fuzzing under ASan + UBSan, ${KVSERVE_FUZZ_SECONDS:-12} s per target, ${SECONDS} s after the start ==" >&2
./scripts/fuzz.sh build-sanitize "${KVSERVE_FUZZ_SECONDS:-12}"
echo "== done in ${SECONDS} s ==" >&2
