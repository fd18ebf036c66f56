//! A socket's connection, the bytes its client sends towards a message
//! not yet whole held against `serve`'s body budget
//! (`KN_BODY_BUDGET_BYTES`, crate::serve_body), which every form POST
//! and Durable Stream body shares.
//!
//! The library gathers a message's frames until its last one; without
//! this, a client sending a message in fragments it never finishes (and
//! answering pings meanwhile) would make the server hold up to
//! `KN_WS_MAX_MESSAGE` for as long as it likes, on every socket at once.
//! A read that finds the budget taken ends the socket (`1013`, try again
//! later), as a body past it is answered `503`; what the client still
//! sends is then read and dropped, so that it gets the close rather than
//! a reset.

use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

use super::Server;
use crate::serve_body::{Held, Refused};
use crate::serve_held::ConnIo;

/// A control frame's bytes besides its payload: two of header and four
/// of mask (a control payload is at most 125 bytes).
const CONTROL_OVERHEAD: u64 = 6;

/// The connection of a socket (module documentation).
pub(super) struct Budgeted {
    io: ConnIo,
    server: Arc<Server>,
    held: Held,
    /// Bytes read since the last whole data message, its control frames
    /// left out.
    taken: u64,
    /// Why the budget refused a read: the socket is being closed.
    refused: Option<(u16, String)>,
    /// The bytes of the refused read (at most one read's, the library's
    /// read buffer), given to the library's next read: the stream stays
    /// whole for the close.
    refused_bytes: Vec<u8>,
}

impl Budgeted {
    pub(super) fn new(io: ConnIo, server: Arc<Server>) -> Budgeted {
        Budgeted { io, server, held: Held::default(), taken: 0, refused: None, refused_bytes: Vec::new() }
    }

    /// A data message was read whole (and answered): its share is given
    /// back.
    pub(super) fn message_done(&mut self) {
        self.held = Held::default();
        self.taken = 0;
    }

    /// A control frame of `payload` bytes was read: no part of a message
    /// (its share stays held until the next message, never taken twice).
    pub(super) fn control_done(&mut self, payload: usize) {
        self.taken = self.taken.saturating_sub(payload as u64 + CONTROL_OVERHEAD);
    }

    /// The close code and reason, when the budget refused a read.
    pub(super) fn refused(&self) -> Option<&(u16, String)> {
        self.refused.as_ref()
    }
}

impl AsyncRead for Budgeted {
    fn poll_read(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        if !this.refused_bytes.is_empty() {
            let n = this.refused_bytes.len().min(buf.remaining());
            buf.put_slice(&this.refused_bytes[..n]);
            this.refused_bytes.drain(..n);
            return Poll::Ready(Ok(()));
        }
        let before = buf.filled().len();
        let read = Pin::new(&mut this.io).poll_read(cx, buf);
        let n = buf.filled().len() - before;
        if !matches!(read, Poll::Ready(Ok(()))) || n == 0 || this.refused.is_some() {
            return read;
        }
        this.taken += n as u64;
        match this.server.budget.hold(&mut this.held, this.taken) {
            Ok(()) => Poll::Ready(Ok(())),
            Err(refused) => {
                let (code, why) = match refused {
                    Refused::TooLarge(why) => (super::close_code::TOO_BIG, why),
                    Refused::Busy(why) | Refused::Unreadable(why) => (super::close_code::TRY_AGAIN_LATER, why),
                };
                this.refused = Some((code, why));
                this.refused_bytes = buf.filled()[before..].to_vec();
                buf.set_filled(before);
                Poll::Ready(Err(io::Error::other("the body budget is taken (KN_BODY_BUDGET_BYTES)")))
            }
        }
    }
}

impl AsyncWrite for Budgeted {
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().io).poll_write(cx, buf)
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_shutdown(cx)
    }
}
