//! What a `kn_presence` reader costs a publisher (docs/PRESENCE.md): a
//! topic routed into N journals (1,000 by default), each with a live
//! tunnel; one thread posts to the topic as fast as it can, in rounds that
//! alternate without and with a tunnel on the topic's `kn_presence` (whose
//! presence pass looks at the N journals every `KN_PRESENCE_PASS_MS`,
//! 1 s by default). Prints the publish rate of each round and the ratio
//! (with / without: 1.00 is "costs nothing").
//!
//! ```text
//! cargo run --release -p kn-journal --example presence_cost -- [SUBSCRIBERS] [ROUNDS] [SECONDS]
//! ```

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use kn_journal::{Config, Event, Selection, Store, Topic};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let subscribers: usize = args.next().map_or(Ok(1000), |a| a.parse())?;
    let rounds: usize = args.next().map_or(Ok(3), |a| a.parse())?;
    let seconds: f64 = args.next().map_or(Ok(4.0), |a| a.parse())?;
    let dir = tempfile::tempdir()?;
    let mut config = Config::from_env()?;
    config.root = dir.path().join("kn_events");
    let store = Arc::new(Store::open_with(config)?);
    let topic = Topic::parse("/bench/chat")?;
    let mut tunnels = Vec::with_capacity(subscribers);
    for n in 0..subscribers {
        let journal = Topic::parse(&format!("/who/u{n}/kn_journal"))?;
        store.route(&topic, journal.as_str().as_bytes(), event(&format!("r{n}")))?;
        tunnels.push(store.tunnel(&journal, &Selection::default())?.tunnel);
    }
    println!("{subscribers} subscribers with live tunnels; {rounds} rounds of {seconds} s each way, alternating");
    let (mut without, mut with) = (Vec::new(), Vec::new());
    let mut posted = 0u64;
    for round in 0..rounds {
        without.push(publish_for(&store, &topic, seconds, &mut posted)?);
        let stop = Arc::new(AtomicBool::new(false));
        let reader = {
            let (store, stop, presence) = (store.clone(), stop.clone(), topic.presence());
            std::thread::spawn(move || -> kn_journal::Result<usize> {
                let start = store.tunnel(&presence, &Selection::all())?;
                let mut seen = start.initial.events.len();
                let mut tunnel = start.tunnel;
                while !stop.load(Ordering::Relaxed) {
                    seen += tunnel.wait(&store, Duration::from_millis(100))?.len();
                }
                Ok(seen)
            })
        };
        with.push(publish_for(&store, &topic, seconds, &mut posted)?);
        stop.store(true, Ordering::Relaxed);
        let seen = reader.join().map_err(|_| "the presence reader panicked")??;
        println!(
            "round {}: without {:.1} posts/s, with a presence reader {:.1} posts/s (it saw {seen} presence events)",
            round + 1,
            without[round],
            with[round]
        );
        // Keep the subscribers' journals fresh (their heartbeat) and read.
        for t in &mut tunnels {
            t.next(&store)?;
        }
    }
    // What one pass costs whoever runs it (a tunnel on kn_presence, once
    // every KN_PRESENCE_PASS_MS), with nothing to post.
    let passes = 20;
    let started = Instant::now();
    for _ in 0..passes {
        store.presence_pass(&topic.presence())?;
    }
    println!("one presence pass over {subscribers} subscribers, nothing changed: {:.2} ms", started.elapsed().as_secs_f64() * 1000.0 / passes as f64);
    let median = |v: &mut Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    let (a, b) = (median(&mut without), median(&mut with));
    println!("median: without {a:.1} posts/s, with {b:.1} posts/s; ratio with/without {:.3}", b / a);
    Ok(())
}

/// Posts to `topic` for `seconds`; the rate.
fn publish_for(store: &Store, topic: &Topic, seconds: f64, posted: &mut u64) -> kn_journal::Result<f64> {
    let started = Instant::now();
    let mut n = 0u64;
    while started.elapsed().as_secs_f64() < seconds {
        *posted += 1;
        let mut e = event(&format!("e{posted}"));
        e.set("kn_payload", "hello");
        store.notify(topic, e)?;
        n += 1;
    }
    Ok(n as f64 / started.elapsed().as_secs_f64())
}

fn event(id: &str) -> Event {
    let mut e = Event::new();
    e.set("kn_id", id);
    e
}
