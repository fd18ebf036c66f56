//! The real `pubsub-cgi` binary run as a CGI process, exactly as a web
//! server runs it: environment variables and the request body on stdin,
//! the response read from stdout. Every method and every error, compared
//! with the bytes of the original server recorded in `tests/golden/`
//! (see `tests/golden/README.md`).
//!
//! The harness is `cgi_direct/harness.rs`; the tunnels and batches are
//! in `cgi_tunnels.rs`.

use std::collections::BTreeSet;
use std::io::{Read, Write};
use std::process::Stdio;
use std::time::{Duration, Instant};

use kn_test_support::{find, wait_exit};

#[path = "cgi_direct/harness.rs"]
mod harness;
use harness::*;

// ----- notify ----------------------------------------------------------------

#[test]
fn notify_js_is_200_notified_with_exact_content_length_in_one_write() {
    let pool = Pool::new("notify-js");
    let cgi = pool.golden("01-notify-js");
    let reply = cgi.run();
    assert_eq!(reply.status(), "200 Notified");
    assert_eq!(reply.header("Content-Type").as_deref(), Some("text/html; charset=utf-8"));
    reply.assert_one_shot();
    // A different topic so that this run also writes (no duplicate).
    assert_one_write(&pool.cgi().post("kn_to=/what/other&kn_payload=x&kn_id=w1"));
}

/// mod_cgid sleeps 10 ms after a request when it finds the CGI's process
/// still there once the output has ended (see `cgi.rs`). So the output of
/// a one-shot reply ends only after the process has exited: at the end of
/// its stdout, the process is already a zombie waiting to be reaped. 30
/// requests of each kind (notify, an error, help) so that a race would
/// show.
#[test]
fn one_shot_output_ends_only_after_the_process_exited() {
    let pool = Pool::new("exit-before-eof");
    let requests = [
        pool.cgi().post("kn_to=/what/exit&kn_payload=x&kn_response_format=simple"),
        pool.cgi().post("kn_to=/what/../bad&kn_payload=x"),
        pool.cgi().get("do_method=help"),
    ];
    for round in 0..30 {
        for cgi in &requests {
            let mut child = cgi.command().stdin(Stdio::piped()).stdout(Stdio::piped()).stderr(Stdio::null()).spawn().unwrap();
            let mut stdin = child.stdin.take().unwrap();
            stdin.write_all(&cgi.body).unwrap();
            drop(stdin);
            let mut out = Vec::new();
            child.stdout.take().unwrap().read_to_end(&mut out).unwrap();
            let at_eof = child.try_wait().unwrap();
            let status = child.wait().unwrap();
            assert!(status.success(), "round {round}: exit status {status}");
            assert!(find(&out, b"Content-Type: ").is_some(), "round {round}: no reply: {}", show(&out));
            assert!(at_eof.is_some(), "round {round}: the output ended while the process still ran: {cgi:?}");
        }
    }
}

#[test]
fn notify_js_page_matches_golden_01() {
    let pool = Pool::new("notify-js-golden");
    let reply = pool.golden("01-notify-js").run();
    assert_js_page_like(&reply, &golden("01-notify-js"));
    let text = reply.text();
    assert!(text.contains("<!----><script"), "the first block closes the prologue's <!--");
    assert!(text.contains("Wrote to '/what/chat' (e1)\\n"), "{text}");
}

#[test]
fn notify_simple_frame_matches_golden_02() {
    let pool = Pool::new("notify-simple");
    post(&pool, "kn_to=/what/chat&kn_payload=seed&kn_id=e0"); // topic exists, as in the golden run
    let cgi = pool.golden("02-notify-simple");
    let reply = cgi.run();
    assert_eq!(reply.header("Content-Type").as_deref(), Some("text/plain; charset=utf-8"));
    reply.assert_one_shot();
    assert_simple_like(&reply, &golden("02-notify-simple"));
    assert_eq!(reply.event().payload(), b"Wrote to '/what/chat' (e2)\n");
    assert_one_write(&pool.cgi().post("kn_to=/what/chat&kn_payload=y&kn_id=e2b&kn_response_format=simple"));
}

#[test]
fn notify_duplicate_has_an_empty_payload() {
    let pool = Pool::new("notify-dup");
    pool.golden("01-notify-js").run();
    let again = pool.golden("01b-notify-js-duplicate-seed1").run();
    assert_js_page_like(&again, &golden("01b-notify-js-duplicate-seed1"));
    assert!(again.text().contains("<pre></pre>"), "{}", again.text());
}

#[test]
fn notify_payload_says_what_was_written() {
    let pool = Pool::new("notify-wrote");
    let e = simple_post(&pool, "kn_to=/what/chat&kn_payload=hello&kn_id=e1");
    assert_eq!(status_of(&e), "200 Notified");
    let payload = String::from_utf8(e.payload().to_vec()).unwrap();
    let lines: Vec<&str> = payload.lines().collect();
    assert_eq!(lines.len(), 3, "{payload}");
    assert!(lines[0].starts_with("Wrote to '/kn_subtopics' ("));
    assert!(lines[1].starts_with("Wrote to '/what/kn_subtopics' ("));
    assert_eq!(lines[2], "Wrote to '/what/chat' (e1)");
    assert!(payload.ends_with(")\n"));
}

#[test]
fn notify_without_kn_to_posts_to_the_path_info_topic() {
    let pool = Pool::new("notify-path-info");
    let reply = pool.cgi().path_info("/what/chat").post("kn_payload=via+path&kn_id=p1&kn_response_format=simple").run();
    assert_eq!(reply.status(), "200 Notified");
    assert!(String::from_utf8_lossy(reply.event().payload()).ends_with("Wrote to '/what/chat' (p1)\n"));
    let none = post(&pool, "kn_payload=nowhere&kn_response_format=simple");
    assert!(none.status().starts_with("400 "), "no topic at all: {}", none.status());
}

// ----- errors of the one-shot methods ------------------------------------------

#[test]
fn bad_topic_js_is_400_with_the_help_paragraph_like_golden_03a() {
    let pool = Pool::new("bad-topic-js");
    let reply = pool.golden("03a-bad-topic-js").run();
    reply.assert_one_shot();
    assert_eq!(reply.status(), "400 bad posting destination topic name");
    let text = reply.text();
    assert!(text.contains("<p>Some aspect of your request was not understood. Please see the <a href=\"http://127.0.0.1:8080/kn?do_method=help\">mod_pubsub documentation</a> for more information.</p><!----><script"), "{text}");
    // Same framing as golden 03a; the sentence itself is ours.
    let g = golden("03a-bad-topic-js");
    let (op, ob, ot) = js_page_parts(&reply.body);
    let (gp, _, gt) = js_page_parts(&g.body);
    let cut = |p: &str| p[..p.find("<pre>").unwrap()].to_string();
    assert_eq!(cut(&op), golden_meta(&cut(&gp)));
    assert_eq!(ot, gt);
    assert!(ob[0].iter().any(|l| l.contains("/what/../x")), "the payload names the topic: {:?}", ob[0]);
}

#[test]
fn bad_topic_simple_is_400_like_golden_03b() {
    let pool = Pool::new("bad-topic-simple");
    let reply = pool.golden("03b-bad-topic-simple").run();
    reply.assert_one_shot();
    assert_eq!(reply.status(), "400 bad posting destination topic name");
    let e = reply.event();
    assert_eq!(status_of(&e), "400 bad posting destination topic name");
    assert!(String::from_utf8_lossy(e.payload()).contains("/what/../x"));
    assert_eq!(e.get("kn_route_location"), Some(&b""[..]));
    assert!(!pool.events().join("x").exists());
}

#[test]
fn unknown_do_method_is_403_like_golden_04() {
    let pool = Pool::new("unknown-method");
    let reply = pool.golden("04-unknown-method-js").run();
    reply.assert_one_shot();
    assert_js_page_like(&reply, &golden("04-unknown-method-js"));
}

#[test]
fn unsupported_format_is_a_complete_403_js_page_and_nothing_is_notified() {
    let pool = Pool::new("bad-format");
    let reply = post(&pool, "kn_to=%2Fwhat%2Fchat&kn_payload=hello&kn_id=e4b&kn_response_format=bogus");
    reply.assert_one_shot();
    assert_eq!(reply.status(), "403 Unsupported kn_response_format value");
    assert_eq!(reply.header("Content-Type").as_deref(), Some("text/html; charset=utf-8"));
    let text = reply.text();
    assert!(text.contains("&quot;bogus&quot;"), "the payload names the value: {text}");
    assert!(text.contains("for more information.</p><!----><script"));
    assert!(text.ends_with("</script><!--\n-->\n</body>\n</html>\n"), "a complete page (golden 04b died here): {text}");
    assert!(pool.store().events(&kn_journal::Topic::parse("/what/chat").unwrap(), &kn_journal::Selection::all()).map(|s| s.events.is_empty()).unwrap_or(true));
    assert!(!pool.events().join("what").exists(), "the notify was not performed");
}

#[test]
fn flash_format_puts_a_nul_after_each_event() {
    let pool = Pool::new("flash");
    let reply = post(&pool, "kn_to=/what/chat&kn_payload=hello&kn_id=f1&kn_response_format=flash");
    reply.assert_one_shot();
    assert_eq!(reply.status(), "200 Notified");
    assert_eq!(reply.header("Content-Type").as_deref(), Some("text/plain; charset=utf-8"));
    assert_eq!(reply.body.last(), Some(&0u8), "NUL after the event");
    assert_eq!(count(&reply.body, b"\0"), 1);
    let (frames, _) = split_frames(&reply.body);
    assert_eq!(frames.len(), 1);
    assert_eq!(&reply.body[frames[0].len()..], b"\0");
    assert_eq!(status_of(&reply.event()), "200 Notified");
}

#[test]
fn put_is_501_with_golden_11f_page() {
    let pool = Pool::new("put");
    let reply = pool.golden("11f-put").run();
    let g = golden("11f-put");
    assert_eq!(reply.status(), "501 Not Implemented");
    assert_eq!(reply.header("Content-Type"), g.header("Content-Type"));
    reply.assert_one_shot();
    assert_eq!(reply.text(), g.text());
}

#[test]
fn head_gets_the_golden_11g_header_block_only() {
    let pool = Pool::new("head");
    let reply = pool.golden("11g-head").run();
    assert_eq!(reply.raw, golden("11g-head").raw, "{}", show(&reply.raw));
    assert_eq!(reply.raw.len(), 71);
}

#[test]
fn no_parameters_is_the_help_page_with_200() {
    let pool = Pool::new("help");
    for cgi in [pool.golden("11d-help-no-params"), pool.golden("11c-help")] {
        let reply = cgi.run();
        reply.assert_one_shot();
        assert_eq!(reply.header("Status"), None, "200, not a redirect");
        assert_eq!(reply.header("Location"), None);
        assert_eq!(reply.header("Content-Type").as_deref(), Some("text/html; charset=utf-8"));
        let text = reply.text();
        assert!(text.contains("<html") && text.contains("http://127.0.0.1:8080/kn"), "{text}");
        assert!(text.contains("notify") && text.contains("route"), "a usage page");
        for method in ["receipts", "ack", "batch", "replay", "test"] {
            assert!(text.contains(&format!("<code>{method}</code>")), "the usage page names do_method={method}");
        }
        for topic in ["kn_subtopics", "kn_routes", "kn_presence"] {
            assert!(text.contains(&format!("/{topic}")), "the usage page names the server-written topic {topic}");
        }
    }
}

#[test]
fn whoami_body_is_the_golden_11a_bytes() {
    let pool = Pool::new("whoami");
    let reply = pool.golden("11a-whoami").run();
    reply.assert_one_shot();
    assert_eq!(reply.body, b"window.kn_userid = 'anonymous';window.kn_displayname = 'Anonymous User';\r\n\r\nif (! window.kn_server) window.kn_server = '/kn';");
    assert_eq!(reply.body, golden("11a-whoami").body);
    assert_eq!(reply.header("Status"), None);
    assert!(reply.header("Content-Type").unwrap().starts_with("application/x-javascript"));
    assert!(reply.header("Expires").is_some() && reply.header("Date").is_some(), "cacheable: {}", reply.head);
    let expires = httpdate_secs(&reply.header("Expires").unwrap());
    let date = httpdate_secs(&reply.header("Date").unwrap());
    assert_eq!(expires - date, 86_400, "cacheable for a day");
}

/// Seconds of an IMF-fixdate, compared only relative to another.
fn httpdate_secs(text: &str) -> i64 {
    let parts: Vec<&str> = text.split([' ', ':']).collect();
    let day: i64 = parts[1].parse().unwrap();
    let months = ["Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec"];
    let month = months.iter().position(|m| *m == parts[2]).unwrap() as i64;
    let year: i64 = parts[3].parse().unwrap();
    let (h, m, s): (i64, i64, i64) = (parts[4].parse().unwrap(), parts[5].parse().unwrap(), parts[6].parse().unwrap());
    // Days from a civil date (Howard Hinnant's algorithm).
    let (y, mo) = if month < 2 { (year - 1, month + 13) } else { (year, month + 1) };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let doy = (153 * (mo - 3) + 2) / 5 + day - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    let days = era * 146_097 + doe;
    days * 86_400 + h * 3600 + m * 60 + s
}

#[test]
fn whoami_names_the_remote_user() {
    let pool = Pool::new("whoami-user");
    let reply = pool.golden("11a-whoami").env("REMOTE_USER", "anna").run();
    let text = reply.text();
    assert!(text.starts_with("window.kn_userid = 'anna';window.kn_displayname = '"), "{text}");
    assert!(!text.contains("anonymous"), "{text}");
    assert!(text.ends_with("if (! window.kn_server) window.kn_server = '/kn';"));
}

#[test]
fn blank_page_has_the_title_with_newline_and_the_redraw_callback() {
    let pool = Pool::new("blank");
    let reply = pool.golden("11b-blank").run();
    reply.assert_one_shot();
    assert_eq!(reply.header("Status"), None);
    assert!(reply.header("Expires").is_some());
    let text = reply.text();
    assert!(text.contains("<title>This Space Intentionally Left Blank\n</title>"), "{text}");
    assert!(text.contains("<script type=\"text/javascript\" src=\"http://127.0.0.1:8080/kn?do_method=whoami\"></script>"));
    let g = golden("11b-blank").text();
    let script = &g[g.find("<!--\nif (parent.kn_redrawCallback)").unwrap()..g.find("// -->").unwrap()];
    assert!(text.contains(script), "the golden redraw script {script:?} in:\n{text}");
    assert!(text.contains("<body>"));
    // The whole page is golden 11b's, but for the meta charset and a final LF.
    assert_eq!(text, golden_meta(&golden("11b-blank").text()) + "\n");
}

#[test]
fn test_page_reports_no_failure() {
    let pool = Pool::new("selftest");
    let reply = pool.golden("11e-test").run();
    reply.assert_one_shot();
    let text = reply.text();
    assert!(!text.contains("FAIL"), "{text}");
    assert!(text.matches("</h1><p> Success.\n").count() >= 5, "{text}");
}

#[test]
fn lib_methods_start_with_whoami_and_contain_the_client() {
    let pool = Pool::new("lib");
    let whoami = pool.golden("11a-whoami").run().body;
    let mut bodies = Vec::new();
    for method in ["lib", "libform", "lib2form"] {
        let reply = pool.cgi().get(&format!("do_method={method}")).run();
        reply.assert_one_shot();
        assert!(reply.header("Content-Type").unwrap().starts_with("application/x-javascript"));
        assert!(reply.body.starts_with(&whoami), "{method} starts with whoami");
        assert!(reply.body.len() > whoami.len() + 1000, "{method} carries the client library");
        assert!(find(&reply.body, b"publish").is_some() && find(&reply.body, b"subscribe").is_some(), "{method}");
        bodies.push(reply.body);
    }
    assert!(bodies[1].len() > bodies[0].len(), "libform adds the form handler");
    assert_ne!(bodies[1], bodies[2], "lib2form is the two-way form handler");
}

#[test]
fn replay_without_the_replay_program_is_501_with_a_clear_message() {
    let pool = Pool::new("replay");
    // kn-replay may be built beside pubsub-cgi: name a missing one instead.
    let cgi = pool.cgi().env("KN_REPLAY", "/nonexistent/kn-replay");
    let reply = cgi.get(&format!("do_method=replay&kn_from={JOURNAL}&kn_response_format=simple")).run();
    reply.assert_one_shot();
    assert_eq!(reply.status(), "501 Not Implemented");
    let e = reply.event();
    assert!(String::from_utf8_lossy(e.payload()).contains("replay"), "{e:?}");
}

// ----- kn_status_to -------------------------------------------------------------

#[test]
fn status_to_answers_exactly_the_31_byte_204() {
    let pool = Pool::new("status-to");
    let reply = post(&pool, "kn_to=/what/chat&kn_payload=x&kn_status_to=/what/status");
    assert_eq!(reply.raw, b"Status: 204 Content forwarded\n\n");
    assert_eq!(reply.raw.len(), 31);
    let stored = pool.store().events(&kn_journal::Topic::parse("/what/status").unwrap(), &kn_journal::Selection::all()).unwrap();
    assert_eq!(stored.events.len(), 1);
    assert_eq!(status_of(&stored.events[0]), "200 Notified");
}

#[test]
fn status_to_a_stale_journal_drops_the_status_and_creates_nothing() {
    let pool = Pool::new("status-to-stale");
    let reply = pool.golden("05a-status-to-no-heartbeat").run();
    assert_eq!(reply.raw, golden("05a-status-to-no-heartbeat").raw);
    assert!(!pool.events().join("who").exists(), "the journal directory is not created");
    assert!(pool.events().join("what/chat").is_dir(), "the notify itself ran");
}

#[test]
fn status_to_an_open_journal_reaches_its_tunnel() {
    let pool = Pool::new("status-to-tunnel");
    post(&pool, "kn_to=/what/chat&kn_payload=hello&kn_id=e1"); // as in the golden run
    let tunnel = open_journal_tunnel(&pool, "05b-status-to-with-tunnel");
    let side = pool.golden("05b-status-to-with-tunnel.side1").run();
    assert_eq!(side.raw, b"Status: 204 Content forwarded\n\n");
    let body = tunnel.frames(2);
    let (frames, _) = split_frames(&body);
    let e = frame_event(frames[1]);
    assert_eq!(status_of(&e), "200 Notified");
    assert_eq!(e.get_str("kn_route_location").as_deref(), Some("abc"));
    assert_eq!(e.payload(), b"Wrote to '/what/chat' (e5b)\n");
    assert!(e.contains("kn_time_t") && e.contains("kn_route_checkpoint") && e.contains("kn_id"));
    let names: BTreeSet<&[u8]> = e.elements().map(|(n, _)| n).collect();
    let golden_names: BTreeSet<Vec<u8>> = split_frames(&golden("05b-status-to-with-tunnel").body).0[1..2]
        .iter()
        .flat_map(|f| frame_event(f).elements().map(|(n, _)| n.to_vec()).collect::<Vec<_>>())
        .collect();
    assert_eq!(names, golden_names.iter().map(Vec::as_slice).collect(), "same elements as golden 05b");
}

// ----- route ----------------------------------------------------------------------

#[test]
fn route_js_is_routed_like_golden_06a() {
    let pool = Pool::new("route-js");
    post(&pool, "kn_to=/what/chat&kn_payload=hello&kn_id=e1");
    let reply = pool.golden("06a-route-js").run();
    reply.assert_one_shot();
    assert_js_page_like(&reply, &golden("06a-route-js"));
}

#[test]
fn route_simple_is_routed_then_ignored_when_repeated() {
    let pool = Pool::new("route-simple");
    post(&pool, "kn_to=/what/chat&kn_payload=hello&kn_id=e1");
    pool.golden("06a-route-js").run();
    let new = pool.golden("06b-route-simple").run();
    new.assert_one_shot();
    assert_simple_like(&new, &golden("06b-route-simple"));
    let repeat = pool.golden("06c-route-simple-repeat").run();
    repeat.assert_one_shot();
    assert_simple_like(&repeat, &golden("06c-route-simple-repeat"));
    assert_eq!(repeat.event().payload(), b"was a duplicate\n");
}

#[test]
fn route_delete_stops_forwarding_like_golden_12() {
    let pool = Pool::new("route-delete");
    let _tunnel = open_journal_tunnel(&pool, "07-tunnel-simple");
    post(&pool, "kn_to=/what/chat&kn_payload=hello&kn_id=e1");
    route_r1(&pool);
    let before = simple_post(&pool, "kn_to=/what/chat&kn_payload=routed&kn_id=e11");
    assert!(String::from_utf8_lossy(before.payload()).contains(JOURNAL), "forwarded while the route lives");
    let reply = pool.golden("12-route-delete").run();
    reply.assert_one_shot();
    assert_js_page_like(&reply, &golden("12-route-delete"));
    let after = pool.golden("12b-notify-after-delete").run();
    assert_simple_like(&after, &golden("12b-notify-after-delete"));
    assert_eq!(after.event().payload(), b"Wrote to '/what/chat' (e12)\n");
    let routes = pool.store().all_routes(&kn_journal::Topic::parse("/what/chat").unwrap()).unwrap();
    let r1 = routes.iter().find(|r| r.id() == b"r1").unwrap();
    assert!(r1.destination().is_empty(), "replaced by an inactive route");
    assert!(r1.event.contains("kn_expires"), "the deletion can be reclaimed");
}

#[test]
fn route_from_a_journal_is_403() {
    let pool = Pool::new("route-from-journal");
    let reply = pool.cgi().post(&format!("do_method=route&kn_from={JOURNAL}&kn_to=/what/x&kn_response_format=simple")).run();
    reply.assert_one_shot();
    assert_eq!(reply.status().split(' ').next(), Some("403"), "{}", reply.status());
}

#[test]
fn route_bad_destination_is_400_naming_it() {
    let pool = Pool::new("route-bad-dest");
    let reply = post(&pool, "do_method=route&kn_from=/what/chat&kn_to=/what/a+b%3Cc&kn_response_format=simple");
    reply.assert_one_shot();
    assert!(reply.status().starts_with("400 "), "{}", reply.status());
    let payload = String::from_utf8_lossy(reply.event().payload()).into_owned();
    assert!(payload.contains("/what/a b<c"), "{payload}");
}

// ----- request errors and limits --------------------------------------------------------

#[test]
fn malformed_percent_encoding_is_400_naming_the_input() {
    let pool = Pool::new("bad-percent");
    let reply = post(&pool, "kn_to=/what/chat&kn_payload=abc%zz");
    reply.assert_one_shot();
    assert!(reply.status().starts_with("400 "), "{}", reply.status());
    let text = reply.text();
    assert!(text.contains("kn_payload=abc%zz"), "{text}");
    assert!(text.contains("href=\"http://127.0.0.1:8080/kn?do_method=help\""), "the help link uses the server URL: {text}");
    assert!(!pool.events().join("what").exists());
}

#[test]
fn content_length_over_the_limit_is_413_without_reading_the_body() {
    let pool = Pool::new("too-long");
    let cgi = pool.cgi().post("").env("CONTENT_LENGTH", "999999999999");
    let mut child = cgi.command().stdin(Stdio::piped()).stdout(Stdio::piped()).stderr(Stdio::null()).spawn().unwrap();
    let stdin = child.stdin.take().unwrap(); // kept open: the body never ends
    let status = wait_exit(&mut child, Duration::from_secs(10));
    if status.is_none() {
        let _ = child.kill();
    }
    let mut out = Vec::new();
    child.stdout.take().unwrap().read_to_end(&mut out).unwrap();
    drop(stdin);
    assert!(status.is_some(), "the CGI must answer without waiting for the body");
    let reply = Reply::parse(out);
    reply.assert_one_shot();
    assert!(reply.status().starts_with("413 "), "{}", reply.status());
    assert!(reply.text().contains("999999999999"), "{}", reply.text());
}

#[test]
fn event_over_the_size_limit_is_413() {
    let pool = Pool::new("too-big");
    let payload = "x".repeat(500);
    let reply = pool.cgi().env("KN_MAX_EVENT_BYTES", "200").post(&format!("kn_to=/what/chat&kn_payload={payload}&kn_response_format=simple")).run();
    reply.assert_one_shot();
    assert!(reply.status().starts_with("413 "), "{}", reply.status());
    assert!(!pool.events().join("what/chat").exists() || pool.store().events(&kn_journal::Topic::parse("/what/chat").unwrap(), &kn_journal::Selection::all()).unwrap().events.is_empty());
}

#[test]
fn notify_to_kn_subtopics_or_kn_routes_is_400_cant_post_there() {
    let pool = Pool::new("reserved");
    for topic in ["/what/kn_subtopics", "/what/chat/kn_routes"] {
        let reply = post(&pool, &format!("kn_to={topic}&kn_payload=x&kn_response_format=simple"));
        assert_eq!(reply.status(), "400 Can't post there", "{topic}");
        assert_eq!(status_of(&reply.event()), "400 Can't post there");
    }
}

#[test]
fn foreign_absolute_kn_to_is_403_proxying_not_supported() {
    let pool = Pool::new("proxy");
    let reply = post(&pool, "kn_to=http%3A%2F%2Fexample.org%2Fkn%2Fwhat%2Fchat&kn_payload=x&kn_response_format=simple");
    assert_eq!(reply.status(), "403 Proxying not supported");
    assert!(String::from_utf8_lossy(reply.event().payload()).contains("http://example.org/kn/what/chat"));
}

#[test]
fn names_alias_is_local_once_an_administrator_adds_it_and_knfoo_is_not_local() {
    let pool = Pool::new("names");
    // This machine's URL is learned; the first name from elsewhere too,
    // once; a request by yet another Host adds nothing.
    assert!(post(&pool, "kn_to=/what/chat&kn_payload=x&kn_response_format=simple").status().starts_with("200 "));
    let reply = pool.cgi().env("HTTP_HOST", "public.example:8080").get("do_method=whoami").run();
    assert!(reply.text().contains("kn_userid"));
    let reply = pool.cgi().env("HTTP_HOST", "alias:8080").get("do_method=whoami").run();
    assert!(reply.text().contains("kn_userid"));
    let names = std::fs::read_to_string(pool.events().join(".names")).unwrap();
    assert_eq!(names.lines().count(), 2, "{names}");
    assert!(names.starts_with("http://127.0.0.1:8080/kn\t"), "{names}");
    assert!(names.contains("\nhttp://public.example:8080/kn\n"), "{names}");
    let alias = "kn_to=http%3A%2F%2Falias%3A8080%2Fkn%2Fwhat%2Fchat&kn_payload=x&kn_id=n1&kn_response_format=simple";
    assert_eq!(post(&pool, alias).status(), "403 Proxying not supported", "a Host a client sent is no name");
    pool.store().add_server_name("http://alias:8080/kn").unwrap();
    let local = post(&pool, alias);
    assert_eq!(local.status(), "200 Notified");
    assert!(String::from_utf8_lossy(local.event().payload()).contains("Wrote to '/what/chat' (n1)"));
    let foo = post(&pool, "kn_to=http%3A%2F%2F127.0.0.1%3A8080%2Fknfoo&kn_payload=x&kn_response_format=simple");
    assert_eq!(foo.status(), "403 Proxying not supported", "…/knfoo is not the local topic /foo");
}

/// Hostile input: every request used to append its `Host` to `.names`,
/// which every CGI start reads and every URL resolution scans.
#[test]
fn a_thousand_distinct_hosts_leave_names_unchanged() {
    let pool = Pool::new("many-hosts");
    assert!(post(&pool, "kn_to=/what/chat&kn_payload=x&kn_response_format=simple").status().starts_with("200 "));
    let before = std::fs::read_to_string(pool.events().join(".names")).unwrap();
    assert!(before.starts_with("http://127.0.0.1:8080/kn\tlearned\t"), "{before}");
    for i in 0..1000 {
        let reply = pool
            .cgi()
            .env("HTTP_HOST", &format!("h{i}.example:8080"))
            .post(&format!("kn_to=/what/chat&kn_payload={i}&kn_response_format=simple"))
            .run();
        assert!(reply.status().starts_with("200 "), "{}", reply.status());
    }
    // Names elsewhere are not this machine's: only the first is taken (a
    // fresh store's public name, once), none of the 999 others.
    let after = std::fs::read_to_string(pool.events().join(".names")).unwrap();
    assert_eq!(after, format!("{before}http://h0.example:8080/kn\n"), ".names grew");
    assert_eq!(pool.store().server_names(), ["http://h0.example:8080/kn", "http://127.0.0.1:8080/kn"]);
}

/// Hostile input: a `Host` equal to a peer's URL made the peer count as
/// this server, so a route to the peer delivered into the local topic.
#[test]
fn a_forged_host_does_not_make_a_route_to_a_peer_deliver_locally() {
    let pool = Pool::new("forged-host");
    // A peer nobody listens at: a delivery to it fails and, with no
    // retries allowed, poisons the route.
    let peer = "127.0.0.1:9";
    let route = format!("do_method=route&kn_from=/what/chat&kn_to=http%3A%2F%2F{peer}%2Fkn%2Fstolen&kn_id=r1&kn_response_format=simple");
    let reply = pool.cgi().env("KN_OUTBOUND", "allow").post(&route).run();
    assert_eq!(reply.status(), "200 Routed", "{}", reply.text());
    let forged = pool
        .cgi()
        .env("KN_OUTBOUND", "allow")
        .env("KN_FORWARD_RETRIES", "0")
        .env("HTTP_HOST", peer)
        .post("kn_to=/what/chat&kn_payload=secret&kn_response_format=simple")
        .run();
    assert_eq!(forged.status(), "200 Notified", "{}", forged.text());
    let stolen = kn_journal::Topic::parse("/stolen").unwrap();
    assert!(
        !pool.events().join("stolen").exists()
            || pool.store().events(&stolen, &kn_journal::Selection::all()).unwrap().events.is_empty(),
        "the route to the peer delivered locally"
    );
    assert!(pool.store().routes(&kn_journal::Topic::parse("/what/chat").unwrap()).unwrap().is_empty(), "the failed delivery poisons the route");
    // A store named by KN_SERVER_URL takes no name from Host, even from
    // its first request, here the forged one creating the route.
    let fresh = Pool::new("forged-first");
    let named = |cgi: Cgi| cgi.env("KN_OUTBOUND", "allow").env("KN_SERVER_URL", "http://127.0.0.1:8080/kn");
    let reply = named(fresh.cgi()).env("HTTP_HOST", peer).post(&route).run();
    assert_eq!(reply.status(), "200 Routed", "{}", reply.text());
    let notified = named(fresh.cgi()).post("kn_to=/what/chat&kn_payload=secret&kn_response_format=simple").run();
    assert_eq!(notified.status(), "200 Notified");
    assert!(!fresh.events().join("stolen").exists(), "the route to the peer delivered locally");
    assert!(!fresh.events().join(".names").exists());
}

#[test]
fn disk_below_the_reserve_is_507_and_nothing_is_stored() {
    let pool = Pool::new("disk-full");
    std::fs::create_dir_all(pool.events()).unwrap();
    let free = fs4::available_space(pool.events()).unwrap();
    let reserve = (free.saturating_mul(2)).max(1 << 40).to_string();
    let reply = pool.cgi().env("KN_RESERVE_BYTES", &reserve).post("kn_to=/what/chat&kn_payload=x&kn_response_format=simple").run();
    reply.assert_one_shot();
    assert_eq!(reply.status(), "507 Insufficient Storage");
    let stored = pool.store().events(&kn_journal::Topic::parse("/what/chat").unwrap(), &kn_journal::Selection::all());
    assert!(stored.map(|s| s.events.is_empty()).unwrap_or(true), "nothing stored");
}

#[test]
fn command_line_arguments_are_ignored_under_a_web_server() {
    let pool = Pool::new("argv");
    let mut cgi = pool.cgi().get("");
    cgi.args = ["serve", "--listen", "127.0.0.1:9"].map(String::from).to_vec();
    let help = cgi.run();
    help.assert_one_shot();
    assert!(help.text().contains("<html"), "answered as a CGI: {}", help.text());
    let mut cgi = pool.cgi().post("kn_to=/what/chat&kn_payload=argv&kn_response_format=simple");
    cgi.args = ["serve", "--listen", "127.0.0.1:9"].map(String::from).to_vec();
    let started = Instant::now();
    let reply = cgi.run();
    assert_eq!(reply.status(), "200 Notified");
    assert!(started.elapsed() < Duration::from_secs(5), "did not stay listening");
    assert!(std::net::TcpStream::connect_timeout(&"127.0.0.1:9".parse().unwrap(), Duration::from_millis(200)).is_err(), "nothing listens on :9");
}

// ----- journal bugs found from here ------------------------------------------------------

/// Found by `tunnel_js_with_expires_ends_itself_and_makes_the_journal_stale`:
/// a tunnel process hung after writing its trailer. `Subscription::drop`
/// (kn-journal `watch.rs`) held the topics lock while `unwatch` waited for
/// the notifier's thread, which waited for that same lock to deliver the
/// `.heartbeat` removal that `Store::expire` had just caused. Fixed in
/// `watch.rs` (the topics lock is never held across a call into the
/// watcher); `serve` drops tunnels, so this must hold.
#[test]
fn journal_tunnel_dropped_right_after_expire_never_deadlocks() {
    let pool = Pool::new("journal-deadlock");
    let root = pool.events();
    let (done, finished) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let store = kn_journal::Store::open(&root).unwrap();
        let topic = kn_journal::Topic::parse("/who/x/s/1/kn_journal").unwrap();
        for round in 0..200 {
            let start = store.tunnel(&topic, &kn_journal::Selection::none()).unwrap();
            store.expire(&topic).unwrap();
            drop(start);
            let _ = done.send(round);
        }
    });
    let mut last = None;
    while let Ok(round) = finished.recv_timeout(Duration::from_secs(5)) {
        last = Some(round);
    }
    assert_eq!(last, Some(199), "a Tunnel drop deadlocked after round {last:?}");
}

/// Hostile input: a body of `a&a&a&…` made one parameter per two bytes
/// (a 24 MiB body: 12 million pairs, several hundred MiB of memory).
#[test]
fn form_elements_up_to_the_limit_are_accepted_and_one_more_is_413() {
    let pool = Pool::new("form-elements");
    // Three in the query, two in the body: five, the limit.
    let at_limit = pool
        .cgi()
        .env("KN_MAX_FORM_ELEMENTS", "5")
        .env("QUERY_STRING", "kn_to=/what/chat&kn_response_format=simple&kn_id=f1")
        .post("kn_payload=x&x=1")
        .run();
    assert_eq!(at_limit.status(), "200 Notified", "{}", at_limit.text());
    let over = pool
        .cgi()
        .env("KN_MAX_FORM_ELEMENTS", "5")
        .env("QUERY_STRING", "kn_to=/what/chat&kn_response_format=simple&kn_id=f2")
        .post("kn_payload=x&x=1&y=2")
        .run();
    over.assert_one_shot();
    assert_eq!(over.status(), "413 Too many form elements", "{}", over.text());
    assert!(over.text().contains("more than 5 form elements in the query string and body together (KN_MAX_FORM_ELEMENTS)"), "{}", over.text());
    let query_only = pool.cgi().env("KN_MAX_FORM_ELEMENTS", "2").get("kn_to=/what/chat&kn_payload=x&kn_id=f3").run();
    assert!(query_only.status().starts_with("413 "), "{}", query_only.status());
    let ids: Vec<_> = pool.store().events(&kn_journal::Topic::parse("/what/chat").unwrap(), &kn_journal::Selection::all()).unwrap().events;
    assert_eq!(ids.iter().map(|e| e.id().unwrap().to_vec()).collect::<Vec<_>>(), [b"f1".to_vec()], "nothing stored past the limit");
    // The default.
    let many = "a=1&".repeat(10_000);
    let reply = pool.cgi().post(&format!("kn_to=/what/chat&kn_payload=x&kn_response_format=simple&{many}")).run();
    assert_eq!(reply.status(), "413 Too many form elements");
}

// ----- old clients: behave as the original ---------------------------------------------

/// The original answers `200 Routed` to a route into a URL of this server
/// that names no valid topic (a `..` segment, or no `/` after the script),
/// and the route poisons at its first delivery (PROTOCOL.md 4.1 step 4, bad
/// name): 2003 clients that stop at a refused route depend on it. Under the
/// default outbound policy (`deny`): no request leaves the server for it.
/// The route's reply is golden 06b's (the same request with another
/// `kn_to`); the notify still succeeds and nothing is delivered.
#[test]
fn route_to_a_url_of_this_server_naming_no_topic_is_routed_then_poisoned_like_the_original() {
    let cases = [
        ("dotdot", "http%3A%2F%2F127.0.0.1%3A8080%2Fkn%2Fwhat%2Fa%2F..%2Fflurb", "segment '..' starts or ends with '.'"),
        ("no-slash", "http%3A%2F%2F127.0.0.1%3A8080%2Fknwhat%2Fa", "only with a '/' after the server URL"),
    ];
    for (case, destination, why) in cases {
        let pool = Pool::new(&format!("route-bad-name-{case}"));
        // As in golden's pool, `/what` exists already.
        post(&pool, "kn_to=/what/chat&kn_payload=hello&kn_id=e1");
        let route = format!(
            "do_method=route&kn_from=%2Fwhat%2Fother&kn_to={destination}&kn_id=r2&kn_uri=http%3A%2F%2Fexample%2Furi2&kn_response_format=simple"
        );
        let reply = post(&pool, &route);
        reply.assert_one_shot();
        assert_simple_like(&reply, &golden("06b-route-simple"));

        let notify = post(&pool, "kn_to=/what/other&kn_payload=hello&kn_id=e1&kn_response_format=simple");
        notify.assert_one_shot();
        assert_eq!(notify.status(), "200 Notified", "{case}: {}", notify.text());
        assert_eq!(status_of(&notify.event()), "200 Notified");
        assert_eq!(
            String::from_utf8_lossy(notify.event().payload()),
            "Wrote to '/what/other' (e1)\nWrote to '/what/other/kn_routes' (r2)\n",
            "{case}: the event, then the poisoning, nothing delivered"
        );

        let store = pool.store();
        let routes = store.all_routes(&kn_journal::Topic::parse("/what/other").unwrap()).unwrap();
        let r2 = routes.iter().find(|r| r.id() == b"r2").expect("route r2");
        assert!(r2.destination().is_empty(), "{case}: poisoned: {r2:?}");
        assert!(r2.event.contains("kn_expires"), "{case}: a poisoned route expires");
        let reason = r2.event.get_str("kn_poisoned").unwrap_or_default();
        assert!(reason.starts_with("bad topic name '") && reason.contains(why), "{case}: {reason}");
        let topics: Vec<String> = store.topics().unwrap().iter().map(|t| t.to_string()).collect();
        assert!(!topics.iter().any(|t| t.contains("flurb") || t.contains("knwhat") || t.starts_with("/what/a")), "{case}: delivered: {topics:?}");

        let again = simple_post(&pool, "kn_to=/what/other&kn_payload=again&kn_id=e2");
        assert_eq!(String::from_utf8_lossy(again.payload()), "Wrote to '/what/other' (e2)\n", "{case}: poisoned once");
    }
}

/// KN_FORWARD_INLINE under CGI: a notify to a topic with more routes is
/// answered once its event is stored (one `Wrote to` line), and the child
/// that outlives the CGI process forwards it right after: every
/// destination gets it.
#[test]
fn a_fan_out_past_forward_inline_is_answered_first_and_forwarded_by_the_child() {
    let pool = Pool::new("forward-inline");
    for i in 0..3 {
        let reply = post(&pool, &format!("do_method=route&kn_from=/what/fan&kn_to=/what/copy{i}&kn_response_format=simple"));
        assert_eq!(reply.status(), "200 Routed", "{}", reply.text());
    }
    let reply = pool.cgi().env("KN_FORWARD_INLINE", "2").post("kn_to=/what/fan&kn_id=fanned&kn_payload=x&kn_response_format=simple").run();
    assert_eq!(reply.status(), "200 Notified");
    let event = reply.event();
    let payload = String::from_utf8_lossy(event.payload()).into_owned();
    assert_eq!(payload.matches("Wrote to '").count(), 1, "{payload}");
    let store = pool.store();
    let arrived = |i: usize| {
        let topic = kn_journal::Topic::parse(&format!("/what/copy{i}")).unwrap();
        store.events(&topic, &kn_journal::Selection::all()).map(|s| s.events.iter().any(|e| e.id() == Some(&b"fanned"[..]))).unwrap_or(false)
    };
    let deadline = Instant::now() + Duration::from_secs(5);
    while !(0..3).all(arrived) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!((0..3).all(arrived), "every route's destination has the event");
    // At the limit: the copies are written before the answer and listed.
    let reply = pool.cgi().env("KN_FORWARD_INLINE", "3").post("kn_to=/what/fan&kn_id=inline&kn_payload=y&kn_response_format=simple").run();
    let event = reply.event();
    let payload = String::from_utf8_lossy(event.payload()).into_owned();
    assert_eq!(payload.matches("Wrote to '").count(), 4, "{payload}");
}
