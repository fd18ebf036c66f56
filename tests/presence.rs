//! `<topic>/kn_presence` across real processes (docs/PRESENCE.md): tunnels
//! held by `pubsub.cgi` under a real Apache and by `pubsub-cgi serve` on
//! one store join and leave; a SIGKILLed tunnel process leaves within the
//! bound; two `serve`s as two hosts (each in a UTS namespace of its own,
//! with its own host name) on one store in shared mode; what each user
//! may see under the access rules; the debounce boundary.
//!
//! The API-level tests: crates/journal/tests/presence.rs.

mod e2e;
mod presence_watch;
mod support;

use std::os::unix::process::CommandExt as _;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use e2e::{KnServer, PATIENCE};
use presence_watch::Watch;
use support::{Apache, Dir, Serve};

/// The presence settings of every server here: a leave one second after
/// the last tunnel closed, a look every 100 ms.
const DEBOUNCE_MS: u64 = 1000;
const PASS_MS: u64 = 100;

fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions and cannot fail.
    unsafe { libc::geteuid() == 0 }
}

/// `serve` over `store` with the presence settings (and `debounce_ms`),
/// as the web server's user when the tests run as root (so that it and
/// Apache's CGIs share the store's files).
fn serve(store: &Path, debounce_ms: u64, extra: &[(&str, &str)]) -> Serve {
    let mut command = Serve::command(store, None);
    command.env("KN_PRESENCE_DEBOUNCE_MS", debounce_ms.to_string()).env("KN_PRESENCE_PASS_MS", PASS_MS.to_string());
    for (k, v) in extra {
        command.env(k, v);
    }
    if is_root() {
        let who = support::server_user();
        command.uid(who.uid).gid(who.gid);
    }
    Serve::spawn(command)
}

fn apache(dir: &Dir) -> Option<Apache> {
    if !support::available(support::APACHE) {
        return None;
    }
    let store = dir.store("kn_events");
    let env = format!("SetEnv KN_PRESENCE_DEBOUNCE_MS {DEBOUNCE_MS}\nSetEnv KN_PRESENCE_PASS_MS {PASS_MS}\n");
    Some(Apache::start(&support::pubsub_cgi(), &store, &env))
}

fn route(server: &impl KnServer, from: &str, to: &str, id: &str) {
    e2e::route(server, from, to, id, "");
}

#[test]
fn presence_joins_and_leaves_across_a_cgi_tunnel_and_a_serve_tunnel_on_one_store() {
    let dir = Dir::new("presence_cgi_serve");
    let Some(apache) = apache(&dir) else { return };
    let serve = serve(&dir.join("kn_events"), DEBOUNCE_MS, &[]);
    route(&apache, "/chat", "/who/a/kn_journal", "ra");
    route(&serve, "/chat", "/who/b/kn_journal", "rb");

    // A watcher through serve; anna's tunnel through Apache (a CGI).
    let mut watcher = Watch::tunnel(&serve, "/chat/kn_presence", "");
    let anna = Watch::tunnel(&apache, "/who/a/kn_journal", "");
    let join = watcher.presence("join", "/who/a/kn_journal", PATIENCE).unwrap_or_else(|| panic!("no join of the CGI tunnel\n{}", apache.log()));
    assert_eq!(join.get("kn_presence_route").as_deref(), Some("ra"), "{join:?}");
    assert!(join.get("kn_presence_since").is_some_and(|s| s.parse::<u64>().is_ok()), "{join:?}");
    // Bob's through serve.
    let bob = Watch::tunnel(&serve, "/who/b/kn_journal", "");
    watcher.presence("join", "/who/b/kn_journal", PATIENCE).expect("no join of the serve tunnel");

    // A reader through Apache (a CGI tunnel on kn_presence) starts with
    // both, then sees them leave as their tunnels close.
    let mut cgi_watcher = Watch::tunnel(&apache, "/chat/kn_presence", "&do_max_age=infinity");
    let mut start = cgi_watcher.presence_for(Duration::from_millis(500));
    start.sort();
    assert_eq!(start, [("join".to_string(), "/who/a/kn_journal".to_string()), ("join".to_string(), "/who/b/kn_journal".to_string())]);

    anna.close();
    for w in [&mut watcher, &mut cgi_watcher] {
        w.presence("leave", "/who/a/kn_journal", PATIENCE).unwrap_or_else(|| panic!("no leave of the CGI tunnel\n{}", apache.log()));
    }
    bob.close();
    for w in [&mut watcher, &mut cgi_watcher] {
        w.presence("leave", "/who/b/kn_journal", PATIENCE).expect("no leave of the serve tunnel");
    }
    // A read now: nobody (leaves are not "connected").
    let mut read = Watch::tunnel(&apache, "/chat/kn_presence", "&do_max_age=infinity&kn_expires=%2B0");
    assert_eq!(read.presence_for(Duration::from_millis(500)), []);
}

#[test]
fn presence_of_a_sigkilled_cgi_tunnel_leaves_within_the_bound() {
    let dir = Dir::new("presence_sigkill");
    let Some(apache) = apache(&dir) else { return };
    route(&apache, "/chat", "/who/k/kn_journal", "rk");
    let _victim = Watch::tunnel(&apache, "/who/k/kn_journal", "");
    let pids = e2e::processes_under(apache.dir_path());
    assert_eq!(pids.len(), 1, "one CGI tunnel expected: {pids:?}");
    let serve = serve(&dir.join("kn_events"), DEBOUNCE_MS, &[]);
    let mut watcher = Watch::tunnel(&serve, "/chat/kn_presence", "&do_max_age=infinity");
    watcher.presence("join", "/who/k/kn_journal", PATIENCE).expect("the victim joined");

    // SAFETY: kill sends a signal to a pid this test found; no memory.
    assert_eq!(unsafe { libc::kill(pids[0] as i32, libc::SIGKILL) }, 0);
    let killed = Instant::now();
    let bound = Duration::from_millis(DEBOUNCE_MS + 2 * PASS_MS);
    let leave = watcher.presence("leave", "/who/k/kn_journal", bound + PATIENCE);
    let took = killed.elapsed();
    eprintln!("a SIGKILLed CGI tunnel left {took:?} after the kill (bound: debounce + 2 × pass = {bound:?})");
    let leave = leave.expect("no leave after the SIGKILL");
    assert!(took >= Duration::from_millis(DEBOUNCE_MS), "left before the debounce: {took:?}");
    assert!(leave.get("kn_presence_left").is_some(), "{leave:?}");
}

#[test]
fn presence_reconnect_within_the_debounce_is_no_leave_and_a_longer_gap_is() {
    let dir = Dir::new("presence_debounce");
    let store = dir.store("kn_events");
    let debounce = 2000;
    let serve = serve(&store, debounce, &[]);
    route(&serve, "/chat", "/who/d/kn_journal", "rd");
    let mut watcher = Watch::tunnel(&serve, "/chat/kn_presence", "");
    let first = Watch::tunnel(&serve, "/who/d/kn_journal", "");
    watcher.presence("join", "/who/d/kn_journal", PATIENCE).expect("join");

    // Closed, and open again well within the debounce: nothing.
    first.close();
    std::thread::sleep(Duration::from_millis(200));
    let second = Watch::tunnel(&serve, "/who/d/kn_journal", "");
    let seen = watcher.presence_for(Duration::from_millis(debounce + 1000));
    assert_eq!(seen, [], "a reconnect within the debounce");

    // Closed for good: a leave, not before the debounce.
    second.close();
    let closed = Instant::now();
    watcher.presence("leave", "/who/d/kn_journal", PATIENCE).expect("leave");
    let took = closed.elapsed();
    eprintln!("left {took:?} after the tunnel closed (debounce {debounce} ms)");
    assert!(took >= Duration::from_millis(debounce), "left before the debounce: {took:?}");
}

/// Two `serve`s over one store in shared mode, each in a UTS namespace of
/// its own with its own host name (when the tests run as root; else one
/// name), both with one public URL as behind a load balancer: a tunnel
/// held on either host shows on both hosts' watchers, and a host killed
/// with SIGKILL leaves within the bound. Not a GlusterFS volume (that is
/// tests/presence_gluster.rs): the readers' locks (bytes of
/// `.kn_readers`) are the kernel's, which GlusterFS's `features/locks`
/// grants across clients the same way (SCALE-OUT.md).
#[test]
fn presence_across_two_hosts_in_shared_mode() {
    let dir = Dir::new("presence_shared");
    let store = dir.store("kn_events");
    let host = |name: &str| {
        let mut command = if is_root() && support::available("/usr/bin/unshare") {
            let mut c = Command::new("/usr/bin/unshare");
            c.args(["--uts", "sh", "-c", &format!("hostname {name} && exec \"$0\" \"$@\""), support::pubsub_cgi().to_str().unwrap()]);
            c
        } else {
            Command::new(support::pubsub_cgi())
        };
        command.args(["serve", "--listen", "127.0.0.1:0", "--public-url", "http://kn.example/kn", "--root"]).arg(&store);
        command.env_remove("KN_EVENTS").env_remove("GATEWAY_INTERFACE");
        command.env("KN_SHARED", "on").env("KN_PRESENCE_DEBOUNCE_MS", DEBOUNCE_MS.to_string()).env("KN_PRESENCE_PASS_MS", PASS_MS.to_string());
        Serve::spawn(command)
    };
    let a = host("kn-host-a");
    let mut b = host("kn-host-b");
    route(&a, "/chat", "/who/x/kn_journal", "rx");
    route(&b, "/chat", "/who/y/kn_journal", "ry");

    let mut on_a = Watch::tunnel(&a, "/chat/kn_presence", "");
    let mut on_b = Watch::tunnel(&b, "/chat/kn_presence", "");
    let x = Watch::tunnel(&a, "/who/x/kn_journal", "");
    let _y = Watch::tunnel(&b, "/who/y/kn_journal", "");
    for w in [&mut on_a, &mut on_b] {
        w.presence("join", "/who/x/kn_journal", PATIENCE).expect("x (on host a) joined");
        w.presence("join", "/who/y/kn_journal", PATIENCE).expect("y (on host b) joined");
    }
    // x's tunnel closes on host a: both hosts see it leave.
    x.close();
    for w in [&mut on_a, &mut on_b] {
        w.presence("leave", "/who/x/kn_journal", PATIENCE).expect("x left");
    }
    // Host b dies (its serve SIGKILLed, with y's tunnel): y leaves on a.
    b.child.kill().unwrap();
    let killed = Instant::now();
    on_a.presence("leave", "/who/y/kn_journal", PATIENCE).expect("y left with its host");
    eprintln!("the tunnel of a SIGKILLed host left {:?} after the kill", killed.elapsed());
}

const RULES: &str = "\
groupfile groups
allow all          /who/{user}/**   users
allow read         /chat            users
allow post,route,delete /chat       @ops
";

/// Who sees whom: a user sees the presence of the journals whose route
/// he made; one who may `route` to the topic sees all; one who may only
/// read it sees no one; anonymous may not read it.
#[test]
fn presence_shows_a_subscriber_only_to_those_who_may_see_its_route() {
    if !support::available("/usr/bin/htpasswd") {
        return;
    }
    let dir = Dir::new("presence_access");
    dir.create("access.rules", RULES);
    dir.create("groups", "ops: dora\n");
    let users = dir.join("users");
    for (i, user) in ["anna", "bob", "carl", "dora"].iter().enumerate() {
        let mut command = Command::new("/usr/bin/htpasswd");
        command.arg(if i == 0 { "-cbB" } else { "-bB" }).arg(&users).arg(user).arg(format!("{user}-pw"));
        assert!(command.stderr(std::process::Stdio::null()).status().unwrap().success());
    }
    let store = dir.store("kn_events");
    let mut command = Serve::command(&store, None);
    command.arg("--htpasswd").arg(&users).env("KN_ACCESS_RULES", dir.join("access.rules"));
    command.env("KN_PRESENCE_DEBOUNCE_MS", DEBOUNCE_MS.to_string()).env("KN_PRESENCE_PASS_MS", PASS_MS.to_string());
    let serve = Serve::spawn(command);
    let url = serve.url();
    let pw = |u: &'static str| -> (&'static str, String) { (u, format!("{u}-pw")) };
    let open = |user: &'static str, query: &str| {
        let (u, p) = pw(user);
        Watch::open(&url, query, Some((u, &p)))
    };
    // anna and bob route /chat into their journals and hold tunnels.
    let mut tunnels = Vec::new();
    for user in ["anna", "bob"] {
        let mut r = open(user, &format!("do_method=route&kn_from=/chat&kn_to=/who/{user}/kn_journal&kn_id=r{user}"));
        assert_eq!(r.next_event(PATIENCE).map(|e| e.status()).as_deref(), Some("200 Routed"), "{}", r.stream.text());
        let mut t = open(user, &format!("do_method=route&kn_from=/who/{user}/kn_journal&kn_status_from=t"));
        assert_eq!(t.next_event(PATIENCE).map(|e| e.status()).as_deref(), Some("200 Watching topic"), "{}", t.stream.text());
        tunnels.push(t);
    }
    let seen_by = |user: &'static str| {
        let mut w = open(user, "do_method=route&kn_from=/chat/kn_presence&do_max_age=infinity&kn_status_from=p");
        let status = w.next_event(PATIENCE).map(|e| e.status());
        assert_eq!(status.as_deref(), Some("200 Watching topic"), "{user}: {}", w.stream.text());
        let mut seen: Vec<String> = w.presence_for(Duration::from_millis(1500)).into_iter().map(|(_, j)| j).collect();
        seen.sort();
        seen
    };
    assert_eq!(seen_by("anna"), ["/who/anna/kn_journal"]);
    assert_eq!(seen_by("bob"), ["/who/bob/kn_journal"]);
    assert_eq!(seen_by("dora"), ["/who/anna/kn_journal", "/who/bob/kn_journal"]);
    assert_eq!(seen_by("carl"), Vec::<String>::new());
    // Anonymous may not read /chat, so not its kn_presence either.
    let mut anonymous = Watch::open(&url, "do_method=route&kn_from=/chat/kn_presence&kn_status_from=p", None);
    anonymous.stream.read_for(Duration::from_secs(2));
    assert_eq!(anonymous.stream.status(), Some(401), "{}", anonymous.stream.text());
    // Nobody posts to it.
    let mut post = open("dora", "do_method=notify&kn_to=/chat/kn_presence&kn_payload=x");
    post.stream.read_for(Duration::from_secs(2));
    assert_eq!(post.stream.status(), Some(400), "{}", post.stream.text());
    drop(tunnels);
}

/// As the JavaScript client subscribes (`kn.subscribe` on `kn_presence`:
/// a route into the page's journal, read by the page's tunnel), with no
/// tunnel on `kn_presence` anywhere: serve's sweep passes the topic every
/// `KN_SWEEP_INTERVAL_MS`, and the joins and leaves travel the route.
#[test]
fn presence_through_a_static_route_into_a_watchers_journal_via_serve() {
    let dir = Dir::new("presence_routed");
    let store = dir.store("kn_events");
    let serve = serve(&store, DEBOUNCE_MS, &[("KN_SWEEP_INTERVAL_MS", "200")]);
    route(&serve, "/chat", "/who/s/kn_journal", "rs");
    let mut page = Watch::tunnel(&serve, "/who/page/kn_journal", "");
    route(&serve, "/chat/kn_presence", "/who/page/kn_journal", "presence");
    let subscriber = Watch::tunnel(&serve, "/who/s/kn_journal", "");
    let join = page.presence("join", "/who/s/kn_journal", PATIENCE).expect("a join through the route");
    assert!(join.get("kn_route_location").is_some_and(|l| l.ends_with("/chat/kn_presence/kn_routes/presence")), "{join:?}");
    subscriber.close();
    page.presence("leave", "/who/s/kn_journal", PATIENCE).expect("a leave through the route");
}
