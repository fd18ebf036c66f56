//! How `serve` holds a tunnel without hyper: once hyper has written a
//! tunnel's response head, the connection's task takes the socket back
//! from hyper (whose connection, with its two 8 KiB buffers, is dropped)
//! and writes the tunnel's pieces itself, in the framing hyper chose
//! (chunked for HTTP/1.1, close-delimited for HTTP/1.0); when the tunnel
//! ends on a connection the client keeps, the socket goes back to a new
//! hyper connection (issue 31, memory per idle subscriber).
//!
//! The hand-over, through [`ConnIo`], the wrapper hyper reads and writes
//! through, and [`HandOff`], shared by the wrapper, the request and the
//! response body:
//!
//! 1. the request opening a tunnel puts the tunnel in the [`HandOff`]
//!    ([`HandOff::arm`]) and answers hyper with the tunnel's head and an
//!    empty body of unknown length (`Body::HandOff`): hyper writes the
//!    head, and for HTTP/1.1 the terminating chunk `0\r\n\r\n`;
//! 2. from the arming on, the wrapper keeps what hyper writes (the head,
//!    a few hundred bytes) instead of sending it; the body's end marks the
//!    response complete, and hyper's next flush (made once hyper's own
//!    buffer is empty) says that all of it reached the wrapper;
//! 3. hyper's next read then finds the end of the stream: hyper closes
//!    its connection, and [`hyper::server::conn::http1::Connection`]'s
//!    `into_parts` gives the socket back, with any byte read past the
//!    request;
//! 4. the connection's task sends the head (less the terminating chunk),
//!    the tunnel's first pieces and then its events, keep-alives and end
//!    ([`follow`]), in one write each as hyper did.
//!
//! The bytes on the wire are hyper's: its head, its chunk framing
//! (`{len:X}\r\n` piece `\r\n`, no empty chunk), its terminating chunk
//! when the tunnel ends, the connection kept after it unless the head
//! said `connection: close`. What a tunnel does not cover: the Durable
//! Streams SSE reads (`/v1/stream/`) still stream through hyper, and a
//! `HEAD` of a tunnel gets its head from hyper and no tunnel (as before).

use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicU8, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};

use bytes::{Buf, Bytes};
use kn_journal::Store;
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt, ReadBuf};
use tokio::net::TcpStream;
use tokio::sync::OwnedSemaphorePermit;
use tokio::time::Instant;

use crate::handler::TunnelReply;
use crate::shutdown::Closing;

/// The most of a tunnel's response head the wrapper keeps; a longer one
/// fails the connection (hyper's heads of tunnels are a few hundred bytes).
pub(crate) const MAX_HEAD: usize = 16 << 10;

/// hyper's terminating chunk (no trailers).
const LAST_CHUNK: &[u8] = b"0\r\n\r\n";

const IDLE: u8 = 0;
/// A tunnel waits in the hand-off; hyper is writing its head.
const ARMED: u8 = 1;
/// hyper took the body's end: what is left to write is in its buffer.
const ENDED: u8 = 2;
/// hyper flushed all of it: its next read ends its connection.
const FLUSHED: u8 = 3;

/// A tunnel and its place under the cap, waiting for the socket.
pub(crate) struct Held {
    pub(crate) tunnel: Box<TunnelReply>,
    pub(crate) permit: OwnedSemaphorePermit,
}

/// What the request, the response body and the wrapper of one hyper
/// connection share (module documentation).
#[derive(Default)]
pub struct HandOff {
    state: AtomicU8,
    held: Mutex<Option<Held>>,
    /// Requests whose answer is being made ([`Answering`]): hyper must
    /// not find the end of the stream while one is (a request pipelined
    /// behind the tunnel's).
    answering: AtomicUsize,
}

/// A request being answered on a connection ([`HandOff::answering`]).
pub(crate) struct Answering(Arc<HandOff>);

impl Drop for Answering {
    fn drop(&mut self) {
        self.0.answering.fetch_sub(1, Ordering::AcqRel);
    }
}

impl HandOff {
    /// Puts `held` in the hand-off: the response now being written is
    /// the tunnel's head.
    pub(crate) fn arm(&self, held: Held) {
        *self.held.lock().unwrap_or_else(|e| e.into_inner()) = Some(held);
        self.state.store(ARMED, Ordering::Release);
    }

    /// Counts a request as being answered until the guard is dropped.
    pub(crate) fn answering(self: &Arc<Self>) -> Answering {
        self.answering.fetch_add(1, Ordering::AcqRel);
        Answering(self.clone())
    }

    /// hyper may end its connection: the tunnel's head is written and no
    /// request behind it is being answered.
    fn may_end(&self) -> bool {
        self.state.load(Ordering::Acquire) == FLUSHED && self.answering.load(Ordering::Acquire) == 0
    }

    /// A tunnel's response went out on this connection: a request
    /// pipelined behind it cannot open another.
    pub(crate) fn is_armed(&self) -> bool {
        self.state.load(Ordering::Acquire) != IDLE
    }

    /// The response body reached its end (`Body::HandOff`).
    pub(crate) fn body_ended(&self) {
        let _ = self.state.compare_exchange(ARMED, ENDED, Ordering::AcqRel, Ordering::Acquire);
    }

    /// The tunnel, once hyper has written all of its head.
    fn take(&self) -> Option<Held> {
        if self.state.load(Ordering::Acquire) != FLUSHED {
            return None;
        }
        self.held.lock().unwrap_or_else(|e| e.into_inner()).take()
    }
}

/// The socket as hyper sees it (module documentation): bytes read past a
/// tunnel's request come first; while a tunnel's head is written, writes
/// are kept in `head`.
pub(crate) struct ConnIo {
    stream: TcpStream,
    prefix: Bytes,
    handoff: Arc<HandOff>,
    head: Vec<u8>,
}

impl ConnIo {
    pub(crate) fn new(stream: TcpStream) -> ConnIo {
        ConnIo { stream, prefix: Bytes::new(), handoff: Arc::default(), head: Vec::new() }
    }

    /// A fresh hand-off for the next hyper connection on this socket.
    pub(crate) fn next_handoff(&mut self) -> Arc<HandOff> {
        self.handoff = Arc::default();
        self.handoff.clone()
    }

    /// Back from hyper: `read` is what hyper read past its last request.
    /// The tunnel hyper wrote the head of, if it did.
    pub(crate) fn back(&mut self, read: Bytes) -> Option<Held> {
        // A copy: hyper's bytes share its read buffer's whole allocation
        // (8 KiB), even when empty, which would stay as long as the tunnel.
        self.prefix = if read.is_empty() { Bytes::new() } else { Bytes::copy_from_slice(&read) };
        self.handoff.take()
    }

    /// Closes the write side as hyper does when a connection ends.
    pub(crate) async fn shut_down(mut self) {
        let _ = self.stream.shutdown().await;
    }
}

impl AsyncRead for ConnIo {
    fn poll_read(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        if this.handoff.may_end() {
            // The end of the stream, as hyper sees it: it closes. While a
            // request sent behind the tunnel's is answered, hyper reads
            // on (the rest of its body, or the client's close).
            return Poll::Ready(Ok(()));
        }
        if !this.prefix.is_empty() {
            let n = this.prefix.len().min(buf.remaining());
            buf.put_slice(&this.prefix[..n]);
            this.prefix.advance(n);
            return Poll::Ready(Ok(()));
        }
        Pin::new(&mut this.stream).poll_read(cx, buf)
    }
}

impl AsyncWrite for ConnIo {
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        if this.handoff.state.load(Ordering::Acquire) == IDLE {
            return Pin::new(&mut this.stream).poll_write(cx, buf);
        }
        if this.head.len() + buf.len() > MAX_HEAD {
            return Poll::Ready(Err(io::Error::other("a tunnel's response head is too long")));
        }
        this.head.extend_from_slice(buf);
        Poll::Ready(Ok(buf.len()))
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        // hyper flushes its writer once its own buffer is empty: after
        // the body's end, all of the tunnel's head is in `head`. Its next
        // read (this task, woken now) ends its connection.
        if this.handoff.state.compare_exchange(ENDED, FLUSHED, Ordering::AcqRel, Ordering::Acquire).is_ok() || this.handoff.may_end() {
            cx.waker().wake_by_ref();
            return Poll::Ready(Ok(()));
        }
        Pin::new(&mut this.stream).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().stream).poll_shutdown(cx)
    }
}

/// How a held tunnel's response is framed, from the head hyper wrote.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Framing {
    /// Chunked (HTTP/1.1), else delimited by the connection's close.
    pub(crate) chunked: bool,
    /// The connection stays open after the response.
    pub(crate) keep: bool,
}

/// Splits what hyper wrote for a tunnel into its head, its framing and
/// what hyper wrote after the tunnel's response: the answers to requests
/// the client sent behind it in the same read (pipelined), which hyper
/// answered at once; they go out after the tunnel's end. `None` if it is
/// not a head followed by nothing or by the terminating chunk.
pub(crate) fn framing(written: &[u8]) -> Option<(&[u8], Framing, &[u8])> {
    let end = written.windows(4).position(|w| w == b"\r\n\r\n")? + 4;
    let (head, rest) = written.split_at(end);
    let lower = head.to_ascii_lowercase();
    let has = |line: &[u8]| lower.windows(line.len()).any(|w| w == line);
    let chunked = has(b"\r\ntransfer-encoding: chunked\r\n");
    if chunked && rest.starts_with(LAST_CHUNK) {
        Some((head, Framing { chunked, keep: !has(b"\r\nconnection: close\r\n") }, &rest[LAST_CHUNK.len()..]))
    } else if !chunked && rest.is_empty() {
        Some((head, Framing { chunked, keep: false }, b""))
    } else {
        None
    }
}

/// Why [`follow`] stopped.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Ended {
    /// The response is complete and the client keeps the connection: hand
    /// the socket to hyper again.
    Keep,
    /// Close the connection.
    Close,
}

/// Serves a held tunnel on `io` until it ends: the head hyper wrote and
/// the first pieces, then the tunnel's events as they went
/// through hyper before (the same reads, keep-alives, deadline and closing
/// event), each piece in `framing`.
pub(crate) async fn follow(
    store: Arc<Store>,
    reader: tokio::runtime::Handle,
    held: Held,
    io: &mut ConnIo,
    mut closing: Closing,
) -> Ended {
    let Held { mut tunnel, permit: _permit } = held;
    let written = std::mem::take(&mut io.head);
    let Some((head, framing, pipelined)) = framing(&written) else { return Ended::Close };
    let mut out = Out { io, framing, gone: false, pipelined: pipelined.to_vec() };
    let mut first = head.to_vec();
    drop(written);
    out.frame(&mut first, &tunnel.take_first());
    out.frame(&mut first, &tunnel.take_initial());
    if out.write(first).await.is_err() {
        return Ended::Close;
    }
    let (keep_alive, every) = tunnel.keep_alive();
    // Notified tunnels re-read at each keep-alive,
    // the others every poll interval.
    let poll = if tunnel.is_notified() && !tunnel.must_poll() { every } else { tunnel.poll_interval() };
    let deadline = tunnel.deadline().map(Instant::from_std);
    let mut last_write = Instant::now();
    let mut reads = crate::serve_tunnel::Reads::default();
    loop {
        if closing.is_closing() {
            let _ = out.piece(&tunnel.closing()).await;
            // The server stops: the connection closes after the response.
            return out.end(false).await;
        }
        let listener = tunnel.listen();
        let Some((back, chunk)) = reads.next(&store, &reader, tunnel).await else { return out.end(true).await };
        tunnel = back;
        match chunk {
            Ok(Some(chunk)) => {
                match out.piece(&chunk).await {
                    Ok(waited) => reads.sent(waited),
                    Err(_) => return Ended::Close,
                }
                last_write = Instant::now();
                if !tunnel.caught_up() {
                    continue;
                }
            }
            Ok(None) => {}
            Err(_) => return out.end(true).await,
        }
        let now = Instant::now();
        if deadline.is_some_and(|d| now >= d) {
            let store = store.clone();
            if let Ok(trailer) = reader.spawn_blocking(move || tunnel.finish(&store)).await {
                if out.piece(&trailer).await.is_err() {
                    return Ended::Close;
                }
            }
            return out.end(true).await;
        }
        let keep_alive_at = last_write + every;
        if now >= keep_alive_at {
            if out.piece(keep_alive).await.is_err() {
                return Ended::Close;
            }
            last_write = now;
            continue;
        }
        let mut wake = keep_alive_at.min(now + poll);
        if let Some(d) = deadline {
            wake = wake.min(d);
        }
        tokio::select! {
            _ = listener => {}
            _ = tokio::time::sleep_until(wake) => {}
            // The client closed the connection (or sent what hyper would
            // keep for the next request): see `Out::watch`.
            gone = out.watch() => if gone { return Ended::Close },
            _ = closing.wait() => {}
        }
    }
}

/// The socket of a held tunnel, writing in its framing.
struct Out<'a> {
    io: &'a mut ConnIo,
    framing: Framing,
    /// Bytes past the request arrived: no more reads (as hyper, which
    /// stops reading mid-response once it holds some).
    gone: bool,
    /// hyper's answers to requests pipelined behind the tunnel's, sent
    /// after its end ([`framing`]).
    pipelined: Vec<u8>,
}

impl Out<'_> {
    /// Appends `piece` to `buf` in the response's framing (an empty piece
    /// is no chunk: hyper skips them too).
    fn frame(&self, buf: &mut Vec<u8>, piece: &[u8]) {
        if piece.is_empty() {
            return;
        }
        if self.framing.chunked {
            buf.extend_from_slice(format!("{:X}\r\n", piece.len()).as_bytes());
            buf.extend_from_slice(piece);
            buf.extend_from_slice(b"\r\n");
        } else {
            buf.extend_from_slice(piece);
        }
    }

    /// Sends one piece; `Ok(true)` when the client made it wait.
    async fn piece(&mut self, piece: &[u8]) -> io::Result<bool> {
        let mut buf = Vec::with_capacity(piece.len() + 12);
        self.frame(&mut buf, piece);
        self.write(buf).await
    }

    /// Writes all of `buf`; `Ok(true)` if the socket could not take it at
    /// once (a slow client).
    async fn write(&mut self, buf: Vec<u8>) -> io::Result<bool> {
        if buf.is_empty() {
            return Ok(false);
        }
        let done = match self.io.stream.try_write(&buf) {
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => 0,
            Err(e) => return Err(e),
        };
        if done == buf.len() {
            return Ok(false);
        }
        self.io.stream.write_all(&buf[done..]).await?;
        Ok(true)
    }

    /// Ends the response (its terminating chunk); `keep`: the connection
    /// may serve another request after it.
    async fn end(mut self, keep: bool) -> Ended {
        if !self.framing.chunked || self.write(LAST_CHUNK.to_vec()).await.is_err() {
            return Ended::Close;
        }
        let pipelined = std::mem::take(&mut self.pipelined);
        if self.write(pipelined).await.is_err() {
            return Ended::Close;
        }
        // Bytes of a next request already read (`gone`) go to hyper first.
        if keep && self.framing.keep {
            Ended::Keep
        } else {
            Ended::Close
        }
    }

    /// Resolves when the client closed the connection (`true`) or sent
    /// bytes, kept for the next request (`false`; never again after).
    async fn watch(&mut self) -> bool {
        if self.gone {
            return std::future::pending().await;
        }
        loop {
            if self.io.stream.readable().await.is_err() {
                return true;
            }
            let mut buf = vec![0; 4096];
            match self.io.stream.try_read(&mut buf) {
                Ok(0) => return true,
                Ok(n) => {
                    buf.truncate(n);
                    let mut prefix = std::mem::take(&mut self.io.prefix).to_vec();
                    prefix.extend_from_slice(&buf);
                    self.io.prefix = Bytes::from(prefix);
                    self.gone = true;
                    return false;
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
                Err(_) => return true,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chunked_heads_keep_the_connection_unless_it_says_close() {
        let written = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n0\r\n\r\n";
        let (head, framed, pipelined) = framing(written).unwrap();
        assert_eq!(head, &written[..written.len() - 5]);
        assert_eq!(framed, Framing { chunked: true, keep: true });
        assert!(pipelined.is_empty());
        let closing = b"HTTP/1.1 200 OK\r\nconnection: close\r\ntransfer-encoding: chunked\r\n\r\n0\r\n\r\n";
        assert_eq!(framing(closing).unwrap().1, Framing { chunked: true, keep: false });
        let mut behind = written.to_vec();
        behind.extend_from_slice(b"HTTP/1.1 200 Notified\r\ncontent-length: 0\r\n\r\n");
        assert_eq!(framing(&behind).unwrap().2, b"HTTP/1.1 200 Notified\r\ncontent-length: 0\r\n\r\n", "a pipelined answer");
    }

    #[test]
    fn http_1_0_heads_are_close_delimited() {
        let written = b"HTTP/1.0 200 OK\r\ncontent-type: text/event-stream\r\n\r\n";
        assert_eq!(framing(written).unwrap(), (&written[..], Framing { chunked: false, keep: false }, &b""[..]));
    }

    #[test]
    fn anything_else_is_refused() {
        assert!(framing(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n").is_none(), "no terminating chunk");
        assert!(framing(b"HTTP/1.0 200 OK\r\n\r\nbody").is_none(), "a body");
        assert!(framing(b"HTTP/1.1 200 OK\r\n").is_none(), "no end of head");
    }
}
