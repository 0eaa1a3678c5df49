//! The TLS stream: a rustls `ServerConnection` over any `AsyncRead + AsyncWrite` transport (a
//! tokio `TcpStream` in qweb, in-memory transports in the tests), after the handshake (see
//! `handshake`), as `AsyncRead + AsyncWrite` for hyper.

use std::io::{self, Read, Write};
use std::pin::Pin;
use std::task::{ready, Context, Poll};

use rustls::ServerConnection;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;

/// `std::io` adapter over an async transport's `poll_*` calls, for rustls' `read_tls` and
/// `write_tls`: `Pending` becomes `WouldBlock` (the transport registered the waker).
pub(crate) struct SyncIo<'a, 'b, IO> {
    pub io: &'a mut IO,
    pub cx: &'a mut Context<'b>,
}

impl<IO: AsyncRead + Unpin> Read for SyncIo<'_, '_, IO> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let mut rb = ReadBuf::new(buf);
        match Pin::new(&mut *self.io).poll_read(self.cx, &mut rb) {
            Poll::Ready(Ok(())) => Ok(rb.filled().len()),
            Poll::Ready(Err(e)) => Err(e),
            Poll::Pending => Err(io::ErrorKind::WouldBlock.into()),
        }
    }
}

impl<IO: AsyncWrite + Unpin> Write for SyncIo<'_, '_, IO> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        match Pin::new(&mut *self.io).poll_write(self.cx, buf) {
            Poll::Ready(r) => r,
            Poll::Pending => Err(io::ErrorKind::WouldBlock.into()),
        }
    }
    fn write_vectored(&mut self, bufs: &[io::IoSlice<'_>]) -> io::Result<usize> {
        match Pin::new(&mut *self.io).poll_write_vectored(self.cx, bufs) {
            Poll::Ready(r) => r,
            Poll::Pending => Err(io::ErrorKind::WouldBlock.into()),
        }
    }
    fn flush(&mut self) -> io::Result<()> {
        match Pin::new(&mut *self.io).poll_flush(self.cx) {
            Poll::Ready(r) => r,
            Poll::Pending => Err(io::ErrorKind::WouldBlock.into()),
        }
    }
}

/// How many bytes of sealed records rustls holds before a write waits for the socket: four
/// records of 16 KiB of plaintext with their overhead (rustls' default of 64 KiB held only
/// three, so an HTTP/2 response went out in `writev`s of three records). Also the most a
/// connection whose peer does not read keeps in rustls.
pub const SEND_BUFFER_LIMIT: usize = 4 * (16 * 1024 + 64);

/// A transport the handshake can run on: bytes both ways, and a way to notice that the peer
/// left while a handshake job is paused (without consuming its data).
pub trait Transport: AsyncRead + AsyncWrite + Unpin {
    /// Ready when the peer has closed its end (EOF or error); pending while it is alive.
    fn poll_peer_gone(&self, cx: &mut Context<'_>) -> Poll<()>;

    /// Ready when a read may find bytes, the end of stream or an error; pending (with `cx`
    /// woken when that changes) while the transport knows it has nothing. The default says
    /// "maybe" and lets the read find out.
    fn poll_readable(&self, _cx: &mut Context<'_>) -> Poll<()> {
        Poll::Ready(())
    }
}

impl Transport for TcpStream {
    fn poll_peer_gone(&self, cx: &mut Context<'_>) -> Poll<()> {
        let mut b = [0u8; 1];
        let mut rb = tokio::io::ReadBuf::new(&mut b);
        match self.poll_peek(cx, &mut rb) {
            Poll::Ready(Ok(0)) | Poll::Ready(Err(_)) => Poll::Ready(()),
            // more data, or nothing yet: the peer is alive
            Poll::Ready(Ok(_)) | Poll::Pending => Poll::Pending,
        }
    }

    /// tokio's read readiness: no system call while the socket is known to be empty (the
    /// last read found nothing and epoll has not said otherwise since).
    fn poll_readable(&self, cx: &mut Context<'_>) -> Poll<()> {
        self.poll_read_ready(cx).map(|_| ())
    }
}

impl Transport for tokio::io::DuplexStream {
    /// An in-memory pipe (tests): its peer is never noticed leaving mid-handshake.
    fn poll_peer_gone(&self, _cx: &mut Context<'_>) -> Poll<()> {
        Poll::Pending
    }
}

/// A TLS connection after its handshake, over `IO` (a `TcpStream` by default).
pub struct TlsStream<IO = TcpStream> {
    io: IO,
    conn: ServerConnection,
    /// The socket reported end of stream.
    read_eof: bool,
    close_sent: bool,
    /// A flush waits one turn of the event loop first (see [`TlsStream::set_flush_after_yield`]).
    flush_after_yield: bool,
    /// This flush already waited its turn.
    flush_yielded: bool,
    /// A read that finds nothing keeps rustls' read buffer (see
    /// [`TlsStream::set_keep_read_buffer`]).
    keep_read_buffer: bool,
    /// The last read of the socket found nothing and freed rustls' read buffer: the next one
    /// waits for the socket to be readable first ([`Transport::poll_readable`]), so that a
    /// connection woken for another reason (its own response written, a stream's task done)
    /// does not allocate and zero the buffer (4 KiB) only to find nothing again and free it.
    /// (A kept buffer costs a read nothing: tokio's read checks readiness itself.)
    drained_and_freed: bool,
}

impl<IO: Transport> TlsStream<IO> {
    pub(crate) fn new(io: IO, mut conn: ServerConnection) -> Self {
        conn.set_buffer_limit(Some(SEND_BUFFER_LIMIT));
        TlsStream {
            io,
            conn,
            read_eof: false,
            close_sent: false,
            flush_after_yield: false,
            flush_yielded: false,
            keep_read_buffer: false,
            drained_and_freed: false,
        }
    }

    /// With `on`, a read (`poll_read`) that finds nothing to read keeps rustls' read buffer
    /// for the next one; `poll_read_ready`, which a connection waiting idle uses, still frees
    /// it. Off by default. An HTTP/2 connection waits in `poll_read`: its driver turns it on
    /// while requests are in flight and off for the read after the last one. The HTTP/1
    /// driver turns it on, since it waits idle in `poll_read_ready`: otherwise each
    /// request allocated and zeroed the buffer again (4 KiB, with glibc's `rep stosb`). A
    /// connection whose request arrives slowly keeps it until the request is in (beside the
    /// driver's own read buffer, which it holds then too), at most until the head timeout.
    pub fn set_keep_read_buffer(&mut self, on: bool) {
        self.keep_read_buffer = on;
    }

    /// With `on`, a flush with records to send first lets the other ready tasks of the event
    /// loop run once (it wakes itself and returns `Pending`), then writes. For HTTP/2, whose
    /// streams each hand the connection a frame and ask for a flush: the frames of all streams
    /// ready in this turn go out in one `writev`, as h2o writes once per event-loop turn.
    /// Costs one turn of latency per flush; off by default (HTTP/1.1 gains nothing).
    pub fn set_flush_after_yield(&mut self, on: bool) {
        self.flush_after_yield = on;
    }

    /// The rustls connection (ALPN, SNI, protocol version, cipher suite).
    pub fn connection(&self) -> &ServerConnection {
        &self.conn
    }

    /// The transport (the socket).
    pub fn socket(&self) -> &IO {
        &self.io
    }

    /// Ready when a read would not wait: plaintext is buffered, or the peer closed (close_notify
    /// or end of stream). Until then it reads and processes TLS records (and sends what they
    /// ask for: alerts, key-update answers) but takes no plaintext, so that an idle
    /// connection can wait for its next request without a read buffer above this stream.
    /// A TLS error is returned here (the alert is sent, best effort).
    pub fn poll_read_ready(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        loop {
            let st = match self.conn.process_new_packets() {
                Ok(st) => st,
                Err(e) => {
                    let _ = self.poll_write_tls(cx);
                    return Poll::Ready(Err(io::Error::new(io::ErrorKind::InvalidData, e)));
                }
            };
            if st.plaintext_bytes_to_read() > 0 || st.peer_has_closed() || self.read_eof {
                return Poll::Ready(Ok(()));
            }
            // (false: end of stream, reported on the next turn)
            if ready!(self.poll_read_tls(cx, true))? && self.conn.wants_write() {
                let _ = self.poll_write_tls(cx);
            }
        }
    }

    /// Writes pending TLS records to the socket until rustls has none or the socket is full.
    fn poll_write_tls(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        while self.conn.wants_write() {
            let mut sync = SyncIo {
                io: &mut self.io,
                cx,
            };
            match self.conn.write_tls(&mut sync) {
                Ok(0) => return Poll::Ready(Err(io::ErrorKind::WriteZero.into())),
                Ok(_) => {}
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Poll::Pending,
                Err(e) => return Poll::Ready(Err(e)),
            }
        }
        Poll::Ready(Ok(()))
    }

    /// Reads TLS records from the socket into rustls and processes them. `Ready(Ok(false))`
    /// at end of stream. With `release`, nothing to read frees rustls' read buffer.
    fn poll_read_tls(&mut self, cx: &mut Context<'_>, release: bool) -> Poll<io::Result<bool>> {
        if self.drained_and_freed {
            ready!(self.io.poll_readable(cx));
            self.drained_and_freed = false;
        }
        let mut sync = SyncIo {
            io: &mut self.io,
            cx,
        };
        match self.conn.read_tls(&mut sync) {
            Ok(0) => {
                self.read_eof = true;
                return Poll::Ready(Ok(false));
            }
            Ok(_) => {}
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                // Nothing to read for now, and the connection may stay idle for long: it keeps
                // no empty read buffer meanwhile (rustls sized it to 4 KiB for this read; the
                // next read allocates it again). Bytes of a record not yet complete are kept.
                if release {
                    // (0: it holds bytes of a record, and the next read needs no new one)
                    self.drained_and_freed = self.conn.release_idle_buffers() > 0;
                }
                return Poll::Pending;
            }
            Err(e) => return Poll::Ready(Err(e)),
        }
        if let Err(e) = self.conn.process_new_packets() {
            // send the alert rustls queued, best effort
            let _ = self.poll_write_tls(cx);
            return Poll::Ready(Err(io::Error::new(io::ErrorKind::InvalidData, e)));
        }
        Poll::Ready(Ok(true))
    }
}

impl<IO: Transport> AsyncRead for TlsStream<IO> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = &mut *self;
        loop {
            // The plaintext is copied from rustls' own buffer without zeroing the caller's
            // buffer first (`Read::read` needs initialised memory: the HTTP/1 driver's 4 KiB of
            // spare capacity were zeroed on every read).
            let mut reader = this.conn.reader();
            match std::io::BufRead::fill_buf(&mut reader) {
                Ok(chunk) => {
                    // empty: the peer sent close_notify
                    let n = chunk.len().min(buf.remaining());
                    buf.put_slice(&chunk[..n]);
                    std::io::BufRead::consume(&mut reader, n);
                    return Poll::Ready(Ok(()));
                }
                // The peer closed without close_notify: for HTTP (which frames its own
                // messages) this is an ordinary end of stream.
                Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => return Poll::Ready(Ok(())),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                Err(e) => return Poll::Ready(Err(e)),
            }
            if this.read_eof {
                return Poll::Ready(Ok(()));
            }
            let release = !this.keep_read_buffer;
            match ready!(this.poll_read_tls(cx, release)) {
                Ok(true) => {
                    // records may have produced something to send (alerts, key updates)
                    if this.conn.wants_write() {
                        let _ = this.poll_write_tls(cx);
                    }
                }
                Ok(false) => {} // EOF: the reader reports it on the next turn
                Err(e) => return Poll::Ready(Err(e)),
            }
        }
    }
}

/// Writes are coalesced: plaintext goes into rustls, which encrypts it into records and holds
/// them (up to its buffer limit, `SEND_BUFFER_LIMIT`); the socket gets them all in one `writev`
/// when the caller flushes (hyper and h2 flush after each batch of frames) or when rustls'
/// buffer is full. An HTTP/2 response of 100 KiB (seven DATA frames) is then one or two
/// `writev`s instead of one per frame. Where rustls' buffer limit cuts a write, it cuts after
/// a whole record, or takes nothing until the held records are out (vendor/rustls/QWEB.md).
impl<IO: Transport> AsyncWrite for TlsStream<IO> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        self.poll_write_vectored(cx, &[io::IoSlice::new(buf)])
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let this = &mut *self;
        if bufs.iter().all(|b| b.is_empty()) {
            return Poll::Ready(Ok(0));
        }
        let mut retried = false;
        loop {
            // rustls takes what fits in its send buffer, in whole records while it holds
            // some (vendor/rustls: a write is not cut into a short record at the limit);
            // nothing when not even one record fits
            let n = this.conn.writer().write_vectored(bufs)?;
            if n > 0 {
                return Poll::Ready(Ok(n));
            }
            // full: write the held records out, then try once more (an empty buffer always
            // takes something; never spin if it did not)
            ready!(this.poll_write_tls(cx))?;
            if retried {
                return Poll::Ready(Err(io::ErrorKind::WriteZero.into()));
            }
            retried = true;
        }
    }

    fn is_write_vectored(&self) -> bool {
        true
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = &mut *self;
        this.conn.writer().flush()?;
        if this.flush_after_yield && !this.flush_yielded && this.conn.wants_write() {
            this.flush_yielded = true;
            cx.waker().wake_by_ref();
            return Poll::Pending;
        }
        this.flush_yielded = false;
        ready!(this.poll_write_tls(cx))?;
        Pin::new(&mut this.io).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = &mut *self;
        if !this.close_sent {
            this.conn.send_close_notify();
            this.close_sent = true;
        }
        ready!(this.poll_write_tls(cx))?;
        Pin::new(&mut this.io).poll_shutdown(cx)
    }
}

/// Mock-IO tests: the handshake driver and the stream over in-memory pipes (`tokio::io::duplex`)
/// with a real rustls client (tokio-rustls) on the other end, as tokio-rustls tests itself.
#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use tokio::io::{AsyncReadExt, AsyncWriteExt, DuplexStream};

    use crate::handshake::{accept, Driver, HandshakeError};
    use crate::{load_certified_key, provider, server_config, SniResolver};

    struct Pair {
        server: Arc<rustls::ServerConfig>,
        client: tokio_rustls::TlsConnector,
        _dir: tempfile::TempDir,
    }

    fn pair() -> Pair {
        let dir = tempfile::tempdir().unwrap();
        let kp = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).unwrap();
        let cert = rcgen::CertificateParams::new(vec!["localhost".into()])
            .unwrap()
            .self_signed(&kp)
            .unwrap();
        std::fs::write(dir.path().join("c.pem"), cert.pem()).unwrap();
        std::fs::write(dir.path().join("k.pem"), kp.serialize_pem()).unwrap();
        let loaded = load_certified_key(
            &dir.path().join("c.pem"),
            &dir.path().join("k.pem"),
            &provider(),
        )
        .unwrap();
        let resolver = SniResolver::new(&[loaded]).unwrap();
        let server = Arc::new(server_config(Arc::new(resolver), false, None).unwrap());
        let mut roots = rustls::RootCertStore::empty();
        roots.add(cert.der().clone()).unwrap();
        let client = rustls::ClientConfig::builder_with_provider(Arc::new(provider()))
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_root_certificates(roots)
            .with_no_client_auth();
        Pair {
            server,
            client: tokio_rustls::TlsConnector::from(Arc::new(client)),
            _dir: dir,
        }
    }

    async fn connect(
        p: &Pair,
        buf: usize,
    ) -> (
        super::TlsStream<DuplexStream>,
        tokio_rustls::client::TlsStream<DuplexStream>,
    ) {
        let (s, c) = tokio::io::duplex(buf);
        let name = rustls::pki_types::ServerName::try_from("localhost").unwrap();
        let (server, client) = tokio::join!(
            accept(s, p.server.clone(), Driver::Direct),
            p.client.connect(name, c)
        );
        (server.unwrap(), client.unwrap())
    }

    #[tokio::test]
    async fn handshake_echo_and_close_notify_over_a_pipe() {
        let p = pair();
        let (mut server, mut client) = connect(&p, 4096).await;
        client.write_all(b"ping").await.unwrap();
        client.flush().await.unwrap();
        let mut b = [0u8; 4];
        server.read_exact(&mut b).await.unwrap();
        assert_eq!(&b, b"ping");
        server.write_all(b"pong").await.unwrap();
        server.flush().await.unwrap();
        client.read_exact(&mut b).await.unwrap();
        assert_eq!(&b, b"pong");
        // shutdown sends close_notify: the client reads a clean end of stream
        server.shutdown().await.unwrap();
        let mut rest = Vec::new();
        client.read_to_end(&mut rest).await.unwrap();
        assert!(rest.is_empty());
    }

    /// A pipe of 64 bytes: every write of the server meets a full transport. Nothing is lost
    /// or duplicated, writes report progress or `Pending` (never a spin), and flush delivers
    /// everything, in both the plain and the vectored write paths. (The client reads while
    /// the server finishes its handshake: the TLS 1.3 session tickets do not fit the pipe.)
    #[tokio::test]
    async fn writes_against_a_full_transport_lose_nothing() {
        let p = pair();
        let (s, c) = tokio::io::duplex(64);
        let body: Vec<u8> = (0..200_000u32).map(|i| (i % 251) as u8).collect();
        let sent = body.clone();
        let config = p.server.clone();
        let writer = async move {
            let mut server = accept(s, config, Driver::Direct).await.unwrap();
            let (a, b) = sent.split_at(sent.len() / 2);
            server.write_all(a).await.unwrap();
            let mut rest = b;
            while !rest.is_empty() {
                let half = rest.len() / 2;
                let bufs = [
                    std::io::IoSlice::new(&rest[..half]),
                    std::io::IoSlice::new(&rest[half..]),
                ];
                let n = server.write_vectored(&bufs).await.unwrap();
                assert!(n > 0);
                rest = &rest[n..];
            }
            server.flush().await.unwrap();
            server.shutdown().await.unwrap();
        };
        let name = rustls::pki_types::ServerName::try_from("localhost").unwrap();
        let reader = async move {
            let mut client = p.client.connect(name, c).await.unwrap();
            let mut got = Vec::new();
            client.read_to_end(&mut got).await.unwrap();
            got
        };
        let ((), got) = tokio::time::timeout(std::time::Duration::from_secs(30), async {
            tokio::join!(writer, reader)
        })
        .await
        .expect("no deadlock");
        assert_eq!(got.len(), body.len());
        assert!(got == body, "bytes differ");
    }

    /// Waits for [`super::TlsStream::poll_read_ready`] for at most `ms` milliseconds.
    async fn ready_within(
        server: &mut super::TlsStream<DuplexStream>,
        ms: u64,
    ) -> Option<std::io::Result<()>> {
        let ready = std::future::poll_fn(|cx| server.poll_read_ready(cx));
        tokio::time::timeout(std::time::Duration::from_millis(ms), ready)
            .await
            .ok()
    }

    /// `keep_read_buffer`: a read that finds nothing keeps rustls' read buffer (the HTTP/1
    /// driver's case: the buffer was freed, then allocated and zeroed again for every request);
    /// without it, and while waiting idle in `poll_read_ready` with it, the buffer is freed.
    #[tokio::test]
    async fn a_read_that_finds_nothing_keeps_the_buffer_only_when_asked() {
        let p = pair();
        let (mut server, mut client) = connect(&p, 65536).await;
        for keep in [true, false, true] {
            server.set_keep_read_buffer(keep);
            client.write_all(b"ping").await.unwrap();
            client.flush().await.unwrap();
            let mut got = [0u8; 4];
            server.read_exact(&mut got).await.unwrap();
            assert_eq!(&got, b"ping");
            // nothing more was sent: this read finds nothing
            let mut more = [0u8; 8];
            let wait = std::time::Duration::from_millis(50);
            assert!(tokio::time::timeout(wait, server.read(&mut more))
                .await
                .is_err());
            let held = server.conn.release_idle_buffers();
            assert_eq!(
                held > 0,
                keep,
                "keep = {keep}: {held} bytes were still held"
            );
        }
        // waiting idle in poll_read_ready frees it, kept or not
        client.write_all(b"ping").await.unwrap();
        client.flush().await.unwrap();
        let mut got = [0u8; 4];
        server.read_exact(&mut got).await.unwrap();
        assert!(ready_within(&mut server, 50).await.is_none());
        assert_eq!(server.conn.release_idle_buffers(), 0);
    }

    /// An idle stream waits for readiness without taking plaintext: records that carry none (a
    /// client's key update) do not wake it and are answered; data wakes it and is then read
    /// whole, under the new keys; close_notify wakes it and reads as end of stream.
    #[tokio::test]
    async fn read_ready_waits_for_plaintext_and_takes_none() {
        let p = pair();
        let (mut server, mut client) = connect(&p, 65536).await;
        assert!(
            ready_within(&mut server, 200).await.is_none(),
            "nothing sent yet"
        );

        client.get_mut().1.refresh_traffic_keys().unwrap();
        client.flush().await.unwrap();
        assert!(
            ready_within(&mut server, 300).await.is_none(),
            "a key update is no plaintext"
        );

        client.write_all(b"GET / HTTP/1.1\r\n").await.unwrap();
        client.flush().await.unwrap();
        ready_within(&mut server, 5000)
            .await
            .expect("ready once data arrived")
            .unwrap();
        // ready twice in a row: it took nothing
        ready_within(&mut server, 5000).await.unwrap().unwrap();
        let mut got = [0u8; 16];
        server.read_exact(&mut got).await.unwrap();
        assert_eq!(&got, b"GET / HTTP/1.1\r\n");

        // the server answered the key update: its replies still decrypt
        server.write_all(b"ok").await.unwrap();
        server.flush().await.unwrap();
        let mut b = [0u8; 2];
        client.read_exact(&mut b).await.unwrap();
        assert_eq!(&b, b"ok");

        client.shutdown().await.unwrap();
        ready_within(&mut server, 5000).await.unwrap().unwrap();
        let mut rest = Vec::new();
        server.read_to_end(&mut rest).await.unwrap();
        assert!(rest.is_empty());
    }

    /// Garbage where a record should be wakes an idle stream with an error; a peer that
    /// vanishes wakes it with a clean end of stream.
    #[tokio::test]
    async fn read_ready_reports_garbage_and_vanished_peers() {
        let p = pair();
        let (mut server, mut client) = connect(&p, 65536).await;
        client
            .get_mut()
            .0
            .write_all(b"\x17\x03\x03\x00\x05hello")
            .await
            .unwrap();
        let e = ready_within(&mut server, 5000)
            .await
            .expect("woken")
            .expect_err("a record that does not decrypt");
        assert_eq!(e.kind(), std::io::ErrorKind::InvalidData, "{e}");

        let (mut server, client) = connect(&p, 65536).await;
        drop(client);
        ready_within(&mut server, 5000).await.unwrap().unwrap();
        let mut rest = Vec::new();
        server.read_to_end(&mut rest).await.unwrap();
        assert!(rest.is_empty());
    }

    /// A peer that sends half a ClientHello and leaves: an error, not a hang.
    /// A transport that counts the writes it gets and keeps a copy of the bytes.
    struct Counting {
        inner: DuplexStream,
        writes: Arc<std::sync::atomic::AtomicUsize>,
        wire: Wire,
    }

    impl Counting {
        fn new(inner: DuplexStream) -> Self {
            Counting {
                inner,
                writes: Default::default(),
                wire: Default::default(),
            }
        }
    }

    impl tokio::io::AsyncRead for Counting {
        fn poll_read(
            mut self: std::pin::Pin<&mut Self>,
            cx: &mut std::task::Context<'_>,
            buf: &mut tokio::io::ReadBuf<'_>,
        ) -> std::task::Poll<std::io::Result<()>> {
            std::pin::Pin::new(&mut self.inner).poll_read(cx, buf)
        }
    }

    impl crate::handshake::Transport for Counting {
        fn poll_peer_gone(&self, cx: &mut std::task::Context<'_>) -> std::task::Poll<()> {
            self.inner.poll_peer_gone(cx)
        }
    }

    impl tokio::io::AsyncWrite for Counting {
        fn poll_write(
            mut self: std::pin::Pin<&mut Self>,
            cx: &mut std::task::Context<'_>,
            buf: &[u8],
        ) -> std::task::Poll<std::io::Result<usize>> {
            self.writes
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            let r = std::pin::Pin::new(&mut self.inner).poll_write(cx, buf);
            if let std::task::Poll::Ready(Ok(n)) = r {
                self.wire.lock().unwrap().extend_from_slice(&buf[..n]);
            }
            r
        }
        /// Vectored, like a socket: one write for all the slices.
        fn poll_write_vectored(
            mut self: std::pin::Pin<&mut Self>,
            cx: &mut std::task::Context<'_>,
            bufs: &[std::io::IoSlice<'_>],
        ) -> std::task::Poll<std::io::Result<usize>> {
            self.writes
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            let all: Vec<u8> = bufs.iter().flat_map(|b| b.iter().copied()).collect();
            let r = std::pin::Pin::new(&mut self.inner).poll_write(cx, &all);
            if let std::task::Poll::Ready(Ok(n)) = r {
                self.wire.lock().unwrap().extend_from_slice(&all[..n]);
            }
            r
        }
        fn is_write_vectored(&self) -> bool {
            true
        }
        fn poll_flush(
            mut self: std::pin::Pin<&mut Self>,
            cx: &mut std::task::Context<'_>,
        ) -> std::task::Poll<std::io::Result<()>> {
            std::pin::Pin::new(&mut self.inner).poll_flush(cx)
        }
        fn poll_shutdown(
            mut self: std::pin::Pin<&mut Self>,
            cx: &mut std::task::Context<'_>,
        ) -> std::task::Poll<std::io::Result<()>> {
            std::pin::Pin::new(&mut self.inner).poll_shutdown(cx)
        }
    }

    type Wire = Arc<std::sync::Mutex<Vec<u8>>>;

    /// A connection over a [`Counting`] transport of 1 MiB, with its write count and bytes.
    async fn connect_counting() -> (
        super::TlsStream<Counting>,
        tokio_rustls::client::TlsStream<DuplexStream>,
        Arc<std::sync::atomic::AtomicUsize>,
        Wire,
    ) {
        let p = pair();
        let (s, c) = tokio::io::duplex(1 << 20);
        let io = Counting::new(s);
        let (writes, wire) = (io.writes.clone(), io.wire.clone());
        let name = rustls::pki_types::ServerName::try_from("localhost").unwrap();
        let (server, client) = tokio::join!(
            accept(io, p.server.clone(), Driver::Direct),
            p.client.connect(name, c)
        );
        (server.unwrap(), client.unwrap(), writes, wire)
    }

    /// Frames written one by one (an HTTP/2 response of 100 KiB: seven 9-byte frame headers
    /// and 16 KiB payloads) reach the transport in a few writes, at the flush or when rustls'
    /// buffer fills, not one or two per frame; the client gets every byte in order.
    #[tokio::test]
    async fn writes_are_coalesced_until_flush() {
        let (mut server, mut client, writes, _) = connect_counting().await;
        let before = writes.load(std::sync::atomic::Ordering::Relaxed);
        let mut sent = Vec::new();
        for i in 0..7u8 {
            let header = [i; 9];
            let payload = vec![i; 16 * 1024];
            server.write_all(&header).await.unwrap();
            server.write_all(&payload).await.unwrap();
            sent.extend_from_slice(&header);
            sent.extend_from_slice(&payload);
        }
        server.flush().await.unwrap();
        let n = writes.load(std::sync::atomic::Ordering::Relaxed) - before;
        // 112 KiB against the 64 KiB send buffer: one write when it fills, one at the flush
        assert!(n <= 3, "{n} transport writes for 14 frame writes");
        let mut got = vec![0u8; sent.len()];
        client.read_exact(&mut got).await.unwrap();
        assert!(got == sent, "bytes differ");
    }

    /// HTTP/2 DATA frames of 16 375 bytes with their 9-byte heads (vendor/h2 sizes them so)
    /// are written as whole 16 KiB records, also where the send buffer fills: it
    /// cut such a write at the limit, into a record of the bytes that fit and a short one for
    /// the rest (15 369 and 1 024 bytes, twice the records to seal and to open).
    #[tokio::test]
    async fn frames_of_one_record_are_written_as_whole_records() {
        let (mut server, mut client, writes, wire) = connect_counting().await;
        let start = wire.lock().unwrap().len();
        let writes_before = writes.load(std::sync::atomic::Ordering::Relaxed);
        let mut sent = Vec::new();
        for i in 0..13u8 {
            let (head, payload) = ([i; 9], vec![i; 16 * 1024 - 9]);
            let bufs = [
                std::io::IoSlice::new(&head),
                std::io::IoSlice::new(&payload),
            ];
            let frame = [&head[..], &payload[..]].concat();
            let mut done = server.write_vectored(&bufs).await.unwrap();
            // a short write leaves the rest for the next call, as h2's `poll_write_buf` does
            while done < frame.len() {
                done += server.write(&frame[done..]).await.unwrap();
            }
            sent.extend_from_slice(&head);
            sent.extend_from_slice(&payload);
        }
        server.flush().await.unwrap();
        // `SEND_BUFFER_LIMIT` holds four such records (rustls' default held three): 13
        // records leave in three writes of four and one of one
        let n = writes.load(std::sync::atomic::Ordering::Relaxed) - writes_before;
        assert_eq!(n, 4, "transport writes for 13 records");
        let mut got = vec![0u8; sent.len()];
        client.read_exact(&mut got).await.unwrap();
        assert!(got == sent, "bytes differ");
        // TLS 1.3 records: 5-byte header, then the length; 16 KiB of plaintext is
        // 16 384 + 1 (content type) + 16 (tag) = 16 401 bytes
        let wire = wire.lock().unwrap();
        let mut records = Vec::new();
        let mut rest = &wire[start..];
        while rest.len() >= 5 {
            let len = usize::from(u16::from_be_bytes([rest[3], rest[4]]));
            records.push(len);
            rest = &rest[(5 + len).min(rest.len())..];
        }
        assert_eq!(records, vec![16_401; 13], "record lengths on the wire");
    }

    /// A send buffer limit under one record (qweb's holds four; rustls allows any) still
    /// takes every write: what fits once the held records are out, never `WriteZero`.
    #[tokio::test]
    async fn a_limit_under_one_record_still_takes_writes() {
        let (mut server, mut client, _, _) = connect_counting().await;
        server.conn.set_buffer_limit(Some(4096));
        let sent: Vec<u8> = (0..50_000u32).map(|i| (i % 251) as u8).collect();
        server.write_all(&sent).await.unwrap();
        server.flush().await.unwrap();
        let mut got = vec![0u8; sent.len()];
        client.read_exact(&mut got).await.unwrap();
        assert!(got == sent, "bytes differ");
    }

    /// With `flush_after_yield` a flush first yields once, then delivers everything: a
    /// flush never hangs, and a frame written by another task in that turn joins the write.
    #[tokio::test]
    async fn flush_after_yield_yields_once_then_delivers() {
        let p = pair();
        let (mut server, mut client) = connect(&p, 1 << 20).await;
        server.set_flush_after_yield(true);
        server.write_all(b"frame-1").await.unwrap();
        let mut flush = std::pin::pin!(server.flush());
        use std::future::Future;
        let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
        assert!(
            flush.as_mut().poll(&mut cx).is_pending(),
            "the first poll yields"
        );
        assert!(matches!(
            flush.as_mut().poll(&mut cx),
            std::task::Poll::Ready(Ok(()))
        ));
        let mut got = [0u8; 7];
        client.read_exact(&mut got).await.unwrap();
        assert_eq!(&got, b"frame-1");
        // nothing to send: no yield
        let mut flush = std::pin::pin!(server.flush());
        assert!(matches!(
            flush.as_mut().poll(&mut cx),
            std::task::Poll::Ready(Ok(()))
        ));
    }

    #[tokio::test]
    async fn a_peer_that_leaves_mid_handshake_is_an_error() {
        let p = pair();
        let (s, mut c) = tokio::io::duplex(4096);
        c.write_all(&[0x16, 0x03, 0x01, 0x02, 0x00, 0x01])
            .await
            .unwrap();
        drop(c);
        let r = tokio::time::timeout(
            std::time::Duration::from_secs(5),
            accept(s, p.server.clone(), Driver::Direct),
        )
        .await
        .expect("no hang");
        let e = r.err().expect("an error");
        assert!(matches!(e, HandshakeError::PeerClosed), "{e:?}");
        // as an io::Error: its kind, and the typed error as its source
        let e = std::io::Error::from(e);
        assert_eq!(e.kind(), std::io::ErrorKind::UnexpectedEof, "{e}");
        let inner = e.get_ref().and_then(|s| s.downcast_ref::<HandshakeError>());
        assert!(matches!(inner, Some(HandshakeError::PeerClosed)), "{e:?}");
    }

    /// Garbage instead of a ClientHello: a TLS error (and an alert), not a hang.
    #[tokio::test]
    async fn garbage_is_refused() {
        let p = pair();
        let (s, mut c) = tokio::io::duplex(4096);
        c.write_all(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
            .await
            .unwrap();
        let r = tokio::time::timeout(
            std::time::Duration::from_secs(5),
            accept(s, p.server.clone(), Driver::Direct),
        )
        .await
        .expect("no hang");
        let e = r.err().expect("an error");
        assert!(matches!(e, HandshakeError::Tls(_)), "{e:?}");
        assert_eq!(
            std::io::Error::from(e).kind(),
            std::io::ErrorKind::InvalidData
        );
    }

    /// A client whose only cipher suite needs an RSA key, against the ECDSA certificate: no
    /// key to match, refused as a TLS error that says so (the alert reaches the client).
    #[tokio::test]
    async fn a_client_with_no_suite_for_the_key_is_refused() {
        let p = pair();
        let mut only_rsa = provider();
        only_rsa.cipher_suites =
            vec![rustls::crypto::aws_lc_rs::cipher_suite::TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256];
        let client = rustls::ClientConfig::builder_with_provider(Arc::new(only_rsa))
            .with_protocol_versions(&[&rustls::version::TLS12])
            .unwrap()
            .with_root_certificates(rustls::RootCertStore::empty())
            .with_no_client_auth();
        let client = tokio_rustls::TlsConnector::from(Arc::new(client));
        let (s, c) = tokio::io::duplex(4096);
        let name = rustls::pki_types::ServerName::try_from("localhost").unwrap();
        let (server, client) = tokio::time::timeout(std::time::Duration::from_secs(5), async {
            tokio::join!(
                accept(s, p.server.clone(), Driver::Direct),
                client.connect(name, c)
            )
        })
        .await
        .expect("no hang");
        assert!(client.is_err());
        let e = server.err().expect("an error");
        assert!(
            matches!(
                e,
                HandshakeError::Tls(rustls::Error::PeerIncompatible(
                    rustls::PeerIncompatible::NoCipherSuitesInCommon
                ))
            ),
            "{e:?}"
        );
    }

    /// A TCP socket that counts the reads it is asked for.
    struct CountingReads {
        inner: tokio::net::TcpStream,
        reads: Arc<std::sync::atomic::AtomicUsize>,
    }

    impl tokio::io::AsyncRead for CountingReads {
        fn poll_read(
            mut self: std::pin::Pin<&mut Self>,
            cx: &mut std::task::Context<'_>,
            buf: &mut tokio::io::ReadBuf<'_>,
        ) -> std::task::Poll<std::io::Result<()>> {
            self.reads
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            std::pin::Pin::new(&mut self.inner).poll_read(cx, buf)
        }
    }

    impl tokio::io::AsyncWrite for CountingReads {
        fn poll_write(
            mut self: std::pin::Pin<&mut Self>,
            cx: &mut std::task::Context<'_>,
            buf: &[u8],
        ) -> std::task::Poll<std::io::Result<usize>> {
            std::pin::Pin::new(&mut self.inner).poll_write(cx, buf)
        }
        fn poll_flush(
            mut self: std::pin::Pin<&mut Self>,
            cx: &mut std::task::Context<'_>,
        ) -> std::task::Poll<std::io::Result<()>> {
            std::pin::Pin::new(&mut self.inner).poll_flush(cx)
        }
        fn poll_shutdown(
            mut self: std::pin::Pin<&mut Self>,
            cx: &mut std::task::Context<'_>,
        ) -> std::task::Poll<std::io::Result<()>> {
            std::pin::Pin::new(&mut self.inner).poll_shutdown(cx)
        }
    }

    impl crate::handshake::Transport for CountingReads {
        fn poll_peer_gone(&self, cx: &mut std::task::Context<'_>) -> std::task::Poll<()> {
            self.inner.poll_peer_gone(cx)
        }
        fn poll_readable(&self, cx: &mut std::task::Context<'_>) -> std::task::Poll<()> {
            self.inner.poll_readable(cx)
        }
    }

    /// A connection woken while its socket is empty (an HTTP/2 connection is woken several
    /// times a request by its own streams) does not read again until the socket is readable:
    /// each such read prepared rustls' read buffer, freed after the last read found nothing
    /// (4 KiB allocated and zeroed, 6.6 times a request at h2load -m1). Real TCP sockets.
    #[tokio::test]
    async fn a_wake_without_bytes_on_the_socket_reads_nothing() {
        use std::sync::atomic::Ordering::Relaxed;
        use std::task::{Context, Waker};

        let p = pair();
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let reads = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let name = rustls::pki_types::ServerName::try_from("localhost").unwrap();
        let server = async {
            let (s, _) = listener.accept().await.unwrap();
            let io = CountingReads {
                inner: s,
                reads: reads.clone(),
            };
            accept(io, p.server.clone(), Driver::Direct).await.unwrap()
        };
        let client = async {
            let c = tokio::net::TcpStream::connect(addr).await.unwrap();
            p.client.connect(name, c).await.unwrap()
        };
        let (mut server, mut client) = tokio::join!(server, client);
        client.write_all(b"ping").await.unwrap();
        client.flush().await.unwrap();
        let mut b = [0u8; 4];
        server.read_exact(&mut b).await.unwrap();
        assert_eq!(&b, b"ping");

        // the read that finds the socket empty, then ten wakes with nothing new on it
        let mut cx = Context::from_waker(Waker::noop());
        let mut one = [0u8; 1];
        let mut rb = tokio::io::ReadBuf::new(&mut one);
        let mut poll = |s: &mut super::TlsStream<CountingReads>,
                        rb: &mut tokio::io::ReadBuf<'_>| {
            tokio::io::AsyncRead::poll_read(std::pin::Pin::new(s), &mut cx, rb)
        };
        assert!(poll(&mut server, &mut rb).is_pending());
        let before = reads.load(Relaxed);
        for _ in 0..10 {
            assert!(poll(&mut server, &mut rb).is_pending());
        }
        assert_eq!(
            reads.load(Relaxed),
            before,
            "a wake with an empty socket read it"
        );

        // bytes that arrive later are read as before
        client.write_all(b"pong").await.unwrap();
        client.flush().await.unwrap();
        server.read_exact(&mut b).await.unwrap();
        assert_eq!(&b, b"pong");
        assert!(reads.load(Relaxed) > before);
    }
}
