//! TLS records as the client receives them: a transport wrapper that counts the records of
//! each content type in the bytes read from the server (the 5-byte record headers of RFC 8446
//! §5.1, read as they pass; a header split across reads is followed), for tests of how a
//! server batches its writes.

use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};

use rustls::ClientConfig;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;

/// Records counted so far on one connection.
#[derive(Debug, Default)]
pub struct Counts {
    /// `application_data` records (content type 23): after the handshake, everything.
    pub application_data: AtomicUsize,
    /// Records of any type.
    pub all: AtomicUsize,
}

impl Counts {
    /// `application_data` records received so far.
    pub fn application_data(&self) -> usize {
        self.application_data.load(Ordering::Relaxed)
    }
}

/// A transport whose read side counts TLS records into [`Counts`].
pub struct RecordCounter<T> {
    inner: T,
    counts: Arc<Counts>,
    /// The record header being read (bytes so far), then the body bytes still to skip.
    head: [u8; 5],
    have: usize,
    skip: usize,
}

impl<T> RecordCounter<T> {
    /// Wraps `inner`; the counts are shared with the returned handle.
    pub fn new(inner: T) -> (Self, Arc<Counts>) {
        let counts = Arc::new(Counts::default());
        let me = RecordCounter {
            inner,
            counts: counts.clone(),
            head: [0; 5],
            have: 0,
            skip: 0,
        };
        (me, counts)
    }

    fn scan(&mut self, mut bytes: &[u8]) {
        while !bytes.is_empty() {
            if self.skip > 0 {
                let n = self.skip.min(bytes.len());
                self.skip -= n;
                bytes = &bytes[n..];
                continue;
            }
            let n = (5 - self.have).min(bytes.len());
            self.head[self.have..self.have + n].copy_from_slice(&bytes[..n]);
            self.have += n;
            bytes = &bytes[n..];
            if self.have == 5 {
                self.have = 0;
                self.skip = u16::from_be_bytes([self.head[3], self.head[4]]) as usize;
                self.counts.all.fetch_add(1, Ordering::Relaxed);
                if self.head[0] == 23 {
                    self.counts.application_data.fetch_add(1, Ordering::Relaxed);
                }
            }
        }
    }
}

impl<T: AsyncRead + Unpin> AsyncRead for RecordCounter<T> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        let r = Pin::new(&mut self.inner).poll_read(cx, buf);
        if let Poll::Ready(Ok(())) = r {
            self.scan(&buf.filled()[before..]);
        }
        r
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for RecordCounter<T> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write(cx, buf)
    }
    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }
    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

/// A TLS connection (SNI `localhost`) whose received records are counted.
pub async fn connect(
    addr: SocketAddr,
    cfg: &Arc<ClientConfig>,
) -> io::Result<(
    tokio_rustls::client::TlsStream<RecordCounter<TcpStream>>,
    Arc<Counts>,
)> {
    let (tcp, counts) = RecordCounter::new(TcpStream::connect(addr).await?);
    let tls = tokio_rustls::TlsConnector::from(cfg.clone())
        .connect(crate::tls::localhost(), tcp)
        .await?;
    Ok((tls, counts))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_split_across_reads_are_counted_once() {
        let (mut c, counts) = RecordCounter::new(());
        // two application_data records (3 and 0 bytes) and a handshake record, cut anywhere
        let bytes = [23, 3, 3, 0, 3, 1, 2, 3, 23, 3, 3, 0, 0, 22, 3, 3, 0, 1, 9];
        for cut in bytes.chunks(2) {
            c.scan(cut);
        }
        assert_eq!(counts.application_data(), 2);
        assert_eq!(counts.all.load(Ordering::Relaxed), 3);
    }
}
