//! Cross-host wake-ups pushed, where the hosts can reach each other
//! (docs/SCALE-OUT.md, "Wake-ups"): the process that reads `.changes` for
//! its host (the host's leader) binds a UDP socket on the address the
//! operator allowed (`Config::wake_addr`, `KN_WAKE_ADDR`, e.g. the host's address on the
//! cluster's network and a port) and announces it on the volume, as a
//! file named by it in `<root>/.wake/`; a process that appended to
//! `.changes` sends every other announced address a one-byte datagram,
//! which makes that host's leader read `.changes` at once instead of at
//! its next poll. The volume stays the truth (the datagram carries
//! nothing but "look now"), and the poll stays the fallback: a datagram
//! lost, a host not announced or unreachable only waits for the poll.

use std::net::{SocketAddr, UdpSocket};
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// The directory of the hosts' announcements, in the store's root.
pub(crate) const WAKE_DIR: &str = ".wake";
/// How long a process keeps the list of announced addresses before it
/// reads the directory again.
const PEERS_FOR: Duration = Duration::from_secs(1);
/// Most addresses nudged per append (a bound on a directory filled by
/// mistake).
const MOST_PEERS: usize = 64;

/// The leader's side: binds `addr` and announces it in `root`'s
/// `.wake/`. The socket answers [`wait`] calls.
pub(crate) fn listen(root: &Path, addr: SocketAddr) -> Option<UdpSocket> {
    let socket = UdpSocket::bind(addr).map_err(|e| eprintln!("kn-journal: cannot listen for wake-ups on {addr}: {e}")).ok()?;
    let dir = root.join(WAKE_DIR);
    let _ = std::fs::create_dir(&dir);
    let announced = crate::log::open_shared(&dir.join(file_name(addr)), false).and_then(|f| {
        use std::os::unix::fs::FileExt;
        f.set_len(0)?;
        f.write_all_at(addr.to_string().as_bytes(), 0)
    });
    if let Err(e) = announced {
        eprintln!("kn-journal: cannot announce {addr} in {}: {e}", dir.display());
        return None;
    }
    Some(socket)
}

/// Waits up to `every` for a datagram on `socket`: true when one came
/// (read `.changes` now), false at the timeout.
pub(crate) fn wait(socket: &UdpSocket, every: Duration) -> bool {
    if socket.set_read_timeout(Some(every.max(Duration::from_millis(1)))).is_err() {
        std::thread::sleep(every);
        return false;
    }
    let mut buf = [0u8; 16];
    let got = socket.recv(&mut buf).is_ok();
    // Several appends may have nudged at once: one read of `.changes`
    // serves them all.
    if got && socket.set_nonblocking(true).is_ok() {
        while socket.recv(&mut buf).is_ok() {}
        let _ = socket.set_nonblocking(false);
    }
    got
}

fn file_name(addr: SocketAddr) -> String {
    addr.to_string().replace([':', '[', ']'], "_")
}

/// The writer's side, kept by a store: the announced addresses, read
/// again every second, and a socket to send from.
#[derive(Default)]
pub(crate) struct Nudger {
    state: Mutex<Option<Peers>>,
}

struct Peers {
    read_at: Instant,
    addrs: Vec<SocketAddr>,
    socket: Option<UdpSocket>,
}

impl Nudger {
    /// Sends every host announced in `root`'s `.wake/` but this one's
    /// (`own`, the leader's address here) a one-byte datagram. Best
    /// effort and never blocking: a failure only leaves the poll.
    pub(crate) fn nudge(&self, root: &Path, own: Option<SocketAddr>) {
        let mut state = self.state.lock().unwrap_or_else(|p| p.into_inner());
        let stale = state.as_ref().is_none_or(|p| p.read_at.elapsed() >= PEERS_FOR);
        if stale {
            let socket = state.take().and_then(|p| p.socket).or_else(|| {
                let s = UdpSocket::bind(("0.0.0.0", 0)).ok()?;
                s.set_nonblocking(true).ok()?;
                Some(s)
            });
            *state = Some(Peers { read_at: Instant::now(), addrs: announced(&root.join(WAKE_DIR)), socket });
        }
        let Some(peers) = state.as_ref() else { return };
        let Some(socket) = peers.socket.as_ref() else { return };
        for addr in peers.addrs.iter().filter(|a| Some(**a) != own) {
            let _ = socket.send_to(b"!", addr);
        }
    }
}

/// The addresses announced in `dir` (at most [`MOST_PEERS`]).
fn announced(dir: &PathBuf) -> Vec<SocketAddr> {
    let Ok(entries) = std::fs::read_dir(dir) else { return Vec::new() };
    entries
        .flatten()
        .filter_map(|e| std::fs::read_to_string(e.path()).ok()?.trim().parse().ok())
        .take(MOST_PEERS)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_nudge_reaches_every_announced_host_but_this_one() {
        let root = tempfile::tempdir().unwrap();
        // Two free ports (a listener announces the address it was given).
        let sa = UdpSocket::bind("127.0.0.1:0").unwrap();
        let sb = UdpSocket::bind("127.0.0.1:0").unwrap();
        let (aa, ab) = (sa.local_addr().unwrap(), sb.local_addr().unwrap());
        drop((sa, sb));
        let a = listen(root.path(), aa).expect("listen a");
        let b = listen(root.path(), ab).expect("listen b");
        let nudger = Nudger::default();
        nudger.nudge(root.path(), Some(aa));
        assert!(wait(&b, Duration::from_secs(5)), "b was not nudged");
        assert!(!wait(&a, Duration::from_millis(50)), "a nudged itself");
    }

    #[test]
    fn no_announcement_no_nudge() {
        assert!(announced(&PathBuf::from("/nonexistent/.wake")).is_empty());
        Nudger::default().nudge(Path::new("/nonexistent"), None);
    }
}
