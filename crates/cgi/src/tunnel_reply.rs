//! A tunnel's reply (PROTOCOL.md 3.4): the first bytes at once, the
//! initial burst, then each new event of the journal, ended by its
//! `kn_expires`, the store's `tunnel_max_time`, the access rules or its
//! token's expiry. [`TunnelReply::run`] drives it in a CGI process;
//! `serve` uses the step methods.

use std::time::{Duration, Instant};

use kn_journal::{Event, Store, Topic, Tunnel};
use kn_wire::{status_event, Format};

use crate::response::Head;

/// A tunnel being served: the first bytes (status event and padding), the
/// initial burst, then events as they land. [`TunnelReply::run`] drives it
/// in a CGI process; an async server uses the step methods.
pub struct TunnelReply {
    /// Status and headers (no length: the body streams).
    pub head: Head,
    pub(crate) first: Vec<u8>,
    pub(crate) initial: Vec<u8>,
    pub(crate) tunnel: Tunnel,
    pub(crate) format: Format,
    /// What follows each burst ([`Format::tunnel_padding`]).
    pub(crate) padding: &'static [u8],
    /// The request's `kn_status_from`, for the status event that ends it.
    pub(crate) status_from: Option<Vec<u8>>,
    /// When the tunnel's `kn_expires` ends it, and its journal with it.
    pub(crate) expires: Option<Instant>,
    /// When the store's `tunnel_max_time` ends it (its journal stays).
    pub(crate) closes: Option<Instant>,
    pub(crate) keep_alive: Duration,
    /// The access rules ended the tunnel (crate::tunnel_end).
    pub(crate) ended: bool,
    /// When the bearer token it was opened with expires: it ends then
    /// with `401` (crate::tunnel_end).
    pub(crate) token_expires: Option<Instant>,
}

impl TunnelReply {
    /// The page prologue, the `200 Watching topic` status event and the
    /// padding: what must reach the client at once.
    pub fn take_first(&mut self) -> Vec<u8> {
        std::mem::take(&mut self.first)
    }

    /// The initially selected events and their padding (empty if none).
    pub fn take_initial(&mut self) -> Vec<u8> {
        std::mem::take(&mut self.initial)
    }

    /// New events since the last call, encoded with their padding; `None`
    /// when nothing is new. Never blocks for long (a file read).
    /// Once the access rules refuse the reader, the chunk is the refusal's
    /// status event and the page's end, and the next call an error.
    pub fn next_chunk(&mut self, store: &Store) -> kn_journal::Result<Option<Vec<u8>>> {
        match crate::tunnel_end::ended(self.tunnel.next(store), &mut self.ended)? {
            Ok(events) => Ok(self.encode(&events)),
            Err(refused) => Ok(Some(self.refusal(refused))),
        }
    }

    fn refusal(&self, refused: kn_journal::Error) -> Vec<u8> {
        crate::tunnel_end::refusal(self.format, refused, self.status_from.as_deref())
    }

    fn encode(&self, events: &[Event]) -> Option<Vec<u8>> {
        if events.is_empty() {
            return None;
        }
        let mut out = Vec::new();
        for e in events {
            self.format.write_event(&mut out, e);
        }
        out.extend_from_slice(self.padding);
        Some(out)
    }

    /// True when the last [`TunnelReply::next_chunk`] returned events and
    /// read all there was: await the wakeup armed before it rather than
    /// read again.
    pub fn caught_up(&self) -> bool {
        !self.ended && self.tunnel.caught_up()
    }

    /// An armed wakeup (a `Future`) for async servers: arm, call
    /// [`TunnelReply::next_chunk`], then await it.
    pub fn listen(&self) -> event_listener::EventListener {
        self.tunnel.listen()
    }

    /// The longest to wait for a wakeup before re-reading anyway.
    pub fn poll_interval(&self) -> Duration {
        self.tunnel.poll_interval()
    }

    /// True when the tunnel must be read every
    /// [`TunnelReply::poll_interval`] whatever its wakeups (a
    /// `kn_presence` tunnel: docs/PRESENCE.md).
    pub fn must_poll(&self) -> bool {
        self.tunnel.must_poll()
    }

    /// True when wakeups come from change notification; false when the
    /// tunnel must poll every [`TunnelReply::poll_interval`].
    pub fn is_notified(&self) -> bool {
        self.tunnel.is_notified()
    }

    /// When the tunnel polls: its topic, and why it has no change
    /// notification (`kn_journal::Tunnel::why_not_notified`).
    pub fn why_not_notified(&self) -> Option<(&Topic, &str)> {
        Some((self.tunnel.topic(), self.tunnel.why_not_notified()?))
    }

    /// What to write when idle, and how often.
    pub fn keep_alive(&self) -> (&'static [u8], Duration) {
        (self.format.keep_alive(), self.keep_alive)
    }

    /// When the tunnel ends: at its `kn_expires`, or at the store's
    /// `tunnel_max_time` if sooner.
    pub fn deadline(&self) -> Option<Instant> {
        [self.expires, self.closes, self.token_expires].into_iter().flatten().min()
    }

    /// Ends a tunnel at its [`TunnelReply::deadline`]; returns the
    /// closing bytes of the page. When its `kn_expires` passed, the
    /// journal becomes stale at once; when the store's `tunnel_max_time`
    /// ended it, the journal stays for the client's reconnection.
    pub fn finish(&self, store: &Store) -> Vec<u8> {
        if let Some(refused) = crate::tunnel_end::token_expired(self.token_expires, self.expires) {
            return self.refusal(refused);
        }
        let expired = self.expires.is_some_and(|e| Instant::now() >= e);
        if expired && self.tunnel.topic().is_journal() {
            let _ = store.expire(self.tunnel.topic());
        }
        self.format.trailer().to_vec()
    }

    /// Ends the tunnel because the server is stopping: a `503 Service
    /// Unavailable` status event (for its `kn_status_from`) and the closing
    /// bytes of the page. The journal stays: the client reconnects at once
    /// (to the next server) and resumes from its last checkpoint.
    pub fn closing(&self) -> Vec<u8> {
        let status = status_event(503, "Service Unavailable", "the server is shutting down: reconnect", self.status_from.as_deref());
        let mut out = self.format.event(&status);
        out.extend_from_slice(self.format.trailer());
        out
    }

    /// Serves the tunnel on a blocking writer until the client goes away
    /// (a write fails) or `kn_expires` passes. Wakes on appends by any
    /// process (no polling loop where change notification works).
    pub fn run(&mut self, store: &Store, out: &mut impl std::io::Write) -> std::io::Result<()> {
        let result = self.follow(store, out);
        // A CGI process exits without dropping the tunnel: what it sent
        // is written now (receipts, docs/PRESENCE.md).
        self.tunnel.flush_receipts();
        result
    }

    fn follow(&mut self, store: &Store, out: &mut impl std::io::Write) -> std::io::Result<()> {
        let mut bytes = self.head.to_cgi_bytes(None);
        bytes.extend_from_slice(&self.take_first());
        write_flush(out, &bytes)?;
        let initial = self.take_initial();
        // A CGI tunnel is a process of its own, which Apache may end
        // without letting it write at its end: its first delivery is
        // written at once (after that, at most once per
        // `KN_RECEIPTS_FLUSH_MS`), so that a short-lived tunnel's
        // "sent" is not lost. `serve`, holding thousands of tunnels,
        // waits the interval (docs/PRESENCE.md, "Receipts").
        let mut first_delivery = true;
        if !initial.is_empty() {
            write_flush(out, &initial)?;
            self.tunnel.flush_receipts();
            first_delivery = false;
        }
        let (keep_alive, every) = self.keep_alive();
        let mut last_write = Instant::now();
        loop {
            let now = Instant::now();
            if let Some(deadline) = self.deadline() {
                if now >= deadline {
                    let trailer = self.finish(store);
                    return write_flush(out, &trailer);
                }
            }
            let until_keep_alive = every.saturating_sub(now.duration_since(last_write));
            let wait = self.deadline().map(|d| d.saturating_duration_since(now)).unwrap_or(until_keep_alive).min(until_keep_alive);
            let events = match crate::tunnel_end::ended(self.tunnel.wait(store, wait), &mut self.ended).map_err(std::io::Error::other)? {
                Ok(events) => events,
                Err(refused) => return write_flush(out, &self.refusal(refused)),
            };
            if let Some(chunk) = self.encode(&events) {
                write_flush(out, &chunk)?;
                last_write = Instant::now();
                if first_delivery {
                    self.tunnel.flush_receipts();
                    first_delivery = false;
                }
            } else if last_write.elapsed() >= every {
                write_flush(out, keep_alive)?;
                last_write = Instant::now();
            }
        }
    }
}

fn write_flush(out: &mut impl std::io::Write, bytes: &[u8]) -> std::io::Result<()> {
    out.write_all(bytes)?;
    out.flush()
}
