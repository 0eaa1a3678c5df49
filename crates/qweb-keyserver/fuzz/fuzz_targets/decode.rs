#![no_main]
//! Feeds arbitrary bytes to the frame decoder: it must return frames or an error, never
//! panic, and never hold more than one maximal frame.

use bytes::BytesMut;
use libfuzzer_sys::fuzz_target;
use qweb_keyserver::protocol::{Frame, MAX_FRAME};

fuzz_target!(|data: &[u8]| {
    let mut buf = BytesMut::from(data);
    while let Ok(Some(frame)) = Frame::decode(&mut buf) {
        // what decodes re-encodes to something that decodes to the same frame
        let mut again = BytesMut::new();
        frame.encode(&mut again);
        assert_eq!(Frame::decode(&mut again).ok().flatten(), Some(frame));
    }
    assert!(buf.capacity() <= 4 + MAX_FRAME + data.len());
});
