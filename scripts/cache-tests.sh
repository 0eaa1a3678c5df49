#!/usr/bin/env bash
# Runs http-cache-tests (the suite behind cache-tests.fyi) against qweb's cache and prints the
# counts by kind, each failing required/optimal test, and any test of the ratchet
# (tests/cache-tests/passing.txt) that no longer passes (exit 1 then).
#
#   scripts/cache-tests.sh [QWEB_BINARY]       # default: target/debug/qweb (built if missing)
#   WRITE_RATCHET=1 scripts/cache-tests.sh     # rewrite the ratchet from this run
#
# The suite is installed with npm into $CACHE_TESTS_DIR (default /tmp/qweb-cache-tests), not
# into the repository. Needs Node.js (v18 or later) and npm.
set -euo pipefail
cd "$(dirname "$0")/.."
repo=$PWD
version=0.4.5
dir=${CACHE_TESTS_DIR:-/tmp/qweb-cache-tests}
qweb=${1:-${CARGO_TARGET_DIR:-target}/debug/qweb}
ratchet=$repo/tests/cache-tests/passing.txt
# the route's cache setting (CACHE_LINE="" measures the proxy without a cache)
cache_line=${CACHE_LINE-"cache = {}"}

if [ ! -x "$qweb" ]; then
    cargo build --bin qweb
fi
suite=$dir/node_modules/http-cache-tests
if [ ! -f "$suite/package.json" ] || ! grep -q "\"version\": \"$version\"" "$suite/package.json"; then
    mkdir -p "$dir"
    (cd "$dir" && npm install --no-audit --no-fund "http-cache-tests@$version" >/dev/null)
fi

# Two free ports below the kernel's range for client sockets.
free_port() {
    python3 - <<'PY'
import random, socket
while True:
    p = random.randint(20000, 32000)
    try:
        s = socket.socket(); s.bind(("127.0.0.1", p)); s.close(); print(p); break
    except OSError:
        pass
PY
}
origin_port=$(free_port)
qweb_port=$(free_port)
while [ "$qweb_port" = "$origin_port" ]; do qweb_port=$(free_port); done

work=$(mktemp -d)
pids=()
cleanup() {
    for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
    wait 2>/dev/null || true
    rm -rf "$work"
}
trap cleanup EXIT

cat >"$work/qweb.toml" <<TOML
state_dir = "$work/state"
workers = 2

[log]
access = false

[[listener]]
address = "127.0.0.1:$qweb_port"

[[route]]
prefix = "/"
upstreams = ["127.0.0.1:$origin_port"]
$cache_line
TOML

(cd "$suite" && npm_config_protocol=http npm_config_pidfile="$work/origin.pid" npm_config_port=$origin_port exec node server/server.mjs >"$work/origin.log" 2>&1) &
pids+=($!)
wait_for() {
    for _ in $(seq 1 100); do
        curl -s -o /dev/null "http://127.0.0.1:$1/" 2>/dev/null && return 0
        sleep 0.1
    done
    echo "nothing answers on port $1" >&2
    return 1
}
wait_for "$origin_port"
"$qweb" serve --config "$work/qweb.toml" >"$work/qweb.log" 2>&1 &
pids+=($!)
wait_for "$qweb_port"

run_suite() {
    node scripts/cache-tests-run.mjs "$suite" "http://127.0.0.1:$qweb_port" \
        >"$work/results.json" 2>"$work/client.log" || true
    if ! node -e 'JSON.parse(require("fs").readFileSync(process.argv[1], "utf8"))' "$work/results.json" 2>/dev/null; then
        echo "the suite's client printed no results:" >&2
        for f in "$work"/client.log "$work"/results.json "$work"/qweb.log; do tail -n 20 "$f" >&2; done
        exit 2
    fi
    cp "$work/results.json" "${CACHE_TESTS_RESULTS:-$dir/results.json}"
}
run_suite
if [ -n "${WRITE_RATCHET:-}" ]; then
    node scripts/cache-tests-count.mjs "$suite" "$work/results.json" "$ratchet" --write-ratchet
    exit
fi
rc=0
node scripts/cache-tests-count.mjs "$suite" "$work/results.json" "$ratchet" || rc=$?
if [ "$rc" = 3 ]; then
    echo "tests lost only to a failed setup request: running the suite once more" >&2
    tail -n 20 "$work/qweb.log" >&2
    run_suite
    rc=0
    node scripts/cache-tests-count.mjs "$suite" "$work/results.json" "$ratchet" || rc=$?
    [ "$rc" = 3 ] && rc=1
fi
exit "$rc"
