//! Running as a CGI program: one request from the environment and stdin,
//! one response on stdout.

use std::io::Write;
use std::os::fd::AsFd;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;

use kn_journal::{Config, Store};
use kn_wire::{status_event, Format, Page};

use crate::handler::{Handler, Options, Reply};
use crate::request::{Limits, Request};
use crate::response::Response;

/// Where the event store of a CGI process is: `KN_EVENTS` (set with
/// Apache's `SetEnv`), else `../kn_events` beside the script's directory,
/// as the original laid it out.
pub fn store_root() -> PathBuf {
    if let Some(root) = std::env::var_os("KN_EVENTS") {
        return PathBuf::from(root);
    }
    let script = std::env::var_os("SCRIPT_FILENAME").map(PathBuf::from).or_else(|| std::env::current_exe().ok());
    match script.as_ref().and_then(|s| s.parent()).and_then(|d| d.parent()) {
        Some(dir) => dir.join("kn_events"),
        None => PathBuf::from("kn_events"),
    }
}

/// Serves the one request of this CGI process. Never reads the command
/// line: a web server passes a query string without `=` as arguments
/// (RFC 3875's search-string rule), and those are not orders. Returns
/// the exit status.
pub fn main() -> u8 {
    let status = if serve_one() == ExitCode::SUCCESS { 0 } else { 1 };
    // Everything is written and every file of the store closed.
    exit_before_end_of_output(status)
}

fn serve_one() -> ExitCode {
    // stdout as a plain file: one write per one-shot response, no line
    // buffering splitting it.
    let mut out = match std::io::stdout().as_fd().try_clone_to_owned() {
        Ok(fd) => std::fs::File::from(fd),
        Err(_) => return ExitCode::FAILURE,
    };
    let config = match Config::new(store_root()).with_env() {
        Ok(c) => c,
        Err(err) => return fail(&mut out, 500, "Server misconfigured", &err.to_string()),
    };
    if let Some(path) = crate::streams::cgi_path() {
        // Durable Streams, mounted with a second ScriptAlias (DEPLOY.md).
        let settings = match kn_streams::StreamsConfig::from_env() {
            Ok(s) => s,
            Err(err) => return fail(&mut out, 500, "Server misconfigured", &err.to_string()),
        };
        let _ = crate::streams::serve_cgi(config, settings, path, &mut out);
        return ExitCode::SUCCESS;
    }
    let request = match Request::from_process(&Limits::for_store(&config)) {
        Ok(r) => r,
        Err(err) => {
            let (code, reason) = err.status();
            let exit = fail(&mut out, code, reason, err.message());
            drain_unread_body();
            return exit;
        }
    };
    // The server's names come from KN_SERVER_URL and `.names`, never
    // from this request's Host (see `Store::adopt_name`).
    let store = match Store::open_with(config).and_then(|s| kn_push::wire(s).map_err(push_error)) {
        Ok(s) => Arc::new(s),
        Err(err) => return fail(&mut out, 500, "Event store unavailable", err.message()),
    };
    let handler = Handler::new(store.clone(), Options::default());
    let (reply, after) = handler.handle_deferring(&request);
    let result = match reply {
        Reply::Done(response) => {
            // Started before the reply is written: a web server may end
            // this process as soon as it has the whole reply (lighttpd).
            complete_after_reply(after);
            let written = response.write_to(&mut out);
            if !request.method().is_supported() {
                drain_unread_body();
            }
            written
        }
        Reply::Tunnel(mut tunnel) => {
            if let Some((topic, why)) = tunnel.why_not_notified() {
                // Each CGI tunnel is a process with an inotify of its own
                // (DEPLOY.md, "Many open tunnels"): past the user's limit
                // it still delivers, by re-reading, and says so once in
                // the web server's error log.
                let every = tunnel.poll_interval().as_millis();
                eprintln!("pubsub.cgi: the tunnel on {topic} re-reads every {every} ms (KN_POLL_MS): no change notification, {why}");
            }
            let _ = tunnel.run(&store, &mut out);
            // The response of a tunnel ends only when this process exits
            // (no Content-Length): leave at once, without waiting on
            // destructors such as the change notifier's thread (stdout is
            // unbuffered; every event was stored before it was sent).
            std::process::exit(0);
        }
    };
    // A failed write means the client went away: nothing left to do.
    let _ = result;
    if store.sweep_due() {
        // pubsub.cgi has no daemon: a request does a bounded slice of the
        // sweep, at most one per KN_SWEEP_INTERVAL_MS across every
        // process (every request's while the sweep is behind), once its
        // response is written. The output stays open:
        // closing it first would end the response while the process still
        // runs, which costs more under mod_cgid than the slice (see
        // `exit_before_end_of_output`).
        kn_streams::sweep_expired_streams(&store);
        let _ = store.sweep(store.config().sweep_budget);
        // Status events a killed request held for a route's population.
        let _ = store.complete_held_statuses();
        // Escalations of unread events that are due (docs/PRESENCE.md).
        let _ = store.complete_unread_escalations();
    }
    ExitCode::SUCCESS
}

/// Runs `after` (a new route's population, issue 12) once the client has
/// the reply, in a detached child started before the reply is written:
/// the web server does not signal it (it leaves the process group and
/// ignores SIGTERM). It holds the output until this process is gone (its
/// reply written); then, through a socket (Apache's `mod_cgid`), it ends
/// the output and waits until the server closes its end, which it does
/// once it has sent the reply; through a pipe it just lets go. Then
/// [`AFTER_REPLY_MARGIN`] more for the reply to reach the client. Where no child can be started, the work stays in the store's
/// outbox for the topic's next writer.
fn complete_after_reply(after: crate::handler::AfterReply) {
    if after.is_empty() {
        return;
    }
    let parent = std::process::id() as libc::pid_t;
    // SAFETY: a CGI process has one thread; the child runs ordinary code
    // on its copy of the memory, then `_exit`s without running the
    // parent's destructors.
    unsafe {
        let pidfd = libc::syscall(libc::SYS_pidfd_open, parent, 0) as libc::c_int;
        // The parent goes on only once the child has left the process
        // group: a web server that signals the CGI's group must not take
        // the child with it.
        let mut ready = [-1 as libc::c_int; 2];
        let synced = libc::pipe2(ready.as_mut_ptr(), libc::O_CLOEXEC) == 0;
        match libc::fork() {
            0 => {}
            child => {
                if pidfd >= 0 {
                    libc::close(pidfd);
                }
                if synced {
                    libc::close(ready[1]);
                    let mut byte = 0u8;
                    if child > 0 {
                        libc::read(ready[0], (&mut byte as *mut u8).cast(), 1);
                    }
                    libc::close(ready[0]);
                }
                return;
            }
        }
        for signal in [libc::SIGTERM, libc::SIGHUP, libc::SIGPIPE] {
            libc::signal(signal, libc::SIG_IGN);
        }
        libc::setsid();
        let output = libc::dup(1);
        let null = libc::open(c"/dev/null".as_ptr(), libc::O_RDWR);
        if null >= 0 {
            for fd in 0..3 {
                libc::dup2(null, fd);
            }
        }
        if synced {
            libc::close(ready[0]);
            libc::write(ready[1], [1u8].as_ptr().cast(), 1);
            libc::close(ready[1]);
        }
        if pidfd >= 0 {
            let mut exited = libc::pollfd { fd: pidfd, events: libc::POLLIN, revents: 0 };
            libc::poll(&mut exited, 1, 5000);
        } else {
            // No pidfd (Linux before 5.3): the parent is gone once this
            // child has another.
            for _ in 0..5000 {
                if libc::getppid() != parent {
                    break;
                }
                libc::usleep(1000);
            }
        }
        // The reply is written. Through a socket (Apache's mod_cgid) end
        // the output here and wait until the server closes its end, which
        // it does once it has sent the reply; a pipe just closes.
        if output >= 0 {
            if libc::shutdown(output, libc::SHUT_WR) == 0 {
                let mut closed = libc::pollfd { fd: output, events: libc::POLLRDHUP, revents: 0 };
                libc::poll(&mut closed, 1, 2000);
            }
            libc::close(output);
        }
        std::thread::sleep(AFTER_REPLY_MARGIN);
        after.run();
        libc::_exit(0);
    }
}

/// How long the population waits once the reply has left this process,
/// for the web server to pass it on.
const AFTER_REPLY_MARGIN: std::time::Duration = std::time::Duration::from_millis(20);

/// Exits so that the web server, when it sees the end of the output,
/// finds this process already gone.
///
/// Apache's mod_cgid, once a CGI's output ends, signals the CGI's process
/// and, if it still exists, sleeps 10 ms before looking again (its
/// `cleanup_nonchild_process`). The output ends when the process's last
/// descriptor of it closes, in the kernel's exit path a moment before the
/// process is gone, and the woken server thread often looks within that
/// moment: measured on the benchmark's Apache, half of all requests slept
/// the 10 ms, which is most of a CGI request's time (the same for any
/// CGI: see `hello-cgi` in BENCHMARKS.md). So the end of the output is
/// handed to a child: the process starts one and exits at once; the child,
/// holding the same descriptors, waits until its parent no longer exists
/// (or is a zombie, as under servers that reap their CGI only after its
/// output ends: lighttpd, fcgiwrap) and then exits, closing them. It costs
/// a `clone` sharing the finished process's memory (no copy). Where that
/// fails, the process simply exits.
#[cfg(target_os = "linux")]
fn exit_before_end_of_output(status: u8) -> u8 {
    // Everything the child needs is prepared before it starts; it then
    // only makes async-signal-safe system calls on that memory.
    let parent = std::process::id() as libc::pid_t;
    let Ok(stat) = std::ffi::CString::new(format!("/proc/{parent}/stat")) else { return status };
    const STACK: usize = 64 << 10;
    // SAFETY: the child shares this process's memory (`CLONE_VM`: no page
    // tables copied, unlike `fork`), runs on a stack of its own mapped
    // here, and reads only `watch`, leaked so that nothing frees it; the
    // parent exits at once without running destructors, and the memory
    // lives on with the child. The child calls only `kill`, `open`,
    // `read`, `close`, `usleep` and `_exit`.
    unsafe {
        let stack = libc::mmap(
            std::ptr::null_mut(),
            STACK,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_STACK,
            -1,
            0,
        );
        if stack == libc::MAP_FAILED {
            return status;
        }
        // Readable once the parent has exited: the child sleeps until then.
        let pidfd = libc::syscall(libc::SYS_pidfd_open, parent, 0) as libc::c_int;
        let watch: *mut Watch = Box::into_raw(Box::new(Watch { parent, pidfd, stat }));
        let top = stack.cast::<u8>().add(STACK).cast::<libc::c_void>();
        if libc::clone(hold_output_until_gone, top, libc::CLONE_VM | libc::SIGCHLD, watch.cast()) == -1 {
            return status;
        }
        libc::_exit(status.into())
    }
}

/// What the child of [`exit_before_end_of_output`] watches.
#[cfg(target_os = "linux")]
struct Watch {
    parent: libc::pid_t,
    /// A pidfd of the parent, or -1 (Linux before 5.3).
    pidfd: libc::c_int,
    stat: std::ffi::CString,
}

/// The child: holds the output (its copies of the descriptors) until the
/// parent no longer exists or is a zombie, one second at most.
#[cfg(target_os = "linux")]
extern "C" fn hold_output_until_gone(watch: *mut libc::c_void) -> libc::c_int {
    // SAFETY: `watch` is the leaked `Watch` of the parent, in memory this
    // process shares and nothing frees.
    unsafe {
        let watch = &*watch.cast::<Watch>();
        if watch.pidfd >= 0 {
            let mut exited = libc::pollfd { fd: watch.pidfd, events: libc::POLLIN, revents: 0 };
            libc::poll(&mut exited, 1, 1000);
        }
        for _ in 0..50_000 {
            if libc::kill(watch.parent, 0) != 0 || is_zombie(&watch.stat) {
                break;
            }
            libc::usleep(20);
        }
        libc::_exit(0)
    }
}

#[cfg(not(target_os = "linux"))]
fn exit_before_end_of_output(status: u8) -> u8 {
    status
}

/// Whether the process whose `/proc/<pid>/stat` is `stat` is gone or a
/// zombie. Async-signal-safe: no allocation.
#[cfg(target_os = "linux")]
unsafe fn is_zombie(stat: &std::ffi::CStr) -> bool {
    let fd = libc::open(stat.as_ptr(), libc::O_RDONLY | libc::O_CLOEXEC);
    if fd < 0 {
        return true;
    }
    let mut buf = [0u8; 512];
    let n = libc::read(fd, buf.as_mut_ptr().cast(), buf.len());
    libc::close(fd);
    if n <= 0 {
        return true;
    }
    // "pid (comm) S ...": the state follows the last ')'.
    let line = &buf[..n as usize];
    match line.iter().rposition(|&b| b == b')') {
        Some(i) => matches!(line.get(i + 2), Some(b'Z' | b'X' | b'x')),
        None => true,
    }
}

/// Reads and discards the request body a reply left unread (a body over
/// the limit, or the body of a PUT), for at most two seconds and at most
/// `CONTENT_LENGTH` bytes. Under Apache's mod_cgid the CGI's stdin and
/// stdout are one socket: exiting with request bytes unread resets it and
/// the reply already written is lost. Nothing read is kept in memory.
fn drain_unread_body() {
    use std::io::Read;
    let length: u64 = std::env::var("CONTENT_LENGTH").ok().and_then(|v| v.trim().parse().ok()).unwrap_or(0);
    if length == 0 {
        return;
    }
    let (done, finished) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = std::io::copy(&mut std::io::stdin().lock().take(length), &mut std::io::sink());
        let _ = done.send(());
    });
    let _ = finished.recv_timeout(std::time::Duration::from_secs(2));
}

/// Answers a request that could not even be parsed, in the `js` format.
fn fail(out: &mut impl Write, code: u16, reason: &str, message: &str) -> ExitCode {
    // The same server URL as every other page (port included), so the
    // help link of a 4xx works.
    let url = crate::request::process_server_url();
    let status = status_event(code, reason, message, None);
    if let Ok(response) = Response::events(Format::Js, &Page::new(url), &[status]) {
        let _ = response.write_to(out);
    }
    ExitCode::SUCCESS
}

/// A Web Push setting or key file that does not work, as a store error.
fn push_error(err: kn_push::Error) -> kn_journal::Error {
    kn_journal::Error::new(kn_journal::ErrorKind::BadRequest, err.to_string())
}
