//! Garbage datagrams to the HTTP/3 port (issue 41, item 5): what qweb answers.

use std::net::UdpSocket;
use std::time::{Duration, Instant};

use qweb_testkit as common;

/// A datagram of 1200 bytes naming QUIC version `version`: quinn answers such datagrams of an
/// unsupported version with Version Negotiation.
fn other_version(i: u32) -> Vec<u8> {
    let mut d = vec![0xc0];
    d.extend_from_slice(&0x1a2a_3a4au32.to_be_bytes());
    d.push(8);
    d.extend_from_slice(&u64::from(i).to_be_bytes());
    d.push(8);
    d.extend_from_slice(&[9; 8]);
    d.resize(1200, 0);
    d
}

/// 2000 datagrams of an unknown version from one socket within a second: at most 64 a
/// second per worker get a Version Negotiation packet (quinn alone answers each).
#[test]
fn version_negotiation_answers_are_bounded_per_second() {
    let t = common::start_with(
        "workers = 1\n[[listener]]\naddress = \"127.0.0.1:0\"\nhttp3 = true\n\
         [listener.tls]\nself_signed = true\n",
        |_| {},
    );
    let addr = t.addrs[0];
    let s = UdpSocket::bind("127.0.0.1:0").unwrap();
    // room for every answer: none lost in our own buffer
    let s2 = socket2::SockRef::from(&s);
    let _ = s2.set_recv_buffer_size(8 << 20);
    s.set_read_timeout(Some(Duration::from_millis(300)))
        .unwrap();
    let start = Instant::now();
    for i in 0..2000 {
        let _ = s.send_to(&other_version(i), addr);
        if i % 100 == 99 {
            // paced (20 ms a hundred), so the server's socket buffer drops none
            std::thread::sleep(Duration::from_millis(20));
        }
    }
    let sent_in = start.elapsed();
    let mut answers = 0;
    let mut buf = [0u8; 1500];
    while let Ok((n, _)) = s.recv_from(&mut buf) {
        // Version Negotiation: long header, version 0
        if n >= 5 && buf[0] & 0x80 != 0 && buf[1..5] == [0; 4] {
            answers += 1;
        }
    }
    let allowed = 64 + (64.0 * sent_in.as_secs_f64()).ceil() as usize;
    assert!(answers >= 1, "no Version Negotiation at all");
    assert!(
        answers <= allowed,
        "{answers} Version Negotiation answers to 2000 datagrams in {sent_in:?} (at most \
         {allowed})"
    );
}
