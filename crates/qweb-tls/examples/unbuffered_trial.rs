//! Issue 36, "Forks": rustls' buffered `ServerConnection` (as `TlsStream` drives it, with the
//! vendored patches) against its unbuffered `UnbufferedServerConnection` (the caller owns the
//! buffers), over in-memory pipes with a real rustls client. The results are in
//! vendor/rustls/QWEB.md, "The unbuffered API, tried (issue 36)".
//!
//! ```text
//! unbuffered_trial mem                      heap held by an idle server connection
//! unbuffered_trial records                  record and write sizes, checked by the client
//! unbuffered_trial cpu MODE SIZE N          N sends of SIZE (big: 1 MiB as 16 KiB writes;
//!                                           small: one 1 KiB response), MODE buffered or
//!                                           unbuffered (under callgrind: the inclusive
//!                                           cost of `sends`, divided by N)
//! unbuffered_trial time ROUNDS              the same sends timed, the two modes interleaved
//! ```

use std::alloc::{GlobalAlloc, Layout, System};
use std::io::{self, Read, Write};
use std::sync::atomic::{AtomicBool, AtomicIsize, Ordering::Relaxed};
use std::sync::Arc;
use std::time::Instant;

use rustls::server::UnbufferedServerConnection;
use rustls::unbuffered::{
    ConnectionState, EncodeError, EncryptError, InsufficientSizeError, UnbufferedStatus,
};
use rustls::{ClientConnection, ServerConnection};

/// Counts the bytes allocated and freed while `COUNTING` is on (the server's calls only).
struct Counting;

static COUNTING: AtomicBool = AtomicBool::new(false);
static LIVE: AtomicIsize = AtomicIsize::new(0);

// SAFETY: every call goes to the system allocator unchanged; the counters are atomics.
#[allow(unsafe_code)]
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        if COUNTING.load(Relaxed) {
            LIVE.fetch_add(layout.size() as isize, Relaxed);
        }
        // SAFETY: forwarded unchanged
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        if COUNTING.load(Relaxed) {
            LIVE.fetch_sub(layout.size() as isize, Relaxed);
        }
        // SAFETY: forwarded unchanged
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        if COUNTING.load(Relaxed) {
            LIVE.fetch_add(new_size as isize - layout.size() as isize, Relaxed);
        }
        // SAFETY: forwarded unchanged
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

/// Runs `f` as the server's work: its allocations are counted.
fn srv<T>(f: impl FnOnce() -> T) -> T {
    COUNTING.store(true, Relaxed);
    let r = f();
    COUNTING.store(false, Relaxed);
    r
}

/// One direction of an in-memory transport; an empty pipe reads as `WouldBlock`. Its own
/// growth is not counted.
#[derive(Default)]
struct Pipe {
    buf: Vec<u8>,
}

impl Read for Pipe {
    fn read(&mut self, out: &mut [u8]) -> io::Result<usize> {
        if self.buf.is_empty() {
            return Err(io::ErrorKind::WouldBlock.into());
        }
        let n = out.len().min(self.buf.len());
        out[..n].copy_from_slice(&self.buf[..n]);
        let was = COUNTING.swap(false, Relaxed);
        self.buf.drain(..n);
        COUNTING.store(was, Relaxed);
        Ok(n)
    }
}

impl Write for Pipe {
    fn write(&mut self, b: &[u8]) -> io::Result<usize> {
        let was = COUNTING.swap(false, Relaxed);
        self.buf.extend_from_slice(b);
        COUNTING.store(was, Relaxed);
        Ok(b.len())
    }
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// The socket of the CPU runs: takes everything, counts bytes and writes (a `writev` is one).
#[derive(Default)]
struct Sink {
    bytes: usize,
    writes: usize,
}

impl Write for Sink {
    fn write(&mut self, b: &[u8]) -> io::Result<usize> {
        self.bytes += b.len();
        self.writes += 1;
        Ok(b.len())
    }
    fn write_vectored(&mut self, bufs: &[io::IoSlice<'_>]) -> io::Result<usize> {
        let n = bufs.iter().map(|b| b.len()).sum();
        self.bytes += n;
        self.writes += 1;
        Ok(n)
    }
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// How many bytes of records either server holds before it writes them out (qweb-tls'
/// `SEND_BUFFER_LIMIT`: four whole records).
const SEND_LIMIT: usize = 4 * (16 * 1024 + 64);

fn configs() -> (Arc<rustls::ServerConfig>, Arc<rustls::ClientConfig>) {
    let kp = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).unwrap();
    let cert = rcgen::CertificateParams::new(vec!["localhost".into()])
        .unwrap()
        .self_signed(&kp)
        .unwrap();
    let key = rustls::pki_types::PrivateKeyDer::Pkcs8(kp.serialize_der().into());
    // qweb's provider (ring's record encryption on x86-64) and protocol versions
    let mut server = rustls::ServerConfig::builder_with_provider(Arc::new(qweb_tls::provider()))
        .with_protocol_versions(&[&rustls::version::TLS13, &rustls::version::TLS12])
        .unwrap()
        .with_no_client_auth()
        .with_single_cert(vec![cert.der().clone()], key)
        .unwrap();
    // no tickets: the stateful session cache would count as the connection's memory
    server.send_tls13_tickets = 0;
    let mut roots = rustls::RootCertStore::empty();
    roots.add(cert.der().clone()).unwrap();
    let client = rustls::ClientConfig::builder_with_provider(Arc::new(qweb_tls::provider()))
        .with_protocol_versions(&[&rustls::version::TLS13])
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
    (Arc::new(server), Arc::new(client))
}

fn client(cfg: &Arc<rustls::ClientConfig>) -> ClientConnection {
    ClientConnection::new(cfg.clone(), "localhost".try_into().unwrap()).unwrap()
}

/// The client's side of one turn: sends what it has, takes what came.
fn client_turn(c: &mut ClientConnection, c2s: &mut Pipe, s2c: &mut Pipe) {
    while c.wants_write() {
        c.write_tls(c2s).unwrap();
    }
    while !s2c.buf.is_empty() {
        c.read_tls(s2c).unwrap();
        c.process_new_packets().unwrap();
    }
    while c.wants_write() {
        c.write_tls(c2s).unwrap();
    }
}

/// The client reads `n` bytes of plaintext.
fn client_read(c: &mut ClientConnection, s2c: &mut Pipe, n: usize) -> Vec<u8> {
    let mut got = vec![0; n];
    let mut at = 0;
    while at < n {
        match c.reader().read(&mut got[at..]) {
            Ok(k) => at += k,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                c.read_tls(s2c).unwrap();
                c.process_new_packets().unwrap();
            }
            Err(e) => panic!("{e}"),
        }
    }
    got
}

// ---- the buffered server, as TlsStream drives it ----

struct Buffered {
    conn: ServerConnection,
    /// Free the idle buffers (the vendored patch); off: stock rustls.
    release: bool,
}

impl Buffered {
    fn new(cfg: &Arc<rustls::ServerConfig>, release: bool) -> Self {
        let mut conn = ServerConnection::new(cfg.clone()).unwrap();
        conn.set_buffer_limit(Some(SEND_LIMIT));
        Buffered { conn, release }
    }

    /// Reads and processes what the client sent, sends what that produced; with nothing more
    /// to read, frees the idle buffers (`TlsStream::poll_read_tls`).
    fn turn(&mut self, c2s: &mut Pipe, s2c: &mut Pipe) {
        loop {
            match self.conn.read_tls(c2s) {
                Ok(_) => {
                    self.conn.process_new_packets().unwrap();
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    if self.release {
                        self.conn.release_idle_buffers();
                    }
                    break;
                }
                Err(e) => panic!("{e}"),
            }
        }
        self.flush(s2c);
    }

    /// `TlsStream::poll_write`: whole records while some are held; full: write them out.
    fn write(&mut self, mut data: &[u8], out: &mut dyn Write) {
        while !data.is_empty() {
            let n = self.conn.writer().write(data).unwrap();
            if n == 0 {
                self.flush(out);
            }
            data = &data[n..];
        }
    }

    fn flush(&mut self, out: &mut dyn Write) {
        while self.conn.wants_write() {
            self.conn.write_tls(out).unwrap();
        }
    }
}

// ---- the unbuffered server: the caller's buffers ----

struct Unbuffered {
    conn: UnbufferedServerConnection,
    /// Received TLS bytes, `used` of them filled.
    inc: Vec<u8>,
    used: usize,
    /// Encoded records, `olen` of them to send.
    out: Vec<u8>,
    olen: usize,
    /// Free the empty buffers when idle.
    release: bool,
}

const READ_SIZE: usize = 4096;

impl Unbuffered {
    fn new(cfg: &Arc<rustls::ServerConfig>, release: bool) -> Self {
        Unbuffered {
            conn: UnbufferedServerConnection::new(cfg.clone()).unwrap(),
            inc: Vec::new(),
            used: 0,
            out: Vec::new(),
            olen: 0,
            release,
        }
    }

    /// Processes the received bytes until rustls wants more or has nothing to do; appends
    /// application data to `plain`. Returns whether the handshake is over (`WriteTraffic`).
    fn process(&mut self, s2c: &mut dyn Write, plain: &mut Vec<u8>) -> bool {
        loop {
            let UnbufferedStatus { discard, state } =
                self.conn.process_tls_records(&mut self.inc[..self.used]);
            let mut stop = None;
            match state.unwrap() {
                ConnectionState::ReadTraffic(mut r) => {
                    while let Some(rec) = r.next_record() {
                        plain.extend_from_slice(rec.unwrap().payload);
                    }
                }
                ConnectionState::EncodeTlsData(mut e) => loop {
                    match e.encode(&mut self.out[self.olen..]) {
                        Ok(n) => {
                            self.olen += n;
                            break;
                        }
                        Err(EncodeError::InsufficientSize(InsufficientSizeError {
                            required_size,
                        })) => self.out.resize(self.olen + required_size, 0),
                        Err(e) => panic!("{e}"),
                    }
                },
                ConnectionState::TransmitTlsData(t) => {
                    s2c.write_all(&self.out[..self.olen]).unwrap();
                    self.olen = 0;
                    t.done();
                }
                ConnectionState::BlockedHandshake => stop = Some(false),
                ConnectionState::WriteTraffic(_) => stop = Some(true),
                other => panic!("unexpected {other:?}"),
            }
            if discard > 0 {
                self.inc.copy_within(discard..self.used, 0);
                self.used -= discard;
            }
            if let Some(done) = stop {
                return done;
            }
        }
    }

    /// Reads what the client sent (4 KiB at a time, as rustls' deframer buffer grows) and
    /// processes it; with nothing more to read, frees its empty buffers.
    fn turn(&mut self, c2s: &mut Pipe, s2c: &mut Pipe, plain: &mut Vec<u8>) -> bool {
        let mut done = self.process(s2c, plain);
        loop {
            if self.inc.len() - self.used < READ_SIZE {
                self.inc.resize(self.used + READ_SIZE, 0);
            }
            match c2s.read(&mut self.inc[self.used..]) {
                Ok(n) => {
                    self.used += n;
                    done = self.process(s2c, plain);
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    if self.release {
                        self.release_idle_buffers();
                    }
                    return done;
                }
                Err(e) => panic!("{e}"),
            }
        }
    }

    /// The caller's choice: an idle connection keeps no empty buffer.
    fn release_idle_buffers(&mut self) {
        if self.used == 0 {
            self.inc = Vec::new();
        }
        if self.olen == 0 {
            self.out = Vec::new();
        }
    }

    /// Encrypts `data` into the send buffer, writing it out first when it would pass the
    /// limit (so, like the buffered server, at most four records are held).
    fn write(&mut self, mut data: &[u8], out: &mut dyn Write) {
        while !data.is_empty() {
            // one record's worth at a time, so that the buffer limit cuts between records
            let take = data.len().min(16 * 1024);
            let UnbufferedStatus { state, discard } =
                self.conn.process_tls_records(&mut self.inc[..self.used]);
            assert_eq!(discard, 0);
            let ConnectionState::WriteTraffic(mut w) = state.unwrap() else {
                panic!("not writable");
            };
            loop {
                match w.encrypt(&data[..take], &mut self.out[self.olen..]) {
                    Ok(n) => {
                        self.olen += n;
                        break;
                    }
                    Err(EncryptError::InsufficientSize(InsufficientSizeError {
                        required_size,
                    })) => {
                        if self.olen > 0 && self.olen + required_size > SEND_LIMIT {
                            out.write_all(&self.out[..self.olen]).unwrap();
                            self.olen = 0;
                        } else {
                            self.out.resize(self.olen + required_size, 0);
                        }
                    }
                    Err(e) => panic!("{e}"),
                }
            }
            data = &data[take..];
        }
    }

    fn flush(&mut self, out: &mut dyn Write) {
        if self.olen > 0 {
            out.write_all(&self.out[..self.olen]).unwrap();
            self.olen = 0;
        }
    }
}

/// Either server, for the runs below.
enum Server {
    B(Buffered),
    U(Unbuffered),
}

impl Server {
    fn new(mode: &str, cfg: &Arc<rustls::ServerConfig>) -> Self {
        match mode {
            "buffered" => Server::B(Buffered::new(cfg, true)),
            "buffered-stock" => Server::B(Buffered::new(cfg, false)),
            "unbuffered" => Server::U(Unbuffered::new(cfg, true)),
            "unbuffered-keep" => Server::U(Unbuffered::new(cfg, false)),
            _ => panic!("mode: buffered, buffered-stock, unbuffered or unbuffered-keep"),
        }
    }

    fn turn(&mut self, c2s: &mut Pipe, s2c: &mut Pipe, plain: &mut Vec<u8>) {
        match self {
            Server::B(b) => {
                b.turn(c2s, s2c);
                let n = b.conn.reader().read_to_end(plain);
                assert!(matches!(n, Err(ref e) if e.kind() == io::ErrorKind::WouldBlock));
            }
            Server::U(u) => {
                u.turn(c2s, s2c, plain);
            }
        }
    }

    fn write(&mut self, data: &[u8], out: &mut dyn Write) {
        match self {
            Server::B(b) => b.write(data, out),
            Server::U(u) => u.write(data, out),
        }
    }

    fn flush(&mut self, out: &mut dyn Write) {
        match self {
            Server::B(b) => b.flush(out),
            Server::U(u) => u.flush(out),
        }
    }

    fn handshaking(&self) -> bool {
        match self {
            Server::B(b) => b.conn.is_handshaking(),
            Server::U(u) => u.conn.is_handshaking(),
        }
    }
}

/// A connection after its handshake and one exchange of 1 KiB each way, idle.
fn connect(
    mode: &str,
    scfg: &Arc<rustls::ServerConfig>,
    ccfg: &Arc<rustls::ClientConfig>,
) -> (Server, ClientConnection, Pipe, Pipe) {
    let (mut c2s, mut s2c) = (Pipe::default(), Pipe::default());
    let mut c = client(ccfg);
    let mut s = srv(|| Server::new(mode, scfg));
    let mut plain = Vec::new();
    while c.is_handshaking() || s.handshaking() {
        client_turn(&mut c, &mut c2s, &mut s2c);
        srv(|| s.turn(&mut c2s, &mut s2c, &mut plain));
    }
    client_turn(&mut c, &mut c2s, &mut s2c);
    srv(|| s.turn(&mut c2s, &mut s2c, &mut plain));
    assert!(plain.is_empty());
    // a request of 1 KiB, a response of 1 KiB
    c.writer().write_all(&[b'q'; 1024]).unwrap();
    client_turn(&mut c, &mut c2s, &mut s2c);
    srv(|| {
        s.turn(&mut c2s, &mut s2c, &mut plain);
        assert_eq!(plain.len(), 1024);
        drop(std::mem::take(&mut plain));
        s.write(&[b'r'; 1024], &mut s2c);
        s.flush(&mut s2c);
        // nothing more to read: the idle connection frees its buffers
        s.turn(&mut c2s, &mut s2c, &mut plain);
    });
    assert_eq!(client_read(&mut c, &mut s2c, 1024), vec![b'r'; 1024]);
    (s, c, c2s, s2c)
}

fn mem(scfg: &Arc<rustls::ServerConfig>, ccfg: &Arc<rustls::ClientConfig>) {
    println!(
        "size_of: ServerConnection {} B; UnbufferedServerConnection {} B + two Vec<u8> {} B",
        size_of::<ServerConnection>(),
        size_of::<UnbufferedServerConnection>(),
        2 * size_of::<Vec<u8>>()
    );
    // buffered: TlsStream with the patch; buffered-stock: without release_idle_buffers;
    // unbuffered: the caller frees its empty buffers when idle; unbuffered-keep: it does not
    for mode in [
        "buffered",
        "buffered-stock",
        "unbuffered",
        "unbuffered-keep",
    ] {
        let before = LIVE.load(Relaxed);
        let conns: Vec<_> = (0..100).map(|_| connect(mode, scfg, ccfg).0).collect();
        let held = LIVE.load(Relaxed) - before;
        println!(
            "{mode:16}: heap held per idle connection {:.1} B (100 connections)",
            held as f64 / 100.0
        );
        drop(conns);
    }
}

/// Record sizes and writes of a 1 MiB response as 16 KiB writes, checked by the client.
fn records(scfg: &Arc<rustls::ServerConfig>, ccfg: &Arc<rustls::ClientConfig>) {
    let body: Vec<u8> = (0..1 << 20).map(|i: u32| (i % 251) as u8).collect();
    for mode in ["buffered", "unbuffered"] {
        for (what, write) in [("1 MiB as 16 KiB writes", 16 * 1024), ("1 KiB", 1024)] {
            let (mut s, mut c, _c2s, _s2c) = connect(mode, scfg, ccfg);
            let len = if write == 1024 { 1024 } else { body.len() };
            let mut wire = Recorder::default();
            for chunk in body[..len].chunks(write) {
                s.write(chunk, &mut wire);
            }
            s.flush(&mut wire);
            let mut sizes = Vec::new();
            let mut at = 0;
            while at < wire.all.len() {
                let n = u16::from_be_bytes([wire.all[at + 3], wire.all[at + 4]]) as usize;
                sizes.push(n + 5);
                at += n + 5;
            }
            let mut pipe = Pipe { buf: wire.all };
            assert!(client_read(&mut c, &mut pipe, len) == body[..len]);
            let mut distinct = sizes.clone();
            distinct.dedup();
            println!(
                "{mode:10} {what}: {} records (sizes {distinct:?}), {} writes of {:?} bytes",
                sizes.len(),
                wire.writes.len(),
                dedup_counts(&wire.writes)
            );
        }
    }
}

fn dedup_counts(v: &[usize]) -> Vec<(usize, usize)> {
    let mut out: Vec<(usize, usize)> = Vec::new();
    for &x in v {
        match out.last_mut() {
            Some((y, n)) if *y == x => *n += 1,
            _ => out.push((x, 1)),
        }
    }
    out
}

#[derive(Default)]
struct Recorder {
    all: Vec<u8>,
    writes: Vec<usize>,
}

impl Write for Recorder {
    fn write(&mut self, b: &[u8]) -> io::Result<usize> {
        self.all.extend_from_slice(b);
        self.writes.push(b.len());
        Ok(b.len())
    }
    fn write_vectored(&mut self, bufs: &[io::IoSlice<'_>]) -> io::Result<usize> {
        let mut n = 0;
        for b in bufs {
            self.all.extend_from_slice(b);
            n += b.len();
        }
        self.writes.push(n);
        Ok(n)
    }
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// `n` sends on one connection: `big` 1 MiB as 16 KiB writes then a flush, `small` one
/// 1 KiB write then a flush.
#[inline(never)]
fn sends(s: &mut Server, body: &[u8], size: &str, n: usize, sink: &mut Sink) {
    for _ in 0..n {
        match size {
            "big" => {
                for chunk in body.chunks(16 * 1024) {
                    s.write(chunk, sink);
                }
            }
            "small" => s.write(&body[..1024], sink),
            _ => panic!("size: big or small"),
        }
        s.flush(sink);
    }
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let (scfg, ccfg) = configs();
    let body = vec![b'x'; 1 << 20];
    match args.first().map(String::as_str) {
        Some("mem") => mem(&scfg, &ccfg),
        Some("records") => records(&scfg, &ccfg),
        Some("cpu") => {
            let (mode, size, n) = (&args[1], &args[2], args[3].parse().unwrap());
            let (mut s, ..) = connect(mode, &scfg, &ccfg);
            let mut sink = Sink::default();
            sends(&mut s, &body, size, n, &mut sink);
            println!(
                "{mode} {size} x{n}: {} bytes in {} writes",
                sink.bytes, sink.writes
            );
        }
        Some("time") => {
            let rounds: usize = args[1].parse().unwrap();
            for (size, n) in [("big", 20), ("small", 2000)] {
                let mut best = [f64::MAX; 2];
                let mut conns: Vec<Server> = ["buffered", "unbuffered"]
                    .iter()
                    .map(|m| connect(m, &scfg, &ccfg).0)
                    .collect();
                for _ in 0..rounds {
                    for (i, s) in conns.iter_mut().enumerate() {
                        let mut sink = Sink::default();
                        let t = Instant::now();
                        sends(s, &body, size, n, &mut sink);
                        let us = t.elapsed().as_secs_f64() * 1e6 / n as f64;
                        std::hint::black_box(sink.bytes);
                        best[i] = best[i].min(us);
                    }
                }
                println!(
                    "{size}: best of {rounds} rounds, µs per send: buffered {:.2}, unbuffered {:.2}",
                    best[0], best[1]
                );
            }
        }
        _ => eprintln!("usage: unbuffered_trial mem | records | cpu MODE SIZE N | time ROUNDS"),
    }
}
