//! kn-post end to end: stdin and name=value arguments into the local
//! store, and over HTTP into `pubsub-cgi serve`.

mod sensors_harness;

use std::process::{Command, Output};

use sensors_harness::*;

fn kn_post(sandbox: &Sandbox, args: &[&str], stdin: &[u8]) -> Output {
    let mut cmd = sensor("kn-post");
    cmd.arg("--root").arg(sandbox.store_dir()).args(args);
    sandbox.run(cmd, stdin)
}

#[test]
fn stdin_is_the_payload_and_arguments_are_elements() {
    let sandbox = Sandbox::new();
    let payload = b"line one\nline two: with = and \x00 NUL\n";
    let out = kn_post(&sandbox, &["/what/chat", "kn_id=42", "subject=hello world", "formula=a=b"], payload);
    assert_code(&out, 0);
    assert_eq!(text(&out.stdout), "42\n", "prints the kn_id");
    let e = sandbox.event("/what/chat", "42");
    assert_eq!(e.payload(), payload, "the payload byte for byte");
    assert_eq!(e.get_str("subject").unwrap(), "hello world");
    assert_eq!(e.get_str("formula").unwrap(), "a=b");
}

#[test]
fn without_kn_id_each_post_is_a_new_event_and_the_id_is_printed() {
    let sandbox = Sandbox::new();
    let a = kn_post(&sandbox, &["/what/chat"], b"one");
    let b = kn_post(&sandbox, &["-m", "two", "/what/chat"], b"ignored");
    assert_code(&a, 0);
    assert_code(&b, 0);
    let (ida, idb) = (text(&a.stdout).trim().to_string(), text(&b.stdout).trim().to_string());
    assert_ne!(ida, idb);
    assert_eq!(sandbox.event("/what/chat", &ida).payload(), b"one");
    assert_eq!(sandbox.event("/what/chat", &idb).payload(), b"two", "--payload instead of stdin");
}

#[test]
fn the_same_kn_id_replaces_and_an_identical_repost_is_stored_once() {
    let sandbox = Sandbox::new();
    assert_code(&kn_post(&sandbox, &["-q", "/what/status", "kn_id=web1"], b"up"), 0);
    let first = sandbox.event("/what/status", "web1");
    assert_code(&kn_post(&sandbox, &["-q", "/what/status", "kn_id=web1"], b"up"), 0);
    assert_eq!(sandbox.event("/what/status", "web1").checkpoint(), first.checkpoint(), "duplicate: not stored again");
    assert_code(&kn_post(&sandbox, &["-q", "/what/status", "kn_id=web1"], b"down"), 0);
    let events = sandbox.events("/what/status");
    assert_eq!(events.len(), 1);
    assert_eq!(events[0].payload(), b"down");
}

#[test]
fn routes_fire_as_for_a_web_notify() {
    let sandbox = Sandbox::new();
    let store = kn_journal::Store::open(sandbox.store_dir()).unwrap();
    let mut route = kn_journal::Event::new();
    route.set("kn_id", "r1");
    store.route(&kn_journal::Topic::parse("/what/chat").unwrap(), b"/who/anna/inbox", route).unwrap();
    drop(store);
    assert_code(&kn_post(&sandbox, &["-q", "/what/chat", "kn_id=m1"], b"hi anna"), 0);
    let routed = sandbox.event("/who/anna/inbox", "m1");
    assert_eq!(routed.payload(), b"hi anna");
    assert_eq!(routed.get_str("kn_route_id").unwrap(), "r1");
}

#[test]
fn posting_to_pubsub_cgi_serve_over_http() {
    let sandbox = Sandbox::new();
    let server_store = sandbox.join("server_events");
    let server = pubsub_server(&server_store);
    let url = format!("{}/what/chat", server.url());
    let mut cmd = sensor("kn-post");
    cmd.args([&url, "kn_id=h1", "tricky=a&b;c=d%20 e"]);
    let out = sandbox.run(cmd, "héllo\nwörld\n".as_bytes());
    assert_code(&out, 0);
    assert_eq!(text(&out.stdout), "h1\n");
    let store = kn_journal::Store::open(&server_store).unwrap();
    let topic = kn_journal::Topic::parse("/what/chat").unwrap();
    let events = store.events(&topic, &kn_journal::Selection::all()).unwrap().events;
    assert_eq!(events.len(), 1);
    assert_eq!(events[0].payload(), "héllo\nwörld\n".as_bytes());
    assert_eq!(events[0].get_str("tricky").unwrap(), "a&b;c=d%20 e");

    // A topic the server refuses: its status, with the sysexits code.
    let mut cmd = sensor("kn-post");
    cmd.args([&format!("{}/kn_routes", url), "-m", "x"]);
    let out = sandbox.run(cmd, b"");
    assert_code(&out, 65);
    assert!(text(&out.stderr).contains("400"), "{}", text(&out.stderr));
}

#[test]
fn failures_have_sysexits_codes() {
    let sandbox = Sandbox::new();
    assert_code(&kn_post(&sandbox, &["/what/chat", "=x"], b""), 64);
    assert_code(&kn_post(&sandbox, &["bad topic"], b""), 64);
    assert_code(&kn_post(&sandbox, &[], b""), 64);
    let mut full = sensor("kn-post");
    full.env("KN_RESERVE_BYTES", "18446744073709551615").arg("--root").arg(sandbox.store_dir()).arg("/what/chat");
    assert_code(&sandbox.run(full, b"x"), 75);
    let mut bad_env = sensor("kn-post");
    bad_env.env("KN_RESERVE_BYTES", "lots").arg("--root").arg(sandbox.store_dir()).arg("/what/chat");
    assert_code(&sandbox.run(bad_env, b"x"), 78);
    let mut too_large = sensor("kn-post");
    too_large.env("KN_MAX_EVENT_BYTES", "100").arg("--root").arg(sandbox.store_dir()).arg("/what/chat");
    assert_code(&sandbox.run(too_large, &[b'x'; 1000]), 65);
    let url = format!("http://127.0.0.1:{}/kn/what/chat", closed_port());
    let mut cmd = sensor("kn-post");
    cmd.args([&url, "-m", "x"]);
    assert_code(&sandbox.run(cmd, b""), 75);
}

#[test]
fn kn_events_names_the_store() {
    let sandbox = Sandbox::new();
    let mut cmd = sensor("kn-post");
    cmd.args(["-q", "/what/env", "kn_id=e1"]);
    cmd.env("KN_EVENTS", sandbox.store_dir());
    // Sandbox::run clears KN_EVENTS for the other tests; set it after.
    cmd.current_dir(sandbox.path()).stdin(std::process::Stdio::piped());
    let mut child = cmd.spawn().unwrap();
    drop(child.stdin.take());
    assert!(child.wait().unwrap().success());
    assert_eq!(sandbox.event("/what/env", "e1").payload(), b"");
}

#[test]
fn the_readme_crontab_line_runs() {
    let sandbox = Sandbox::new();
    let line = readme_block("A crontab line").trim().to_string();
    let command: Vec<&str> = line.splitn(6, ' ').collect();
    assert_eq!(command.len(), 6, "a crontab line: {line}");
    let command = command[5]
        .replace("/usr/local/bin/kn-post", &sensor_path("kn-post").display().to_string())
        .replace("/var/lib/kn_events", &sandbox.store_dir().display().to_string());
    for _ in 0..2 {
        let out = sandbox.run(
            {
                let mut sh = Command::new("sh");
                sh.arg("-c").arg(&command);
                sh
            },
            b"",
        );
        assert_code(&out, 0);
        assert_eq!(text(&out.stdout), "", "-q");
    }
    let events = sandbox.events("/what/load");
    assert_eq!(events.len(), 1, "one event per host, replaced: {events:#?}");
    assert!(text(events[0].payload()).contains("load average"), "{:?}", events[0]);
}

#[test]
fn help_documents_the_sensor() {
    let out = sensor("kn-post").arg("--help").output().unwrap();
    assert_code(&out, 0);
    let help = text(&out.stdout);
    for needle in ["NAME=VALUE", "kn_payload", "kn_id", "crontab", "--root", "http://", "75"] {
        assert!(help.contains(needle), "--help mentions {needle}:\n{help}");
    }
}
