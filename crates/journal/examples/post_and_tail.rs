//! Posts a few events into `./kn_events` (or `$KN_EVENTS`) and follows the
//! topic like `tail -f`, printing each event as it lands, including those
//! posted by other processes.
//!
//! ```text
//! cargo run -p kn-journal --example post_and_tail -- /what/chat
//! ```

use std::time::Duration;

use kn_journal::{Config, Event, Selection, Store, Topic};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let name = std::env::args().nth(1).unwrap_or_else(|| "/what/chat".to_string());
    let topic = Topic::parse(&name)?;
    let store = Store::open_with(Config::from_env()?)?;
    let start = store.tunnel(&topic, &Selection { max_n: Some(10), ..Selection::none() })?;
    for e in &start.initial.events {
        print_event(e);
    }
    let mut tunnel = start.tunnel;
    for i in 1..=3 {
        let mut e = Event::new();
        e.set("kn_payload", format!("hello {i} from process {}", std::process::id()));
        store.notify(&topic, e)?;
    }
    println!("following {topic} (Ctrl-C to stop)...");
    loop {
        for e in tunnel.wait(&store, Duration::from_secs(30))? {
            print_event(&e);
        }
    }
}

fn print_event(e: &Event) {
    println!(
        "[{}] {}: {}",
        e.get_str("kn_route_checkpoint").unwrap_or_default(),
        e.get_str("kn_id").unwrap_or_default(),
        String::from_utf8_lossy(e.payload())
    );
}
