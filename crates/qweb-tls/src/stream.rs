//! The TLS stream: a rustls `ServerConnection` over a tokio `TcpStream`, after the handshake
//! (see `handshake`), as `AsyncRead + AsyncWrite` for hyper.

use std::io::{self, Read, Write};
use std::pin::Pin;
use std::task::{ready, Context, Poll};

use rustls::ServerConnection;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;

/// `std::io` adapter over a tokio socket's non-blocking `try_*` calls: `WouldBlock` when the
/// socket is not ready (and the readiness is then cleared, so the next `poll_*_ready`
/// registers the waker).
pub(crate) struct TryIo<'a>(pub &'a TcpStream);

impl Read for TryIo<'_> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        self.0.try_read(buf)
    }
}

impl Write for TryIo<'_> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.0.try_write(buf)
    }
    fn write_vectored(&mut self, bufs: &[io::IoSlice<'_>]) -> io::Result<usize> {
        self.0.try_write_vectored(bufs)
    }
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// A TLS connection after its handshake.
pub struct TlsStream {
    io: TcpStream,
    conn: ServerConnection,
    /// The socket reported end of stream.
    read_eof: bool,
    close_sent: bool,
}

impl TlsStream {
    pub(crate) fn new(io: TcpStream, conn: ServerConnection) -> Self {
        TlsStream {
            io,
            conn,
            read_eof: false,
            close_sent: false,
        }
    }

    /// The rustls connection (ALPN, SNI, protocol version, cipher suite).
    pub fn connection(&self) -> &ServerConnection {
        &self.conn
    }

    /// The socket.
    pub fn socket(&self) -> &TcpStream {
        &self.io
    }

    /// Writes pending TLS records to the socket until rustls has none or the socket is full.
    fn poll_write_tls(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        while self.conn.wants_write() {
            ready!(self.io.poll_write_ready(cx))?;
            match self.conn.write_tls(&mut TryIo(&self.io)) {
                Ok(0) => return Poll::Ready(Err(io::ErrorKind::WriteZero.into())),
                Ok(_) => {}
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                Err(e) => return Poll::Ready(Err(e)),
            }
        }
        Poll::Ready(Ok(()))
    }

    /// Reads TLS records from the socket into rustls and processes them. `Ready(Ok(false))`
    /// at end of stream.
    fn poll_read_tls(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<bool>> {
        loop {
            ready!(self.io.poll_read_ready(cx))?;
            match self.conn.read_tls(&mut TryIo(&self.io)) {
                Ok(0) => {
                    self.read_eof = true;
                    return Poll::Ready(Ok(false));
                }
                Ok(_) => break,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
                Err(e) => return Poll::Ready(Err(e)),
            }
        }
        if let Err(e) = self.conn.process_new_packets() {
            // send the alert rustls queued, best effort
            let _ = self.poll_write_tls(cx);
            return Poll::Ready(Err(io::Error::new(io::ErrorKind::InvalidData, e)));
        }
        Poll::Ready(Ok(true))
    }
}

impl AsyncRead for TlsStream {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = &mut *self;
        loop {
            match this.conn.reader().read(buf.initialize_unfilled()) {
                Ok(n) => {
                    // n == 0: the peer sent close_notify
                    buf.advance(n);
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
            match ready!(this.poll_read_tls(cx)) {
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

impl AsyncWrite for TlsStream {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = &mut *self;
        let mut pos = 0;
        while pos < buf.len() {
            let n = this.conn.writer().write(&buf[pos..])?;
            if n == 0 && !this.conn.wants_write() {
                return Poll::Ready(Err(io::ErrorKind::WriteZero.into()));
            }
            pos += n;
            match this.poll_write_tls(cx) {
                Poll::Ready(Ok(())) => {}
                Poll::Ready(Err(e)) => return Poll::Ready(Err(e)),
                Poll::Pending => {
                    return if pos == 0 {
                        Poll::Pending
                    } else {
                        Poll::Ready(Ok(pos))
                    }
                }
            }
        }
        Poll::Ready(Ok(pos))
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
            // rustls takes what fits in its send buffer (maybe nothing when it is full)
            let n = this.conn.writer().write_vectored(bufs)?;
            match this.poll_write_tls(cx) {
                Poll::Ready(Err(e)) => return Poll::Ready(Err(e)),
                Poll::Pending if n == 0 => return Poll::Pending,
                // the buffer was full and is now written out: try once more (an empty
                // buffer always takes something; never spin if it did not)
                Poll::Ready(Ok(())) if n == 0 => {
                    if retried {
                        return Poll::Ready(Err(io::ErrorKind::WriteZero.into()));
                    }
                    retried = true;
                }
                _ => return Poll::Ready(Ok(n)),
            }
        }
    }

    fn is_write_vectored(&self) -> bool {
        true
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = &mut *self;
        this.conn.writer().flush()?;
        this.poll_write_tls(cx)
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
