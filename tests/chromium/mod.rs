//! Headless Chromium for the browser tests (`tests/browser.rs`,
//! `tests/browser_tokens.rs`): Debian's `chromium` driven through
//! `chromedriver` with WebDriver (fantoccini), and the small helpers every
//! such test uses (run a script in the page, wait for it to be true).

#![allow(dead_code)]

use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use fantoccini::{Client, ClientBuilder};
use serde_json::{json, Value};

use crate::support::{self, Dir};

pub const CHROMIUM: &str = "/usr/bin/chromium";
pub const CHROMEDRIVER: &str = "/usr/bin/chromedriver";

/// One Chromium at a time.
pub static TURN: Mutex<()> = Mutex::new(());

/// Whether the browser tests can run: Apache, chromium and chromedriver.
pub fn browser_available() -> bool {
    if !support::available(support::APACHE) {
        return false;
    }
    [CHROMIUM, CHROMEDRIVER].into_iter().all(support::available)
}

pub fn copy_dir(from: &Path, to: &Path) {
    for entry in std::fs::read_dir(from).unwrap_or_else(|e| panic!("read {}: {e}", from.display())) {
        let entry = entry.expect("directory entry");
        let dest = to.join(entry.file_name());
        if entry.file_type().map(|t| t.is_dir()).unwrap_or(false) {
            std::fs::create_dir_all(&dest).expect("mkdir");
            let _ = std::fs::set_permissions(&dest, std::os::unix::fs::PermissionsExt::from_mode(0o755));
            copy_dir(&entry.path(), &dest);
        } else {
            std::fs::copy(entry.path(), &dest).expect("copy");
            let _ = std::fs::set_permissions(&dest, std::os::unix::fs::PermissionsExt::from_mode(0o644));
        }
    }
}

/// A chromedriver we started (killed, with its browsers, when dropped).
pub struct Driver {
    child: Child,
    url: String,
    _profiles: Dir,
    profiles: PathBuf,
}

impl Driver {
    pub fn start() -> Driver {
        let port = support::free_port();
        let profiles = Dir::new("chromium-profiles");
        let child = Command::new(CHROMEDRIVER)
            .arg(format!("--port={port}"))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start chromedriver");
        let ready = support::wait_for(Duration::from_secs(15), || TcpStream::connect(("127.0.0.1", port)).is_ok());
        assert!(ready, "chromedriver did not listen on port {port}");
        let path = profiles.path().to_path_buf();
        Driver { child, url: format!("http://127.0.0.1:{port}"), _profiles: profiles, profiles: path }
    }

    /// A fresh headless Chromium (its own profile directory).
    pub async fn browser(&self, name: &str) -> Client {
        let profile = self.profiles.join(name);
        let mut caps = serde_json::Map::new();
        caps.insert(
            "goog:chromeOptions".into(),
            json!({
                "binary": CHROMIUM,
                "args": [
                    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                    "--disable-background-networking", "--disable-component-update", "--disable-sync",
                    "--disable-dev-shm-usage", "--window-size=1200,900",
                    format!("--user-data-dir={}", profile.display()),
                ],
            }),
        );
        ClientBuilder::new(hyper_util::client::legacy::connect::HttpConnector::new())
            .capabilities(caps)
            .connect(&self.url)
            .await
            .unwrap_or_else(|e| panic!("starting chromium through chromedriver: {e}"))
    }
}

impl Drop for Driver {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

pub fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().expect("tokio runtime")
}

/// Runs `script` (a function body) in the page and returns its value.
pub async fn js(page: &Client, script: &str) -> Value {
    page.execute(script, vec![]).await.unwrap_or_else(|e| panic!("script failed: {e}\n{script}"))
}

/// Waits up to `limit` for `script` to return something truthy; returns
/// the last value.
pub async fn wait_js(page: &Client, limit: Duration, script: &str) -> Value {
    let deadline = Instant::now() + limit;
    loop {
        let v = js(page, script).await;
        let truthy = !matches!(v, Value::Null | Value::Bool(false)) && v != json!(0) && v != json!("");
        if truthy || Instant::now() > deadline {
            return v;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

pub async fn wait_connected(page: &Client, what: &str) {
    let v = wait_js(page, Duration::from_secs(15), "return window.kn && window.kn.connected;").await;
    assert_eq!(v, json!(true), "{what}: the page's SSE connection did not open");
}

/// Saves a screenshot when `KN_SCREENSHOTS` names a directory.
pub async fn screenshot(page: &Client, name: &str) {
    let Some(dir) = std::env::var_os("KN_SCREENSHOTS") else { return };
    let png = page.screenshot().await.expect("screenshot");
    let path = Path::new(&dir).join(format!("{name}.png"));
    std::fs::write(&path, png).unwrap_or_else(|e| panic!("write {}: {e}", path.display()));
}
