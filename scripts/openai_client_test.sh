#!/usr/bin/env bash
# Starts `kvserve serve` on a free loopback port with the real default model,
# runs tests/openai_client_test.py (the PyPI `openai` client) against it, then
# stops the server with SIGTERM and checks that it exits 0.
# Usage: scripts/openai_client_test.sh [KVSERVE_BINARY] [MODEL] [TEST_SCRIPT] [SERVE_FLAGS...]
# (TEST_SCRIPT defaults to tests/openai_client_test.py; SERVE_FLAGS go to `kvserve serve`).
# Exits 77 (ctest's "skipped") when python3, the client's packages or the model is missing
# (KVSERVE_TEST_PACKAGES names them: "openai jsonschema" unless set, "anthropic" or "ollama jsonschema" for theirs).
# KVSERVE_TEST_MODELS: more model files (space-separated) served besides MODEL (`-m` each), skipped when missing.
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
bin=${1:-$root/build/kvserve}
model=${2:-$root/models/smollm2-135m-instruct-q4_1.gguf}
script=${3:-$root/tests/openai_client_test.py}
shift $(($# < 3 ? $# : 3))

packages=${KVSERVE_TEST_PACKAGES:-openai jsonschema}
python3 -c "import ${packages// /, }" 2>/dev/null ||
  { echo "skipped: needs python3 with the packages $packages (pip install $packages)"; exit 77; }
more_models=()
for m in "$model" ${KVSERVE_TEST_MODELS:-}; do
  [ -f "$m" ] || { echo "skipped: $m not found (run scripts/fetch_models.sh)"; exit 77; }
  [ "$m" = "$model" ] || more_models+=(-m "$m")
done

log=$(mktemp)
"$bin" serve -m "$model" ${more_models[@]+"${more_models[@]}"} --port 0 --api-key test-key -t 2 "$@" >"$log" 2>&1 &
server=$!
cleanup() { kill -TERM "$server" 2>/dev/null; wait "$server" 2>/dev/null; rm -f "$log"; }
trap cleanup EXIT

# --port 0 picks a free port; the server prints it once it listens.
url=""
for _ in $(seq 300); do
  url=$(grep -o 'http://127.0.0.1:[0-9]*' "$log" | head -1)
  [ -n "$url" ] && break
  kill -0 "$server" 2>/dev/null || { cat "$log"; echo "the server exited early"; exit 1; }
  sleep 0.1
done
[ -n "$url" ] || { cat "$log"; echo "the server did not start"; exit 1; }

KVSERVE_URL="$url/v1" KVSERVE_API_KEY=test-key python3 "$script"
status=$?

kill -TERM "$server"
wait "$server"
server_status=$?
trap - EXIT
cat "$log"
rm -f "$log"
[ "$server_status" -eq 0 ] || { echo "kvserve serve exited $server_status after SIGTERM"; exit 1; }
exit "$status"
