//! Apache and lighttpd: private instances on free loopback ports.

use std::fmt;
use std::fs;
use std::net::{TcpListener, TcpStream};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::thread;
use std::time::{Duration, Instant};

use crate::*;


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

    /// Its loopback port.
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

    /// Its loopback port.
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

