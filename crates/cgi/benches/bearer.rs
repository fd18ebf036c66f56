//! What checking a bearer token costs per request (docs/ACCESS.md,
//! "Bearer tokens"; BENCHMARKS.md, "Other measurements"): the same request
//! through the handler without a token, with an HS256 token, and (when
//! `openssl` is there to make the keys) with ES256 and RS256 tokens, each
//! remembered (`KN_TOKEN_CACHE`, a token presented again) and checked in
//! full (a token's first presentation).
//!
//! `cargo bench -p kn-cgi --bench bearer`

use std::process::Command;
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use criterion::{criterion_group, criterion_main, Criterion};
use jsonwebtoken::{Algorithm, EncodingKey, Header};
use kn_cgi::handler::{Handler, Options};
use kn_cgi::{Limits, Request};
use kn_journal::{Config, Store};

fn token(kid: &str, alg: Algorithm, key: &EncodingKey) -> String {
    let exp = SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_secs() + 3600;
    let mut header = Header::new(alg);
    header.kid = Some(kid.to_string());
    let claims = serde_json::json!({"sub": "anna", "exp": exp, "kn": {"all": ["/who/anna/**"]}});
    jsonwebtoken::encode(&header, &claims, key).unwrap()
}

/// A private and public PEM made by `openssl genpkey` (`None` without it).
fn pem_pair(dir: &std::path::Path, name: &str, args: &[&str]) -> Option<(Vec<u8>, std::path::PathBuf)> {
    let private = dir.join(format!("{name}.pem"));
    let public = dir.join(format!("{name}.pub.pem"));
    let made = Command::new("openssl").arg("genpkey").args(args).arg("-out").arg(&private).output().ok()?.status.success()
        && Command::new("openssl").args(["pkey", "-pubout", "-in"]).arg(&private).arg("-out").arg(&public).output().ok()?.status.success();
    made.then(|| (std::fs::read(&private).unwrap(), public))
}

fn bench(c: &mut Criterion) {
    let dir = tempfile::tempdir().unwrap();
    let secret = dir.path().join("hs.key");
    std::fs::write(&secret, [7u8; 32]).unwrap();
    let mut keys = vec![format!("h=HS256:{}", secret.display())];
    let mut tokens = vec![("HS256", token("h", Algorithm::HS256, &EncodingKey::from_secret(&[7u8; 32])))];
    if let Some((private, public)) = pem_pair(dir.path(), "es", &["-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:P-256"]) {
        keys.push(format!("e=ES256:{}", public.display()));
        tokens.push(("ES256", token("e", Algorithm::ES256, &EncodingKey::from_ec_pem(&private).unwrap())));
    }
    if let Some((private, public)) = pem_pair(dir.path(), "rs", &["-algorithm", "RSA", "-pkeyopt", "rsa_keygen_bits:2048"]) {
        keys.push(format!("r=RS256:{}", public.display()));
        tokens.push(("RS256", token("r", Algorithm::RS256, &EncodingKey::from_rsa_pem(&private).unwrap())));
    }
    let mut config = Config::new(dir.path().join("kn_events"));
    config.token_keys = Some(keys.join(","));
    let store = Arc::new(Store::open_with(config.clone()).unwrap());
    let handler = Handler::new(store, Options::default());
    // Every presentation checked in full: nothing remembered (a new
    // token each time, as a first request is).
    let mut cold = Config::new(dir.path().join("kn_events_cold"));
    cold.token_keys = config.token_keys.clone();
    cold.token_cache = 0;
    let cold = Handler::new(Arc::new(Store::open_with(cold).unwrap()), Options::default());
    let request = |query: &str, token: Option<&str>| {
        let bearer = token.map(|t| format!("Bearer {t}"));
        let mut vars = vec![
            ("REQUEST_METHOD", "GET".to_string()),
            ("QUERY_STRING", query.to_string()),
            ("SCRIPT_NAME", "/kn".to_string()),
            ("SERVER_NAME", "127.0.0.1".to_string()),
            ("SERVER_PORT", "8080".to_string()),
        ];
        if let Some(b) = bearer {
            vars.push(("HTTP_AUTHORIZATION", b));
        }
        Request::from_cgi_env(vars, &b""[..], &Limits::default()).unwrap()
    };
    for (what, query) in [
        ("whoami", "do_method=whoami"),
        ("notify", "do_method=notify&kn_to=/who/anna/notes&kn_payload=hello&kn_id=same&kn_response_format=simple"),
    ] {
        let mut group = c.benchmark_group(format!("bearer/{what}"));
        let plain = request(query, None);
        group.bench_function("no token", |b| b.iter(|| handler.handle(&plain)));
        for (alg, token) in &tokens {
            let with = request(query, Some(token));
            group.bench_function(format!("{alg} remembered"), |b| b.iter(|| handler.handle(&with)));
            group.bench_function(format!("{alg} checked"), |b| b.iter(|| cold.handle(&with)));
        }
        group.finish();
    }
}

criterion_group! {
    name = benches;
    config = Criterion::default().sample_size(30).measurement_time(std::time::Duration::from_secs(3)).warm_up_time(std::time::Duration::from_secs(1));
    targets = bench
}
criterion_main!(benches);
