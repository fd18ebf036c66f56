//! Bearer tokens through the real `pubsub-cgi` (docs/ACCESS.md, "Bearer
//! tokens"): every refusal (`401`, `WWW-Authenticate: Bearer
//! error="invalid_token"`, the reason), key rotation by `kid`, a token
//! narrowing a broad rule, a capability without `sub`, as a CGI process
//! and under `serve` (header, `kn_token` parameter, cookie; refusals in
//! /metrics), Durable Streams under the same tokens (live reads ended at
//! expiry), a tunnel ended by its token's expiry and resumed with a new
//! token, nothing lost, routes carrying their token's rights until it
//! expires, and `/metrics` scraped with a token.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use jsonwebtoken::{Algorithm, EncodingKey, Header};
use kn_journal::{Event, Selection, Store, Topic};
use kn_test_support::http::Stream;
use kn_test_support::{run_with_stdin, Dir, Serve};
use serde_json::{json, Value};

const BIN: &str = env!("CARGO_BIN_EXE_pubsub-cgi");

const RULES: &str = "\
group staff: anna
allow all        /** users
allow read       /kn_metrics *
allow read       /what/public/** *
";

const SECRET_A: &[u8] = b"an HS256 secret of key a, 32 bytes or more";
const SECRET_B: &[u8] = b"an HS256 secret of key b, 32 bytes or more";

fn now() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_secs()
}

/// A token of `claims`, signed with `secret` by `alg`, naming `kid`.
fn hs(kid: Option<&str>, alg: Algorithm, secret: &[u8], claims: Value) -> String {
    let mut header = Header::new(alg);
    header.kid = kid.map(str::to_string);
    jsonwebtoken::encode(&header, &claims, &EncodingKey::from_secret(secret)).unwrap()
}

/// anna's token of key `a`, valid for an hour, with `extra` claims.
fn anna(extra: Value) -> String {
    let mut claims = json!({"sub": "anna", "exp": now() + 3600});
    if let (Some(c), Some(e)) = (claims.as_object_mut(), extra.as_object()) {
        c.extend(e.clone());
    }
    hs(Some("a"), Algorithm::HS256, SECRET_A, claims)
}

struct Site {
    dir: Dir,
    keys: String,
}

impl Site {
    fn new(name: &str) -> Site {
        let dir = Dir::new(name);
        dir.create("access.rules", RULES);
        let a = dir.create("a.key", SECRET_A);
        let b = dir.create("b.key", SECRET_B);
        let keys = format!("a=HS256:{},b=HS256:{}", a.display(), b.display());
        Site { dir, keys }
    }

    fn root(&self) -> PathBuf {
        self.dir.join("kn_events")
    }

    fn payloads(&self, topic: &str) -> Vec<String> {
        let store = Store::open(self.root()).unwrap();
        let selected = store.events(&Topic::parse(topic).unwrap(), &Selection::all()).map(|s| s.events).unwrap_or_default();
        selected.iter().map(|e| String::from_utf8_lossy(e.payload()).into_owned()).collect()
    }

    /// One CGI request with `env` besides the usual variables.
    fn cgi(&self, query: &str, env: &[(&str, &str)]) -> Answer {
        let mut command = Command::new(BIN);
        command
            .env_clear()
            .env("GATEWAY_INTERFACE", "CGI/1.1")
            .env("REQUEST_METHOD", "GET")
            .env("QUERY_STRING", format!("{query}&kn_response_format=simple"))
            .env("SCRIPT_NAME", "/kn")
            .env("SERVER_NAME", "127.0.0.1")
            .env("SERVER_PORT", "8080")
            .env("KN_EVENTS", self.root())
            .env("KN_ACCESS_RULES", self.dir.join("access.rules"))
            .env("KN_TOKEN_KEYS", &self.keys)
            .stdout(Stdio::piped());
        for (k, v) in env {
            command.env(k, v);
        }
        let output = run_with_stdin(&mut command, b"", Duration::from_secs(20));
        let text = String::from_utf8_lossy(&output.stdout).into_owned();
        let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
        let code = head.lines().find_map(|l| l.strip_prefix("Status: ")).and_then(|s| s.get(..3)?.parse().ok()).unwrap_or(200);
        Answer { code, head: head.to_string(), body: body.to_string() }
    }

    /// A CGI request bringing `token` in `Authorization: Bearer` (as
    /// Apache passes it with `CGIPassAuth On`).
    fn cgi_with(&self, token: &str, query: &str, env: &[(&str, &str)]) -> Answer {
        let bearer = format!("Bearer {token}");
        let mut all = vec![("HTTP_AUTHORIZATION", bearer.as_str())];
        all.extend_from_slice(env);
        self.cgi(query, &all)
    }

    fn serve(&self, extra: &[&str]) -> Serve {
        let mut command = Serve::command_of(Path::new(BIN), &self.root(), None);
        // No leeway: a token's life ends at its exp, to the second.
        command.args(extra).env("KN_ACCESS_RULES", self.dir.join("access.rules")).env("KN_TOKEN_KEYS", &self.keys).env("KN_TOKEN_LEEWAY", "0");
        Serve::spawn(command)
    }
}

#[derive(Debug)]
struct Answer {
    code: u16,
    head: String,
    body: String,
}

impl Answer {
    fn refused_as(&self, reason: &str) -> bool {
        self.code == 401
            && self.head.to_ascii_lowercase().contains("www-authenticate: bearer error=\"invalid_token\"")
            && self.body.contains(&format!("invalid bearer token ({reason})"))
    }
}

fn request(serve: &Serve, method: &str, target: &str, headers: &str) -> Answer {
    let request = format!("{method} {target} HTTP/1.1\r\nHost: {}\r\nConnection: close\r\nContent-Length: 0\r\n{headers}\r\n", serve.addr());
    let mut stream = Stream::send(&serve.url(), request.as_bytes());
    stream.read_to_end(Duration::from_secs(10));
    let text = |b: &[u8]| String::from_utf8_lossy(b).into_owned();
    Answer { code: stream.status().unwrap_or(0), head: text(stream.head()), body: text(stream.body()) }
}

const POST: &str = "do_method=notify&kn_to=/who/anna/notes&kn_payload=hi";

#[test]
fn every_unusable_token_is_refused_401_invalid_token_never_anonymous() {
    let site = Site::new("bearer_refusals");
    let settings = [("KN_TOKEN_ISSUER", "https://issuer.example"), ("KN_TOKEN_AUDIENCE", "knpubsub"), ("KN_TOKEN_LEEWAY", "0")];
    let good = json!({"sub": "anna", "iss": "https://issuer.example", "aud": "knpubsub", "exp": now() + 3600});
    let with = |change: Value| {
        let mut claims = good.clone();
        claims.as_object_mut().unwrap().extend(change.as_object().unwrap().clone());
        claims
    };
    let ok = hs(Some("a"), Algorithm::HS256, SECRET_A, good.clone());
    let a = site.cgi_with(&ok, POST, &settings);
    assert_eq!(a.code, 200, "{a:?}");

    let cases = [
        ("malformed", "not-a-jwt".to_string()),
        ("malformed", String::new()),
        // alg: none, unsigned.
        ("malformed", "eyJhbGciOiJub25lIiwidHlwIjoiSldUIn0.eyJzdWIiOiJhbm5hIiwiZXhwIjo5OTk5OTk5OTk5fQ.".to_string()),
        ("expired", hs(Some("a"), Algorithm::HS256, SECRET_A, with(json!({"exp": now() - 10})))),
        ("expired", hs(Some("a"), Algorithm::HS256, SECRET_A, json!({"sub": "anna", "iss": "https://issuer.example", "aud": "knpubsub"}))),
        ("not_yet_valid", hs(Some("a"), Algorithm::HS256, SECRET_A, with(json!({"nbf": now() + 600})))),
        ("wrong_audience", hs(Some("a"), Algorithm::HS256, SECRET_A, with(json!({"aud": "someone-else"})))),
        ("wrong_issuer", hs(Some("a"), Algorithm::HS256, SECRET_A, with(json!({"iss": "https://evil.example"})))),
        ("bad_signature", hs(Some("a"), Algorithm::HS256, SECRET_B, good.clone())),
        ("unknown_kid", hs(Some("z"), Algorithm::HS256, SECRET_A, good.clone())),
        // Another algorithm than the key's, even with the key's secret.
        ("wrong_algorithm", hs(Some("a"), Algorithm::HS384, SECRET_A, good.clone())),
        ("bad_claims", hs(Some("a"), Algorithm::HS256, SECRET_A, with(json!({"kn": {"write": ["/x"]}})))),
    ];
    for (reason, token) in &cases {
        let a = site.cgi_with(token, POST, &settings);
        assert!(a.refused_as(reason), "{reason}: {a:?}");
        // The same in the kn_token parameter.
        let a = site.cgi(&format!("{POST}&kn_token={token}"), &settings);
        assert!(a.refused_as(reason), "{reason} (parameter): {a:?}");
    }
    assert_eq!(site.payloads("/who/anna/notes"), ["hi"], "nothing refused was posted");
    // No token at all: anonymous, as before (the rules' own 401, a Basic challenge).
    let a = site.cgi(POST, &settings);
    assert_eq!(a.code, 401, "{a:?}");
    assert!(a.head.contains("Basic realm"), "{a:?}");
    assert_eq!(site.cgi("kn_from=/what/public/x&kn_expires=%2B0", &settings).code, 200);
}

#[test]
fn a_token_longer_than_the_limit_is_refused_without_decoding() {
    let site = Site::new("bearer_too_long");
    let token = anna(json!({}));
    let exact = token.len().to_string();
    let less = (token.len() - 1).to_string();
    assert_eq!(site.cgi_with(&token, POST, &[("KN_TOKEN_MAX_BYTES", &exact)]).code, 200);
    let a = site.cgi_with(&token, POST, &[("KN_TOKEN_MAX_BYTES", &less)]);
    assert!(a.refused_as("too_long"), "{a:?}");
}

#[test]
fn key_rotation_accepts_both_kids_and_refuses_a_retired_one() {
    let site = Site::new("bearer_rotation");
    let claims = json!({"sub": "anna", "exp": now() + 3600});
    let old = hs(Some("a"), Algorithm::HS256, SECRET_A, claims.clone());
    let new = hs(Some("b"), Algorithm::HS256, SECRET_B, claims.clone());
    assert_eq!(site.cgi_with(&old, POST, &[]).code, 200);
    assert_eq!(site.cgi_with(&new, POST, &[]).code, 200);
    // Key a retired: only b is left.
    let only_b = format!("b=HS256:{}", site.dir.join("b.key").display());
    let a = site.cgi_with(&old, POST, &[("KN_TOKEN_KEYS", &only_b)]);
    assert!(a.refused_as("unknown_kid"), "{a:?}");
    assert_eq!(site.cgi_with(&new, POST, &[("KN_TOKEN_KEYS", &only_b)]).code, 200);
    // With one key, a token without kid is checked with it; with two, it is refused.
    let bare = hs(None, Algorithm::HS256, SECRET_B, claims);
    assert_eq!(site.cgi_with(&bare, POST, &[("KN_TOKEN_KEYS", &only_b)]).code, 200);
    assert!(site.cgi_with(&bare, POST, &[]).refused_as("unknown_kid"));
}

#[test]
fn a_token_narrows_a_broad_rule_and_a_capability_has_exactly_its_claim() {
    let site = Site::new("bearer_narrowing");
    // The rules let every user do everything; the token only reads anna's
    // corner and posts to the chat.
    let narrow = anna(json!({"kn": {"read": ["/who/anna/**"], "post": ["/what/chat"]}}));
    assert_eq!(site.cgi_with(&narrow, "do_method=notify&kn_to=/what/chat&kn_payload=hello", &[]).code, 200);
    let a = site.cgi_with(&narrow, POST, &[]);
    assert_eq!(a.code, 403, "{a:?}");
    assert!(a.body.contains("the token of user 'anna' may not post to '/who/anna/notes': its kn claim does not allow it"), "{a:?}");
    assert_eq!(site.cgi_with(&narrow, "kn_from=/who/anna/notes&kn_expires=%2B0", &[]).code, 200);
    assert_eq!(site.cgi_with(&narrow, "kn_from=/what/chat&kn_expires=%2B0", &[]).code, 403);
    // A route needs read on its source and route on its destination.
    let a = site.cgi_with(&narrow, "do_method=route&kn_from=/who/anna/notes&kn_to=/who/anna/inbox&kn_id=r1", &[]);
    assert_eq!(a.code, 403, "{a:?}");
    // Without sub: exactly its claim, whatever the rules (which give
    // anonymous nothing here).
    let capability = hs(Some("a"), Algorithm::HS256, SECRET_A, json!({"exp": now() + 60, "kn": {"post": ["/what/drop"]}}));
    assert_eq!(site.cgi_with(&capability, "do_method=notify&kn_to=/what/drop&kn_payload=x", &[]).code, 200);
    assert_eq!(site.cgi_with(&capability, "do_method=notify&kn_to=/what/chat&kn_payload=x", &[]).code, 403);
    assert_eq!(site.cgi_with(&capability, "kn_from=/what/drop&kn_expires=%2B0", &[]).code, 403);
    assert_eq!(site.payloads("/what/drop"), ["x"]);
    // The groups claim: staff may post where only staff may.
    std::fs::write(site.dir.join("access.rules"), "allow post /what/staff/** @staff\n").unwrap();
    let bob = hs(Some("a"), Algorithm::HS256, SECRET_A, json!({"sub": "bob", "groups": ["staff"], "exp": now() + 60}));
    assert_eq!(site.cgi_with(&bob, "do_method=notify&kn_to=/what/staff/x&kn_payload=x", &[]).code, 200);
    assert_eq!(site.cgi("do_method=notify&kn_to=/what/staff/x&kn_payload=x", &[("REMOTE_USER", "bob")]).code, 403);
}

#[test]
fn a_token_minted_with_the_stores_key_is_accepted() {
    let site = Site::new("bearer_store_key");
    let root = site.root();
    std::fs::create_dir_all(&root).unwrap();
    let key = kn_journal::access::token_key_of_store(&root, true).unwrap().unwrap();
    let claims = json!({"sub": "anna", "exp": now() + 60});
    assert_eq!(site.cgi_with(&hs(Some("store"), Algorithm::HS256, &key, claims.clone()), POST, &[]).code, 200);
    assert!(site.cgi_with(&hs(Some("store"), Algorithm::HS256, SECRET_A, claims), POST, &[]).refused_as("bad_signature"));
}

#[test]
fn serve_reads_tokens_from_header_parameter_and_cookie_and_counts_refusals() {
    let site = Site::new("bearer_serve");
    // With an htpasswd file, a Bearer header is not taken for Basic credentials.
    site.dir.create("users", "carl:{SHA}qUqP5cyxm6YcTAhz05Hph5gvu9M=\n");
    let users = site.dir.join("users");
    let serve = site.serve(&["--htpasswd", users.to_str().unwrap()]);
    let token = anna(json!({}));
    let a = request(&serve, "GET", &format!("/kn?{POST}&kn_id=h&kn_response_format=simple"), &format!("Authorization: Bearer {token}\r\n"));
    assert_eq!(a.code, 200, "{a:?}");
    let a = request(&serve, "GET", &format!("/kn?do_method=notify&kn_to=/who/anna/notes&kn_payload=p&kn_id=p&kn_token={token}&kn_response_format=simple"), "");
    assert_eq!(a.code, 200, "{a:?}");
    let a = request(&serve, "GET", "/kn?do_method=notify&kn_to=/who/anna/notes&kn_payload=c&kn_id=c&kn_response_format=simple", &format!("Cookie: other=1; kn_token={token}\r\nSec-Fetch-Site: same-origin\r\n"));
    assert_eq!(a.code, 200, "{a:?}");
    assert_eq!(site.payloads("/who/anna/notes"), ["hi", "p", "c"]);
    // The token itself is never stored with the event.
    let store = Store::open(site.root()).unwrap();
    let events = store.events(&Topic::parse("/who/anna/notes").unwrap(), &Selection::all()).unwrap().events;
    assert!(events.iter().all(|e: &Event| e.get("kn_token").is_none()), "{events:?}");

    let expired = hs(Some("a"), Algorithm::HS256, SECRET_A, json!({"sub": "anna", "exp": now() - 120}));
    for _ in 0..2 {
        let a = request(&serve, "GET", &format!("/kn?{POST}&kn_response_format=simple"), &format!("Authorization: Bearer {expired}\r\n"));
        assert!(a.refused_as("expired"), "{a:?}");
    }
    let a = request(&serve, "GET", &format!("/kn?{POST}&kn_response_format=simple"), "Cookie: kn_token=garbage\r\n");
    assert!(a.refused_as("malformed"), "{a:?}");
    let metrics = request(&serve, "GET", "/metrics", "");
    assert_eq!(metrics.code, 200, "{metrics:?}");
    assert!(metrics.body.contains("kn_token_refusals_total{reason=\"expired\"} 2"), "{}", metrics.body);
    assert!(metrics.body.contains("kn_token_refusals_total{reason=\"malformed\"} 1"), "{}", metrics.body);
    assert!(metrics.body.contains("kn_token_refusals_total{reason=\"bad_signature\"} 0"), "{}", metrics.body);
}

#[test]
fn durable_streams_take_the_same_tokens() {
    let site = Site::new("bearer_streams");
    let serve = site.serve(&[]);
    let token = anna(json!({"kn": {"post": ["/v1/stream/anna/**"], "read": ["/v1/stream/anna/**"]}}));
    let bearer = format!("Authorization: Bearer {token}\r\nContent-Type: text/plain\r\n");
    let a = request(&serve, "PUT", "/v1/stream/anna/notes", &bearer);
    assert_eq!(a.code, 201, "{a:?}");
    assert_eq!(request(&serve, "GET", "/v1/stream/anna/notes?offset=-1", &bearer).code, 200);
    // Allowed by the rules, not by the token.
    let a = request(&serve, "PUT", "/v1/stream/bob/notes", &bearer);
    assert_eq!(a.code, 403, "{a:?}");
    let a = request(&serve, "GET", "/v1/stream/anna/notes?offset=-1", "Authorization: Bearer nonsense\r\n");
    assert!(a.refused_as("malformed"), "{a:?}");
    // Anonymous, as before: refused by the rules with a Basic challenge.
    assert_eq!(request(&serve, "GET", "/v1/stream/anna/notes?offset=-1", "").code, 401);
    drop(serve);
    // The same as a CGI mounted at .../v1/stream (the header as Apache
    // passes it with CGIPassAuth On).
    let cgi = |method: &str, path: &str, authorization: &str| -> String {
        let mut command = Command::new(BIN);
        command
            .env_clear()
            .env("GATEWAY_INTERFACE", "CGI/1.1")
            .env("SCRIPT_NAME", "/cgi-bin/pubsub.cgi/v1/stream")
            .env("PATH_INFO", path)
            .env("REQUEST_METHOD", method)
            .env("QUERY_STRING", "offset=-1")
            .env("SERVER_NAME", "127.0.0.1")
            .env("SERVER_PORT", "80")
            .env("CONTENT_TYPE", "text/plain")
            .env("CONTENT_LENGTH", "0")
            .env("HTTP_AUTHORIZATION", authorization)
            .env("KN_EVENTS", site.root())
            .env("KN_ACCESS_RULES", site.dir.join("access.rules"))
            .env("KN_TOKEN_KEYS", &site.keys)
            .stdout(Stdio::piped());
        String::from_utf8_lossy(&run_with_stdin(&mut command, b"", Duration::from_secs(20)).stdout).into_owned()
    };
    let bearer = format!("Bearer {token}");
    let out = cgi("PUT", "/anna/cgi", &bearer);
    assert!(out.starts_with("Status: 201 Created\r\n"), "{out}");
    assert!(cgi("GET", "/anna/cgi", &bearer).starts_with("Status: 200"), "a read");
    assert!(cgi("PUT", "/bob/cgi", &bearer).starts_with("Status: 403 "), "outside the claim");
    let out = cgi("GET", "/anna/cgi", "Bearer nonsense");
    assert!(out.starts_with("Status: 401 ") && out.contains("Bearer error=\"invalid_token\""), "{out}");
}

/// The last `kn_route_checkpoint` in a simple-format text.
fn last_checkpoint(text: &str) -> Option<String> {
    text.lines().filter_map(|l| l.strip_prefix("kn_route_checkpoint: ")).next_back().map(str::to_string)
}

#[test]
fn a_tunnel_ends_401_when_its_token_expires_and_resumes_with_a_new_one_losing_nothing() {
    let site = Site::new("bearer_tunnel_expiry");
    let serve = site.serve(&[]);
    let post = |id: &str, payload: &str| {
        let store = Store::open(site.root()).unwrap();
        store.notify(&Topic::parse("/who/anna/feed").unwrap(), Event::from_pairs([("kn_id", id), ("kn_payload", payload)])).unwrap();
    };
    let short = hs(Some("a"), Algorithm::HS256, SECRET_A, json!({"sub": "anna", "exp": now() + 3}));
    let open = |token: &str, extra: &str| {
        let request = format!(
            "GET /kn/who/anna/feed?kn_response_format=simple{extra} HTTP/1.0\r\nHost: {}\r\nAuthorization: Bearer {token}\r\n\r\n",
            serve.addr()
        );
        Stream::send(&serve.url(), request.as_bytes())
    };
    let mut tunnel = open(&short, "");
    assert!(tunnel.read_until(b"Watching topic", Duration::from_secs(10)), "{}", tunnel.text());
    post("e1", "before-expiry");
    assert!(tunnel.read_until(b"before-expiry", Duration::from_secs(10)), "{}", tunnel.text());
    // At expiry, without any event to deliver, the tunnel ends with 401.
    assert!(tunnel.read_until(b"401 Unauthorized", Duration::from_secs(10)), "{}", tunnel.text());
    assert!(tunnel.read_to_end(Duration::from_secs(10)), "the tunnel ends: {}", tunnel.text());
    let text = tunnel.text();
    assert!(text.contains("bearer token expired"), "{text}");
    let checkpoint = last_checkpoint(&text).expect("a checkpoint");
    post("e2", "while-away");
    // A new token, from the checkpoint: nothing lost.
    let fresh = anna(json!({}));
    let mut again = open(&fresh, &format!("&do_since_checkpoint={checkpoint}"));
    assert!(again.read_until(b"while-away", Duration::from_secs(10)), "{}", again.text());
    assert!(!again.text().contains("before-expiry"), "{}", again.text());
}

#[test]
fn public_key_tokens_rs256_es256_eddsa_verify_and_refuse_algorithm_confusion() {
    if !kn_test_support::skip::available("/usr/bin/openssl") {
        return;
    }
    let site = Site::new("bearer_public_keys");
    let mut entries = Vec::new();
    let mut signers = Vec::new();
    for (kid, alg, genpkey) in [
        ("r", Algorithm::RS256, vec!["-algorithm", "RSA", "-pkeyopt", "rsa_keygen_bits:2048"]),
        ("e", Algorithm::ES256, vec!["-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:P-256"]),
        ("d", Algorithm::EdDSA, vec!["-algorithm", "ED25519"]),
    ] {
        let private = site.dir.join(&format!("{kid}.pem"));
        let public = site.dir.join(&format!("{kid}.pub.pem"));
        let ok = Command::new("openssl").arg("genpkey").args(&genpkey).arg("-out").arg(&private).status().unwrap().success();
        assert!(ok, "openssl genpkey {genpkey:?}");
        let ok = Command::new("openssl").args(["pkey", "-pubout", "-in"]).arg(&private).arg("-out").arg(&public).status().unwrap().success();
        assert!(ok);
        let name = match alg {
            Algorithm::RS256 => "RS256",
            Algorithm::ES256 => "ES256",
            _ => "EdDSA",
        };
        entries.push(format!("{kid}={name}:{}", public.display()));
        let pem = std::fs::read(&private).unwrap();
        let key = match alg {
            Algorithm::RS256 => EncodingKey::from_rsa_pem(&pem).unwrap(),
            Algorithm::ES256 => EncodingKey::from_ec_pem(&pem).unwrap(),
            _ => EncodingKey::from_ed_pem(&pem).unwrap(),
        };
        signers.push((kid, alg, key, std::fs::read(&public).unwrap()));
    }
    let keys = entries.join(",");
    let claims = json!({"sub": "anna", "exp": now() + 60});
    for (kid, alg, key, public) in &signers {
        let mut header = Header::new(*alg);
        header.kid = Some(kid.to_string());
        let token = jsonwebtoken::encode(&header, &claims, key).unwrap();
        let a = site.cgi_with(&token, POST, &[("KN_TOKEN_KEYS", &keys)]);
        assert_eq!(a.code, 200, "{kid}: {a:?}");
        // The classic confusion: HS256 "signed" with the public key's PEM.
        let forged = hs(Some(kid), Algorithm::HS256, public, claims.clone());
        let a = site.cgi_with(&forged, POST, &[("KN_TOKEN_KEYS", &keys)]);
        assert!(a.refused_as("wrong_algorithm"), "{kid}: {a:?}");
    }
}

/// pubsub.cgi under a real Apache: the `Authorization` header reaches the
/// CGI only with `CGIPassAuth On` (docs/DEPLOY.md, section 5), and the
/// access log format that logs `%U` instead of `%r` keeps a `kn_token`
/// parameter out of the log.
#[test]
fn apache_passes_the_bearer_header_with_cgipassauth_and_a_log_format_without_the_query_keeps_tokens_out() {
    if !kn_test_support::available(kn_test_support::APACHE) {
        return;
    }
    let site = Site::new("bearer_apache");
    for key in ["a.key", "b.key", "access.rules"] {
        std::fs::set_permissions(site.dir.join(key), std::os::unix::fs::PermissionsExt::from_mode(0o644)).unwrap();
    }
    let store = site.dir.store("kn_events");
    let tokenless = site.dir.join("tokenless.log");
    let conf = |pass: &str| {
        format!(
            "SetEnv KN_ACCESS_RULES {rules}\nSetEnv KN_TOKEN_KEYS {keys}\n\
             LogFormat \"%h %l %u %t \\\"%m %U %H\\\" %>s %O\" tokenless\nCustomLog {log} tokenless\n\
             <Location /kn>\n{pass}\n</Location>\n",
            rules = site.dir.join("access.rules").display(),
            keys = site.keys,
            log = tokenless.display(),
        )
    };
    let token = anna(json!({}));
    let ask = |apache: &kn_test_support::Apache, query: &str, headers: &str| {
        let url = apache.url();
        let addr = url.strip_prefix("http://").unwrap().split_once('/').unwrap().0.to_string();
        let request = format!("GET /kn?{query}&kn_response_format=simple HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n{headers}\r\n");
        let once = || {
            let mut stream = Stream::send(&url, request.as_bytes());
            stream.read_to_end(Duration::from_secs(10));
            let text = |b: &[u8]| String::from_utf8_lossy(b).into_owned();
            Answer { code: stream.status().unwrap_or(0), head: text(stream.head()), body: text(stream.body()) }
        };
        // mod_cgid answers 503 until its daemon is up (a loaded machine).
        let mut answer = once();
        for _ in 0..50 {
            if answer.code != 503 {
                break;
            }
            std::thread::sleep(Duration::from_millis(100));
            answer = once();
        }
        answer
    };
    let bearer = format!("Authorization: Bearer {token}\r\n");
    {
        // Without CGIPassAuth the CGI never sees the header: anonymous.
        let apache = kn_test_support::Apache::start(Path::new(BIN), &store, &conf(""));
        let a = ask(&apache, POST, &bearer);
        assert_eq!(a.code, 401, "{a:?}");
        assert!(a.head.contains("Basic realm"), "{a:?}");
    }
    let apache = kn_test_support::Apache::start(Path::new(BIN), &store, &conf("CGIPassAuth On"));
    let a = ask(&apache, &format!("{POST}&kn_id=h"), &bearer);
    assert_eq!(a.code, 200, "{a:?}");
    let a = ask(&apache, POST, "Authorization: Bearer forged\r\n");
    assert!(a.refused_as("malformed"), "{a:?}");
    let a = ask(&apache, &format!("do_method=notify&kn_to=/who/anna/notes&kn_payload=q&kn_id=q&kn_token={token}"), "");
    assert_eq!(a.code, 200, "{a:?}");
    let log = std::fs::read_to_string(&tokenless).unwrap_or_default();
    assert!(log.contains("GET /kn HTTP/1.1\" 200"), "{log}");
    assert!(!log.contains(&token), "the token reached the log: {log}");
}

#[test]
fn a_stream_long_poll_ends_when_its_token_expires() {
    let site = Site::new("bearer_stream_expiry");
    let mut command = Serve::command_of(Path::new(BIN), &site.root(), None);
    // A long-poll would otherwise wait 30 s.
    command.env("KN_ACCESS_RULES", site.dir.join("access.rules")).env("KN_TOKEN_KEYS", &site.keys).env("KN_STREAM_LONG_POLL_MS", "30000").env("KN_TOKEN_LEEWAY", "0");
    let serve = Serve::spawn(command);
    let long = anna(json!({}));
    let put = format!("Authorization: Bearer {long}\r\nContent-Type: text/plain\r\n");
    assert_eq!(request(&serve, "PUT", "/v1/stream/anna/live", &put).code, 201);
    let short = hs(Some("a"), Algorithm::HS256, SECRET_A, json!({"sub": "anna", "exp": now() + 2}));
    let started = std::time::Instant::now();
    let a = request(&serve, "GET", "/v1/stream/anna/live?offset=now&live=long-poll", &format!("Authorization: Bearer {short}\r\n"));
    let took = started.elapsed();
    assert_eq!(a.code, 204, "{a:?}");
    assert!(took < Duration::from_secs(8), "ended at the token's expiry, not the long-poll's: {took:?}");
    // The next poll with the same token is refused.
    std::thread::sleep(Duration::from_millis(1100));
    let a = request(&serve, "GET", "/v1/stream/anna/live?offset=now&live=long-poll", &format!("Authorization: Bearer {short}\r\n"));
    assert!(a.refused_as("expired"), "{a:?}");
}

/// The `kn_expires` of the route from `from` of id `id`, as stored.
fn route_expires(site: &Site, from: &str, id: &str) -> Option<String> {
    let store = Store::open(site.root()).unwrap();
    let routes = Topic::parse(&format!("{from}/kn_routes")).unwrap();
    let events = store.events(&routes, &Selection::all()).unwrap().events;
    let route = events.iter().find(|e| e.id() == Some(id.as_bytes()))?;
    route.get("kn_expires").map(|v| String::from_utf8_lossy(v).into_owned())
}

#[test]
fn a_route_made_with_a_token_expires_with_it_unless_the_rules_grant_the_user_more() {
    let site = Site::new("bearer_route_expiry");
    std::fs::write(site.dir.join("access.rules"), "group staff: anna\nallow read,route,post /what/staff/** @staff\n").unwrap();
    let exp = now() + 600;
    // bob is staff by his token's groups only: the route ends with the token.
    let bob = hs(Some("a"), Algorithm::HS256, SECRET_A, json!({"sub": "bob", "groups": ["staff"], "exp": exp}));
    let a = site.cgi_with(&bob, "do_method=route&kn_from=/what/staff/a&kn_to=/what/staff/b&kn_id=bob1", &[]);
    assert_eq!(a.code, 200, "{a:?}");
    let expires: u64 = route_expires(&site, "/what/staff/a", "bob1").expect("a kn_expires").parse().unwrap();
    assert!(expires <= exp + 30, "no later than the token (and its leeway): {expires} > {exp}");
    // Until then it carries the token's rights: it delivers.
    let a = site.cgi_with(&anna(json!({})), "do_method=notify&kn_to=/what/staff/a&kn_payload=for-bob", &[]);
    assert_eq!(a.code, 200, "{a:?}");
    assert_eq!(site.payloads("/what/staff/b"), ["for-bob"], "delivered along bob's route, judged with his token's group");
    // A later kn_expires asked for is cut to the token's.
    let a = site.cgi_with(&bob, &format!("do_method=route&kn_from=/what/staff/a&kn_to=/what/staff/b&kn_id=bob2&kn_expires={}", exp + 86_400), &[]);
    assert_eq!(a.code, 200, "{a:?}");
    let expires: u64 = route_expires(&site, "/what/staff/a", "bob2").unwrap().parse().unwrap();
    assert!(expires <= exp + 30, "{expires}");
    // anna is staff by the rules: her route keeps what she asked for.
    let a = site.cgi_with(&anna(json!({})), "do_method=route&kn_from=/what/staff/a&kn_to=/what/staff/b&kn_id=anna1", &[]);
    assert_eq!(a.code, 200, "{a:?}");
    assert_eq!(route_expires(&site, "/what/staff/a", "anna1"), None);
}

#[test]
fn a_cgi_tunnel_ends_401_when_its_token_expires() {
    let site = Site::new("bearer_cgi_tunnel_expiry");
    let short = hs(Some("a"), Algorithm::HS256, SECRET_A, json!({"sub": "anna", "exp": now() + 2}));
    let started = std::time::Instant::now();
    let a = site.cgi_with(&short, "kn_from=/who/anna/feed", &[("PATH_INFO", "/who/anna/feed"), ("KN_TOKEN_LEEWAY", "0")]);
    assert!(started.elapsed() < Duration::from_secs(15), "ended at the token's expiry");
    assert_eq!(a.code, 200, "the tunnel opened: {a:?}");
    assert!(a.body.contains("Watching topic"), "{a:?}");
    assert!(a.body.contains("status: 401 Unauthorized"), "{a:?}");
    assert!(a.body.contains("bearer token expired"), "{a:?}");
}

/// `serve`'s `/metrics` scraped as Prometheus does with `authorization:
/// credentials_file` (docs/DEPLOY.md): a token granting `read` on
/// `/kn_metrics` gets the page; one that does not, `403`; an unusable
/// one, `401` with a Bearer challenge; none, the rules' Basic `401`.
#[test]
fn metrics_are_scraped_with_a_token_granting_read_on_kn_metrics_and_refused_otherwise() {
    let site = Site::new("bearer_metrics");
    std::fs::write(site.dir.join("access.rules"), "allow read /kn_metrics prometheus\nallow all /who/{user}/** users\n").unwrap();
    let serve = site.serve(&[]);
    let scrape = |token: &str| request(&serve, "GET", "/metrics", &format!("Authorization: Bearer {token}\r\n"));
    let prometheus = hs(Some("a"), Algorithm::HS256, SECRET_A, json!({"sub": "prometheus", "exp": now() + 600}));
    let a = scrape(&prometheus);
    assert_eq!(a.code, 200, "{a:?}");
    assert!(a.body.contains("kn_token_refusals_total"), "{}", a.body);
    // A capability for exactly /kn_metrics, whatever the rules say.
    let capability = hs(Some("a"), Algorithm::HS256, SECRET_A, json!({"exp": now() + 600, "kn": {"read": ["/kn_metrics"]}}));
    assert_eq!(scrape(&capability).code, 200);
    // Through the kn_token parameter too.
    assert_eq!(request(&serve, "GET", &format!("/metrics?kn_token={prometheus}"), "").code, 200);
    // A user the rules do not let, a claim that does not name it: 403.
    let a = scrape(&anna(json!({})));
    assert_eq!(a.code, 403, "{a:?}");
    assert!(a.body.contains("user 'anna' may not read '/kn_metrics'"), "{a:?}");
    let narrowed = hs(Some("a"), Algorithm::HS256, SECRET_A, json!({"sub": "prometheus", "exp": now() + 600, "kn": {"read": ["/who/prometheus/**"]}}));
    let a = scrape(&narrowed);
    assert_eq!(a.code, 403, "{a:?}");
    assert!(a.body.contains("its kn claim does not allow it"), "{a:?}");
    // Expired: 401 with the Bearer challenge; none: the Basic one.
    let expired = hs(Some("a"), Algorithm::HS256, SECRET_A, json!({"sub": "prometheus", "exp": now() - 60}));
    assert!(scrape(&expired).refused_as("expired"), "{:?}", scrape(&expired));
    let a = request(&serve, "GET", "/metrics", "");
    assert_eq!(a.code, 401, "{a:?}");
    assert!(a.head.contains("Basic realm"), "{a:?}");
}

#[test]
fn a_stream_sse_read_closes_when_its_token_expires() {
    let site = Site::new("bearer_stream_sse_expiry");
    let serve = site.serve(&[]);
    let long = anna(json!({}));
    let put = format!("Authorization: Bearer {long}\r\nContent-Type: text/plain\r\n");
    assert_eq!(request(&serve, "PUT", "/v1/stream/anna/sse", &put).code, 201);
    let short = hs(Some("a"), Algorithm::HS256, SECRET_A, json!({"sub": "anna", "exp": now() + 2}));
    let started = std::time::Instant::now();
    let read = format!("GET /v1/stream/anna/sse?offset=-1&live=sse HTTP/1.1\r\nHost: {}\r\nConnection: close\r\nAuthorization: Bearer {short}\r\n\r\n", serve.addr());
    let mut stream = Stream::send(&serve.url(), read.as_bytes());
    assert!(stream.read_to_end(Duration::from_secs(15)), "the SSE response ends: {}", stream.text());
    assert_eq!(stream.status(), Some(200), "{}", stream.text());
    assert!(started.elapsed() < Duration::from_secs(12), "at the token's expiry: {:?}", started.elapsed());
    // The next read with the same token is refused.
    std::thread::sleep(Duration::from_millis(1100));
    let a = request(&serve, "GET", "/v1/stream/anna/sse?offset=-1&live=sse", &format!("Authorization: Bearer {short}\r\n"));
    assert!(a.refused_as("expired"), "{a:?}");
}

/// A page of another origin reads the answers to its requests bringing
/// `kn_token` (an `EventSource`, a form POST): `Access-Control-Allow-Origin:
/// *`, refusals included; every other answer is unchanged.
#[test]
fn answers_to_requests_bringing_kn_token_allow_any_origin_and_no_others_change() {
    let site = Site::new("bearer_cors");
    let token = anna(json!({}));
    let allows = |a: &Answer| a.head.lines().any(|l| l == "Access-Control-Allow-Origin: *");
    let a = site.cgi(&format!("{POST}&kn_token={token}"), &[]);
    assert!(a.code == 200 && allows(&a), "{a:?}");
    let a = site.cgi(&format!("kn_from=/who/anna/notes&kn_expires=%2B0&kn_token={token}"), &[]);
    assert!(a.code == 200 && allows(&a), "a tunnel: {a:?}");
    let a = site.cgi(&format!("{POST}&kn_token=nonsense"), &[]);
    assert!(a.refused_as("malformed") && allows(&a), "{a:?}");
    for a in [site.cgi_with(&token, POST, &[]), site.cgi(POST, &[]), site.cgi("kn_from=/what/public/x&kn_expires=%2B0", &[])] {
        assert!(!a.head.to_ascii_lowercase().contains("access-control"), "{a:?}");
    }
}
