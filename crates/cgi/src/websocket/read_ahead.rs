//! A socket's connection as the library reads it: what the client sent
//! is read from the connection in reads of up to [`READ`] bytes, kept
//! only until the library has taken it, and given back then; an idle
//! socket holds no read buffer at all (as a held SSE tunnel, which holds
//! none), where the library's own buffer would stay allocated for the
//! socket's life. The library is set to read in small steps
//! (`WsConfig::socket`), which this serves from memory, not from the
//! connection.

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

/// The most read from the connection at once.
pub(super) const READ: usize = 4096;

/// A connection whose reads go through a buffer held only while it holds
/// bytes (module documentation).
pub(super) struct ReadAhead<S> {
    inner: S,
    /// Bytes read and not yet taken, from `at` on; no capacity when none.
    ahead: Vec<u8>,
    at: usize,
}

impl<S> ReadAhead<S> {
    pub(super) fn new(inner: S) -> ReadAhead<S> {
        ReadAhead { inner, ahead: Vec::new(), at: 0 }
    }

    pub(super) fn get_ref(&self) -> &S {
        &self.inner
    }

    pub(super) fn get_mut(&mut self) -> &mut S {
        &mut self.inner
    }

    /// Bytes read from the connection and not yet taken by the library.
    #[cfg(test)]
    fn held(&self) -> usize {
        self.ahead.capacity()
    }

    fn take(&mut self, buf: &mut ReadBuf<'_>) {
        let n = (self.ahead.len() - self.at).min(buf.remaining());
        buf.put_slice(&self.ahead[self.at..self.at + n]);
        self.at += n;
        if self.at == self.ahead.len() {
            self.ahead = Vec::new();
            self.at = 0;
        }
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for ReadAhead<S> {
    fn poll_read(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        if this.at < this.ahead.len() {
            this.take(buf);
            return Poll::Ready(Ok(()));
        }
        if buf.remaining() >= READ {
            return Pin::new(&mut this.inner).poll_read(cx, buf);
        }
        // Read on the stack; only what the library does not take now is
        // kept, in a buffer of its size.
        let mut stack = [0u8; READ];
        let mut read = ReadBuf::new(&mut stack);
        match Pin::new(&mut this.inner).poll_read(cx, &mut read) {
            Poll::Ready(Ok(())) => {
                this.ahead = read.filled().to_vec();
                this.at = 0;
                if !this.ahead.is_empty() {
                    this.take(buf);
                }
                Poll::Ready(Ok(()))
            }
            other => other,
        }
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for ReadAhead<S> {
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().inner).poll_write(cx, buf)
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::AsyncReadExt;

    #[tokio::test]
    async fn what_is_read_ahead_is_given_in_order_and_then_let_go() {
        let sent: Vec<u8> = (0..3000u32).map(|i| (i % 251) as u8).collect();
        let mut reader = ReadAhead::new(&sent[..]);
        let mut got = Vec::new();
        let mut step = [0u8; 14];
        loop {
            let n = reader.read(&mut step).await.unwrap();
            if n == 0 {
                break;
            }
            got.extend_from_slice(&step[..n]);
            if got.len() == sent.len() {
                assert_eq!(reader.held(), 0, "nothing is kept once all is taken");
            }
        }
        assert_eq!(got, sent);
        assert_eq!(reader.held(), 0);
    }
}
