//! Where a `serve` tunnel reads and encodes what is new: on its own task
//! while its reads are small (the fast path: a delivery to a thousand
//! tunnels then costs no hand-over to another thread and back per
//! tunnel), on the tunnel pool when a read may be large, so that a tunnel
//! catching up on large payloads never holds an async worker.
//!
//! A read may be large when the tunnel is behind: its last read stopped
//! before the end (the rest of a backlog), or its last piece had to wait
//! for room in the connection's queue (a slow client, while events piled
//! up), or it has carried a large piece ([`LARGE_PIECE`]) before (a topic
//! of large payloads: every read from then on is made on the pool). What
//! a tunnel following its topic reads after each append, one small event
//! at a time, stays on its task. The first read of a topic's first large
//! payload is still made on the task: nothing says beforehand how large
//! what is new is (RELIABILITY.md, "Classes of defects").

use std::sync::Arc;

use kn_journal::Store;

use crate::handler::TunnelReply;

/// A piece of at least this many bytes makes every later read of its
/// tunnel go to the pool.
pub(crate) const LARGE_PIECE: usize = 64 << 10;

/// What a tunnel's reads so far say of the next one.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct Reads {
    /// A piece of [`LARGE_PIECE`] or more was read.
    large: bool,
    /// The next read may find a backlog.
    behind: bool,
}

/// A read's outcome: the tunnel back, and what it read.
pub(crate) type Read = (Box<TunnelReply>, kn_journal::Result<Option<Vec<u8>>>);

impl Reads {
    /// Whether the next read is made on the pool.
    pub(crate) fn off_the_task(&self) -> bool {
        self.large || self.behind
    }

    /// The piece just read was sent; `waited`: the connection's queue had
    /// no room for it (the client is slow, events may pile up meanwhile).
    pub(crate) fn sent(&mut self, waited: bool) {
        self.behind |= waited;
    }

    /// Reads what is new in `tunnel` (see the module documentation for
    /// where); `None` when the pool could not run the read (the server is
    /// going away): end the tunnel.
    pub(crate) async fn next(&mut self, store: &Arc<Store>, pool: &tokio::runtime::Handle, mut tunnel: Box<TunnelReply>) -> Option<Read> {
        let (tunnel, chunk) = if self.off_the_task() {
            let store = store.clone();
            pool.spawn_blocking(move || {
                let chunk = tunnel.next_chunk(&store);
                (tunnel, chunk)
            })
            .await
            .ok()?
        } else {
            let chunk = tunnel.next_chunk(store);
            (tunnel, chunk)
        };
        self.note(&chunk, tunnel.caught_up());
        Some((tunnel, chunk))
    }

    fn note(&mut self, chunk: &kn_journal::Result<Option<Vec<u8>>>, caught_up: bool) {
        let read = match chunk {
            Ok(Some(piece)) => piece.len(),
            _ => 0,
        };
        self.large |= read >= LARGE_PIECE;
        self.behind = read > 0 && !caught_up;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn small_reads_of_a_tunnel_keeping_up_stay_on_its_task() {
        let mut reads = Reads::default();
        assert!(!reads.off_the_task());
        reads.note(&Ok(Some(vec![0; 100])), true);
        reads.sent(false);
        assert!(!reads.off_the_task());
        reads.note(&Ok(None), true);
        assert!(!reads.off_the_task());
    }

    #[test]
    fn a_backlog_a_slow_client_or_a_large_piece_moves_reads_to_the_pool() {
        let mut reads = Reads::default();
        reads.note(&Ok(Some(vec![0; 100])), false);
        assert!(reads.off_the_task(), "the read stopped before the end");
        reads.note(&Ok(Some(vec![0; 100])), true);
        assert!(!reads.off_the_task(), "caught up again");
        reads.sent(true);
        assert!(reads.off_the_task(), "the client made the piece wait");
        reads.note(&Ok(None), true);
        assert!(!reads.off_the_task());
        reads.note(&Ok(Some(vec![0; LARGE_PIECE])), true);
        reads.note(&Ok(Some(vec![0; 10])), true);
        assert!(reads.off_the_task(), "a topic of large payloads stays on the pool");
    }
}
