//! A socket followed by its connection's task, once hyper has written the
//! `101`: the tunnel's pieces sent as text frames, the client's requests
//! answered, pings, the send-queue bound, and the close that ends it with
//! a code saying why (docs/PROTOCOL.md, "WebSocket (extension)").
//!
//! One task per socket, as a held SSE tunnel: it waits for the journal's
//! wakeup, a frame from the client, the socket taking what is queued, a
//! timer or the server's stop, whichever comes first. A tunnel catching
//! up on a backlog reads its next part only once the socket took the last
//! (the journal is the queue, on disk); a new event is queued at once,
//! and one that would make more than `KN_WS_SEND_QUEUE` bytes wait for a
//! reader that takes nothing closes the socket: a slow reader never grows
//! the server, and resumes from its checkpoint when it reconnects.

use std::future::poll_fn;
use std::pin::Pin;
use std::sync::Arc;
use std::task::Poll;

use futures_util::{Sink, Stream};
use tokio::time::Instant;
use tokio_tungstenite::tungstenite::protocol::frame::coding::CloseCode;
use tokio_tungstenite::tungstenite::protocol::{CloseFrame, Role};
use tokio_tungstenite::tungstenite::{Error as WsError, Message, Utf8Bytes};
use tokio_tungstenite::WebSocketStream;

use super::frames;
use super::{Pending, Server, WsConfig};
use crate::handler::{AfterReply, Reply, TunnelReply};
use crate::request::Request;
use crate::serve_held::ConnIo;
use crate::serve_tunnel::Reads;

type Socket = WebSocketStream<ConnIo>;

/// The close codes of docs/PROTOCOL.md, "WebSocket (extension)".
pub(crate) mod code {
    /// The tunnel reached its `kn_expires` or the store's
    /// `tunnel_max_time`.
    pub(crate) const ENDED: u16 = 1000;
    /// The server is stopping (SIGTERM): reconnect, to it or another.
    pub(crate) const GOING_AWAY: u16 = 1001;
    /// A frame that breaks RFC 6455.
    pub(crate) const PROTOCOL_ERROR: u16 = 1002;
    /// A binary frame: requests are text.
    pub(crate) const UNSUPPORTED: u16 = 1003;
    /// A text frame that is not UTF-8.
    pub(crate) const INVALID_DATA: u16 = 1007;
    /// A frame or message past `KN_WS_MAX_FRAME` / `KN_WS_MAX_MESSAGE`.
    pub(crate) const TOO_BIG: u16 = 1009;
    /// The tunnel failed to read its journal.
    pub(crate) const INTERNAL: u16 = 1011;
    /// 4000 + the status of the status event that ended the tunnel: `4401`
    /// (a bearer token expired, or the rules refuse an anonymous reader),
    /// `4403` (the rules no longer let the reader read).
    pub(crate) const STATUS_BASE: u16 = 4000;
    /// No pong within `KN_WS_PONG_TIMEOUT_MS` of a ping.
    pub(crate) const NO_PONG: u16 = 4408;
    /// More than `KN_WS_SEND_QUEUE` bytes waited for the reader.
    pub(crate) const TOO_SLOW: u16 = 4429;
}

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
    Incoming(Option<Result<Message, WsError>>),
}

/// Follows the socket of `pending` on `io` until it ends.
pub(super) async fn follow(server: Arc<Server>, pending: Pending, io: ConnIo, config: WsConfig) {
    let Pending { tunnel, permit, who } = pending;
    let mut ws = WebSocketStream::from_raw_socket(io, Role::Server, Some(config.socket())).await;
    let mut socket = Following { server: server.clone(), ws: &mut ws, who, config: config.clone(), flushed: true };
    let (end, tunnel) = socket.run(tunnel).await;
    if let End::Close(code, reason) = end {
        let frame = CloseFrame { code: CloseCode::from(code), reason: reason.into() };
        // The close frame, and the client's in answer, for a moment at
        // most: a reader that takes nothing is simply dropped.
        let _ = tokio::time::timeout(config.pong_timeout, async {
            let _ = ws.close(Some(frame)).await;
            while let Some(Ok(_)) = futures_util::StreamExt::next(&mut ws).await {}
        })
        .await;
    } else {
        let _ = tokio::time::timeout(config.pong_timeout, futures_util::SinkExt::flush(&mut ws)).await;
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
    config: WsConfig,
    /// Everything queued reached the connection.
    flushed: bool,
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
            if !backlog || self.flushed {
                let Some((back, chunk)) = reads.next(&store, &reader, tunnel).await else {
                    return (End::Close(code::GOING_AWAY, "the server is stopping: reconnect".into()), None);
                };
                tunnel = back;
                match chunk {
                    Ok(Some(piece)) => {
                        if let Err(end) = self.send_piece(&piece) {
                            return (end, kept(tunnel));
                        }
                        reads.sent(!self.flushed);
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
            if backlog && self.flushed {
                continue;
            }
            if let Some(sent) = ping_sent {
                if now >= sent + self.config.pong_timeout {
                    return (End::Close(code::NO_PONG, "no pong: the connection seems lost".into()), kept(tunnel));
                }
            } else if now >= last_heard + self.config.ping_every {
                if let Err(end) = self.queue(Message::Ping(Default::default())) {
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
            let flushed = self.flushed;
            let ws = &mut *self.ws;
            let step = poll_fn(|cx| {
                if !flushed {
                    if let Poll::Ready(r) = Pin::new(&mut *ws).poll_flush(cx) {
                        return Poll::Ready(Step::Flushed(r));
                    }
                }
                Pin::new(&mut *ws).poll_next(cx).map(Step::Incoming)
            });
            tokio::select! {
                step = step => match step {
                    Step::Flushed(Ok(())) => self.flushed = true,
                    Step::Flushed(Err(_)) => return (End::Gone, kept(tunnel)),
                    Step::Incoming(None) => return (End::Gone, kept(tunnel)),
                    Step::Incoming(Some(Err(err))) => return (refused_frame(err), kept(tunnel)),
                    Step::Incoming(Some(Ok(message))) => {
                        last_heard = Instant::now();
                        ping_sent = None;
                        if let Err(end) = self.incoming(message).await {
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

    /// Queues the JSON objects of a tunnel's piece, one text frame each.
    fn send_piece(&mut self, piece: &[u8]) -> Result<(), End> {
        for object in frames::objects(piece) {
            self.queue(Message::text(object))?;
        }
        Ok(())
    }

    /// Queues `message` without waiting: written at once as far as the
    /// connection takes it, the rest kept, up to `KN_WS_SEND_QUEUE`.
    fn queue(&mut self, message: Message) -> Result<(), End> {
        self.flushed = false;
        match Pin::new(&mut *self.ws).start_send(message) {
            Ok(()) => Ok(()),
            Err(WsError::WriteBufferFull(_)) => Err(End::Close(
                code::TOO_SLOW,
                format!("more than {} bytes waited for this reader (KN_WS_SEND_QUEUE): reconnect from your last checkpoint", self.config.send_queue),
            )),
            Err(_) => Err(End::Gone),
        }
    }

    /// A frame from the client: a request (text), or what the library
    /// answers itself (ping, close).
    async fn incoming(&mut self, message: Message) -> Result<(), End> {
        match message {
            Message::Text(text) => self.request(text).await,
            Message::Binary(_) => Err(End::Close(code::UNSUPPORTED, "requests are text frames".into())),
            // Its pong (or the close's answer) waits in the library: flush.
            Message::Ping(_) | Message::Close(_) => {
                self.flushed = false;
                Ok(())
            }
            Message::Pong(_) | Message::Frame(_) => Ok(()),
        }
    }

    /// Answers one request of the client with its status events, made by
    /// the handler on the request pool as a form POST would be.
    async fn request(&mut self, text: Utf8Bytes) -> Result<(), End> {
        let who = self.who.clone();
        let server = self.server.clone();
        // Parsing a frame (up to KN_WS_MAX_MESSAGE) and making the request
        // are the pool's work, never the event loop's.
        let handled = self.server.pool.spawn_blocking(move || answer(&server, &who, text.as_str())).await;
        let (answers, after) = handled.unwrap_or_else(|_| {
            (vec![frames::answer(kn_wire::status_event(500, "Internal Server Error", "the request handler failed (a bug: please report it)", None), None)], None)
        });
        // A new route's population, a deferred fan-out: once the answer
        // is made, as after a form request's reply.
        if let Some(after) = after.filter(|a| !a.is_empty()) {
            tokio::task::spawn_blocking(move || after.run());
        }
        for answer in answers {
            self.queue(Message::text(answer))?;
        }
        Ok(())
    }
}

/// The frames answering one text frame of the client: its request made
/// by the handler as a form POST of `who` would be, or why it is none.
fn answer(server: &Server, who: &super::Who, text: &str) -> (Vec<String>, Option<AfterReply>) {
    let message = match frames::message(text) {
        Ok(message) => message,
        Err(why) => {
            let kn_id = kn_wire::Params::parse(text.as_bytes()).ok().and_then(|p| p.get("kn_id").map(<[u8]>::to_vec));
            return (vec![frames::refusal(&why, kn_id.as_deref())], None);
        }
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
            (vec![frames::refusal(&frames::NotARequest("a tunnel does not travel on a WebSocket".into()), kn_id)], None)
        }
    }
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
