//! Deep and wide routing through the journal API: a chain of 10,000 topics
//! routed one into the next, and one topic routed to 5,000 others. Each
//! post runs on a thread with a 256 KiB stack, so forwarding whose
//! recursion grew with the chain would overflow it; peak memory (VmHWM)
//! growth is measured and bounded. Figures are printed (`--nocapture`)
//! and recorded in docs/RELIABILITY.md.

use std::path::Path;
use std::thread;
use std::time::Instant;

mod common;
use common::{ev, scratch, t};

use kn_journal::{Config, ErrorKind, Selection, Store};

const SERVER: &str = "http://test.example/kn";

/// Stack of the thread that posts: small enough that recursion growing
/// with the chain's length (or the fan-out's width) overflows it.
const SMALL_STACK: usize = 256 << 10;

/// Largest peak-RSS growth a deep or wide post may cause.
const MAX_RSS_GROWTH_KB: u64 = 200 << 10;

fn store(root: &Path) -> Store {
    let mut c = Config::new(root);
    c.reserve_bytes = 0;
    c.server_url = Some(SERVER.to_string());
    Store::open_with(c).unwrap()
}

/// Peak resident set size of this process so far, in KiB.
fn vm_hwm_kb() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find(|l| l.starts_with("VmHWM:"))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

/// Runs `f` on a thread with a [`SMALL_STACK`]; a stack overflow aborts
/// the test process, which fails the test.
fn on_small_stack<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> T {
    thread::Builder::new().stack_size(SMALL_STACK).spawn(f).unwrap().join().expect("posting thread panicked")
}

#[test]
fn a_chain_of_10000_routed_topics_delivers_to_the_last_on_a_small_stack() {
    const N: usize = 10_000;
    let dir = scratch("kn-deep-routing-");
    let store = std::sync::Arc::new(store(dir.path()));
    let started = Instant::now();
    for i in 0..N - 1 {
        let report = store.route(&t(&format!("/chain/{i}")), format!("/chain/{}", i + 1).as_bytes(), ev(&[("kn_id", "next")])).unwrap();
        assert!(!report.ignored);
    }
    let routed = started.elapsed();
    let before = vm_hwm_kb();
    let posting = store.clone();
    let started = Instant::now();
    let report = on_small_stack(move || posting.notify(&t("/chain/0"), ev(&[("kn_id", "deep"), ("kn_payload", "down the chain")])).unwrap());
    let posted = started.elapsed();
    let growth = vm_hwm_kb().saturating_sub(before);
    eprintln!(
        "chain of {N}: {} routes in {routed:?}; one post made {} writes in {posted:?}; peak RSS grew {growth} KiB (VmHWM {} KiB)",
        N - 1,
        report.writes.len(),
        vm_hwm_kb()
    );
    assert!(report.poisoned.is_empty(), "{:?}", &report.poisoned[..report.poisoned.len().min(3)]);
    let last = store.events(&t(&format!("/chain/{}", N - 1)), &Selection::all()).unwrap().events;
    assert_eq!(last.len(), 1, "the last topic of the chain got {last:?}");
    assert_eq!(last[0].payload(), b"down the chain");
    assert_eq!(last[0].get("kn_routed_from"), Some(format!("{SERVER}/chain/{}", N - 2).as_bytes()));
    assert_eq!(report.writes.iter().filter(|w| w.id == b"deep").count(), N);
    assert!(growth < MAX_RSS_GROWTH_KB, "peak RSS grew {growth} KiB");
}

#[test]
fn one_topic_routed_to_5000_others_delivers_to_all_on_a_small_stack() {
    const N: usize = 5_000;
    let dir = scratch("kn-deep-routing-");
    let store = std::sync::Arc::new(store(dir.path()));
    let started = Instant::now();
    for i in 0..N {
        store.route(&t("/wide/source"), format!("/wide/to/{i}").as_bytes(), ev(&[("kn_id", &format!("r{i}"))])).unwrap();
    }
    let routed = started.elapsed();
    assert_eq!(store.routes(&t("/wide/source")).unwrap().len(), N);
    assert!(store.config().max_forwards >= N, "max_forwards {} is below the fan-out", store.config().max_forwards);
    let before = vm_hwm_kb();
    let posting = store.clone();
    let started = Instant::now();
    let report = on_small_stack(move || posting.notify(&t("/wide/source"), ev(&[("kn_id", "wide"), ("kn_payload", "to all")])).unwrap());
    let posted = started.elapsed();
    let growth = vm_hwm_kb().saturating_sub(before);
    eprintln!(
        "fan-out of {N}: routes in {routed:?}; one post made {} writes in {posted:?}; peak RSS grew {growth} KiB",
        report.writes.len()
    );
    assert!(report.poisoned.is_empty());
    for i in 0..N {
        let got = store.events(&t(&format!("/wide/to/{i}")), &Selection::all()).unwrap().events;
        assert_eq!(got.len(), 1, "/wide/to/{i} got {got:?}");
        assert_eq!(got[0].payload(), b"to all");
    }
    assert!(growth < MAX_RSS_GROWTH_KB, "peak RSS grew {growth} KiB");
}

/// A post whose forwarding would exceed `max_forwards` stops there with an
/// error naming the limit; the posted event itself is stored.
#[test]
fn a_fan_out_beyond_max_forwards_stops_with_a_clear_error() {
    let dir = scratch("kn-deep-routing-");
    let mut c = Config::new(dir.path());
    c.reserve_bytes = 0;
    c.server_url = Some(SERVER.to_string());
    c.max_forwards = 50;
    let store = Store::open_with(c).unwrap();
    for i in 0..60 {
        store.route(&t("/fan/source"), format!("/fan/to/{i}").as_bytes(), ev(&[("kn_id", &format!("r{i}"))])).unwrap();
    }
    let err = store.notify(&t("/fan/source"), ev(&[("kn_id", "x"), ("kn_payload", "p")])).unwrap_err();
    eprintln!("fan-out of 60 over max_forwards 50: {:?} {:?}: {err}", err.kind(), err.kind().status());
    assert_eq!(err.kind(), ErrorKind::TooManyDeliveries);
    assert_eq!(err.kind().status(), (508, "Too many deliveries"));
    assert!(err.to_string().contains("more than 50 deliveries"), "{err}");
    assert_eq!(store.events(&t("/fan/source"), &Selection::all()).unwrap().events.len(), 1);
}

/// A topic takes at most `max_routes` active routes: one more is refused
/// (403), replacing an existing one (same `kn_id`) still works, and a
/// deleted route makes room.
#[test]
fn routes_beyond_max_routes_are_refused_with_403() {
    let dir = scratch("kn-deep-routing-");
    let mut c = Config::new(dir.path());
    c.reserve_bytes = 0;
    c.server_url = Some(SERVER.to_string());
    c.max_routes = 20;
    let store = Store::open_with(c).unwrap();
    let from = t("/limited");
    for i in 0..20 {
        store.route(&from, format!("/to/{i}").as_bytes(), ev(&[("kn_id", &format!("r{i}"))])).unwrap();
    }
    let err = store.route(&from, b"/to/20", ev(&[("kn_id", "r20")])).unwrap_err();
    eprintln!("route 21 of max_routes 20: {:?}: {err}", err.kind().status());
    assert_eq!(err.kind(), ErrorKind::Forbidden);
    assert_eq!(err.kind().status().0, 403);
    assert!(err.to_string().contains("maximum"), "{err}");
    store.route(&from, b"/to/elsewhere", ev(&[("kn_id", "r3")])).unwrap();
    store.delete_route(&from, b"r0", None).unwrap();
    store.route(&from, b"/to/20", ev(&[("kn_id", "r20")])).unwrap();
    assert_eq!(store.routes(&from).unwrap().len(), 20);
}
