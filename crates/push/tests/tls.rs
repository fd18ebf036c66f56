//! Web Push over https (issue 42): the sender against the stand-in push
//! service of push_service.py serving TLS on 127.0.0.1 (the test setting
//! allows a loopback literal), with a CA and certificate this test makes
//! with openssl. Trusted through `Sender::trusting` (KN_PUSH_CA_FILE), the
//! push is delivered and decrypted by PyPI's http_ece; with the built-in
//! roots the certificate is refused; and an allowlisted name that
//! resolves to loopback is refused after resolution.

use std::io::{BufRead, BufReader, Read};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine;
use kn_journal::internal::{Push, PushAnswer};
use kn_journal::{Config, Event};
use kn_push::{PushPolicy, PushSettings, Sender};

/// A test CA and a certificate for `localhost` and 127.0.0.1 it signed,
/// made with openssl in `dir`: (CA file, certificate, key).
fn certificates(dir: &Path) -> Option<(PathBuf, PathBuf, PathBuf)> {
    if Command::new("openssl").arg("version").output().is_err() {
        kn_test_support::skip("openssl is needed to make the test certificates");
        return None;
    }
    let run = |args: &[&str]| {
        let out = Command::new("openssl").args(args).current_dir(dir).output().unwrap();
        assert!(out.status.success(), "openssl {args:?}: {}", String::from_utf8_lossy(&out.stderr));
    };
    let ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes"];
    run(&[&["req", "-x509"][..], &ec, &["-keyout", "ca.key", "-out", "ca.pem", "-days", "2", "-subj", "/CN=kn-push test CA"]].concat());
    run(&[&["req"][..], &ec, &["-keyout", "leaf.key", "-out", "leaf.csr", "-subj", "/CN=localhost"]].concat());
    std::fs::write(
        dir.join("leaf.ext"),
        "subjectAltName=DNS:localhost,IP:127.0.0.1\nbasicConstraints=CA:FALSE\nkeyUsage=digitalSignature\nextendedKeyUsage=serverAuth\n",
    )
    .unwrap();
    run(&[
        "x509", "-req", "-in", "leaf.csr", "-CA", "ca.pem", "-CAkey", "ca.key", "-CAcreateserial", "-out", "leaf.pem", "-days", "2", "-extfile",
        "leaf.ext",
    ]);
    Some((dir.join("ca.pem"), dir.join("leaf.pem"), dir.join("leaf.key")))
}

struct StandIn {
    child: Child,
    keys: serde_json::Value,
    base: String,
    ca: PathBuf,
}

impl Drop for StandIn {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl StandIn {
    fn start(dir: &Path) -> Option<StandIn> {
        match Command::new("python3").args(["-c", "import http_ece, py_vapid"]).output() {
            Ok(out) if out.status.success() => {}
            other => {
                kn_test_support::skip(&format!("python3 with http_ece and py_vapid is needed (pip install http_ece py_vapid): {other:?}"));
                return None;
            }
        }
        let (ca, cert, key) = certificates(dir)?;
        let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/push_service.py");
        let mut child = Command::new("python3").arg(script).arg("--https").arg(&cert).arg(&key).stdout(Stdio::piped()).spawn().unwrap();
        let mut line = String::new();
        BufReader::new(child.stdout.take().unwrap()).read_line(&mut line).unwrap();
        let first: serde_json::Value = serde_json::from_str(&line).unwrap_or_else(|e| panic!("stand-in said {line:?}: {e}"));
        Some(StandIn { child, keys: first["subscription"]["keys"].clone(), base: first["base"].as_str().unwrap().to_string(), ca })
    }

    fn destination(&self, path: &str) -> String {
        let json = serde_json::json!({"endpoint": format!("{}{path}", self.base), "keys": self.keys});
        format!("webpush:{}", URL_SAFE_NO_PAD.encode(json.to_string()))
    }

    /// What the stand-in made of each push (GET /results over its TLS).
    fn results(&self) -> Vec<serde_json::Value> {
        let pem = std::fs::read(&self.ca).unwrap();
        let certs: Vec<_> = ureq::tls::parse_pem(&pem)
            .filter_map(|i| match i.unwrap() {
                ureq::tls::PemItem::Certificate(c) => Some(c),
                _ => None,
            })
            .collect();
        let tls = ureq::tls::TlsConfig::builder().root_certs(ureq::tls::RootCerts::Specific(Arc::new(certs))).build();
        let agent = ureq::Agent::config_builder().tls_config(tls).build().new_agent();
        let mut body = String::new();
        agent.get(&format!("{}/results", self.base)).call().unwrap().body_mut().as_reader().read_to_string(&mut body).unwrap();
        serde_json::from_str(&body).unwrap()
    }
}

/// A sender whose allowlist is `host`, with the test setting or not.
fn sender_for(root: &Path, host: &str, test_loopback: bool) -> Sender {
    let policy: PushPolicy = host.parse().unwrap();
    let policy = if test_loopback { policy.allowing_loopback_for_tests() } else { policy };
    let settings = PushSettings { contact: "mailto:ops@example.org".into(), policy, test_loopback };
    Sender::open(root, &Config::new(root), settings).unwrap()
}

fn event() -> Event {
    let mut event = Event::new();
    event.set("kn_id", "e1");
    event.set("kn_payload", "over tls");
    event
}

#[test]
fn a_push_over_https_to_a_service_with_a_trusted_ca_is_sent_and_decrypts() {
    let dir = tempfile::tempdir().unwrap();
    let Some(service) = StandIn::start(dir.path()) else { return };
    let sender = sender(dir.path(), true).trusting(&service.ca).unwrap();
    let answer = sender.send(&service.destination("/push/201"), &Event::new(), &event());
    assert!(matches!(answer, PushAnswer::Sent), "{answer:?}");
    let results = service.results();
    assert_eq!(results.len(), 1, "{results:?}");
    assert_eq!(results[0]["ok"], true, "{results:?}");
    assert_eq!(results[0]["claims"]["aud"], service.base.as_str(), "{results:?}");
    let plaintext = base64::engine::general_purpose::STANDARD.decode(results[0]["plaintext"].as_str().unwrap()).unwrap();
    let message: serde_json::Value = serde_json::from_slice(&plaintext).unwrap();
    assert_eq!(message["kn_payload"], "over tls");
}

#[test]
fn a_push_service_whose_certificate_no_trusted_root_signed_is_not_sent_to() {
    let dir = tempfile::tempdir().unwrap();
    let Some(service) = StandIn::start(dir.path()) else { return };
    // The built-in Mozilla roots: the test CA is not among them.
    let answer = sender(dir.path(), true).send(&service.destination("/push/201"), &Event::new(), &event());
    match &answer {
        PushAnswer::Retry(None, why) => assert!(why.to_lowercase().contains("certificate"), "{why}"),
        other => panic!("{other:?}"),
    }
    assert!(service.results().is_empty());
}

fn sender(root: &Path, test_loopback: bool) -> Sender {
    sender_for(root, "default", test_loopback)
}

/// A name that resolves to loopback only with no DNS: this machine's host
/// name as Debian's /etc/hosts has it (`127.0.1.1 name`; this kind of
/// machine's `127.0.0.1 vm`), else any other name /etc/hosts gives a
/// loopback address. It passes the allowlist's checks of names
/// (`localhost` is refused by name), so only what it resolves to can
/// refuse it.
fn loopback_name() -> Option<String> {
    use std::net::ToSocketAddrs;
    let resolves_to_loopback = |name: &str| {
        let addrs: Vec<_> = (name, 443).to_socket_addrs().map(|a| a.collect()).unwrap_or_default();
        !name.is_empty() && !addrs.is_empty() && addrs.iter().all(|a| a.ip().is_loopback())
    };
    let host = Command::new("hostname").output().ok().and_then(|o| String::from_utf8(o.stdout).ok()).unwrap_or_default();
    let hosts = std::fs::read_to_string("/etc/hosts").unwrap_or_default();
    let listed = hosts
        .lines()
        .map(|line| line.split('#').next().unwrap_or(""))
        .filter(|line| line.split_whitespace().next().is_some_and(|addr| addr.starts_with("127.") || addr == "::1"))
        .flat_map(|line| line.split_whitespace().skip(1).map(str::to_string).collect::<Vec<_>>());
    std::iter::once(host.trim().to_string())
        .chain(listed)
        .map(|name| name.to_ascii_lowercase())
        .filter(|name| !name.starts_with("localhost") && !name.starts_with("ip6-") && name.contains(|c: char| c.is_ascii_alphabetic()))
        .find(|name| resolves_to_loopback(name))
}

#[test]
fn an_allowlisted_push_service_name_that_resolves_to_loopback_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let Some(name) = loopback_name() else {
        kn_test_support::skip("this machine's host name does not resolve to loopback only (/etc/hosts)");
        return;
    };
    // The name is on the allowlist and is not an address literal: only
    // what it resolves to can refuse it, before any connection.
    let sender = sender_for(dir.path(), &name, false);
    let keys = r#"{"p256dh":"BCVxsr7N_eNgVRqvHtD0zTZsEc6-VV-JvLexhqUzORcxaOzi6-AYWXvTBHm4bjyPjs7Vd8pZGH6SRpkNtoIAiw4","auth":"BTBZMqHH6r4Tts7J_aSIgg"}"#;
    let json = format!(r#"{{"endpoint":"https://{name}/push/201","keys":{keys}}}"#);
    let destination = format!("webpush:{}", URL_SAFE_NO_PAD.encode(json));
    let answer = sender.send(&destination, &Event::new(), &event());
    match &answer {
        PushAnswer::Refused(why) => assert!(why.contains(&format!("'{name}' resolves to 127.")), "{why}"),
        other => panic!("{other:?}"),
    }
}

#[test]
fn a_ca_file_without_a_certificate_is_an_error_naming_it() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("empty.pem");
    std::fs::write(&file, "not a certificate\n").unwrap();
    let err = sender(dir.path(), false).trusting(&file).err().unwrap();
    assert!(err.to_string().contains("KN_PUSH_CA_FILE") && err.to_string().contains("empty.pem"), "{err}");
}
