//! kn-feed end to end: RSS and Atom fixtures, from files and from a real
//! HTTP listener, run twice the way cron runs it.

mod sensors_harness;

use std::process::{Command, Output};

use sensors_harness::*;

fn kn_feed(sandbox: &Sandbox, feed: &str, target: &str) -> Output {
    let mut cmd = sensor("kn-feed");
    cmd.arg("--root").arg(sandbox.store_dir()).arg(feed).arg(target);
    sandbox.run(cmd, b"")
}

fn summary(out: &Output) -> String {
    assert_code(out, 0);
    text(&out.stdout).trim().to_string()
}

fn checkpoints(sandbox: &Sandbox, topic: &str) -> Vec<(Vec<u8>, Vec<u8>)> {
    let mut all: Vec<_> = sandbox
        .events(topic)
        .iter()
        .map(|e| (e.id().unwrap_or_default().to_vec(), e.checkpoint().unwrap_or_default().to_vec()))
        .collect();
    all.sort();
    all
}

const RSS: &str = "feed/rss2.xml";

#[test]
fn rss_items_become_events_keyed_by_guid_or_link() {
    let sandbox = Sandbox::new();
    let out = kn_feed(&sandbox, &fixture_path(RSS).display().to_string(), "/what/news");
    assert_eq!(summary(&out), "3 new or changed, 0 unchanged");
    assert_eq!(sandbox.events("/what/news").len(), 3);

    let first = sandbox.event("/what/news", "news-2004-001");
    assert_eq!(first.get_str("title").unwrap(), "Sensors land in knpubsub");
    assert_eq!(first.get_str("link").unwrap(), "http://news.example.org/2004/01/sensors");
    assert_eq!(first.get_str("published").unwrap(), "2004-01-03T10:00:00+00:00");
    assert_eq!(first.get_str("author").unwrap(), "Anna");
    assert_eq!(first.get_str("category").unwrap(), "release");
    assert_eq!(first.get_str("summary").unwrap(), "Mail, feeds and stdin now flow into the journal.");
    assert_eq!(first.get_str("kn_payload").unwrap(), "Mail, feeds and stdin now flow into the journal.");

    // No guid: the link is the id.
    let second = sandbox.event("/what/news", "http://news.example.org/2004/01/cron");
    assert_eq!(second.get_str("title").unwrap(), "Feeds every ten minutes");
    let third = sandbox.event("/what/news", "http://news.example.org/2004/01/cafe");
    assert_eq!(third.get_str("title").unwrap(), "Café opening");
    assert!(!third.contains("published") && !third.contains("updated"), "no time the feed did not give: {third:?}");
}

#[test]
fn a_second_run_posts_nothing_and_a_changed_item_is_updated() {
    let sandbox = Sandbox::new();
    let feed = sandbox.write("rss.xml", fixture(RSS));
    let feed = feed.display().to_string();
    assert_eq!(summary(&kn_feed(&sandbox, &feed, "/what/news")), "3 new or changed, 0 unchanged");
    let before = checkpoints(&sandbox, "/what/news");

    assert_eq!(summary(&kn_feed(&sandbox, &feed, "/what/news")), "0 new or changed, 3 unchanged");
    assert_eq!(checkpoints(&sandbox, "/what/news"), before, "nothing was stored again");

    let changed = String::from_utf8(fixture(RSS)).unwrap().replace("Feeds every ten minutes", "Feeds every five minutes");
    sandbox.write("rss.xml", changed);
    assert_eq!(summary(&kn_feed(&sandbox, &feed, "/what/news")), "1 new or changed, 2 unchanged");
    let events = sandbox.events("/what/news");
    assert_eq!(events.len(), 3, "the changed item replaced its event: {events:#?}");
    let updated = sandbox.event("/what/news", "http://news.example.org/2004/01/cron");
    assert_eq!(updated.get_str("title").unwrap(), "Feeds every five minutes");
    let after = checkpoints(&sandbox, "/what/news");
    let moved: Vec<_> = before.iter().zip(&after).filter(|(a, b)| a != b).map(|(a, _)| text(&a.0)).collect();
    assert_eq!(moved, ["http://news.example.org/2004/01/cron"]);
}

#[test]
fn atom_entries_with_html_content_become_text() {
    let sandbox = Sandbox::new();
    let out = kn_feed(&sandbox, &fixture_path("feed/atom.xml").display().to_string(), "/what/blog");
    assert_eq!(summary(&out), "2 new or changed, 0 unchanged");
    let one = sandbox.event("/what/blog", "urn:uuid:1225c695-cfb8-4ebb-aaaa-80da344efa6a");
    assert_eq!(one.get_str("title").unwrap(), "Atom entry one");
    assert_eq!(one.get_str("link").unwrap(), "http://blog.example.org/one");
    assert_eq!(one.get_str("updated").unwrap(), "2004-01-05T18:30:02+00:00");
    assert_eq!(one.get_str("published").unwrap(), "2004-01-04T18:30:02+00:00");
    assert_eq!(one.get_str("author").unwrap(), "Dana");
    assert_eq!(one.get_str("summary").unwrap(), "First summary");
    let payload = one.get_str("kn_payload").unwrap();
    assert!(payload.contains("first") && payload.contains("entry") && !payload.contains('<'), "{payload}");
    let two = sandbox.event("/what/blog", "urn:uuid:1225c695-cfb8-4ebb-aaaa-80da344efa6b");
    assert_eq!(two.get_str("kn_payload").unwrap(), "Second summary, no content", "no content: the summary");
}

#[test]
fn a_feed_served_over_http_is_fetched_and_rerun_posts_only_changes() {
    let sandbox = Sandbox::new();
    let server = StaticServer::start(fixture(RSS), "application/rss+xml");
    let url = server.url("/rss.xml");
    assert_eq!(summary(&kn_feed(&sandbox, &url, "/what/news")), "3 new or changed, 0 unchanged");
    assert_eq!(summary(&kn_feed(&sandbox, &url, "/what/news")), "0 new or changed, 3 unchanged");
    let changed = String::from_utf8(fixture(RSS)).unwrap().replace("Free coffee", "Free tea");
    server.set_body(changed.into_bytes());
    assert_eq!(summary(&kn_feed(&sandbox, &url, "/what/news")), "1 new or changed, 2 unchanged");
    assert_eq!(*server.requests.lock().unwrap(), 3);
    let cafe = sandbox.event("/what/news", "http://news.example.org/2004/01/cafe");
    assert_eq!(cafe.get_str("kn_payload").unwrap(), "Free tea for every subscriber.");
}

#[test]
fn the_readme_crontab_line_runs() {
    let sandbox = Sandbox::new();
    let server = StaticServer::start(fixture(RSS), "application/rss+xml");
    let line = readme_block("The crontab line").trim().to_string();
    // Five time fields, then the command cron hands to sh.
    let command: Vec<&str> = line.splitn(6, ' ').collect();
    assert_eq!(command.len(), 6, "a crontab line: {line}");
    let command = command[5]
        .replace("/usr/local/bin/kn-feed", &sensor_path("kn-feed").display().to_string())
        .replace("/var/lib/kn_events", &sandbox.store_dir().display().to_string())
        .replace("http://news.example.org/rss.xml", &server.url("/rss.xml"));
    for run in 0..2 {
        let mut sh = Command::new("sh");
        sh.arg("-c").arg(&command);
        let out = sandbox.run(sh, b"");
        assert_code(&out, 0);
        assert_eq!(text(&out.stdout), "", "-q: cron mails nothing (run {run})");
    }
    assert_eq!(sandbox.events("/what/news").len(), 3);
}

#[test]
fn a_remote_pubsub_server_gets_each_item_once() {
    let sandbox = Sandbox::new();
    let server_store = sandbox.join("server_events");
    let server = pubsub_server(&server_store);
    let url = format!("{}/what/news", server.url());
    let feed = fixture_path(RSS).display().to_string();
    for expected in ["3 new or changed, 0 unchanged", "0 new or changed, 3 unchanged"] {
        let mut cmd = sensor("kn-feed");
        cmd.arg(&feed).arg(&url);
        assert_eq!(summary(&sandbox.run(cmd, b"")), expected);
    }
    let store = kn_journal::Store::open(&server_store).unwrap();
    let topic = kn_journal::Topic::parse("/what/news").unwrap();
    assert_eq!(store.events(&topic, &kn_journal::Selection::all()).unwrap().events.len(), 3);
}

#[test]
fn stdin_is_a_feed_too() {
    let sandbox = Sandbox::new();
    let mut cmd = sensor("kn-feed");
    cmd.args(["-q", "--root"]).arg(sandbox.store_dir()).args(["-", "/what/blog", "source=atom"]);
    let out = sandbox.run(cmd, &fixture("feed/atom.xml"));
    assert_code(&out, 0);
    assert_eq!(text(&out.stdout), "");
    let events = sandbox.events("/what/blog");
    assert_eq!(events.len(), 2);
    assert!(events.iter().all(|e| e.get_str("source").as_deref() == Some("atom")));
}

#[test]
fn failures_have_sysexits_codes_and_name_the_input() {
    let sandbox = Sandbox::new();
    let not_a_feed = sandbox.write("notes.txt", "just some text\n");
    let out = kn_feed(&sandbox, &not_a_feed.display().to_string(), "/what/news");
    assert_code(&out, 65);
    assert!(text(&out.stderr).contains("notes.txt"), "{}", text(&out.stderr));

    let out = kn_feed(&sandbox, &sandbox.join("missing.xml").display().to_string(), "/what/news");
    assert_code(&out, 66);
    assert!(text(&out.stderr).contains("missing.xml"), "{}", text(&out.stderr));

    let unreachable = format!("http://127.0.0.1:{}/rss.xml", closed_port());
    let out = kn_feed(&sandbox, &unreachable, "/what/news");
    assert_code(&out, 75);
    assert!(text(&out.stderr).contains(&unreachable), "{}", text(&out.stderr));

    let out = kn_feed(&sandbox, "https://news.example.org/rss.xml", "/what/news");
    assert_code(&out, 64);
    assert!(text(&out.stderr).contains("curl"), "says how to fetch https: {}", text(&out.stderr));

    let feed = fixture_path(RSS).display().to_string();
    let target = format!("http://127.0.0.1:{}/kn/what/news", closed_port());
    assert_code(&kn_feed(&sandbox, &feed, &target), 75);

    let mut full = sensor("kn-feed");
    full.env("KN_RESERVE_BYTES", "18446744073709551615").arg("--root").arg(sandbox.store_dir()).arg(&feed).arg("/what/news");
    assert_code(&sandbox.run(full, b""), 75);
    assert!(sandbox.events("/what/news").is_empty());
}

#[test]
fn help_documents_the_sensor() {
    let out = sensor("kn-feed").arg("--help").output().unwrap();
    assert_code(&out, 0);
    let help = text(&out.stdout);
    for needle in ["RSS", "Atom", "crontab", "kn_id", "unchanged", "-q", "75", "--root"] {
        assert!(help.contains(needle), "--help mentions {needle}:\n{help}");
    }
}

/// A listener that answers every request with a redirect to `to(own base
/// URL)` and counts the requests.
fn redirecting_server(to: impl Fn(&str) -> String + Send + 'static) -> (String, std::sync::mpsc::Receiver<String>) {
    use std::io::{Read, Write};
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    let own = base.clone();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(mut stream) = stream else { return };
            let mut head = Vec::new();
            let mut byte = [0u8; 1];
            while !head.ends_with(b"\r\n\r\n") && stream.read(&mut byte).map(|n| n == 1).unwrap_or(false) {
                head.push(byte[0]);
            }
            let reply = format!("HTTP/1.1 302 Found\r\nLocation: {}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n", to(&own));
            // Reported before answering: the client's reply implies the report.
            let _ = tx.send(String::from_utf8_lossy(&head).lines().next().unwrap_or("").to_string());
            let _ = stream.write_all(reply.as_bytes());
        }
    });
    (base, rx)
}

#[test]
fn redirects_are_followed_only_within_the_feed_origin_or_the_outbound_policy() {
    let sandbox = Sandbox::new();
    let elsewhere = StaticServer::start(fixture(RSS), "application/rss+xml");
    let target = elsewhere.url("/rss.xml");
    let to = target.clone();
    let (base, rx) = redirecting_server(move |_| to.clone());
    let url = format!("{base}/feed");

    // Another origin that KN_OUTBOUND does not allow: refused before any
    // connection there.
    let mut cmd = sensor("kn-feed");
    cmd.arg("--root").arg(sandbox.store_dir()).arg(&url).arg("/what/news").env("KN_OUTBOUND", "deny");
    let out = sandbox.run(cmd, b"");
    assert_code(&out, 69);
    assert!(text(&out.stderr).contains(&target), "names the refused hop: {}", text(&out.stderr));
    assert_eq!(*elsewhere.requests.lock().unwrap(), 0, "the refused origin was contacted");
    assert_eq!(rx.try_iter().count(), 1);

    // Allowed by KN_OUTBOUND: followed.
    let mut cmd = sensor("kn-feed");
    cmd.arg("--root").arg(sandbox.store_dir()).arg(&url).arg("/what/news").env("KN_OUTBOUND", elsewhere.url("/"));
    assert_eq!(summary(&sandbox.run(cmd, b"")), "3 new or changed, 0 unchanged");
    assert_eq!(*elsewhere.requests.lock().unwrap(), 1);

    // Redirects on the feed's own origin are followed, up to
    // KN_REMOTE_MAX_REDIRECTS.
    let (base, rx) = redirecting_server(|own| format!("{own}/again"));
    let mut cmd = sensor("kn-feed");
    cmd.arg("--root").arg(sandbox.store_dir()).arg(format!("{base}/feed")).arg("/what/news").env("KN_REMOTE_MAX_REDIRECTS", "2");
    let out = sandbox.run(cmd, b"");
    assert_code(&out, 75);
    assert!(text(&out.stderr).contains("more than 2 redirects"), "{}", text(&out.stderr));
    assert_eq!(rx.try_iter().count(), 3, "the first request and two redirects");
}
