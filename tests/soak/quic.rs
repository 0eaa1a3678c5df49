//! The soak's hostile QUIC clients: garbage datagrams to the HTTP/3 port, and half-open
//! handshakes (a real Initial with a ClientHello, then nothing).

use std::net::{SocketAddr, UdpSocket};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use rustls::quic::{ClientConnection, Keys, Version};
use rustls::CipherSuite;
use rustls::Side;
use rustls::SupportedCipherSuite;

/// xorshift64: the garbage need not be good randomness, only cheap and varied.
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed | 1)
    }
    pub fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    pub fn fill(&mut self, buf: &mut [u8]) {
        for c in buf.chunks_mut(8) {
            let r = self.next().to_le_bytes();
            c.copy_from_slice(&r[..c.len()]);
        }
    }
}

/// One garbage datagram of kind `kind % 4`, into `pkt`:
/// 0. random bytes, 1 to 1500 of them;
/// 1. 1200 random bytes with a long header of an unsupported version (Version Negotiation
///    territory: a server answers those of 1200 bytes or more);
/// 2. 1200 random bytes shaped as a QUIC v1 Initial (8-byte IDs, no token): the server
///    derives Initial keys and fails to decrypt;
/// 3. a short header addressed to a random 8-byte ID, 100 to 1500 bytes (stateless reset
///    territory).
pub fn garbage(rng: &mut Rng, kind: u64, pkt: &mut Vec<u8>) {
    let len = match kind % 4 {
        0 => 1 + (rng.next() % 1500) as usize,
        1 | 2 => 1200,
        _ => 100 + (rng.next() % 1400) as usize,
    };
    pkt.resize(len, 0);
    rng.fill(pkt);
    match kind % 4 {
        1 => {
            pkt[0] |= 0xc0;
            // never 0 (Version Negotiation) nor 1 (QUIC v1)
            pkt[1] = 0x1a;
            pkt[5] = 8;
            pkt[14] = 8;
        }
        2 => {
            pkt[0] = 0xc0 | (pkt[0] & 0x0f);
            pkt[1..5].copy_from_slice(&1u32.to_be_bytes());
            pkt[5] = 8;
            pkt[14] = 8;
            pkt[23] = 0; // token length
            pkt[24] = 0x40 | 4; // length: 2-byte varint, 0x4?? bytes
        }
        3 => pkt[0] = 0x40 | (pkt[0] & 0x3f),
        _ => {}
    }
}

/// Garbage datagrams (the four kinds of [`garbage`] in turn, or those of
/// `QWEB_SOAK_QUIC_KINDS`) to `addr` at `rate` a second,
/// from 16 sockets (16 source ports), in batches every 5 ms.
pub async fn quic_garbage(addr: SocketAddr, rate: u64, sent: &AtomicU64, errors: &AtomicU64) {
    let mut socks = Vec::new();
    for _ in 0..16 {
        match tokio::net::UdpSocket::bind("127.0.0.1:0").await {
            Ok(s) => socks.push(s),
            Err(_) => {
                errors.fetch_add(1, Ordering::Relaxed);
            }
        }
    }
    if socks.is_empty() {
        return;
    }
    let mut rng = Rng::new(0x9e37_79b9_7f4a_7c15);
    let mut pkt = Vec::with_capacity(1500);
    let start = Instant::now();
    let mut n = 0u64;
    // `QWEB_SOAK_QUIC_KINDS=1,2`: only those kinds of [`garbage`] (to see what each costs)
    let kinds: Vec<u64> = std::env::var("QWEB_SOAK_QUIC_KINDS")
        .unwrap_or_else(|_| "0,1,2,3".into())
        .split(',')
        .filter_map(|k| k.trim().parse().ok())
        .collect();
    let kinds = if kinds.is_empty() {
        vec![0, 1, 2, 3]
    } else {
        kinds
    };
    let mut tick = tokio::time::interval(Duration::from_millis(5));
    loop {
        tick.tick().await;
        let due = start.elapsed().as_micros() as u64 * rate / 1_000_000;
        while n < due {
            garbage(&mut rng, kinds[(n as usize) % kinds.len()], &mut pkt);
            let s = &socks[(n as usize) % socks.len()];
            match s.try_send_to(&pkt, addr) {
                Ok(_) => {
                    sent.fetch_add(1, Ordering::Relaxed);
                }
                // a full socket buffer: dropped, as on a network
                Err(_) => {
                    errors.fetch_add(1, Ordering::Relaxed);
                }
            }
            n += 1;
        }
    }
}

/// A real QUIC v1 Initial packet (padded to 1200 bytes) carrying a ClientHello for `h3`, with
/// connection IDs from `rng`.
pub fn real_initial(cfg: &Arc<rustls::ClientConfig>, rng: &mut Rng) -> Option<Vec<u8>> {
    let (mut dcid, mut scid) = ([0u8; 8], [0u8; 8]);
    rng.fill(&mut dcid);
    rng.fill(&mut scid);
    // transport parameters: initial_source_connection_id (0x0f) only
    let mut params = vec![0x0f, 8];
    params.extend_from_slice(&scid);
    let mut conn = ClientConnection::new(
        cfg.clone(),
        Version::V1,
        qweb_testkit::tls::localhost(),
        params,
    )
    .ok()?;
    let mut hello = Vec::new();
    let _ = conn.write_hs(&mut hello);
    let suite = rustls::crypto::aws_lc_rs::cipher_suite::TLS13_AES_128_GCM_SHA256;
    let SupportedCipherSuite::Tls13(tls13) = suite else {
        return None;
    };
    debug_assert_eq!(suite.suite(), CipherSuite::TLS13_AES_128_GCM_SHA256);
    let keys = Keys::initial(Version::V1, tls13, tls13.quic?, &dcid, Side::Client);
    // header: first byte, version, DCID, SCID, token length 0, length (2-byte varint), a
    // 4-byte packet number 0
    let mut pkt = vec![0xc3];
    pkt.extend_from_slice(&1u32.to_be_bytes());
    pkt.push(8);
    pkt.extend_from_slice(&dcid);
    pkt.push(8);
    pkt.extend_from_slice(&scid);
    pkt.push(0);
    let len_at = pkt.len();
    pkt.extend_from_slice(&[0, 0]);
    let pn_at = pkt.len();
    pkt.extend_from_slice(&[0; 4]);
    let header_len = pkt.len();
    // payload: CRYPTO (offset 0, 2-byte varint length), then PADDING to 1200 with the tag
    let mut payload = vec![0x06, 0x00];
    let n = u16::try_from(hello.len()).ok()?;
    payload.extend_from_slice(&(0x4000 | n).to_be_bytes());
    payload.extend_from_slice(&hello);
    let tag_len = 16;
    payload.resize((1200 - header_len - tag_len).max(payload.len()), 0);
    let length = u16::try_from(4 + payload.len() + tag_len).ok()?;
    pkt[len_at..len_at + 2].copy_from_slice(&(0x4000 | length).to_be_bytes());
    let tag = keys
        .local
        .packet
        .encrypt_in_place(0, &pkt[..header_len], &mut payload)
        .ok()?;
    pkt.extend_from_slice(&payload);
    pkt.extend_from_slice(tag.as_ref());
    // header protection: the sample starts 4 bytes after the packet number's start
    let sample: Vec<u8> = pkt[pn_at + 4..pn_at + 20].to_vec();
    let (head, rest) = pkt.split_at_mut(pn_at);
    keys.local
        .header
        .encrypt_in_place(&sample, &mut head[0], &mut rest[..4])
        .ok()?;
    Some(pkt)
}

/// Half-open handshakes: `rate` a second, each a real Initial from a fresh socket (a new
/// source port) that then never answers; the server holds each until its handshake timeout,
/// retransmitting its flight, or answers with a Retry past its threshold.
pub async fn quic_halfopen(
    addr: SocketAddr,
    cfg: Arc<rustls::ClientConfig>,
    rate: u64,
    sent: &AtomicU64,
    errors: &AtomicU64,
) {
    let mut rng = Rng::new(0x2545_f491_4f6c_dd1d);
    let mut tick = tokio::time::interval(Duration::from_micros(1_000_000 / rate.max(1)));
    // the sockets stay open (unread) for 10 s, as a client that went away without a word
    let mut held: std::collections::VecDeque<(Instant, UdpSocket)> = Default::default();
    loop {
        tick.tick().await;
        while held
            .front()
            .is_some_and(|(t, _)| t.elapsed() > Duration::from_secs(10))
        {
            held.pop_front();
        }
        let Some(pkt) = real_initial(&cfg, &mut rng) else {
            errors.fetch_add(1, Ordering::Relaxed);
            continue;
        };
        let Ok(s) = UdpSocket::bind("127.0.0.1:0") else {
            errors.fetch_add(1, Ordering::Relaxed);
            continue;
        };
        if s.send_to(&pkt, addr).is_ok() {
            sent.fetch_add(1, Ordering::Relaxed);
            held.push_back((Instant::now(), s));
        } else {
            errors.fetch_add(1, Ordering::Relaxed);
        }
    }
}
