//! A socket followed by its connection's task, once hyper has written the
//! `101`: the tunnel's pieces sent as text frames, the client's requests
//! answered, pings, the send-queue bound, and the close that ends it with
//! a code saying why (docs/PROTOCOL.md, "WebSocket (extension)").
//!
//! One task per socket, as a held SSE tunnel: it waits for the journal's
//! wakeup, a frame from the client, the connection taking what is
//! queued, a timer or the server's stop, whichever comes first. A tunnel
//! catching up on a backlog reads its next part only once the connection
//! took the last (the journal is the queue, on disk); a new event is
//! queued at once, and one that finds more than `KN_WS_SEND_QUEUE` bytes
//! still waiting for a reader that takes nothing closes the socket: a
//! slow reader never grows the server, and resumes from its checkpoint
//! when it reconnects.
//!
//! The server's frames are written here, not by the library, which keeps
//! its write buffer at the largest frame it ever sent (a socket that once
//! carried a 1 MiB event would hold 1 MiB for the rest of its life): what
//! the connection does not take at once waits in a buffer of this task,
//! given back once it is empty, as a held SSE tunnel's pieces. The
//! library reads and answers the client's control frames (pong, close);
//! its few bytes and these never interleave, since the client is read
//! only when nothing of ours is waiting, and ours are written only once
//! the library's are out.

use std::future::poll_fn;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, Waker};

use futures_util::{Sink, Stream};
use tokio::io::AsyncWrite;
use tokio::time::Instant;
use tokio_tungstenite::tungstenite::protocol::frame::coding::{CloseCode, Data as OpData, OpCode};
use tokio_tungstenite::tungstenite::protocol::frame::{Frame, FrameHeader};
use tokio_tungstenite::tungstenite::protocol::{CloseFrame, Role};
use tokio_tungstenite::tungstenite::{Error as WsError, Message, Utf8Bytes};
use tokio_tungstenite::WebSocketStream;

use super::budget::Budgeted;
use super::read_ahead::ReadAhead;
use super::frames;
use super::{Pending, Server, WsConfig};
use crate::handler::{AfterReply, Reply, TunnelReply};
use crate::request::Request;
use crate::serve_held::ConnIo;
use crate::serve_tunnel::Reads;

type Socket = WebSocketStream<ReadAhead<Budgeted>>;

/// The close codes of docs/PROTOCOL.md, "WebSocket (extension)".
use super::close_code as code;

/// Why a socket ends.
enum End {
    /// Send a close frame with this code and reason.
    Close(u16, String),
    /// The client closed, or the connection is gone: nothing to say.
    Gone,
}

/// What the socket did while the task waited.
enum Step {
    Flushed(Result<(), WsError>),
    Wrote(std::io::Result<usize>),
    Incoming(Option<Result<Message, WsError>>),
}

/// Follows the socket of `pending` on `io` until it ends.
pub(super) async fn follow(server: Arc<Server>, pending: Pending, io: ConnIo, config: &'static WsConfig) {
    let Pending { tunnel, permit, who } = pending;
    let io = ReadAhead::new(Budgeted::new(io, server.clone()));
    let mut ws = WebSocketStream::from_raw_socket(io, Role::Server, Some(config.socket())).await;
    let mut socket = Following { server: server.clone(), ws: &mut ws, who, config, pending: Vec::new(), library_owes: false };
    let (end, tunnel) = socket.run(tunnel).await;
    // The close frame after what is queued, and the client's in answer,
    // for a moment at most: a reader that takes nothing is then dropped.
    if let End::Close(code, reason) = end {
        let frame = CloseFrame { code: CloseCode::from(code), reason: reason.into() };
        // Boxed, as the rare paths of `run`: a held socket's state is
        // only what it needs while it waits.
        let _ = tokio::time::timeout(config.pong_timeout, Box::pin(socket.close(frame))).await;
    }
    // Its watch and reader's mark are let go off the event loop, as a
    // held tunnel's.
    server.readers.handle().spawn_blocking(move || drop((tunnel, permit)));
}

/// A tunnel, or none when a pool task holding it failed.
type Kept = Option<Box<TunnelReply>>;

fn kept(tunnel: Box<TunnelReply>) -> Kept {
    Some(tunnel)
}

struct Following<'a> {
    server: Arc<Server>,
    ws: &'a mut Socket,
    who: super::Who,
    config: &'static WsConfig,
    /// Bytes of whole frames the connection has not taken yet (at most
    /// `KN_WS_SEND_QUEUE` and one frame); empty, with no capacity, when
    /// it took everything.
    pending: Vec<u8>,
    /// The library has a pong or a close's answer to write (it goes
    /// before anything of ours).
    library_owes: bool,
}

impl Following<'_> {
    async fn run(&mut self, mut tunnel: Box<TunnelReply>) -> (End, Kept) {
        let store = self.server.store.clone();
        let reader = self.server.readers.handle();
        let mut closing = self.server.closing.clone();
        for piece in [tunnel.take_first(), tunnel.take_initial()] {
            if let Err(end) = self.send_piece(&piece) {
                return (end, kept(tunnel));
            }
        }
        let poll = if tunnel.is_notified() && !tunnel.must_poll() { self.config.ping_every } else { tunnel.poll_interval() };
        let deadline = tunnel.deadline().map(Instant::from_std);
        let mut reads = Reads::default();
        let mut last_heard = Instant::now();
        let mut ping_sent: Option<Instant> = None;
        // A backlog is read on once the socket took the last part of it.
        let mut backlog = false;
        loop {
            if closing.is_closing() {
                let _ = self.send_piece(&tunnel.closing());
                return (End::Close(code::GOING_AWAY, "the server is stopping: reconnect".into()), kept(tunnel));
            }
            // Armed before the read, so that nothing landing after the
            // read goes unnoticed.
            let listener = tunnel.listen();
            if !backlog || self.drained() {
                let Some((back, chunk)) = reads.next(&store, &reader, tunnel).await else {
                    return (End::Close(code::GOING_AWAY, "the server is stopping: reconnect".into()), None);
                };
                tunnel = back;
                match chunk {
                    Ok(Some(piece)) => {
                        if let Err(end) = self.send_piece(&piece) {
                            return (end, kept(tunnel));
                        }
                        reads.sent(!self.drained());
                        if tunnel.ended {
                            return (ended_by(&piece), kept(tunnel));
                        }
                        backlog = !tunnel.caught_up();
                    }
                    Ok(None) => backlog = false,
                    Err(err) => return (End::Close(code::INTERNAL, reason(&err.to_string())), kept(tunnel)),
                }
            }
            let now = Instant::now();
            if deadline.is_some_and(|d| now >= d) {
                let store = store.clone();
                let (back, piece) = match reader.spawn_blocking(move || { let piece = tunnel.finish(&store); (tunnel, piece) }).await {
                    Ok(done) => done,
                    Err(_) => return (End::Gone, None),
                };
                tunnel = back;
                let _ = self.send_piece(&piece);
                return (ended_by(&piece), kept(tunnel));
            }
            if backlog && self.drained() {
                continue;
            }
            if let Some(sent) = ping_sent {
                if now >= sent + self.config.pong_timeout {
                    return (End::Close(code::NO_PONG, "no pong: the connection seems lost".into()), kept(tunnel));
                }
            } else if now >= last_heard + self.config.ping_every {
                if let Err(end) = self.queue(Frame::ping(Vec::new())) {
                    return (end, kept(tunnel));
                }
                ping_sent = Some(now);
            }
            let mut wake = now + poll;
            wake = wake.min(match ping_sent {
                Some(sent) => sent + self.config.pong_timeout,
                None => last_heard + self.config.ping_every,
            });
            if let Some(d) = deadline {
                wake = wake.min(d);
            }
            let (owes, pending) = (self.library_owes, &self.pending);
            let ws = &mut *self.ws;
            let step = poll_fn(|cx| {
                if owes {
                    return Pin::new(&mut *ws).poll_flush(cx).map(Step::Flushed);
                }
                if !pending.is_empty() {
                    return Pin::new(ws.get_mut()).poll_write(cx, pending).map(Step::Wrote);
                }
                Pin::new(&mut *ws).poll_next(cx).map(Step::Incoming)
            });
            tokio::select! {
                step = step => match step {
                    Step::Flushed(Ok(())) => self.library_owes = false,
                    Step::Flushed(Err(_)) | Step::Wrote(Ok(0)) | Step::Wrote(Err(_)) => return (End::Gone, kept(tunnel)),
                    Step::Wrote(Ok(n)) => self.took(n),
                    Step::Incoming(None) => return (End::Gone, kept(tunnel)),
                    Step::Incoming(Some(Err(err))) => {
                        let end = match self.ws.get_ref().get_ref().refused() {
                            Some((code, why)) => End::Close(*code, reason(why)),
                            None => refused_frame(err),
                        };
                        return (end, kept(tunnel));
                    }
                    Step::Incoming(Some(Ok(message))) => {
                        last_heard = Instant::now();
                        ping_sent = None;
                        // Boxed: a request's state (its frame, its
                        // answers, the pool's handle) is held only while
                        // it is answered, not by every idle socket.
                        if let Err(end) = Box::pin(self.incoming(message)).await {
                            return (end, kept(tunnel));
                        }
                    }
                },
                _ = listener => {}
                _ = tokio::time::sleep_until(wake) => {}
                _ = closing.wait() => {}
            }
        }
    }

    /// Queues the JSON objects of a tunnel's piece, one text frame each,
    /// framed where they lie (the `data:` line is the frame's payload as
    /// it is: no copy of its own, no re-encoding), and writes them in one
    /// write, as a held SSE tunnel writes a piece.
    fn send_piece(&mut self, piece: &[u8]) -> Result<(), End> {
        let was_empty = self.pending.is_empty();
        // Room for the piece's frames at once (a frame's header is no
        // longer than the `data: ` and newline it replaces, but for 10
        // bytes of a frame over 64 KiB).
        self.pending.reserve(piece.len().min(self.config.send_queue));
        for object in frames::objects(piece) {
            self.make_room(text_header().len(object.len() as u64) + object.len())?;
            text_header().format(object.len() as u64, &mut self.pending).map_err(|_| End::Gone)?;
            self.pending.extend_from_slice(object.as_bytes());
        }
        if self.pending.is_empty() {
            // A piece with no object (a keep-alive): no room kept.
            self.pending = Vec::new();
        } else if was_empty && !self.library_owes {
            self.write_now()?;
        }
        Ok(())
    }

    /// Room for a frame of `len` bytes: what waits is written as far as
    /// the connection takes it when the frame would bring it past
    /// `KN_WS_SEND_QUEUE`, and if the frame still finds more than that
    /// waiting, the socket ends.
    fn make_room(&mut self, len: usize) -> Result<(), End> {
        if self.pending.is_empty() || self.pending.len() + len <= self.config.send_queue {
            return Ok(());
        }
        if !self.library_owes {
            self.write_now()?;
        }
        if !self.pending.is_empty() && self.pending.len() + len > self.config.send_queue {
            return Err(End::Close(
                code::TOO_SLOW,
                format!("more than {} bytes waited for this reader (KN_WS_SEND_QUEUE): reconnect from your last checkpoint", self.config.send_queue),
            ));
        }
        Ok(())
    }

    /// Everything queued reached the connection.
    fn drained(&self) -> bool {
        self.pending.is_empty() && !self.library_owes
    }

    /// Queues `frame` without waiting: written at once as far as the
    /// connection takes it, the rest kept. A frame that finds more than
    /// `KN_WS_SEND_QUEUE` bytes still waiting ends the socket.
    fn queue(&mut self, frame: Frame) -> Result<(), End> {
        self.make_room(frame.len())?;
        let was_empty = self.pending.is_empty();
        frame.format(&mut self.pending).map_err(|_| End::Gone)?;
        if was_empty && !self.library_owes {
            self.write_now()?;
        }
        Ok(())
    }

    /// Writes what is waiting as far as the connection takes it now.
    fn write_now(&mut self) -> Result<(), End> {
        let mut cx = Context::from_waker(Waker::noop());
        while !self.pending.is_empty() {
            match Pin::new(self.ws.get_mut()).poll_write(&mut cx, &self.pending) {
                Poll::Ready(Ok(0)) | Poll::Ready(Err(_)) => return Err(End::Gone),
                Poll::Ready(Ok(n)) => self.took(n),
                Poll::Pending => break,
            }
        }
        Ok(())
    }

    /// The connection took the first `n` bytes waiting.
    fn took(&mut self, n: usize) {
        self.pending.drain(..n.min(self.pending.len()));
        if self.pending.is_empty() {
            // Given back: a large frame's room is not kept.
            self.pending = Vec::new();
        }
    }

    /// Ends the socket with `frame`: what is queued, then the close, then
    /// the client's answer.
    async fn close(&mut self, frame: CloseFrame) {
        if futures_util::SinkExt::flush(&mut *self.ws).await.is_err() {
            return;
        }
        let pending = std::mem::take(&mut self.pending);
        if tokio::io::AsyncWriteExt::write_all(self.ws.get_mut(), &pending).await.is_err() {
            return;
        }
        let _ = self.ws.close(Some(frame)).await;
        while let Some(Ok(_)) = futures_util::StreamExt::next(&mut *self.ws).await {}
    }

    /// A frame from the client: a request (text), or what the library
    /// answers itself (ping, close).
    async fn incoming(&mut self, message: Message) -> Result<(), End> {
        match message {
            Message::Text(text) => self.request(text).await,
            Message::Binary(_) => Err(End::Close(code::UNSUPPORTED, "requests are text frames".into())),
            // Its pong (or the close's answer) waits in the library.
            Message::Ping(payload) => {
                self.ws.get_mut().get_mut().control_done(payload.len());
                self.library_owes = true;
                Ok(())
            }
            Message::Close(_) => {
                self.library_owes = true;
                Ok(())
            }
            Message::Pong(payload) => {
                self.ws.get_mut().get_mut().control_done(payload.len());
                Ok(())
            }
            Message::Frame(_) => Ok(()),
        }
    }

    /// Answers one request of the client with its status events, made by
    /// the handler on the request pool as a form POST would be.
    async fn request(&mut self, text: Utf8Bytes) -> Result<(), End> {
        let mut who = self.who.clone();
        // The login the socket was opened with, checked again (a cache
        // hit unless the htpasswd file changed): a password changed or a
        // user removed ends the socket, as it refuses the next form POST.
        match self.server.gate.identify(&who.headers, who.peer).await {
            Ok(Some(user)) => who.remote_user = Some(user),
            // No login among what the socket keeps (a token, which the
            // handler checks, or a trusted proxy's header): as opened.
            Ok(None) => {}
            Err(_) => {
                let status = kn_wire::status_event(401, "Unauthorized", "the login this socket was opened with is no longer valid", None);
                self.queue(text_frame(frames::answer(status, None)))?;
                return Err(End::Close(code::STATUS_BASE + 401, "the login is no longer valid: reconnect with new credentials".into()));
            }
        }
        let server = self.server.clone();
        // Parsing a frame (up to KN_WS_MAX_MESSAGE) and making the request
        // are the pool's work, never the event loop's.
        let handled = self.server.pool.spawn_blocking(move || answer(&server, &who, text.as_str())).await;
        // The message is answered: its share of the body budget is given
        // back (crate::websocket::budget).
        self.ws.get_mut().get_mut().message_done();
        let (answers, after) = handled.unwrap_or_else(|_| {
            (vec![frames::answer(kn_wire::status_event(500, "Internal Server Error", "the request handler failed (a bug: please report it)", None), None)], None)
        });
        // A new route's population, a deferred fan-out: once the answer
        // is made, as after a form request's reply.
        if let Some(after) = after.filter(|a| !a.is_empty()) {
            tokio::task::spawn_blocking(move || after.run());
        }
        for answer in answers {
            self.queue(text_frame(answer))?;
        }
        Ok(())
    }
}

/// The frames answering one text frame of the client: its request made
/// by the handler as a form POST of `who` would be, or why it is none.
fn answer(server: &Server, who: &super::Who, text: &str) -> (Vec<String>, Option<AfterReply>) {
    // One pair of the request is its format (crate::websocket::frames).
    let message = match frames::message(text, server.limits.max_elements().saturating_sub(1)) {
        Ok(message) => message,
        Err(why) => return (vec![frames::refusal(&why)], None),
    };
    let kn_id = message.kn_id.as_deref();
    let request = match Request::from_http(who.request(message.body), &server.limits) {
        Ok(request) => request,
        Err(err) => {
            let (code, why) = err.status();
            return (vec![frames::answer(kn_wire::status_event(code, why, err.message().as_bytes(), None), kn_id)], None);
        }
    };
    match server.handler.handle_deferring(&request) {
        (Reply::Done(response), after) => (frames::answers(&response.body, kn_id), Some(after)),
        (Reply::Tunnel(tunnel), _) => {
            drop(tunnel);
            (vec![frames::refusal(&frames::NotARequest::new("a tunnel does not travel on a WebSocket", kn_id))], None)
        }
    }
}

/// The header of a text frame of the server (unmasked, whole).
fn text_header() -> FrameHeader {
    FrameHeader { is_final: true, opcode: OpCode::Data(OpData::Text), mask: None, ..FrameHeader::default() }
}

/// A text frame of the server (unmasked, whole).
fn text_frame(text: impl Into<String>) -> Frame {
    Frame::message(text.into(), OpCode::Data(OpData::Text), true)
}

/// The close that follows a tunnel's last piece: `4000 +` the status of
/// a refusal in it (`4401`, `4403`), else `1000`.
fn ended_by(piece: &[u8]) -> End {
    let refused = frames::objects(piece).filter_map(frames::status_code).find(|c| (400..500).contains(c));
    match refused {
        Some(status) => End::Close(code::STATUS_BASE + status, format!("the tunnel was refused: {status}")),
        None => End::Close(code::ENDED, "the tunnel ended".into()),
    }
}

/// The close answering a frame the library refused.
fn refused_frame(err: WsError) -> End {
    match err {
        WsError::Capacity(e) => End::Close(code::TOO_BIG, reason(&format!("{e} (KN_WS_MAX_FRAME, KN_WS_MAX_MESSAGE)"))),
        WsError::Utf8(_) => End::Close(code::INVALID_DATA, "a text frame that is not UTF-8".into()),
        WsError::Protocol(e) => End::Close(code::PROTOCOL_ERROR, reason(&e.to_string())),
        _ => End::Gone,
    }
}

/// A close frame's reason holds at most 123 bytes.
fn reason(text: &str) -> String {
    let mut end = text.len().min(123);
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    text[..end].to_owned()
}
