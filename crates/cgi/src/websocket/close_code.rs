//! The close codes of docs/PROTOCOL.md, "WebSocket (extension)": what
//! `socket.rs` ends a socket with, and what `budget.rs` ends a message with.

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
/// A message in progress found the body budget
/// (`KN_BODY_BUDGET_BYTES`) taken: reconnect later.
pub(crate) const TRY_AGAIN_LATER: u16 = 1013;
/// 4000 + the status of the status event that ended the tunnel: `4401`
/// (a bearer token expired, or the rules refuse an anonymous reader),
/// `4403` (the rules no longer let the reader read).
pub(crate) const STATUS_BASE: u16 = 4000;
/// No pong within `KN_WS_PONG_TIMEOUT_MS` of a ping.
pub(crate) const NO_PONG: u16 = 4408;
/// More than `KN_WS_SEND_QUEUE` bytes waited for the reader.
pub(crate) const TOO_SLOW: u16 = 4429;
