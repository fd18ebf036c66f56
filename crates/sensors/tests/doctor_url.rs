//! `kn doctor --url`: a running server's self-test as an exit status (the
//! health check of docs/DEPLOY.md, section 8): 0 only when every check
//! passed, never for a server that is down.

mod sensors_harness;

use std::os::unix::fs::PermissionsExt;
use std::process::{Command, Output};

use sensors_harness::*;

fn kn_doctor_url(sandbox: &Sandbox, url: &str) -> Output {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_kn"));
    cmd.args(["doctor", "--url", url]);
    sandbox.run(cmd, b"")
}

#[test]
fn a_healthy_server_passes_with_one_line_per_check() {
    let sandbox = Sandbox::new();
    let server = pubsub_server(&sandbox.store_dir());
    let out = kn_doctor_url(&sandbox, &server.url());
    assert_code(&out, 0);
    let report = text(&out.stdout);
    assert!(report.lines().count() >= 2, "{report}");
    assert!(report.lines().all(|l| l.starts_with("ok ")), "{report}");
}

#[test]
fn a_server_that_is_down_fails() {
    let sandbox = Sandbox::new();
    let port = kn_test_support::free_port();
    let out = kn_doctor_url(&sandbox, &format!("http://127.0.0.1:{port}/kn"));
    assert_code(&out, 75);
    assert!(text(&out.stderr).contains("did not answer"), "{}", text(&out.stderr));
}

#[test]
fn a_failed_check_fails_and_is_named() {
    let sandbox = Sandbox::new();
    let server = pubsub_server(&sandbox.store_dir());
    // A file of the store that the group cannot write: the modes check fails.
    let odd = sandbox.store_dir().join("odd-file");
    std::fs::write(&odd, b"x").unwrap();
    std::fs::set_permissions(&odd, std::fs::Permissions::from_mode(0o600)).unwrap();
    let out = kn_doctor_url(&sandbox, &server.url());
    assert_code(&out, 1);
    let report = text(&out.stdout);
    assert!(report.lines().any(|l| l.starts_with("FAIL ") && l.contains("odd-file")), "{report}");
}

#[test]
fn a_page_that_is_not_the_self_test_fails() {
    let sandbox = Sandbox::new();
    let server = pubsub_server(&sandbox.store_dir());
    // The server's own start page: 200, but no self-test checks.
    let page = server.url().trim_end_matches("/kn").to_string() + "/?";
    let out = kn_doctor_url(&sandbox, &page);
    assert_code(&out, 69);
}
