//! A tiny harness for end-to-end tests: real binaries under real web servers.
//!
//! In the style of ripgrep's `tests/util.rs`, each test reads like a shell
//! session:
//!
//! ```ignore
//! mod support;
//! use support::{Apache, Dir};
//!
//! #[test]
//! fn notify_answers_200() {
//!     if !support::available(support::APACHE) { return; }
//!     let dir = Dir::new("notify_answers_200");
//!     let store = dir.store("events");
//!     let apache = Apache::start(&support::pubsub_cgi(), &store, "");
//!     let resp = support::post_form(&apache.url(), &[("kn_to", "/t"), ("kn_payload", "x")]);
//!     assert_eq!(resp.status, 200, "{}", apache.error_log());
//! }
//! ```
//!
//! What it provides:
//!
//! * [`Dir`]: a temporary directory the web server's user can traverse, with
//!   helpers to write files, executable scripts and event stores.
//! * [`Apache`] (2.4, `mpm_event` + `mod_cgid`, as Debian ships it) and
//!   [`Lighttpd`] (`mod_cgi`): a private instance on a free loopback port with
//!   the CGI mounted at `/kn` (the path the protocol's JavaScript library
//!   expects) and `KN_EVENTS` set to the store; [`Apache::start_proxy`] is
//!   Apache forwarding `/kn` to a backend such as `pubsub-cgi serve`. Each is
//!   stopped, with every child and CGI it started, when dropped.
//! * [`available`]: skip (with a printed reason) when a server is not
//!   installed, except under `CI=true`, where a missing server is a failure.
//! * [`get`], [`post_form`], [`post`]: one-shot HTTP requests ([`Response`]);
//!   [`Stream`]: a raw connection read incrementally with deadlines, for
//!   tunnels and for hanging up mid-response.
//! * [`cargo_bin`], [`pubsub_cgi`], [`hello_cgi`]: the workspace's binaries.
//!
//! Tests run as root on CI. Apache refuses to run its children as root, so
//! when the tests are root the servers run as `www-data`: the harness makes
//! temporary directories world-traversable, copies the CGI next to the
//! server's configuration (the checkout may sit under a private `/root`), and
//! hands the event store to that user.

#![allow(dead_code)]

use std::ffi::CString;
use std::fmt;
use std::fs;
use std::io::{self, BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::OnceLock;
use std::thread;
use std::time::{Duration, Instant};

/// The Apache 2.4 binary, as Debian installs it.
pub const APACHE: &str = "/usr/sbin/apache2";
/// Apache's loadable modules, as Debian installs them.
pub const APACHE_MODULES: &str = "/usr/lib/apache2/modules";
/// The lighttpd binary, as Debian installs it.
pub const LIGHTTPD: &str = "/usr/sbin/lighttpd";
/// lighttpd's loadable modules, as Debian installs them.
pub const LIGHTTPD_MODULES: &str = "/usr/lib/lighttpd";

/// How long a server gets to start listening, or to stop, before the test
/// gives up on it.
const SERVER_DEADLINE: Duration = Duration::from_secs(15);

// ---------------------------------------------------------------------------
// Skipping

/// True when running under CI (`CI` set to anything but `false`/`0`/empty).
pub fn on_ci() -> bool {
    match std::env::var("CI") {
        Ok(v) => !(v.is_empty() || v == "false" || v == "0"),
        Err(_) => false,
    }
}

/// Whether the server binary `program` (e.g. [`APACHE`], [`LIGHTTPD`]) can be
/// used. When it is missing this prints why the test is skipped and returns
/// false, except on CI, where the tests must not silently pass: there it
/// panics.
pub fn available(program: &str) -> bool {
    if Path::new(program).exists() {
        return true;
    }
    if on_ci() {
        panic!("{program} is not installed, and CI is set: .ci/run must install it");
    }
    eprintln!("skipping: {program} is not installed (apt-get install apache2 lighttpd)");
    false
}

// ---------------------------------------------------------------------------
// Dir

/// A temporary directory, removed when dropped (set `KN_KEEP_TEST_DIRS=1` to
/// keep it for a post-mortem). It is world-traversable (0755) so that a web
/// server running as another user can reach the CGIs and stores inside.
pub struct Dir {
    tmp: Option<tempfile::TempDir>,
    path: PathBuf,
}

impl Dir {
    /// A fresh directory whose name starts with `name` (use the test's name).
    pub fn new(name: &str) -> Dir {
        let tmp = tempfile::Builder::new()
            .prefix(&format!("kn-{name}-"))
            .tempdir()
            .expect("create temporary directory");
        let path = tmp.path().to_path_buf();
        set_mode(&path, 0o755);
        let keep = std::env::var_os("KN_KEEP_TEST_DIRS").is_some();
        let tmp = if keep {
            eprintln!("keeping {}", path.display());
            let _ = tmp.keep();
            None
        } else {
            Some(tmp)
        };
        Dir { tmp, path }
    }

    /// The directory itself.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// `name` inside the directory (nothing is created).
    pub fn join(&self, name: &str) -> PathBuf {
        self.path.join(name)
    }

    /// Writes a file (creating parent directories) and returns its path.
    pub fn create(&self, name: &str, contents: impl AsRef<[u8]>) -> PathBuf {
        let path = self.path.join(name);
        if let Some(parent) = path.parent() {
            fs::create_dir_all(parent).expect("create parent directory");
        }
        fs::write(&path, contents).unwrap_or_else(|e| panic!("write {}: {e}", path.display()));
        set_mode(&path, 0o644);
        path
    }

    /// Writes an executable script (mode 0755), e.g. a shell CGI.
    pub fn create_script(&self, name: &str, contents: &str) -> PathBuf {
        let path = self.create(name, contents);
        set_mode(&path, 0o755);
        path
    }

    /// Creates a directory (mode 0755) and returns its path.
    pub fn create_dir(&self, name: &str) -> PathBuf {
        let path = self.path.join(name);
        fs::create_dir_all(&path).unwrap_or_else(|e| panic!("mkdir {}: {e}", path.display()));
        set_mode(&path, 0o755);
        path
    }

    /// Creates an event store directory that the web server's user may
    /// write (see [`make_writable_by_server`]).
    pub fn store(&self, name: &str) -> PathBuf {
        let path = self.create_dir(name);
        make_writable_by_server(&path);
        path
    }

    /// The contents of a file, lossily as text ("" when it does not exist).
    pub fn read(&self, name: &str) -> String {
        fs::read(self.path.join(name))
            .map(|b| String::from_utf8_lossy(&b).into_owned())
            .unwrap_or_default()
    }
}

impl fmt::Debug for Dir {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Dir({})", self.path.display())
    }
}

impl Drop for Dir {
    fn drop(&mut self) {
        // Files made by the server's user are removable by root; nothing to
        // do beyond what TempDir does.
        let _ = self.tmp.take();
    }
}

fn set_mode(path: &Path, mode: u32) {
    let _ = fs::set_permissions(path, fs::Permissions::from_mode(mode));
}

// ---------------------------------------------------------------------------
// Users

/// The user a web server's workers (and so the CGIs) run as.
#[derive(Clone, Debug)]
pub struct RunAs {
    /// User name, for the server configuration.
    pub user: String,
    /// Group name, for the server configuration.
    pub group: String,
    pub uid: u32,
    pub gid: u32,
}

fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions and cannot fail.
    unsafe { libc::geteuid() == 0 }
}

/// The user the servers' workers run as: `www-data` when the tests run as
/// root (Apache will not run children as root), else the current user (an
/// unprivileged server cannot switch users anyway).
pub fn server_user() -> RunAs {
    static USER: OnceLock<RunAs> = OnceLock::new();
    USER.get_or_init(|| {
        if !is_root() {
            // SAFETY: getuid/getgid have no preconditions and cannot fail.
            let (uid, gid) = unsafe { (libc::getuid(), libc::getgid()) };
            return RunAs { user: format!("#{uid}"), group: format!("#{gid}"), uid, gid };
        }
        let name = "www-data";
        let cname = CString::new(name).expect("no NUL in user name");
        // SAFETY: getpwnam is given a valid C string; the result is read
        // before any other passwd call (tests call this once, under OnceLock).
        let pw = unsafe { libc::getpwnam(cname.as_ptr()) };
        if pw.is_null() {
            panic!("user {name} does not exist: tests run as root need it (apt-get install apache2 creates it)");
        }
        // SAFETY: pw is non-null and points to a valid passwd record.
        let (uid, gid) = unsafe { ((*pw).pw_uid, (*pw).pw_gid) };
        RunAs { user: name.into(), group: name.into(), uid, gid }
    })
    .clone()
}

/// Gives `path` (recursively) to the server's user when the tests run as
/// root, so that CGIs can create events in it; otherwise the current user
/// already owns it.
pub fn make_writable_by_server(path: &Path) {
    if !is_root() {
        return;
    }
    let who = server_user();
    chown_recursive(path, who.uid, who.gid);
}

fn chown_recursive(path: &Path, uid: u32, gid: u32) {
    let _ = std::os::unix::fs::lchown(path, Some(uid), Some(gid));
    let Ok(meta) = fs::symlink_metadata(path) else { return };
    if !meta.is_dir() {
        return;
    }
    let Ok(entries) = fs::read_dir(path) else { return };
    for entry in entries.flatten() {
        chown_recursive(&entry.path(), uid, gid);
    }
}

// ---------------------------------------------------------------------------
// Binaries

/// The workspace binary `name` (e.g. `"pubsub-cgi"`), built if needed.
///
/// `env!("CARGO_BIN_EXE_<name>")` only exists for binaries of the package
/// whose tests are being compiled, and these tests live in the root package
/// while the binaries live in `kn-cgi`; and `cargo test` builds another
/// package's binaries only as test harnesses, not as programs. So the harness
/// looks in the target directory this test executable was built into
/// (`<target>/<profile>/deps/<test>` → `<target>/<profile>/<name>`) and runs
/// `cargo build -p kn-cgi --bins` (same profile, same target directory) once
/// per test process first: a no-op when up to date, and it guarantees that a
/// test never runs a binary older than the sources. Set `KN_TEST_NO_BUILD=1`
/// to skip the build (the binary must then exist).
pub fn cargo_bin(name: &str) -> PathBuf {
    let layout = target_layout();
    static BUILT: OnceLock<Result<(), String>> = OnceLock::new();
    if std::env::var_os("KN_TEST_NO_BUILD").is_none() {
        if let Err(e) = BUILT.get_or_init(|| build_bins(&layout)) {
            panic!("{e}");
        }
    }
    let path = layout.profile_dir.join(name);
    if !path.exists() {
        panic!("binary {} does not exist (was it built?)", path.display());
    }
    path
}

/// `pubsub-cgi`, the program under test.
pub fn pubsub_cgi() -> PathBuf {
    cargo_bin("pubsub-cgi")
}

/// `hello-cgi`, the minimal CGI that benchmarks measure against.
pub fn hello_cgi() -> PathBuf {
    cargo_bin("hello-cgi")
}

/// `pubsub-cgi serve` listening on a free loopback port; killed when
/// dropped.
pub struct Serve {
    pub child: Child,
    /// `http://127.0.0.1:PORT`, without `/kn`.
    pub base: String,
}

impl Serve {
    /// The command line of `pubsub-cgi serve` on a free port over the store
    /// `root`, with static files from `www`, without the test's own
    /// `KN_EVENTS` and `GATEWAY_INTERFACE`.
    pub fn command(root: &Path, www: Option<&Path>) -> Command {
        let mut command = Command::new(pubsub_cgi());
        command.args(["serve", "--listen", "127.0.0.1:0", "--root"]).arg(root);
        if let Some(www) = www {
            command.arg("--static").arg(www);
        }
        command.env_remove("KN_EVENTS").env_remove("GATEWAY_INTERFACE");
        command
    }

    /// Starts `command` (a `pubsub-cgi serve` command line) and waits for
    /// its ready line, `knpubsub serving http://ADDR/kn (store DIR)`.
    pub fn spawn(mut command: Command) -> Serve {
        let mut child = command.stdout(Stdio::piped()).spawn().expect("start pubsub-cgi serve");
        let mut line = String::new();
        BufReader::new(child.stdout.take().expect("stdout")).read_line(&mut line).expect("first line");
        let base = line
            .strip_prefix("knpubsub serving ")
            .and_then(|rest| rest.split_once("/kn (store "))
            .map(|(base, _)| base.to_string())
            .unwrap_or_else(|| panic!("unexpected first line: {line:?}"));
        Serve { child, base }
    }

    /// Its `/kn` URL.
    pub fn url(&self) -> String {
        format!("{}/kn", self.base)
    }
}

impl Drop for Serve {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

struct TargetLayout {
    /// `<target>[/<triple>]/<profile>`: where binaries land.
    profile_dir: PathBuf,
    /// The `--target-dir`.
    target_dir: PathBuf,
    /// `Some(triple)` when built with `--target`.
    triple: Option<String>,
    /// The profile directory's name: `debug` for dev/test, else the profile.
    profile: String,
}

fn target_layout() -> TargetLayout {
    let exe = std::env::current_exe().expect("current test executable");
    // <target>[/<triple>]/<profile>/deps/<test-exe>
    let profile_dir = exe
        .parent()
        .and_then(Path::parent)
        .map(Path::to_path_buf)
        .expect("test executable lives in <target>/<profile>/deps");
    let profile = profile_dir
        .file_name()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_else(|| "debug".into());
    let above = profile_dir.parent().map(Path::to_path_buf).unwrap_or_default();
    // The target directory holds CACHEDIR.TAG; a triple directory does not.
    let (target_dir, triple) = if above.join("CACHEDIR.TAG").exists() || above.parent().is_none() {
        (above, None)
    } else {
        let triple = above.file_name().map(|s| s.to_string_lossy().into_owned());
        (above.parent().map(Path::to_path_buf).unwrap_or_default(), triple)
    };
    let target_dir = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .filter(|d| d.is_absolute() && target_dir.as_os_str().is_empty())
        .unwrap_or(target_dir);
    TargetLayout { profile_dir, target_dir, triple, profile }
}

fn build_bins(layout: &TargetLayout) -> Result<(), String> {
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let mut cmd = Command::new(cargo);
    cmd.current_dir(env!("CARGO_MANIFEST_DIR"))
        .args(["build", "--quiet", "-p", "kn-cgi", "--bins", "--target-dir"])
        .arg(&layout.target_dir);
    match layout.profile.as_str() {
        "debug" => {}
        "release" => {
            cmd.arg("--release");
        }
        other => {
            cmd.args(["--profile", other]);
        }
    }
    if let Some(triple) = &layout.triple {
        cmd.args(["--target", triple]);
    }
    let out = cmd.output().map_err(|e| format!("running cargo build: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "cargo build -p kn-cgi --bins failed ({}):\n{}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    Ok(())
}

// ---------------------------------------------------------------------------
// Servers

/// A free TCP port on 127.0.0.1 (free when asked; servers retry on a clash).
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("bind 127.0.0.1:0")
}

/// A web server process we started, in its own process group so that it and
/// every child and CGI it forked can be stopped together.
struct Server {
    name: &'static str,
    child: Child,
    port: u16,
    dir: Dir,
    error_log: PathBuf,
    /// Signal for an orderly stop; SIGKILL to the group follows.
    stop_signal: libc::c_int,
}

impl Server {
    /// Starts `cmd` (a foreground server) and waits until `port` answers.
    /// Returns `Err(log)` when the server exited first (port clash, bad
    /// config), so that the caller may retry on another port.
    fn spawn(
        name: &'static str,
        mut cmd: Command,
        port: u16,
        dir: Dir,
        error_log: PathBuf,
        stop_signal: libc::c_int,
    ) -> Result<Server, (Dir, String)> {
        let out = fs::File::create(dir.join("server.out")).expect("create server.out");
        let err = out.try_clone().expect("dup server.out");
        cmd.stdin(Stdio::null()).stdout(out).stderr(err).process_group(0);
        let mut child = match cmd.spawn() {
            Ok(c) => c,
            Err(e) => panic!("cannot start {name}: {e}"),
        };
        let deadline = Instant::now() + SERVER_DEADLINE;
        loop {
            if TcpStream::connect(("127.0.0.1", port)).is_ok() {
                return Ok(Server { name, child, port, dir, error_log, stop_signal });
            }
            if let Ok(Some(status)) = child.try_wait() {
                // Kill any worker it left behind before the retry.
                // SAFETY: negative pid = the process group we created.
                unsafe { libc::kill(-(child.id() as libc::pid_t), libc::SIGKILL) };
                let log = format!(
                    "{name} exited with {status} before listening on port {port}\n--- output:\n{}\n--- error log:\n{}",
                    dir.read("server.out"),
                    read_lossy(&error_log),
                );
                return Err((dir, log));
            }
            if Instant::now() > deadline {
                let log = read_lossy(&error_log);
                // Dropping the Server stops what did start.
                drop(Server { name, child, port, dir, error_log, stop_signal });
                panic!("{name} did not listen on port {port} within {SERVER_DEADLINE:?}\n{log}");
            }
            thread::sleep(Duration::from_millis(20));
        }
    }

    fn stop(&mut self) {
        let pid = self.child.id() as libc::pid_t;
        // SAFETY: kill with a pid we own; errors (already gone) are ignored.
        unsafe { libc::kill(pid, self.stop_signal) };
        let deadline = Instant::now() + Duration::from_secs(5);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                break;
            }
            thread::sleep(Duration::from_millis(20));
        }
        // Leftover workers, cgid daemons and CGIs (a tunnel never ends by
        // itself) share the server's process group.
        // SAFETY: negative pid = the process group we created for the server.
        unsafe { libc::kill(-pid, libc::SIGKILL) };
        let _ = self.child.wait();
    }
}

impl Server {
    /// Starts `cmd` again on the same port, in the same directory, after
    /// stopping whatever runs now: a server restart as an administrator
    /// does one. Panics if it does not listen within the deadline.
    fn respawn(&mut self, mut cmd: Command) {
        self.stop();
        let out = fs::OpenOptions::new()
            .append(true)
            .create(true)
            .open(self.dir.join("server.out"))
            .expect("open server.out");
        let err = out.try_clone().expect("dup server.out");
        cmd.stdin(Stdio::null()).stdout(out).stderr(err).process_group(0);
        self.child = cmd.spawn().unwrap_or_else(|e| panic!("cannot restart {}: {e}", self.name));
        let deadline = Instant::now() + SERVER_DEADLINE;
        while TcpStream::connect(("127.0.0.1", self.port)).is_err() {
            if let Ok(Some(status)) = self.child.try_wait() {
                panic!("{} exited with {status} on restart\n{}", self.name, read_lossy(&self.error_log));
            }
            if Instant::now() > deadline {
                panic!("{} did not listen again on port {} within {SERVER_DEADLINE:?}", self.name, self.port);
            }
            thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.stop();
    }
}

fn read_lossy(path: &Path) -> String {
    fs::read(path).map(|b| String::from_utf8_lossy(&b).into_owned()).unwrap_or_default()
}

/// Starts a server on a free port, retrying on another port if it exits
/// before listening (another test may have taken the port in between).
fn start_with_retry(
    name: &'static str,
    mut make: impl FnMut(u16, &Dir) -> (Command, PathBuf, libc::c_int),
) -> Server {
    let mut dir = Dir::new(name);
    let mut last = String::new();
    for _ in 0..3 {
        let port = free_port();
        let (cmd, error_log, stop) = make(port, &dir);
        match Server::spawn(name, cmd, port, dir, error_log, stop) {
            Ok(server) => return server,
            Err((d, log)) => {
                dir = d;
                last = log;
            }
        }
    }
    panic!("could not start {name}:\n{last}");
}

/// Copies `cgi` into the server's directory, where the server's user can
/// execute it even when the original sits under a private home directory.
fn install_cgi(dir: &Dir, cgi: &Path) -> PathBuf {
    let name = cgi.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_else(|| "cgi".into());
    let bin = dir.create_dir("cgi-bin");
    let dest = bin.join(name);
    fs::copy(cgi, &dest).unwrap_or_else(|e| panic!("copy {} to {}: {e}", cgi.display(), dest.display()));
    set_mode(&dest, 0o755);
    dest
}

/// A directory the server's user may write (logs written after dropping
/// privileges, the store of a test).
fn server_writable_dir(dir: &Dir, name: &str) -> PathBuf {
    let path = dir.create_dir(name);
    make_writable_by_server(&path);
    path
}

/// A private Apache 2.4 (`mpm_event`, `mod_cgid`: Debian's defaults) on a
/// free loopback port. Stopped, with its CGIs, when dropped.
pub struct Apache {
    server: Server,
    conf: PathBuf,
}

impl Apache {
    /// Apache with `cgi_path` mounted at `/kn` (`ScriptAlias`), `KN_EVENTS`
    /// set to `store` (handed to the server's user), and `extra_conf`
    /// appended to the configuration (e.g. more `ScriptAlias` lines).
    pub fn start(cgi_path: &Path, store: &Path, extra_conf: &str) -> Apache {
        let cgi_path = cgi_path.to_path_buf();
        let store = store.to_path_buf();
        make_writable_by_server(&store);
        let extra = extra_conf.to_string();
        Apache::start_with(move |dir| {
            let cgi = install_cgi(dir, &cgi_path);
            format!(
                "ScriptAlias /kn {cgi}\nSetEnv KN_EVENTS {store}\n{extra}\n",
                cgi = cgi.display(),
                store = store.display(),
            )
        })
    }

    /// Apache forwarding `/kn` to `backend` (e.g. `http://127.0.0.1:PORT/kn`,
    /// the built-in `pubsub-cgi serve`) through `mod_proxy_http`, with
    /// `flushpackets=on` so that tunnels stream through the proxy.
    pub fn start_proxy(backend: &str, extra_conf: &str) -> Apache {
        let backend = backend.trim_end_matches('/').to_string();
        let extra = extra_conf.to_string();
        Apache::start_with(move |_| {
            format!(
                "ProxyPass /kn {backend} flushpackets=on\nProxyPassReverse /kn {backend}\n{extra}\n"
            )
        })
    }

    /// Apache with the harness's base configuration plus `site(dir)`.
    pub fn start_with(mut site: impl FnMut(&Dir) -> String) -> Apache {
        let mut conf_path = PathBuf::new();
        let server = start_with_retry("apache", |port, dir| {
            let conf = apache_conf(port, dir, &site(dir));
            conf_path = dir.create("httpd.conf", conf);
            let mut cmd = Command::new(APACHE);
            cmd.arg("-f").arg(&conf_path).arg("-DFOREGROUND");
            // SIGTERM is Apache's "stop": children are told to exit at
            // once. Not graceful-stop (SIGWINCH): that waits out
            // GracefulShutdownTimeout for the idle keep-alive connections
            // the test client pools, adding seconds to every test.
            // Server::stop then kills whatever is left in the group.
            (cmd, dir.join("logs/error.log"), libc::SIGTERM)
        });
        Apache { server, conf: conf_path }
    }

    /// The CGI's URL, `http://127.0.0.1:PORT/kn`.
    pub fn url(&self) -> String {
        format!("{}/kn", self.base_url())
    }

    /// `http://127.0.0.1:PORT`.
    pub fn base_url(&self) -> String {
        format!("http://127.0.0.1:{}", self.server.port)
    }

    pub fn port(&self) -> u16 {
        self.server.port
    }

    /// The server's temporary directory (configuration, logs, CGI copy).
    pub fn dir(&self) -> &Dir {
        &self.server.dir
    }

    /// The generated `httpd.conf`.
    pub fn conf(&self) -> &Path {
        &self.conf
    }

    /// The error log so far (CGI stderr lands here), for assertion messages.
    pub fn error_log(&self) -> String {
        read_lossy(&self.server.error_log)
    }

    /// The pid of the Apache parent process.
    pub fn pid(&self) -> u32 {
        self.server.child.id()
    }

    /// Stops Apache, every child and every CGI it started (open tunnels
    /// included), as a crash or an administrator's stop would; the port is
    /// free until [`Apache::restart`].
    pub fn stop(&mut self) {
        self.server.stop();
    }

    /// Starts Apache again on the same port with the same configuration
    /// (and so the same store), stopping it first if it still runs.
    pub fn restart(&mut self) {
        let mut cmd = Command::new(APACHE);
        cmd.arg("-f").arg(&self.conf).arg("-DFOREGROUND");
        self.server.respawn(cmd);
    }
}

impl fmt::Debug for Apache {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Apache({}, {:?})", self.url(), self.server.dir)
    }
}

fn apache_conf(port: u16, dir: &Dir, site: &str) -> String {
    let run = dir.path().display().to_string();
    let logs = server_writable_dir(dir, "logs").display().to_string();
    let who = server_user();
    let user = if is_root() {
        format!("User {}\nGroup {}\n", who.user, who.group)
    } else {
        String::new()
    };
    format!(
        r#"# Generated by tests/support: a self-contained Apache for one test.
ServerRoot /usr/lib/apache2
ServerName 127.0.0.1
Listen 127.0.0.1:{port}
LoadModule mpm_event_module {m}/mod_mpm_event.so
LoadModule authz_core_module {m}/mod_authz_core.so
LoadModule cgid_module {m}/mod_cgid.so
LoadModule alias_module {m}/mod_alias.so
LoadModule env_module {m}/mod_env.so
LoadModule mime_module {m}/mod_mime.so
LoadModule headers_module {m}/mod_headers.so
LoadModule proxy_module {m}/mod_proxy.so
LoadModule proxy_http_module {m}/mod_proxy_http.so
{user}PidFile {run}/httpd.pid
DefaultRuntimeDir {run}
Mutex file:{run} default
ScriptSock {run}/cgid.sock
ErrorLog {logs}/error.log
LogLevel info
LogFormat "%h %l %u %t \"%r\" %>s %b %D" common
CustomLog {logs}/access.log common
TypesConfig /dev/null
DocumentRoot {run}
# Debian's apache2.conf value: how long Apache waits for CGI output, so a
# tunnel must write keep-alives more often than this.
Timeout 300
GracefulShutdownTimeout 2
StartServers 1
MinSpareThreads 5
MaxSpareThreads 50
ThreadsPerChild 25
MaxRequestWorkers 100
<Directory />
    Require all granted
</Directory>
{site}"#,
        m = APACHE_MODULES,
    )
}

/// A private lighttpd (`mod_cgi`) on a free loopback port. Stopped, with
/// its CGIs, when dropped.
pub struct Lighttpd {
    server: Server,
}

impl Lighttpd {
    /// lighttpd with `cgi_path` mounted at `/kn` (`cgi.assign`), `KN_EVENTS`
    /// set to `store` (handed to the server's user), and `extra_conf`
    /// appended to the configuration.
    pub fn start(cgi_path: &Path, store: &Path, extra_conf: &str) -> Lighttpd {
        make_writable_by_server(store);
        let server = start_with_retry("lighttpd", |port, dir| {
            let cgi = install_cgi(dir, cgi_path);
            let logs = server_writable_dir(dir, "logs");
            let who = server_user();
            let user = if is_root() {
                format!("server.username = \"{}\"\nserver.groupname = \"{}\"\n", who.user, who.group)
            } else {
                String::new()
            };
            let conf = format!(
                r#"# Generated by tests/support: a self-contained lighttpd for one test.
server.modules = ("mod_alias", "mod_cgi", "mod_setenv", "mod_accesslog")
server.module-path = "{modules}"
server.document-root = "{root}"
server.bind = "127.0.0.1"
server.port = {port}
{user}server.errorlog = "{logs}/error.log"
accesslog.filename = "{logs}/access.log"
# Stream CGI output as it comes (tunnels), and request bodies too.
server.stream-response-body = 2
server.stream-request-body = 1
alias.url = ( "/kn" => "{cgi}" )
$HTTP["url"] =~ "^/kn(/|$)" {{
    cgi.assign = ( "" => "" )
}}
setenv.add-environment = ( "KN_EVENTS" => "{store}" )
{extra_conf}
"#,
                modules = LIGHTTPD_MODULES,
                root = dir.path().display(),
                logs = logs.display(),
                cgi = cgi.display(),
                store = store.display(),
            );
            let conf_path = dir.create("lighttpd.conf", conf);
            let mut cmd = Command::new(LIGHTTPD);
            cmd.arg("-D").arg("-f").arg(&conf_path);
            (cmd, logs.join("error.log"), libc::SIGTERM)
        });
        Lighttpd { server }
    }

    /// The CGI's URL, `http://127.0.0.1:PORT/kn`.
    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}/kn", self.server.port)
    }

    pub fn port(&self) -> u16 {
        self.server.port
    }

    /// The server's temporary directory.
    pub fn dir(&self) -> &Dir {
        &self.server.dir
    }

    /// The error log so far (CGI stderr lands here), for assertion messages.
    pub fn error_log(&self) -> String {
        read_lossy(&self.server.error_log)
    }
}

impl fmt::Debug for Lighttpd {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Lighttpd({}, {:?})", self.url(), self.server.dir)
    }
}

// ---------------------------------------------------------------------------
// Processes

/// Whether process `pid` exists (and is not a zombie awaiting its parent).
pub fn process_alive(pid: u32) -> bool {
    match fs::read_to_string(format!("/proc/{pid}/stat")) {
        // The state follows the parenthesised command name.
        Ok(stat) => stat.rsplit_once(") ").map(|(_, rest)| !rest.starts_with('Z')).unwrap_or(true),
        Err(_) => false,
    }
}

/// Waits up to `limit` for `cond`; true if it became true.
pub fn wait_for(limit: Duration, mut cond: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + limit;
    loop {
        if cond() {
            return true;
        }
        if Instant::now() > deadline {
            return false;
        }
        thread::sleep(Duration::from_millis(25));
    }
}

// ---------------------------------------------------------------------------
// HTTP client

/// A complete HTTP response.
#[derive(Clone, Debug)]
pub struct Response {
    pub status: u16,
    /// Header names in lower case, in arrival order.
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

impl Response {
    /// The first header named `name` (case-insensitive).
    pub fn header(&self, name: &str) -> Option<&str> {
        let name = name.to_ascii_lowercase();
        self.headers.iter().find(|(n, _)| *n == name).map(|(_, v)| v.as_str())
    }

    /// The body as text (lossy UTF-8).
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }
}

fn agent() -> &'static ureq::Agent {
    static AGENT: OnceLock<ureq::Agent> = OnceLock::new();
    AGENT.get_or_init(|| {
        ureq::Agent::config_builder()
            .http_status_as_error(false)
            .max_redirects(0)
            .timeout_global(Some(Duration::from_secs(30)))
            .build()
            .into()
    })
}

fn into_response(url: &str, result: Result<ureq::http::Response<ureq::Body>, ureq::Error>) -> Response {
    let mut resp = result.unwrap_or_else(|e| panic!("request to {url} failed: {e}"));
    let status = resp.status().as_u16();
    let headers = resp
        .headers()
        .iter()
        .map(|(n, v)| (n.as_str().to_ascii_lowercase(), String::from_utf8_lossy(v.as_bytes()).into_owned()))
        .collect();
    let body = resp
        .body_mut()
        .with_config()
        .limit(64 * 1024 * 1024)
        .read_to_vec()
        .unwrap_or_else(|e| panic!("reading body from {url}: {e}"));
    Response { status, headers, body }
}

/// `GET url`; panics on a transport error (any HTTP status is returned).
pub fn get(url: &str) -> Response {
    into_response(url, agent().get(url).call())
}

/// `POST url` with `pairs` form-urlencoded as the body.
pub fn post_form(url: &str, pairs: &[(&str, &str)]) -> Response {
    into_response(url, agent().post(url).send_form(pairs.iter().copied()))
}

/// `POST url` with a raw body and content type.
pub fn post(url: &str, content_type: &str, body: &[u8]) -> Response {
    into_response(url, agent().post(url).content_type(content_type).send(body))
}

/// A raw HTTP connection whose response is read incrementally, for tunnels
/// and for hanging up mid-response (drop it, or call [`Stream::close`]).
pub struct Stream {
    sock: TcpStream,
    received: Vec<u8>,
    eof: bool,
}

/// Splits `http://host:port/path?query` into (`host:port`, `/path?query`).
fn split_url(url: &str) -> (String, String) {
    let rest = url.strip_prefix("http://").unwrap_or_else(|| panic!("not an http:// URL: {url}"));
    match rest.find('/') {
        Some(i) => (rest[..i].to_string(), rest[i..].to_string()),
        None => (rest.to_string(), "/".to_string()),
    }
}

impl Stream {
    /// Opens `GET url` as HTTP/1.0, so that the body arrives as the raw
    /// bytes the server writes (no chunked framing) until it closes.
    pub fn get(url: &str) -> Stream {
        let (host, path) = split_url(url);
        let req = format!("GET {path} HTTP/1.0\r\nHost: {host}\r\nUser-Agent: kn-tests\r\n\r\n");
        Stream::send(url, req.as_bytes())
    }

    /// Opens a connection to `url`'s host and writes `request` verbatim.
    pub fn send(url: &str, request: &[u8]) -> Stream {
        let (host, _) = split_url(url);
        let mut sock = TcpStream::connect(&host).unwrap_or_else(|e| panic!("connect {host}: {e}"));
        sock.write_all(request).unwrap_or_else(|e| panic!("send to {host}: {e}"));
        Stream { sock, received: Vec::new(), eof: false }
    }

    /// Everything received so far (status line, headers and body).
    pub fn received(&self) -> &[u8] {
        &self.received
    }

    /// Everything received so far, as text (lossy UTF-8).
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.received).into_owned()
    }

    /// Whether the server has closed the connection.
    pub fn eof(&self) -> bool {
        self.eof
    }

    /// The status code, once the status line has arrived.
    pub fn status(&self) -> Option<u16> {
        let line = self.received.split(|&b| b == b'\n').next()?;
        let line = std::str::from_utf8(line).ok()?;
        line.split_whitespace().nth(1)?.parse().ok()
    }

    /// The body received so far (after the blank line ending the headers).
    pub fn body(&self) -> &[u8] {
        match find(&self.received, b"\r\n\r\n") {
            Some(i) => &self.received[i + 4..],
            None => &[],
        }
    }

    /// Reads whatever arrives within `limit` (or until the server closes).
    pub fn read_for(&mut self, limit: Duration) -> &[u8] {
        let deadline = Instant::now() + limit;
        while !self.eof && self.read_some(deadline) {}
        &self.received
    }

    /// Reads until `needle` has been received, the server closes, or `limit`
    /// passes; true if `needle` was seen. Everything read stays in
    /// [`Stream::received`].
    pub fn read_until(&mut self, needle: &[u8], limit: Duration) -> bool {
        let deadline = Instant::now() + limit;
        loop {
            if find(&self.received, needle).is_some() {
                return true;
            }
            if self.eof || !self.read_some(deadline) {
                return find(&self.received, needle).is_some();
            }
        }
    }

    /// Reads once: whatever arrives first within `limit`. False on timeout
    /// or end of stream. For clients that parse as bytes arrive and time
    /// each arrival (tunnel latency).
    pub fn read_once(&mut self, limit: Duration) -> bool {
        !self.eof && self.read_some(Instant::now() + limit)
    }

    /// Reads until the server closes the connection or `limit` passes; true
    /// if it closed.
    pub fn read_to_end(&mut self, limit: Duration) -> bool {
        self.read_for(limit);
        self.eof
    }

    /// Reads once, blocking no later than `deadline`; false on timeout or
    /// end of stream.
    fn read_some(&mut self, deadline: Instant) -> bool {
        let now = Instant::now();
        if now >= deadline {
            return false;
        }
        let _ = self.sock.set_read_timeout(Some(deadline - now));
        let mut buf = [0u8; 16 * 1024];
        match self.sock.read(&mut buf) {
            Ok(0) => {
                self.eof = true;
                false
            }
            Ok(n) => {
                self.received.extend_from_slice(&buf[..n]);
                true
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => true,
            Err(e) if matches!(e.kind(), io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut) => false,
            Err(_) => {
                // A reset is the server hanging up too.
                self.eof = true;
                false
            }
        }
    }

    /// Hangs up: the client vanishes mid-response.
    pub fn close(self) {
        let _ = self.sock.shutdown(std::net::Shutdown::Both);
    }
}

/// The first position of `needle` in `hay`.
pub fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    if needle.is_empty() {
        return Some(0);
    }
    hay.windows(needle.len()).position(|w| w == needle)
}

/// The inode owner of `path` (for tests about file ownership).
pub fn owner(path: &Path) -> Option<u32> {
    fs::metadata(path).ok().map(|m| m.uid())
}
