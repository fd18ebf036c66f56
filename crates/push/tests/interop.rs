//! Interoperability with an independent implementation: what kn-push
//! prepares is checked by push_service.py, which verifies the VAPID JWT
//! with PyPI's py_vapid and decrypts the body with PyPI's http_ece (RFC
//! 8291), as a push service and a browser would.

use std::io::{BufRead, BufReader, Write};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};

use base64::engine::general_purpose::STANDARD;
use base64::Engine;
use kn_push::{prepare, PushOptions, Subscription, VapidKey, MAX_BODY_BYTES, OVERHEAD};

struct StandIn {
    child: Child,
    stdin: ChildStdin,
    stdout: BufReader<ChildStdout>,
    subscription: Subscription,
}

impl StandIn {
    /// Starts the stand-in, or returns None after skipping (outside CI)
    /// when python3 or its modules are missing.
    fn start() -> Option<StandIn> {
        let probe = Command::new("python3").args(["-c", "import http_ece, py_vapid"]).output();
        match probe {
            Ok(out) if out.status.success() => {}
            Ok(out) => {
                kn_test_support::skip(&format!(
                    "python3 lacks http_ece or py_vapid (pip install http_ece py_vapid): {}",
                    String::from_utf8_lossy(&out.stderr)
                ));
                return None;
            }
            Err(e) => {
                kn_test_support::skip(&format!("python3 cannot run: {e}"));
                return None;
            }
        }
        let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/push_service.py");
        let mut child = Command::new("python3").arg(script).stdin(Stdio::piped()).stdout(Stdio::piped()).spawn().unwrap();
        let stdin = child.stdin.take().unwrap();
        let mut stdout = BufReader::new(child.stdout.take().unwrap());
        let mut line = String::new();
        stdout.read_line(&mut line).unwrap();
        let first: serde_json::Value = serde_json::from_str(&line).unwrap();
        let subscription = Subscription::parse(&first["subscription"].to_string()).unwrap();
        Some(StandIn { child, stdin, stdout, subscription })
    }

    /// Hands a prepared request to the stand-in; its verdict.
    fn check(&mut self, req: &kn_push::PushRequest) -> serde_json::Value {
        let headers: serde_json::Map<String, serde_json::Value> =
            req.headers.iter().map(|(n, v)| (n.to_string(), serde_json::Value::String(v.clone()))).collect();
        let message = serde_json::json!({"endpoint": req.endpoint, "headers": headers, "body": STANDARD.encode(&req.body)});
        writeln!(self.stdin, "{message}").unwrap();
        let mut line = String::new();
        self.stdout.read_line(&mut line).unwrap();
        serde_json::from_str(&line).unwrap()
    }
}

impl Drop for StandIn {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn now() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_secs()
}

#[test]
fn http_ece_decrypts_and_py_vapid_verifies_what_kn_push_sends() {
    let Some(mut service) = StandIn::start() else { return };
    let key = VapidKey::generate();
    let options = PushOptions::parse(Some("120"), Some("high"), Some("chat")).unwrap();
    let payload = "{\"kn_route_topic\":\"/what/chat\",\"kn_payload\":\"héllo\"}".as_bytes();
    let req = prepare(&service.subscription.clone(), &key, "mailto:ops@example.org", &options, payload, b"{}", now()).unwrap();
    let verdict = service.check(&req);
    assert_eq!(verdict["ok"], true, "{verdict}");
    assert_eq!(STANDARD.decode(verdict["plaintext"].as_str().unwrap()).unwrap(), payload);
    assert_eq!(verdict["claims"]["sub"], "mailto:ops@example.org");
}

#[test]
fn the_largest_event_that_fits_is_sent_whole_and_one_byte_more_sends_its_id() {
    let Some(mut service) = StandIn::start() else { return };
    let key = VapidKey::generate();
    let sub = service.subscription.clone();
    let fits = vec![b'a'; MAX_BODY_BYTES - OVERHEAD];
    let req = prepare(&sub, &key, "mailto:ops@example.org", &PushOptions::default(), &fits, b"{\"kn_event_id\":\"e1\"}", now()).unwrap();
    assert!(!req.shortened);
    assert_eq!(req.body.len(), MAX_BODY_BYTES);
    let verdict = service.check(&req);
    assert_eq!(verdict["ok"], true, "{verdict}");
    assert_eq!(STANDARD.decode(verdict["plaintext"].as_str().unwrap()).unwrap(), fits);

    let over = vec![b'a'; MAX_BODY_BYTES - OVERHEAD + 1];
    let req = prepare(&sub, &key, "mailto:ops@example.org", &PushOptions::default(), &over, b"{\"kn_event_id\":\"e1\"}", now()).unwrap();
    assert!(req.shortened);
    let verdict = service.check(&req);
    assert_eq!(verdict["ok"], true, "{verdict}");
    assert_eq!(STANDARD.decode(verdict["plaintext"].as_str().unwrap()).unwrap(), b"{\"kn_event_id\":\"e1\"}");
}

#[test]
fn the_stand_in_refuses_a_message_signed_by_another_key() {
    // The stand-in is a test that can fail: a JWT whose signature does not
    // match the k= it names is refused.
    let Some(mut service) = StandIn::start() else { return };
    let sub = service.subscription.clone();
    let mut req = prepare(&sub, &VapidKey::generate(), "mailto:ops@example.org", &PushOptions::default(), b"x", b"{}", now()).unwrap();
    let other = VapidKey::generate().public_base64url();
    for (name, value) in req.headers.iter_mut() {
        if *name == "Authorization" {
            let t = value.split(", k=").next().unwrap().to_string();
            *value = format!("{t}, k={other}");
        }
    }
    let verdict = service.check(&req);
    assert_eq!(verdict["ok"], false, "{verdict}");
}
