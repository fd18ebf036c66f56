//! The workspace's binaries, built on demand, and `pubsub-cgi serve` launched from one.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdout, Command, Stdio};
use std::sync::OnceLock;



/// The workspace binary `name` (e.g. `"pubsub-cgi"`), built if needed.
///
/// `env!("CARGO_BIN_EXE_<name>")` only exists for binaries of the package
/// whose tests are being compiled, and these tests live in the root package
/// while the binaries live in `kn-cgi` and `kn-sensors`; and `cargo test`
/// builds another package's binaries only as test harnesses, not as
/// programs. So the harness looks in the target directory this test
/// executable was built into (`<target>/<profile>/deps/<test>` →
/// `<target>/<profile>/<name>`) and runs `cargo build -p kn-cgi -p
/// kn-sensors --bins` (same profile, same target directory) once
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

/// `pubsub-cgi` built with the `failpoints` feature (faults injected on
/// request, `KN_FAILPOINT`), once per test process, into
/// `<target>/failpoints` (same profile) so that it never replaces the
/// binary other tests run.
pub fn failpoint_cgi() -> PathBuf {
    static BUILT: OnceLock<PathBuf> = OnceLock::new();
    BUILT
        .get_or_init(|| {
            let layout = target_layout();
            let target = layout.target_dir.join("failpoints");
            if let Err(e) = cargo_build(&layout, &target, &["-p", "kn-cgi", "--bin", "pubsub-cgi", "--features", "failpoints"]) {
                panic!("{e}");
            }
            let mut dir = target;
            if let Some(triple) = &layout.triple {
                dir.push(triple);
            }
            dir.join(layout.profile_dir.file_name().expect("profile directory")).join("pubsub-cgi")
        })
        .clone()
}

/// `pubsub-cgi serve` listening on a free loopback port; killed when
/// dropped.
pub struct Serve {
    /// The server process.
    pub child: Child,
    /// `http://127.0.0.1:PORT`, without `/kn`.
    pub base: String,
    /// The rest of its standard output, kept open so that the server never
    /// writes to a closed pipe.
    pub stdout: BufReader<ChildStdout>,
}

impl Serve {
    /// The command line of the workspace's `pubsub-cgi serve` (see
    /// [`Serve::command_of`]).
    pub fn command(root: &Path, www: Option<&Path>) -> Command {
        Serve::command_of(&pubsub_cgi(), root, www)
    }

    /// The command line of `bin serve` (a `pubsub-cgi`, e.g.
    /// `env!("CARGO_BIN_EXE_pubsub-cgi")`) on a free port over the store
    /// `root`, with static files from `www`, without the test's own
    /// `KN_EVENTS` and `GATEWAY_INTERFACE`.
    pub fn command_of(bin: &Path, root: &Path, www: Option<&Path>) -> Command {
        let mut command = Command::new(bin);
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
        let mut stdout = BufReader::new(child.stdout.take().expect("stdout"));
        let mut line = String::new();
        stdout.read_line(&mut line).expect("first line");
        let base = line
            .strip_prefix("knpubsub serving ")
            .and_then(|rest| rest.split_once("/kn (store "))
            .map(|(base, _)| base.to_string())
            .unwrap_or_else(|| panic!("unexpected first line: {line:?}"));
        Serve { child, base, stdout }
    }

    /// Its `/kn` URL.
    pub fn url(&self) -> String {
        format!("{}/kn", self.base)
    }

    /// `127.0.0.1:PORT`, to connect a socket to.
    pub fn addr(&self) -> &str {
        self.base.strip_prefix("http://").unwrap_or(&self.base)
    }
}

impl Drop for Serve {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

pub(crate) struct TargetLayout {
    /// `<target>[/<triple>]/<profile>`: where binaries land.
    pub(crate) profile_dir: PathBuf,
    /// The `--target-dir`.
    pub(crate) target_dir: PathBuf,
    /// `Some(triple)` when built with `--target`.
    triple: Option<String>,
    /// The profile directory's name: `debug` for dev/test, else the profile.
    profile: String,
}

pub(crate) fn target_layout() -> TargetLayout {
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
    cargo_build(layout, &layout.target_dir, &["-p", "kn-cgi", "-p", "kn-sensors", "--bins"])
}

/// `cargo build <what>` into `target_dir`, with the profile and target
/// triple of this test executable.
fn cargo_build(layout: &TargetLayout, target_dir: &Path, what: &[&str]) -> Result<(), String> {
    cargo(layout, target_dir, "build", what).map(|_| ())
}

/// Runs `cargo <command> --quiet <what>` in the workspace, into
/// `target_dir`, with the profile and target of this test executable;
/// its standard output, or why it failed.
fn cargo(layout: &TargetLayout, target_dir: &Path, command: &str, what: &[&str]) -> Result<String, String> {
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let mut cmd = Command::new(cargo);
    cmd.current_dir(env!("CARGO_MANIFEST_DIR")).args([command, "--quiet"]).args(what).arg("--target-dir").arg(target_dir);
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
    let out = cmd.output().map_err(|e| format!("running cargo {command}: {e}"))?;
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    if !out.status.success() {
        return Err(format!("cargo {command} {} failed ({}):\n{stdout}{}", what.join(" "), out.status, String::from_utf8_lossy(&out.stderr)));
    }
    Ok(stdout)
}

/// Runs the integration test `test` of `package` built with the
/// `failpoints` feature (tests that arm faults inside the library itself,
/// `#![cfg(feature = "failpoints")]`, which a plain `cargo test` compiles
/// to nothing), into `<target>/failpoints` like [`failpoint_cgi`]; returns
/// its output (`test result: ok. N passed; ...`), or panics with it when a
/// test failed.
pub fn failpoint_tests(package: &str, test: &str) -> String {
    let layout = target_layout();
    let target = layout.target_dir.join("failpoints");
    match cargo(&layout, &target, "test", &["-p", package, "--features", "failpoints", "--test", test]) {
        Ok(out) => out,
        Err(e) => panic!("{e}"),
    }
}

