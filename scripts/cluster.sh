#!/usr/bin/env bash
# Data-parallel serving on one host: N `kvserve serve` replicas behind SGLang's
# router (PyPI `smg`, or its predecessor `sglang-router`), which routes requests
# that share a prefix to the replica holding it (--policy cache_aware) and
# balances the rest (docs/scaling.md). Prints the router's URL, then runs until
# Ctrl-C / SIGTERM and stops everything it started.
#
# Usage: scripts/cluster.sh [-n REPLICAS] [-m MODEL] [--host HOST] [--port PORT] [--policy POLICY]
#                           [-t THREADS_PER_REPLICA] [--request-timeout S] [--api-key-file FILE] [--kvserve BIN]
#                           [--router-flags "FLAGS"] [-- SERVE_FLAGS...]
#   -n REPLICAS     replicas to start (default 3)
#   -m MODEL        GGUF file every replica serves (default models/smollm2-135m-instruct-q4_1.gguf)
#   --host HOST     the one address everything listens on: replicas, router, router metrics (default 127.0.0.1)
#   --port PORT     the router's port (default 30000; 0: a free one); replicas take free ports
#   --policy P      cache_aware (default), round_robin, random, power_of_two (the router's policies)
#   -t THREADS      threads per replica (default: the cores split between the replicas, at least 1)
#   --request-timeout S  the router ends any request after S seconds, streams included (default 600; the
#                   router's own is 1800): how long a client can wait on a replica that hangs without dying
#   --api-key-file FILE  the cluster's API key (the file's first line that is not blank or a # comment):
#                   every replica requires it, the router sends it to them and requires it of clients.
#                   KVSERVE_API_KEY=KEY in the environment does the same. No key ever goes on a command
#                   line (replicas get it in their environment, curl on its standard input, the router
#                   through a Python wrapper); --api-key KEY still works but puts it on this script's own
#                   command line, where other users see it in ps
#   --kvserve BIN   the kvserve binary (default build/kvserve)
#   --router-flags  more flags for the router, one string (e.g. "--cache-threshold 0.5")
#   SERVE_FLAGS     go to every `kvserve serve` (e.g. --max-running 8 --kv-type q8_0)
# Environment: PYTHON (default python3) has the router package; KVSERVE_CLUSTER_LOGS keeps the
# logs in that folder (default: a temporary one, removed at exit); KVSERVE_API_KEY (above).
# Output lines: "replica I: URL pid PID", "router: URL pid PID (PACKAGE VERSION, policy P)", then "ready: URL".
# Exits 77 when no router package is installed (pip install smg), 1 when something fails to start.
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
replicas=3
model=$root/models/smollm2-135m-instruct-q4_1.gguf
host=127.0.0.1
port=30000
policy=cache_aware
threads=0
request_timeout=600
api_key=${KVSERVE_API_KEY:-}
api_key_file=""
bin=$root/build/kvserve
router_flags=""
py=${PYTHON:-python3}
while [ $# -gt 0 ]; do
  case $1 in
    -n) replicas=$2; shift 2 ;;
    -m) model=$2; shift 2 ;;
    --host) host=$2; shift 2 ;;
    --port) port=$2; shift 2 ;;
    --policy) policy=$2; shift 2 ;;
    -t) threads=$2; shift 2 ;;
    --request-timeout) request_timeout=$2; shift 2 ;;
    --api-key) api_key=$2; shift 2 ;;
    --api-key-file) api_key_file=$2; shift 2 ;;
    --kvserve) bin=$2; shift 2 ;;
    --router-flags) router_flags=$2; shift 2 ;;
    --) shift; break ;;
    -h|--help) sed -n '2,/^set /p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) echo "cluster.sh: unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
done
serve_flags=("$@")
if [ -n "$api_key_file" ]; then
  [ -r "$api_key_file" ] || { echo "cluster.sh: cannot read --api-key-file $api_key_file" >&2; exit 2; }
  api_key=$(grep -v '^[[:space:]]*\(#\|$\)' "$api_key_file" | head -1 | tr -d '[:space:]')
  [ -n "$api_key" ] || { echo "cluster.sh: --api-key-file $api_key_file holds no key" >&2; exit 2; }
fi
api_key=${api_key%%,*}  # KVSERVE_API_KEY may list several: the router sends and requires one
api_key=${api_key//[[:space:]]/}
# Replicas read KVSERVE_API_KEY (kvserve serve), the router KVSERVE_ROUTER_API_KEY (router_main below).
if [ -n "$api_key" ]; then export KVSERVE_API_KEY=$api_key KVSERVE_ROUTER_API_KEY=$api_key
else unset KVSERVE_API_KEY KVSERVE_ROUTER_API_KEY; fi
# curl to the router, with the key as a header read from standard input (printf is a shell builtin).
router_curl() {
  if [ -n "$api_key" ]; then printf 'Authorization: Bearer %s\n' "$api_key" | curl -H @- "$@"; else curl "$@"; fi
}
# The router's launcher, given the key from the environment: smg takes --api-key only on its command
# line, so this appends it to sys.argv inside the process, where ps does not see it.
router_main='import os, runpy, sys
key = os.environ.pop("KVSERVE_ROUTER_API_KEY", "")
sys.argv = sys.argv[1:] + (["--api-key", key] if key else [])
runpy.run_module(sys.argv[0], run_name="__main__", alter_sys=True)'
[[ $replicas =~ ^[1-9][0-9]*$ ]] || { echo "cluster.sh: -n must be a positive number, got $replicas" >&2; exit 2; }
[ -x "$bin" ] || { echo "cluster.sh: $bin not found (build kvserve first)" >&2; exit 1; }
[ -f "$model" ] || { echo "cluster.sh: $model not found (scripts/fetch_models.sh)" >&2; exit 1; }

# The router: smg (the current name) or sglang-router; both take the same launch flags.
if "$py" -c "import smg" 2>/dev/null; then router_pkg=smg; router_mod=smg.launch_router
elif "$py" -c "import sglang_router" 2>/dev/null; then router_pkg=sglang-router; router_mod=sglang_router.launch_router
else
  echo "cluster.sh: no router: install SGLang's router with '$py -m pip install smg' (or sglang-router)" >&2
  exit 77
fi
router_version=$("$py" -c "import importlib.metadata as m; print(m.version('$router_pkg'))" 2>/dev/null || echo "?")

if [ "$threads" -le 0 ] 2>/dev/null; then threads=$(( $(nproc) / replicas )); [ "$threads" -ge 1 ] || threads=1; fi

logs=${KVSERVE_CLUSTER_LOGS:-}
keep_logs=1
[ -n "$logs" ] || { logs=$(mktemp -d); keep_logs=0; }
mkdir -p "$logs"

pids=()
router_pid=""
cleanup() {
  trap - EXIT INT TERM
  # The router first (no new requests), then the replicas: each finishes what it runs (kvserve's grace).
  if [ -n "$router_pid" ]; then
    kill -TERM "$router_pid" 2>/dev/null
    for _ in $(seq 10); do kill -0 "$router_pid" 2>/dev/null || break; sleep 0.1; done
    kill -KILL "$router_pid" 2>/dev/null  # smg keeps its listener open 5 s for load balancers; nothing to drain here
    wait "$router_pid" 2>/dev/null
  fi
  for pid in "${pids[@]}"; do kill -TERM "$pid" 2>/dev/null; done
  for pid in "${pids[@]}"; do
    for _ in $(seq 150); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    kill -KILL "$pid" 2>/dev/null
    wait "$pid" 2>/dev/null
  done
  [ "$keep_logs" = 1 ] || rm -rf "$logs"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

free_port() {
  "$py" -c "import socket,sys; s=socket.socket(socket.AF_INET6 if ':' in sys.argv[1] else socket.AF_INET); s.bind((sys.argv[1], 0)); print(s.getsockname()[1])" "$host"
}
url_host=$host
[[ $host == *:* ]] && url_host="[$host]"

# Replicas on free ports of the one address; each prints its URL once it listens.
urls=()
for i in $(seq "$replicas"); do
  "$bin" serve -m "$model" --host "$host" --port 0 -t "$threads" "${serve_flags[@]}" \
    >"$logs/replica-$i.log" 2>&1 &
  pids+=($!)
done
for i in $(seq "$replicas"); do
  pid=${pids[$((i - 1))]}
  url=""
  for _ in $(seq 600); do
    url=$(grep -o 'on http://[^ ]*' "$logs/replica-$i.log" | head -1 | sed 's/^on //')
    [ -n "$url" ] && break
    kill -0 "$pid" 2>/dev/null || break
    sleep 0.1
  done
  if [ -z "$url" ]; then
    echo "cluster.sh: replica $i did not start:" >&2; cat "$logs/replica-$i.log" >&2; exit 1
  fi
  urls+=("$url")
  echo "replica $i: $url pid $pid"
done

[ "$port" != 0 ] || port=$(free_port)
metrics_port=$(free_port)
# Health checked every 2 s (2 s to answer), out after 2 misses: a dead or hung replica leaves the pool
# within ~4-8 s; until then the router retries a refused request on another replica, and a request
# already sent to a hung one ends after --request-timeout.
# shellcheck disable=SC2086  # router_flags is split on purpose
"$py" -c "$router_main" "$router_mod" --host "$host" --port "$port" --worker-urls "${urls[@]}" --policy "$policy" \
  --prometheus-host "$host" --prometheus-port "$metrics_port" \
  --health-check-interval-secs 2 --health-check-timeout-secs 2 --health-failure-threshold 2 \
  --request-timeout-secs "$request_timeout" --worker-startup-timeout-secs 120 \
  --log-level warn $router_flags >"$logs/router.log" 2>&1 &
router_pid=$!
router_url="http://$url_host:$port"
echo "router: $router_url pid $router_pid ($router_pkg $router_version, policy $policy, metrics on $url_host:$metrics_port)"

# Ready once the router lists every replica as healthy.
healthy=0
for _ in $(seq 600); do
  kill -0 "$router_pid" 2>/dev/null || { echo "cluster.sh: the router exited:" >&2; cat "$logs/router.log" >&2; exit 1; }
  healthy=$(router_curl -s -m 2 "$router_url/workers" 2>/dev/null | grep -o '"is_healthy":true' | wc -l)
  [ "$healthy" -ge "$replicas" ] && break
  sleep 0.1
done
if [ "$healthy" -lt "$replicas" ]; then
  echo "cluster.sh: the router registered $healthy of $replicas replicas within 60 s:" >&2
  cat "$logs/router.log" >&2
  exit 1
fi
echo "ready: $router_url (logs in $logs; Ctrl-C stops everything)"

# Until the router exits or a signal arrives (the traps then stop the rest).
wait "$router_pid"
status=$?
router_pid=""
echo "cluster.sh: the router exited ($status):" >&2
tail -20 "$logs/router.log" >&2
exit 1
