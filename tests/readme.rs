//! README.md's commands, run as a newcomer runs them: its `serve` command
//! (the built `pubsub-cgi` for `cargo run ... --`) in a fresh directory,
//! then the `sh` blocks of "Try it" in order, each command exactly as
//! written (only the port of `127.0.0.1:8080` is replaced, by the one
//! `serve` picked: `KN_LISTEN=127.0.0.1:0`), through `sh -c`. What the
//! README says they show is read from the comment above each command and
//! checked:
//!
//! * `# answers "TEXT"`: the command prints TEXT;
//! * `# shows "TEXT"` on a command that stays open (`curl -N`, the tunnel
//!   of a second terminal, or a follower such as `kn tail -f`): it prints
//!   TEXT;
//! * `the tunnel shows WORD`: once the command has run, the open tunnel
//!   (the first command that stays open) prints a line WORD.
//!
//! `cargo run` lines are not run (see [`Step::is_cargo_run`]). Then the
//! Sensors section's commands that reach nothing outside
//! (`pubsub.example` is no server of ours) run the same way.

mod support;

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

const CURL: &str = "/usr/bin/curl";
/// Where the README says `serve` listens.
const README_ADDR: &str = "127.0.0.1:8080";

/// One command of a `sh` block, with the comment lines above it.
#[derive(Debug)]
struct Step {
    comment: String,
    command: String,
}

impl Step {
    /// The quoted text after `word ` in the comment (`answers "..."`).
    fn quoted(&self, word: &str) -> Option<&str> {
        let rest = &self.comment[self.comment.find(&format!("{word} \""))? + word.len() + 2..];
        rest.split('"').next()
    }

    /// The word after "the tunnel shows ".
    fn tunnel_shows(&self) -> Option<&str> {
        let rest = &self.comment[self.comment.find("the tunnel shows ")? + "the tunnel shows ".len()..];
        rest.split(|c: char| c.is_whitespace() || c == ',' || c == '.').next()
    }

    /// A command that stays open: a tunnel (`curl -N`) or a follower
    /// (`kn tail -f`).
    fn stays_open(&self) -> bool {
        self.command.starts_with("curl -N ") || self.command.split_whitespace().any(|w| w == "-f" || w == "--follow")
    }

    /// A `cargo run` of the workspace's own code: `serve` is started as
    /// the README says by [`Session::start`] (the binary the tests built),
    /// and the journal's example follows a topic until stopped, so it is
    /// not run here (`cargo test` builds and checks examples).
    fn is_cargo_run(&self) -> bool {
        self.command.starts_with("cargo run ")
    }
}

/// The text of README.md's section `heading` (up to the next `## `).
fn section(heading: &str) -> String {
    let readme = std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("README.md")).expect("README.md");
    let start = readme.find(&format!("\n## {heading}\n")).unwrap_or_else(|| panic!("README.md has no section '{heading}'"));
    let body = &readme[start + heading.len() + 5..];
    body[..body.find("\n## ").unwrap_or(body.len())].to_string()
}

/// The commands of the section's ```` ```sh ```` blocks, in order.
fn sh_steps(section: &str) -> Vec<Step> {
    let mut steps = Vec::new();
    let mut rest = section;
    while let Some(start) = rest.find("```sh\n") {
        let block = &rest[start + 6..];
        let end = block.find("```").expect("an unclosed code block");
        let mut comment = String::new();
        for line in block[..end].lines().filter(|l| !l.trim().is_empty()) {
            match line.strip_prefix('#') {
                Some(c) => comment.push_str(c.trim()),
                None => steps.push(Step { comment: std::mem::take(&mut comment), command: line.to_string() }),
            }
        }
        rest = &block[end + 3..];
    }
    steps
}

/// A newcomer's session: `serve` started as the README says, in a fresh
/// directory (its default store `./kn_events` there), and what other
/// terminals hold open: the tunnel first, then any follower.
struct Session {
    dir: support::Dir,
    serve: support::Serve,
    path: OsString,
    open: Vec<(Child, PathBuf)>,
}

impl Session {
    fn start(name: &str) -> Session {
        let dir = support::Dir::new(name);
        let two = section("Two commands");
        let line = two.lines().find(|l| l.starts_with("cargo run ")).expect("the serve command");
        let (_, args) = line.split_once(" -- ").unwrap_or_else(|| panic!("'{line}' passes no arguments to the program"));
        assert!(line.contains("-p kn-cgi"), "{line}: not pubsub-cgi");
        let mut command = Command::new(support::pubsub_cgi());
        command
            .args(args.split_whitespace())
            .current_dir(dir.path())
            .env("KN_LISTEN", "127.0.0.1:0")
            .env_remove("KN_EVENTS")
            .env_remove("GATEWAY_INTERFACE");
        let serve = support::Serve::spawn(command);
        // The sensors and kn as installed: on the PATH.
        let bins = support::cargo_bin("kn-post").parent().expect("bin directory").to_path_buf();
        let mut path = OsString::from(bins);
        path.push(":");
        path.push(std::env::var_os("PATH").unwrap_or_default());
        Session { dir, serve, path, open: Vec::new() }
    }

    /// `command` as a shell runs it in the session's directory, the
    /// README's address replaced by serve's (a command that stays open is
    /// `exec`'d, so that it is the process to stop at the end).
    fn shell(&self, command: &str, stays_open: bool) -> Command {
        let command = command.replace(README_ADDR, self.serve.addr());
        let mut sh = Command::new("sh");
        sh.arg("-c").arg(if stays_open { format!("exec {command}") } else { command }).current_dir(self.dir.path()).env("PATH", &self.path).env_remove("KN_EVENTS");
        sh
    }

    fn run(&self, step: &Step) -> String {
        let out: Output = self.shell(&step.command, false).stdin(Stdio::null()).output().expect("sh");
        let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
        assert!(out.status.success(), "`{}` failed ({}): {stdout}{}", step.command, out.status, String::from_utf8_lossy(&out.stderr));
        stdout
    }

    /// Runs the README's steps in order, checking what each says it shows.
    fn follow(&mut self, steps: &[Step]) {
        for step in steps.iter().filter(|s| !s.is_cargo_run()) {
            if step.stays_open() {
                let out = self.dir.join(&format!("open-{}.out", self.open.len()));
                let file = std::fs::File::create(&out).unwrap();
                // curl draws its progress meter when not writing to a terminal.
                let child = self.shell(&step.command, true).stdin(Stdio::null()).stdout(file).stderr(Stdio::null()).spawn().expect("sh");
                self.open.push((child, out.clone()));
                if let Some(text) = step.quoted("shows") {
                    let shown = || std::fs::read_to_string(&out).unwrap_or_default();
                    assert!(wait(|| shown().contains(text)), "`{}` never showed {text:?}:\n{}", step.command, shown());
                }
                continue;
            }
            let seen = step.tunnel_shows().map(|word| self.lines(word));
            let stdout = self.run(step);
            if let Some(text) = step.quoted("answers") {
                assert!(stdout.contains(text), "`{}` answered\n{stdout}\nnot {text:?}", step.command);
            }
            if let (Some(word), Some(seen)) = (step.tunnel_shows(), seen) {
                assert!(self.wait_tunnel(|t| t.lines().filter(|l| *l == word).count() > seen), "the tunnel never showed {word}:\n{}", self.tunnel_text());
            }
        }
    }

    /// What the tunnel (the first command left open) printed so far.
    fn tunnel_text(&self) -> String {
        self.open.first().map(|(_, out)| std::fs::read_to_string(out).unwrap_or_default()).unwrap_or_default()
    }

    /// Lines of the tunnel's output that are `word`.
    fn lines(&self, word: &str) -> usize {
        self.tunnel_text().lines().filter(|l| *l == word).count()
    }

    fn wait_tunnel(&self, done: impl Fn(&str) -> bool) -> bool {
        wait(|| done(&self.tunnel_text()))
    }
}

/// Whether `done` becomes true within 10 seconds.
fn wait(done: impl Fn() -> bool) -> bool {
    let deadline = Instant::now() + Duration::from_secs(10);
    while Instant::now() < deadline {
        if done() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    false
}

impl Drop for Session {
    fn drop(&mut self) {
        for (child, _) in &mut self.open {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// "Try it", as written: the tunnel opened first shows the event posted
/// after the route, and (curl being no browser) no padding.
#[test]
fn readme_try_it_shows_what_it_promises() {
    if !support::available(CURL) {
        return;
    }
    let steps = sh_steps(&section("Try it"));
    assert!(steps.iter().any(Step::stays_open), "{steps:?}");
    assert!(steps.iter().any(|s| s.tunnel_shows().is_some()), "the README promises nothing to check: {steps:?}");
    assert!(steps.iter().any(|s| s.command.starts_with("kn tail -f ")), "Try it names kn tail -f: {steps:?}");
    let mut session = Session::start("readme_try_it");
    session.follow(&steps);
    let tunnel = session.tunnel_text();
    assert!(!tunnel.contains(&" ".repeat(4096)), "padding in a terminal's tunnel:\n{tunnel}");
    // What the README says of the simple format's escapes, on what the
    // tunnel showed.
    let routed_from = tunnel.lines().find_map(|l| l.strip_prefix("kn_routed_from: ")).expect("a routed event");
    let readme = std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("README.md")).unwrap();
    let example = format!("`kn_routed_from: {}`", routed_from.replace(&session.serve.addr().replace(':', "=3A"), "127.0.0.1=3A8080"));
    assert!(readme.contains(&example), "README.md's escape example is not what the tunnel shows ({example})");
}

/// The Sensors section's local commands after "Try it": a local post
/// fires the route made through `serve` "exactly as for a web client's
/// notify", so the tunnel shows it too, and the route stays active.
#[test]
fn readme_sensor_post_fires_the_route_of_try_it() {
    if !support::available(CURL) {
        return;
    }
    let mut session = Session::start("readme_sensors");
    session.follow(&sh_steps(&section("Try it")));
    let sensors: Vec<Step> = sh_steps(&section("Sensors")).into_iter().filter(|s| !s.command.contains(".example")).collect();
    let post = sensors.iter().find(|s| s.command.contains("kn-post /what/chat")).expect("the README's local kn-post");
    let hellos = session.lines("hello");
    let id = session.run(post);
    assert_eq!(id.lines().count(), 1, "kn-post prints the event's kn_id: {id}");
    let routes = session.run(&Step { comment: String::new(), command: "kn routes /what/chat".into() });
    assert!(!routes.contains("kn_poisoned="), "the route was poisoned: {routes}");
    assert!(session.wait_tunnel(|t| t.lines().filter(|l| *l == "hello").count() > hellos), "the tunnel never showed the sensor's hello:\n{}", session.tunnel_text());
}

#[test]
fn readme_steps_are_parsed_with_their_promises() {
    let steps = sh_steps("x\n```sh\n# answers \"a b\", and the tunnel shows hi\ncurl x\n\ncurl -N y\n```\n");
    assert_eq!(steps.len(), 2);
    assert_eq!(steps[0].quoted("answers"), Some("a b"));
    assert_eq!(steps[0].tunnel_shows(), Some("hi"));
    assert!(steps[1].stays_open() && steps[1].comment.is_empty());
    let follow = sh_steps("```sh\n# shows \"hello\"\nkn tail -f /who/me/kn_journal\nkn tail /x\n```\n");
    assert!(follow[0].stays_open() && !follow[1].stays_open());
}
