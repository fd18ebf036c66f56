//! kn-mail end to end: a real procmail delivers messages through the
//! README's recipe into the sensor, which writes a real store.

mod sensors_harness;

use std::process::Command;

use sensors_harness::*;

/// The README's procmail recipe, with the sandbox's binary and store.
fn procmail_rc(sandbox: &Sandbox) -> std::path::PathBuf {
    procmail_rc_with(sandbox, "")
}

/// The README's recipe after `preamble` (procmail assignments, which it
/// exports to the programs it runs: as root it passes on no other
/// environment).
fn procmail_rc_with(sandbox: &Sandbox, preamble: &str) -> std::path::PathBuf {
    let recipe = readme_block("procmail recipe")
        .replace("/usr/local/bin/kn-mail", &sensor_path("kn-mail").display().to_string())
        .replace("/var/lib/kn_events", &sandbox.store_dir().display().to_string());
    assert!(recipe.contains(":0"), "the README block is a procmail recipe:\n{recipe}");
    // procmail takes HOME from the password file (root's, in CI), so the
    // log and the fallback mailbox are named absolutely.
    let rc = format!(
        "LOGFILE={}\nVERBOSE=on\nDEFAULT={}\n{preamble}\n{recipe}",
        sandbox.join("procmail.log").display(),
        sandbox.join("mbox").display()
    );
    sandbox.write("procmailrc", rc)
}

/// procmail, or `None` (a recorded skip) when it is not installed and this
/// is not CI.
fn procmail() -> Option<Command> {
    let found = std::env::var_os("PATH")
        .map(|paths| std::env::split_paths(&paths).any(|dir| dir.join("procmail").is_file()))
        .unwrap_or(false);
    if !found {
        kn_test_support::skip("procmail is not installed (.ci/run installs it)");
        return None;
    }
    Some(Command::new("procmail"))
}

/// Delivers `message` with `procmail -m <rcfile>`; returns its exit code.
fn deliver(sandbox: &Sandbox, rc: &std::path::Path, message: &[u8]) -> Option<i32> {
    let mut cmd = procmail()?;
    cmd.arg("-m").arg(rc);
    let out = sandbox.run(cmd, message);
    Some(out.status.code().unwrap_or(-1))
}

fn procmail_log(sandbox: &Sandbox) -> String {
    std::fs::read_to_string(sandbox.join("procmail.log")).unwrap_or_default()
}

fn kn_mail(sandbox: &Sandbox, target: &str, message: &[u8]) -> std::process::Output {
    let mut cmd = sensor("kn-mail");
    cmd.arg("--root").arg(sandbox.store_dir()).arg(target);
    sandbox.run(cmd, message)
}

#[test]
fn procmail_delivers_a_message_with_its_decoded_subject_and_body() {
    let sandbox = Sandbox::new();
    let rc = procmail_rc(&sandbox);
    let Some(code) = deliver(&sandbox, &rc, &fixture("mail/encoded.eml")) else { return };
    assert_eq!(code, 0, "procmail log:\n{}", procmail_log(&sandbox));
    assert!(!sandbox.join("mbox").exists(), "the sensor took the message; nothing fell through to the mailbox");

    let e = sandbox.event("/what/mail", "20040103010530.4F2A1@example.org");
    // RFC 2047 B and Q encoded words, folded over two lines, to UTF-8.
    assert_eq!(e.get_str("Subject").unwrap(), "Grüße aus Köln — café");
    assert_eq!(e.get_str("From").unwrap(), "Anna Müller <anna@example.org>");
    assert_eq!(e.get_str("To").unwrap(), "Sensors <sensors@example.net>, Bob <bob@example.net>");
    assert_eq!(e.get_str("Date").unwrap(), "Sat, 3 Jan 2004 01:05:30 +0100");
    assert_eq!(e.get_str("Message-ID").unwrap(), "<20040103010530.4F2A1@example.org>");
    assert_eq!(e.get_str("X-Mailer").unwrap(), "knpubsub test suite");
    // Quoted-printable ISO-8859-1 body, soft line break joined.
    assert_eq!(
        e.get_str("kn_payload").unwrap(),
        "Grüße aus Köln!\nDies ist eine Zeile, die sehr lang ist und deshalb mit einem weichen Zeilenumbruch kodiert wurde.\n"
    );
    // The mbox From_ line and the trace fields are not elements.
    assert!(!e.contains("Received") && !e.contains("Return-Path"), "{e:?}");
    assert!(e.elements().all(|(n, _)| !n.starts_with(b"From ")), "{e:?}");
}

#[test]
fn the_same_message_delivered_twice_is_stored_once() {
    let sandbox = Sandbox::new();
    let rc = procmail_rc(&sandbox);
    let message = fixture("mail/encoded.eml");
    let Some(code) = deliver(&sandbox, &rc, &message) else { return };
    assert_eq!(code, 0, "{}", procmail_log(&sandbox));
    let first = sandbox.event("/what/mail", "20040103010530.4F2A1@example.org");

    // The mail system redelivers it, through another relay this time.
    let text = String::from_utf8(message).unwrap();
    let relayed = text.replacen(
        "Return-Path",
        "Received: from relay2.example.net by mx.example.net; Sun, 4 Jan 2004 08:00:00 +0100\nReturn-Path",
        1,
    );
    assert_eq!(deliver(&sandbox, &rc, relayed.as_bytes()), Some(0), "{}", procmail_log(&sandbox));

    let events = sandbox.events("/what/mail");
    assert_eq!(events.len(), 1, "{events:#?}");
    assert_eq!(
        events[0].checkpoint(),
        first.checkpoint(),
        "the redelivery was a duplicate: not stored again (a replacement would get a new checkpoint)"
    );
}

#[test]
fn a_message_without_message_id_is_also_stored_once() {
    let sandbox = Sandbox::new();
    let message = fixture("mail/no-message-id.eml");
    assert_code(&kn_mail(&sandbox, "/what/cron", &message), 0);
    let first = sandbox.events("/what/cron");
    assert_code(&kn_mail(&sandbox, "/what/cron", &message), 0);
    let again = sandbox.events("/what/cron");
    assert_eq!(again.len(), 1);
    assert_eq!(first[0].checkpoint(), again[0].checkpoint());
    assert!(again[0].id().unwrap().starts_with(b"mail-"), "{:?}", again[0]);
    assert_eq!(again[0].get_str("Subject").unwrap(), "Cron <root@host> run-parts /etc/cron.daily");
}

#[test]
fn multipart_text_plain_is_the_payload_and_other_parts_are_described() {
    let sandbox = Sandbox::new();
    let rc = procmail_rc(&sandbox);
    let Some(code) = deliver(&sandbox, &rc, &fixture("mail/multipart.eml")) else { return };
    assert_eq!(code, 0, "{}", procmail_log(&sandbox));
    let e = sandbox.event("/what/mail", "report-q4@example.com");
    assert_eq!(e.get_str("kn_payload").unwrap(), "The report is attached.\nNumbers are up.\n");
    assert_eq!(e.get_str("attachment.1").unwrap(), "report-q4.pdf; application/pdf; 72 bytes");
    let html = e.get_str("alternative.1").unwrap();
    assert!(html.starts_with("-; text/html; "), "{html}");
    assert!(!e.contains("attachment.2") && !e.contains("alternative.2"), "{e:?}");
    assert_eq!(e.get_str("Subject").unwrap(), "Quarterly report");
}

#[test]
fn an_html_only_message_becomes_text() {
    let sandbox = Sandbox::new();
    assert_code(&kn_mail(&sandbox, "/what/news", &fixture("mail/html-only.eml")), 0);
    let e = sandbox.event("/what/news", "news-1@example.com");
    let payload = e.get_str("kn_payload").unwrap();
    assert!(payload.contains("Hello"), "{payload}");
    assert!(payload.contains("Read [more][1] & enjoy."), "{payload}");
    assert!(payload.contains("http://example.com/more"), "{payload}");
    assert!(!payload.contains('<') && !payload.contains("color: red"), "{payload}");
}

#[test]
fn a_full_disk_exits_75_and_procmail_keeps_the_message() {
    let sandbox = Sandbox::new();
    let message = fixture("mail/encoded.eml");
    let mut cmd = sensor("kn-mail");
    cmd.env("KN_RESERVE_BYTES", "18446744073709551615").arg("--root").arg(sandbox.store_dir()).arg("/what/mail");
    let out = sandbox.run(cmd, &message);
    assert_code(&out, 75);
    assert!(text(&out.stderr).contains("disk full"), "{}", text(&out.stderr));
    assert!(sandbox.events("/what/mail").is_empty());

    // Through procmail: the failed pipe lets the message fall through to
    // the mailbox instead of losing it.
    let rc = procmail_rc_with(&sandbox, "KN_RESERVE_BYTES=18446744073709551615");
    let Some(mut procmail) = procmail() else { return };
    procmail.arg("-m").arg(&rc);
    let out = sandbox.run(procmail, &message);
    assert_eq!(out.status.code(), Some(0), "{}", procmail_log(&sandbox));
    assert!(procmail_log(&sandbox).contains("Program failure (75)"), "{}", procmail_log(&sandbox));
    let mbox = std::fs::read_to_string(sandbox.join("mbox")).expect("the message is in the mailbox");
    assert!(mbox.contains("Message-ID: <20040103010530.4F2A1@example.org>"));
    assert!(sandbox.events("/what/mail").is_empty());
}

#[test]
fn unusable_input_exits_65() {
    let sandbox = Sandbox::new();
    for input in [&b""[..], b"\n\n", &fixture("mail/not-a-message.txt")] {
        let out = kn_mail(&sandbox, "/what/mail", input);
        assert_code(&out, 65);
        assert!(text(&out.stderr).starts_with("kn-mail: "), "{}", text(&out.stderr));
    }
    assert!(sandbox.events("/what/mail").is_empty());
}

#[test]
fn an_unreachable_server_exits_75() {
    let sandbox = Sandbox::new();
    let url = format!("http://127.0.0.1:{}/kn/what/mail", closed_port());
    let mut cmd = sensor("kn-mail");
    cmd.arg(&url);
    let out = sandbox.run(cmd, &fixture("mail/encoded.eml"));
    assert_code(&out, 75);
    assert!(text(&out.stderr).contains(&url), "the message names the URL: {}", text(&out.stderr));
}

#[test]
fn a_remote_pubsub_server_gets_the_message_once() {
    let sandbox = Sandbox::new();
    let server_store = sandbox.join("server_events");
    let server = pubsub_server(&server_store);
    let url = server.url();
    let message = fixture("mail/encoded.eml");
    for _ in 0..2 {
        let mut cmd = sensor("kn-mail");
        cmd.arg("-v").arg(format!("{url}/what/mail"));
        assert_code(&sandbox.run(cmd, &message), 0);
    }
    let store = kn_journal::Store::open(&server_store).unwrap();
    let events = store.events(&kn_journal::Topic::parse("/what/mail").unwrap(), &kn_journal::Selection::all()).unwrap().events;
    assert_eq!(events.len(), 1, "{events:#?}");
    assert_eq!(events[0].get_str("Subject").unwrap(), "Grüße aus Köln — café");
    assert_eq!(events[0].id(), Some(&b"20040103010530.4F2A1@example.org"[..]));
}

#[test]
fn extra_elements_and_bad_command_lines() {
    let sandbox = Sandbox::new();
    let mut cmd = sensor("kn-mail");
    cmd.arg("--root").arg(sandbox.store_dir()).args(["/what/mail", "kn_expires=infinity", "list=sensors"]);
    assert_code(&sandbox.run(cmd, &fixture("mail/multipart.eml")), 0);
    let e = sandbox.event("/what/mail", "report-q4@example.com");
    assert_eq!(e.get_str("list").unwrap(), "sensors");

    for args in [&["/bad topic"][..], &["/what/kn_routes"], &["/what/mail", "noequals"], &["ftp://x/y"], &[]] {
        let mut cmd = sensor("kn-mail");
        cmd.arg("--root").arg(sandbox.store_dir()).args(args);
        let out = sandbox.run(cmd, &fixture("mail/encoded.eml"));
        assert_code(&out, 64);
    }
}

#[test]
fn help_documents_the_sensor() {
    let out = sensor("kn-mail").arg("--help").output().unwrap();
    assert_code(&out, 0);
    let help = text(&out.stdout);
    for needle in ["procmail", ".forward", "Message-ID", "75", "65", "--root", "TARGET", "http://"] {
        assert!(help.contains(needle), "--help mentions {needle}:\n{help}");
    }
    let readme = readme();
    assert!(readme.contains("kn-mail"), "the README documents kn-mail");
}
