#![no_main]
//! Arbitrary bytes as a request head: `qweb_server::fuzzing::head` checks the head parser's
//! rules with assertions (first byte: piece size and limits).

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| qweb_server::fuzzing::head(data));
