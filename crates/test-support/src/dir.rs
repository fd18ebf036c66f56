//! Temporary directories a web server's user can reach, and that user.

use std::ffi::CString;
use std::fmt;
use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;



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

pub(crate) fn set_mode(path: &Path, mode: u32) {
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
    /// Numeric user id.
    pub uid: u32,
    /// Numeric group id.
    pub gid: u32,
}

pub(crate) fn is_root() -> bool {
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

