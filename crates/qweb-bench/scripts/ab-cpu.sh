#!/bin/bash
# CPU time per request of two qweb binaries, interleaved (docs/BENCHMARKS.md "Method"): each
# round starts A, then B, on the same configuration; each serves 2 s of warm-up and then
# `wrk -t1 -c32 -d5s` of keep-alive requests for URL, and its user and system CPU time
# (from /proc/PID/stat) is divided by the requests wrk completed; so is the client's own CPU
# time (`/usr/bin/time`, Debian's package `time`): client and server share the machine.
#
#   ab-cpu.sh A B [ROUNDS] [URL]    (defaults: 3 rounds, https://127.0.0.1:18445/1k.bin)
#
# LOAD=h2 measures HTTP/2 instead: `h2load -c8 -m10 -n ${H2_REQUESTS:-20000}` (bench G's
# 100 KiB row: URL https://127.0.0.1:18445/100k.bin); every request must succeed.
#
# The configuration (written to a temporary folder): 2 workers, access log off, a TLS
# listener on 18445 (self-signed) and a plain one on 18446, serving a folder with 1k.bin,
# 100k.bin and 1m.bin.
set -euo pipefail
A=$1; B=$2; ROUNDS=${3:-3}; URL=${4:-https://127.0.0.1:18445/1k.bin}
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
mkdir -p "$dir/site" "$dir/state"
head -c 1024 /dev/urandom > "$dir/site/1k.bin"
head -c 102400 /dev/urandom > "$dir/site/100k.bin"
head -c 1048576 /dev/urandom > "$dir/site/1m.bin"
LOAD=${LOAD:-wrk}
H2_REQUESTS=${H2_REQUESTS:-20000}
cat > "$dir/q.toml" <<TOML
workers = 2
state_dir = "$dir/state"
[log]
access = false
[[listener]]
address = "127.0.0.1:18445"
[listener.tls]
self_signed = true
[[listener]]
address = "127.0.0.1:18446"
[[route]]
prefix = "/"
root = "$dir/site"
TOML
tick=$(getconf CLK_TCK)
run() {
  local bin=$1
  "$bin" serve --config "$dir/q.toml" > /dev/null 2> "$dir/err.log" &
  local pid=$!
  sleep 1.5
  local out reqs rps
  if [ "$LOAD" = h2 ]; then
    h2load -c8 -m10 -n "$((H2_REQUESTS / 4))" "$URL" > /dev/null 2>&1
    read -r u0 s0 < <(awk '{print $14, $15}' "/proc/$pid/stat")
    out=$(/usr/bin/time -f "CLIENT %U %S" h2load -c8 -m10 -n "$H2_REQUESTS" "$URL" 2>&1)
    read -r u1 s1 < <(awk '{print $14, $15}' "/proc/$pid/stat")
    reqs=$(echo "$out" | awk '/^requests:/ {print $8}')
    rps=$(echo "$out" | awk '/^finished in/ {print $4}')
    if [ "$reqs" != "$H2_REQUESTS" ]; then echo "h2load: $reqs of $H2_REQUESTS succeeded" >&2; exit 1; fi
  else
    wrk -t1 -c32 -d2s "$URL" > /dev/null 2>&1
    read -r u0 s0 < <(awk '{print $14, $15}' "/proc/$pid/stat")
    out=$(/usr/bin/time -f "CLIENT %U %S" wrk -t1 -c32 -d5s "$URL" 2>&1)
    read -r u1 s1 < <(awk '{print $14, $15}' "/proc/$pid/stat")
    reqs=$(echo "$out" | awk '/requests in/ {print $1}')
    rps=$(echo "$out" | awk '/Requests\/sec/ {print $2}')
  fi
  kill "$pid"; wait "$pid" 2>/dev/null || true
  local cu cs
  read -r cu cs < <(echo "$out" | awk '/^CLIENT/ {print $2, $3}')
  echo "$bin rps=$rps us_user_per_req=$(echo "($u1-$u0)*1000000/$tick/$reqs" | bc -l | cut -c1-5) us_sys_per_req=$(echo "($s1-$s0)*1000000/$tick/$reqs" | bc -l | cut -c1-5) client_us_per_req=$(echo "($cu+$cs)*1000000/$reqs" | bc -l | cut -c1-6)"
}
for _ in $(seq "$ROUNDS"); do run "$A"; run "$B"; done
