#![no_main]
//! Arbitrary bytes as a request body: `qweb_server::fuzzing::body` decodes them fed whole, in
//! pieces and byte by byte and checks that all agree (first 4 bytes: framing, length, piece
//! size, trailer limit).

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| qweb_server::fuzzing::body(data));
