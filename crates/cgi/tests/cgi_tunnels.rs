//! The real `pubsub-cgi` binary as a CGI process holding a tunnel open, as
//! a web server runs it: the tunnel formats, their first bytes and
//! keep-alives, the golden tunnels of `tests/golden/`, and batches
//! (`do_method=batch`). The harness is `cgi_direct/harness.rs`.

use std::collections::BTreeSet;
use std::io::Read;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use kn_cgi::Event;
use kn_test_support::{find, wait_exit};

#[path = "cgi_direct/harness.rs"]
mod harness;
use harness::*;

// ----- tunnels -------------------------------------------------------------------

/// Checks the start of a simple tunnel: the header block, the status frame
/// and 4096 spaces, nothing else.
fn assert_simple_tunnel_start(body: &[u8], status_from: &str) -> Event {
    let (frames, seps) = split_frames(body);
    assert!(seps[0].is_empty(), "the status frame comes first");
    let status = frame_event(frames[0]);
    assert_eq!(status_of(&status), "200 Watching topic");
    assert_eq!(status.get_str("kn_route_location").as_deref(), Some(status_from));
    assert!(status.payload().ends_with(format!("Watching for events in topic '{JOURNAL}'.").as_bytes()), "{status:?}");
    let after = &body[frames[0].len()..];
    assert!(after.len() >= PADDING && after[..PADDING].iter().all(|&b| b == b' '), "4096 spaces of padding");
    status
}

/// Separators between simple frames are spaces only (one C client aborts
/// on a newline between frames).
fn assert_spaces_only(seps: &[&[u8]]) {
    for s in seps {
        assert!(s.iter().all(|&b| b == b' '), "separator with other bytes than spaces: {:?}", String::from_utf8_lossy(s));
    }
}

#[test]
fn tunnel_simple_streams_each_event_like_golden_07() {
    let pool = Pool::new("tunnel-simple");
    let tunnel = pool.golden("07-tunnel-simple").spawn();
    let first = tunnel.frames(1);
    let head = Reply::parse(tunnel.bytes());
    assert_eq!(head.status(), "200 Watching topic");
    assert_eq!(head.header("Content-Type").as_deref(), Some("text/plain; charset=utf-8"));
    assert_eq!(head.header("Content-Length"), None, "a tunnel streams");
    assert_simple_tunnel_start(&first, "tun1");
    route_r1(&pool);
    for side in 1..=4 {
        let reply = pool.golden(&format!("07-tunnel-simple.side{side}")).run();
        assert_eq!(reply.status(), "200 Notified", "side {side}: {}", reply.text());
        let body = tunnel.frames(1 + side);
        let (frames, _) = split_frames(&body);
        let end = find(&body, frames[side]).unwrap() + frames[side].len();
        let padded = tunnel.wait_for(Duration::from_secs(5), "padding after the event", |b| {
            Reply::split(b).is_some_and(|(_, body)| body.len() >= end + PADDING)
        });
        let body = Reply::parse(padded).body;
        assert!(body[end..end + PADDING].iter().all(|&b| b == b' '), "4096 spaces after event {side}");
    }
    // Keep-alives land between frames: wait for one.
    let len = tunnel.bytes().len();
    tunnel.wait_for(Duration::from_secs(5), "a keep-alive", |b| b.len() > len);
    let body = Reply::parse(tunnel.bytes()).body;
    let (frames, seps) = split_frames(&body);
    assert_eq!(frames.len(), 5);
    assert_spaces_only(&seps);

    let golden_frames: Vec<Event> = split_frames(&golden("07-tunnel-simple").body).0.iter().map(|f| frame_event(f)).collect();
    for (i, ours) in frames.iter().map(|f| frame_event(f)).enumerate().skip(1) {
        let g = &golden_frames[i];
        assert_eq!(ours.payload(), g.payload(), "payload of event {i}");
        for (name, value) in g.elements() {
            match name {
                b"kn_time_t" | b"kn_route_checkpoint" => assert!(ours.contains(name)),
                _ => assert_eq!(ours.get(name), Some(value), "event {i}, element {}", String::from_utf8_lossy(name)),
            }
        }
        assert_eq!(ours.len(), g.len(), "event {i} has exactly the golden elements: {ours:?}");
    }
    // The routed event's simple bytes: the golden 07 escapes.
    let e7b = String::from_utf8_lossy(frames[2]).into_owned();
    assert!(find(frames[2], b"extra: =20\xce\xba\xe1\xbd\xb9\xcf=83\xce\xbc\xce\xb5=0Aline=3A a=3Db=00end\n").is_some(), "{e7b}");
    assert!(find(frames[3], b"tricky: <b>\"q\" \\ =09=0D=0C=7F\xc2=85 end=20\n").is_some());
    assert!(find(frames[3], b"name \xce\xba=3A=3D: v\n").is_some());
    assert!(find(frames[3], b"empty: \n").is_some());
    assert!(find(frames[1], b"kn_routed_from: http=3A//127.0.0.1=3A8080/kn/what/chat\n").is_some());
    assert!(find(frames[1], b"kn_route_location: http=3A//example/uri1\n").is_some());
}

#[test]
fn tunnel_js_escapes_events_like_golden_08() {
    let pool = Pool::new("tunnel-js");
    drop(open_journal_tunnel(&pool, "07-tunnel-simple")); // the journal exists, as in the golden run
    let tunnel = pool.golden("08-tunnel-js").spawn();
    let first = tunnel.blocks(1);
    let head = Reply::parse(tunnel.bytes());
    assert_eq!(head.status(), "200 Watching topic");
    assert_eq!(head.header("Content-Type").as_deref(), Some("text/html; charset=utf-8"));
    let text = String::from_utf8_lossy(&first).into_owned();
    assert!(text.contains("\n<body onload=\"if(parent.kn_tunnelLoadCallback) parent.kn_tunnelLoadCallback(window)\">\n<h1>200 Watching topic</h1>"), "{text}");
    let g = golden("08-tunnel-js");
    let (gp, _, _) = js_page_parts(&g.body);
    assert_eq!(&text[..text.find("--><script").unwrap()], golden_meta(&gp), "tunnel page prologue");
    route_r1(&pool);
    for side in 1..=4 {
        let reply = pool.golden(&format!("08-tunnel-js.side{side}")).run();
        assert_eq!(reply.status(), "200 Notified");
    }
    let body = tunnel.blocks(5);
    let ours = js_blocks(&body);
    let golden_blocks = js_blocks(&g.body);
    assert_eq!(block_set(&ours[0]), block_set(&golden_blocks[0]), "the status block");
    for i in 1..=4 {
        assert_eq!(block_set(&ours[i]), block_set(&golden_blocks[i]), "block of e8{}", ["", "a", "b", "c", "d"][i]);
    }
    // Blocks are followed by the padding inside the comment.
    let text = String::from_utf8_lossy(&body).into_owned();
    assert!(text.contains(&format!("</script><!--\n{}\n", " ".repeat(PADDING))), "padding after a block");
}

#[test]
fn tunnel_js_with_expires_ends_itself_and_makes_the_journal_stale() {
    let pool = Pool::new("tunnel-expires");
    let started = Instant::now();
    let mut tunnel = pool.golden("08b-tunnel-js-expires").spawn();
    tunnel.blocks(1);
    let status = tunnel.wait_exit(Duration::from_secs(6)).expect("the tunnel ends by itself");
    let took = started.elapsed();
    println!("tunnel with kn_expires=+2 ended after {took:?}");
    assert!(status.success());
    assert!(took >= Duration::from_millis(1900) && took < Duration::from_secs(4), "{took:?}");
    let body = Reply::parse(tunnel.bytes()).body;
    assert!(body.ends_with(b"-->\n</body>\n</html>\n"), "{}", show(&body));
    assert!(count(&body, b"</html>") >= 1);
    let reply = post(&pool, "kn_to=/who/a/s/9/kn_journal&kn_payload=late&kn_response_format=simple");
    assert_eq!(reply.status(), "404 Expired", "the journal is stale at once");
}

/// Under a web server too, KN_TUNNEL_MAX_TIME ends the tunnel's CGI
/// process (so that an old child of a gracefully reloaded Apache finishes),
/// and leaves its journal fresh for the reconnection.
#[test]
fn tunnel_max_time_ends_the_cgi_and_leaves_the_journal_fresh() {
    let pool = Pool::new("tunnel-max-time");
    let started = Instant::now();
    let mut tunnel = pool.cgi().env("KN_TUNNEL_MAX_TIME", "1").get("kn_response_format=simple").path_info("/who/t/s/1/kn_journal").spawn();
    tunnel.frames(1);
    let status = tunnel.wait_exit(Duration::from_secs(6)).expect("the tunnel ends by itself");
    let took = started.elapsed();
    assert!(status.success());
    assert!(took >= Duration::from_millis(900) && took < Duration::from_secs(4), "{took:?}");
    let reply = post(&pool, "kn_to=/who/t/s/1/kn_journal&kn_payload=meanwhile&kn_response_format=simple");
    assert_eq!(reply.status(), "200 Notified", "the journal is not stale");
}

fn seeded_journal(pool: &Pool) -> Vec<Event> {
    let tunnel = open_journal_tunnel(pool, "07-tunnel-simple");
    route_r1(pool);
    for side in 1..=4 {
        pool.golden(&format!("07-tunnel-simple.side{side}")).run();
    }
    let body = tunnel.frames(5);
    split_frames(&body).0.iter().map(|f| frame_event(f)).collect()
}

fn ids(events: &[Event]) -> Vec<String> {
    events.iter().map(|e| e.get_str("kn_id").unwrap_or_default()).collect()
}

#[test]
fn tunnel_max_n_1_sends_only_the_newest_event_like_golden_09a() {
    let pool = Pool::new("tunnel-max-n");
    seeded_journal(&pool);
    let tunnel = pool.golden("09a-tunnel-max-n-1").spawn();
    let body = tunnel.frames(2);
    assert_simple_tunnel_start(&body, "tun9a");
    std::thread::sleep(Duration::from_millis(300));
    let body = Reply::parse(tunnel.bytes()).body;
    let (frames, seps) = split_frames(&body);
    assert_eq!(ids(&frames[1..].iter().map(|f| frame_event(f)).collect::<Vec<_>>()), ["e7d"]);
    assert_spaces_only(&seps);
    assert!(seps[1].len() >= PADDING, "padding between the status and the burst");
}

#[test]
fn tunnel_since_checkpoint_excludes_that_event_like_golden_09b() {
    let pool = Pool::new("tunnel-since");
    let seeded = seeded_journal(&pool);
    let e7a = seeded.iter().find(|e| e.get("kn_id") == Some(b"e7a")).unwrap();
    let checkpoint = e7a.get_str("kn_route_checkpoint").unwrap();
    let tunnel = pool
        .golden("09b-tunnel-since-checkpoint")
        .env("QUERY_STRING", &format!("do_method=route&kn_response_format=simple&kn_status_from=tun9b&do_since_checkpoint={checkpoint}"))
        .spawn();
    let body = tunnel.frames(4);
    assert_simple_tunnel_start(&body, "tun9b");
    std::thread::sleep(Duration::from_millis(300));
    let body = Reply::parse(tunnel.bytes()).body;
    let (frames, seps) = split_frames(&body);
    let events: Vec<Event> = frames[1..].iter().map(|f| frame_event(f)).collect();
    assert_eq!(ids(&events), ["e7b", "e7c", "e7d"]);
    assert!(seps[2].is_empty() && seps[3].is_empty(), "one burst: no padding inside it");
    assert_spaces_only(&seps);
}

#[test]
fn tunnel_since_unknown_checkpoint_replays_everything_like_golden_09c() {
    let pool = Pool::new("tunnel-since-unknown");
    seeded_journal(&pool);
    let tunnel = pool.golden("09c-tunnel-since-unknown-checkpoint").spawn();
    let body = tunnel.frames(5);
    assert_simple_tunnel_start(&body, "tun9c");
    std::thread::sleep(Duration::from_millis(300));
    let body = Reply::parse(tunnel.bytes()).body;
    let (frames, _) = split_frames(&body);
    let events: Vec<Event> = frames[1..].iter().map(|f| frame_event(f)).collect();
    assert_eq!(ids(&events), ["e7a", "e7b", "e7c", "e7d"]);
}

#[test]
fn get_without_do_method_with_semicolons_and_absolute_kn_from_is_a_tunnel() {
    let pool = Pool::new("tunnel-get");
    let tunnel = pool.golden("08-tunnel-js").spawn();
    let body = tunnel.blocks(1);
    let status = &js_blocks(&body)[0];
    assert!(status.contains(&"{name:\"status\",value:\"200 Watching topic\"}".to_string()), "{status:?}");
    assert!(status.contains(&"{name:\"kn_route_location\",value:\"http://127.0.0.1:8080/kn/who/a/s/1/kn_journal/kn_status/11111111_1\"}".to_string()));
    assert!(pool.events().join("who/a/s/1/kn_journal").is_dir());
}

#[test]
fn tunnel_delivers_an_event_within_100_ms_of_the_notify() {
    let pool = Pool::new("tunnel-latency");
    let tunnel = open_journal_tunnel(&pool, "07-tunnel-simple");
    // Wait for the padding, so that the next bytes are the event.
    tunnel.wait_for(Duration::from_secs(5), "padding", |b| {
        Reply::split(b).is_some_and(|(_, body)| split_frames(body).0.first().is_some_and(|f| body.len() >= f.len() + PADDING))
    });
    let offset = tunnel.bytes().len();
    let sent = Instant::now();
    let reply = pool.golden("07-tunnel-simple.side4").run();
    let posted = Instant::now();
    assert_eq!(reply.status(), "200 Notified");
    tunnel.frames(2);
    let arrived = tunnel.arrival_of(offset).unwrap();
    let latency = arrived.saturating_duration_since(posted);
    println!(
        "tunnel latency: {:?} after the notify process started, {latency:?} after it returned (0 = before)",
        arrived.saturating_duration_since(sent)
    );
    assert!(latency < Duration::from_millis(100), "{latency:?}");
}

#[test]
fn tunnel_process_exits_when_the_client_goes_away() {
    let pool = Pool::new("tunnel-gone");
    let mut child = pool
        .golden("07-tunnel-simple")
        .command()
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut stdout = child.stdout.take().unwrap();
    let mut buf = vec![0u8; 256];
    let n = stdout.read(&mut buf).unwrap();
    assert!(n > 0);
    drop(stdout); // the browser vanished
    let gone = Instant::now();
    let status = wait_exit(&mut child, Duration::from_secs(5));
    if status.is_none() {
        let pid = child.id();
        let _ = Command::new("sh").arg("-c").arg(format!("cat /proc/{pid}/task/*/wchan; echo; ls -l /proc/{pid}/fd; cat /proc/{pid}/task/*/stat")).status();
        let _ = child.kill();
        let _ = child.wait();
    }
    assert!(status.is_some(), "the CGI must notice the closed pipe through its keep-alives");
    println!("tunnel exited {:?} after its stdout closed", gone.elapsed());
}

// ----- batch -------------------------------------------------------------------------

#[test]
fn batch_with_status_to_the_journal_delivers_five_frames_in_order() {
    let pool = Pool::new("batch-tunnel");
    let tunnel = open_journal_tunnel(&pool, "10-batch-tunnel");
    post(&pool, "kn_to=/what/chat&kn_payload=hello&kn_id=e1");
    route_r1(&pool);
    let reply = pool.golden("10-batch").run();
    assert_eq!(reply.raw, golden("10-batch").raw);
    let body = tunnel.frames(6);
    let (frames, seps) = split_frames(&body);
    let events: Vec<Event> = frames[1..6].iter().map(|f| frame_event(f)).collect();
    let summary: Vec<(String, String, String)> = events
        .iter()
        .map(|e| (status_of(e), e.get_str("kn_route_location").unwrap_or_default(), e.get_str("kn_id").unwrap_or_default()))
        .collect();
    assert_eq!(summary[0].0, "200 Processing batch");
    assert_eq!(summary[0].1, "b0");
    assert_eq!(events[0].payload(), b"");
    assert_eq!((summary[1].1.as_str(), summary[1].2.as_str()), ("http://example/uri1", "e10a"));
    assert_eq!(events[1].payload(), b"batch one");
    assert_eq!((summary[2].0.as_str(), summary[2].1.as_str()), ("200 Notified", "b1"));
    assert_eq!((summary[3].2.as_str(), events[3].payload()), ("e10b", &b"batch two"[..]));
    assert_eq!((summary[4].0.as_str(), summary[4].1.as_str()), ("200 Notified", "b2"));
    assert_spaces_only(&seps);
    let golden_events: Vec<Event> = split_frames(&golden("10-batch-tunnel").body).0[1..].iter().map(|f| frame_event(f)).collect();
    for (o, g) in events.iter().zip(&golden_events) {
        let names = |e: &Event| e.elements().map(|(n, _)| n.to_vec()).collect::<BTreeSet<_>>();
        assert_eq!(names(o), names(g), "same elements as golden 10");
    }
}

#[test]
fn batch_without_status_to_answers_the_statuses_in_order() {
    let pool = Pool::new("batch-reply");
    let reply = post(
        &pool,
        "do_method=batch&kn_status_from=b0&kn_response_format=simple\
         &kn_batch=do_method%3Dnotify%3Bkn_to%3D%252Fwhat%252Fchat%3Bkn_payload%3Dbatch%2520one%3Bkn_id%3De10a%3Bkn_status_from%3Db1\
         &kn_batch=do_method%3Droute%3Bkn_from%3D%252Fwhat%252Fchat%3Bkn_to%3D%252Fwhat%252Fcopy%3Bkn_id%3Dr9%3Bkn_status_from%3Db2",
    );
    reply.assert_one_shot();
    assert_eq!(reply.status(), "200 Processing batch");
    let events = reply.events();
    let summary: Vec<(String, String)> =
        events.iter().map(|e| (status_of(e), e.get_str("kn_route_location").unwrap_or_default())).collect();
    assert_eq!(
        summary,
        [("200 Processing batch".into(), "b0".into()), ("200 Notified".into(), "b1".into()), ("200 Routed".into(), "b2".into())]
    );
    assert!(String::from_utf8_lossy(events[1].payload()).contains("Wrote to '/what/chat' (e10a)\n"));
    let stored = pool.store().events(&kn_journal::Topic::parse("/what/chat").unwrap(), &kn_journal::Selection::all()).unwrap();
    assert_eq!(stored.events[0].payload(), b"batch one", "`;` separated the pairs inside the kn_batch value");
}

#[test]
fn batch_refuses_other_methods_and_still_runs_the_rest() {
    let pool = Pool::new("batch-refuse");
    let reply = post(
        &pool,
        "do_method=batch&kn_response_format=simple\
         &kn_batch=do_method%3Dwhoami%3Bkn_status_from%3Dx1\
         &kn_batch=do_method%3Dnotify%3Bkn_to%3D%252Fwhat%252Fchat%3Bkn_payload%3Dstill%3Bkn_status_from%3Dx2",
    );
    let events = reply.events();
    let statuses: Vec<String> = events.iter().map(status_of).collect();
    assert_eq!(statuses, ["200 Processing batch", "400 can't batch that", "200 Notified"]);
    assert_eq!(events[1].get_str("kn_route_location").as_deref(), Some("x1"));
    assert_eq!(events[2].get_str("kn_route_location").as_deref(), Some("x2"));
}

