//! `kn token`: a bearer token signed with the store's own HS256 key
//! (docs/ACCESS.md, "Bearer tokens").

use std::os::unix::fs::PermissionsExt;
use std::process::Command;

use jsonwebtoken::{Algorithm, DecodingKey, Validation};
use serde_json::Value;

const KN: &str = env!("CARGO_BIN_EXE_kn");

fn kn(root: &std::path::Path, args: &[&str]) -> std::process::Output {
    Command::new(KN).env_clear().arg("--root").arg(root).arg("token").args(args).output().unwrap()
}

fn claims(root: &std::path::Path, token: &str) -> Value {
    let key = std::fs::read(root.join(".token-key")).unwrap();
    let header = jsonwebtoken::decode_header(token).unwrap();
    assert_eq!(header.kid.as_deref(), Some("store"));
    assert_eq!(header.alg, Algorithm::HS256);
    let mut validation = Validation::new(Algorithm::HS256);
    validation.validate_aud = false;
    jsonwebtoken::decode::<Value>(token, &DecodingKey::from_secret(&key), &validation).unwrap().claims
}

#[test]
fn kn_token_prints_a_token_signed_with_a_new_store_key_of_mode_0660() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("kn_events");
    let out = kn(&root, &["--user", "anna", "--groups", "staff,ops", "--read", "/who/anna/**", "--post", "/what/chat", "--ttl", "1h"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let token = String::from_utf8(out.stdout).unwrap();
    let mode = std::fs::metadata(root.join(".token-key")).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o660);
    let c = claims(&root, token.trim());
    assert_eq!(c["sub"], "anna");
    assert_eq!(c["groups"], serde_json::json!(["staff", "ops"]));
    assert_eq!(c["kn"], serde_json::json!({"read": ["/who/anna/**"], "post": ["/what/chat"]}));
    let ttl = c["exp"].as_u64().unwrap() - c["iat"].as_u64().unwrap();
    assert_eq!(ttl, 3600);
    // The same key signs the next one.
    let again = kn(&root, &["--read", "/what/drop"]);
    let c = claims(&root, String::from_utf8(again.stdout).unwrap().trim());
    assert!(c.get("sub").is_none(), "a capability: {c}");
    assert_eq!(c["kn"], serde_json::json!({"read": ["/what/drop"]}));
}

#[test]
fn kn_token_refuses_a_bad_lifetime() {
    let dir = tempfile::tempdir().unwrap();
    let out = kn(&dir.path().join("kn_events"), &["--user", "anna", "--ttl", "1w"]);
    assert_eq!(out.status.code(), Some(64), "{}", String::from_utf8_lossy(&out.stderr));
}
