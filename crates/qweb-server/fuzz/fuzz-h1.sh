#!/usr/bin/env bash
# Fuzzes qweb's HTTP/1.1 wire layer (crates/qweb-server/src/http/h1): the targets `h1_head`
# and `h1_body` call `qweb_server::fuzzing::{head, body}`, which check the parser's rules with
# assertions. Not part of CI (.ci/run): it takes minutes of CPU and a nightly switch.
#
#   crates/qweb-server/fuzz/fuzz-h1.sh [SECONDS] [TARGET...]
#
# runs each target (default: both) for SECONDS (default 60). A crash leaves its input in
# artifacts/<target>/ and stops the script; `cargo fuzz tmin <target> <file>` minimises it.
# The corpus grows in corpus/<target>/ (ignored by git) from one run to the next.
set -euo pipefail
cd "$(dirname "$0")"
secs="${1:-60}"
shift || true
targets=("$@")
if [ ${#targets[@]} -eq 0 ]; then
    targets=(h1_head h1_body)
fi

if ! cargo fuzz --version >/dev/null 2>&1; then
    cargo install cargo-fuzz --locked
fi
# cargo fuzz needs nightly flags (-Zsanitizer): the stable toolchain with its nightly switch.
export RUSTC_BOOTSTRAP=1
export CARGO_INCREMENTAL=0
# --no-cfg-fuzzing: under cfg(fuzzing) the vendored h2 builds a module without docs, which its
# deny(missing_docs) refuses; nothing of qweb's reads cfg(fuzzing).
flags=(--no-cfg-fuzzing)

# Seeds: a few well-formed inputs (the first byte chooses piece sizes and limits, see
# src/http/h1/fuzzing.rs), written once; the fuzzer keeps what it finds next to them.
seed() { # target name bytes
    mkdir -p "corpus/$1"
    [ -e "corpus/$1/$2" ] || printf '%b' "$3" >"corpus/$1/$2"
}
seed h1_head get '\x00GET /a?b HTTP/1.1\r\nHost: x\r\nAccept: */*\r\n\r\n'
seed h1_head post '\x13POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\nExpect: 100-continue\r\n\r\nhello'
seed h1_head chunked '\x27\r\nPUT / HTTP/1.1\r\nTransfer-Encoding: gzip, chunked\r\nContent-Length: 3\r\nConnection: close\r\n\r\n'
seed h1_head old '\x41GET / HTTP/1.0\nConnection: keep-alive\nTE: trailers\nUpgrade: x\n\n'
seed h1_body chunked '\x00\x00\x00\x035\r\nhello\r\n1;a=b\r\n!\r\n0\r\nX-T: 1\r\n\r\nNEXT'
seed h1_body length '\x02\x05\x00\x02helloGET'

cargo fuzz build "${flags[@]}"
for t in "${targets[@]}"; do
    echo "== $t: $secs s"
    cargo fuzz run "${flags[@]}" "$t" -- -max_total_time="$secs" -print_final_stats=1
done
