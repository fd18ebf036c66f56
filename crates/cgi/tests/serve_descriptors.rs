//! The descriptors of `pubsub-cgi serve` holding tunnels (issue 31, part
//! 5): N tunnels on N journals cost N descriptors (their connections)
//! plus a cache bounded by `KN_OPEN_TOPICS` (at most four per kept set of
//! topic files, and a tunnel's segment for half as many), never a
//! descriptor more per tunnel (the readers' marks are bytes of one open
//! file, FORMAT.md, "Readers and checkpoints"). Counted in
//! `/proc/PID/fd`: deterministic, no timing.

use std::path::Path;
use std::time::Duration;

use kn_test_support::raw::{Conn, Tunnel};
use kn_test_support::Serve;

/// Descriptors a server opens once, lazily, after its first tunnel (the
/// readers' `.kn_readers`, the change notifier's, the sweep's files):
/// room for them, not per tunnel.
const SLACK: usize = 12;

fn start(open_topics: usize) -> (Serve, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let mut command = Serve::command_of(Path::new(env!("CARGO_BIN_EXE_pubsub-cgi")), &dir.path().join("events"), None);
    command
        .current_dir(dir.path())
        .env_remove("KN_MAX_CONNECTIONS")
        .env_remove("KN_MAX_TUNNELS")
        .env("KN_OPEN_TOPICS", open_topics.to_string());
    (Serve::spawn(command), dir)
}

fn count(serve: &Serve) -> usize {
    std::fs::read_dir(format!("/proc/{}/fd", serve.child.id())).unwrap().count()
}

/// The server's descriptors once the connections of the posts just
/// answered are closed: the client closes first and the server's side
/// goes a moment later, so a count taken at once may hold one of them
/// (CI once saw 149 gained for 150 tunnels, the `before` count holding a
/// post's connection). Counted until the same figure comes three times in
/// a row 50 ms apart, for at most 10 s.
fn descriptors(serve: &Serve) -> usize {
    let mut last = count(serve);
    let mut same = 0;
    for _ in 0..200 {
        std::thread::sleep(Duration::from_millis(50));
        let now = count(serve);
        same = if now == last { same + 1 } else { 0 };
        last = now;
        if same == 2 {
            break;
        }
    }
    last
}

fn post(serve: &Serve, body: &str) {
    let mut conn = Conn::connect(serve.addr(), Duration::from_secs(20));
    conn.send("POST", "/kn", body.as_bytes());
    let reply = conn.reply();
    assert!(reply.status_line.starts_with("HTTP/1.1 200"), "{body}: {}", reply.text());
}

fn tunnel(serve: &Serve, journal: &str) -> Tunnel {
    let mut conn = Conn::connect(serve.addr(), Duration::from_secs(20));
    conn.send("GET", &format!("/kn{journal}?kn_response_format=simple"), b"");
    let mut tunnel = conn.into_tunnel();
    assert!(tunnel.wait_for(b"status: 200 Watching topic", Duration::from_secs(20)), "no status: {}", tunnel.text());
    tunnel
}

/// Opens `n` tunnels, each on a journal of its own routed from one
/// source, posts an event to the source (each journal gets a copy: its
/// writer's files are kept, within the cache), and returns how many
/// descriptors the server gained over one tunnel already open.
fn descriptors_for(open_topics: usize, n: usize) -> usize {
    let (serve, _dir) = start(open_topics);
    let mut tunnels = vec![tunnel(&serve, "/who/first/kn_journal")];
    post(&serve, "do_method=route&kn_from=/what/src&kn_to=/who/first/kn_journal&kn_response_format=simple");
    post(&serve, "do_method=notify&kn_to=/what/src&kn_payload=warm&kn_response_format=simple");
    assert!(tunnels[0].wait_for(b"warm", Duration::from_secs(20)), "{}", tunnels[0].text());
    let before = descriptors(&serve);
    for i in 0..n {
        let journal = format!("/who/j{i}/kn_journal");
        tunnels.push(tunnel(&serve, &journal));
        post(&serve, &format!("do_method=route&kn_from=/what/src&kn_to={journal}&kn_response_format=simple"));
    }
    post(&serve, "do_method=notify&kn_to=/what/src&kn_payload=fanned&kn_response_format=simple");
    for t in &mut tunnels {
        assert!(t.wait_for(b"fanned", Duration::from_secs(20)), "{}", t.text());
    }
    descriptors(&serve) - before
}

#[test]
fn n_tunnels_on_n_journals_cost_n_descriptors_and_a_cache_bounded_by_open_topics() {
    const N: usize = 150;
    const OPEN_TOPICS: usize = 8;
    // Four per kept set, one per tunnel's kept segment (half as many).
    let cache = 4 * OPEN_TOPICS + OPEN_TOPICS / 2;
    let gained = descriptors_for(OPEN_TOPICS, N);
    assert!(gained <= N + cache + SLACK, "{N} tunnels took {gained} descriptors: more than {N} + {cache} + {SLACK}");
    assert!(gained >= N, "each tunnel holds its connection: {gained}");
}

#[test]
fn with_no_cache_a_tunnel_costs_its_connection_alone() {
    const N: usize = 100;
    let gained = descriptors_for(0, N);
    assert!(gained <= N + SLACK, "{N} tunnels took {gained} descriptors with KN_OPEN_TOPICS=0");
}
