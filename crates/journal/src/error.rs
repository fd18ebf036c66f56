//! The one error type of the crate.

use std::fmt;
use std::path::Path;

/// What kind of failure an [`Error`] is. Each kind maps to the protocol
/// status a server answers with ([`ErrorKind::status`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ErrorKind {
    /// A topic name broke the rules of PROTOCOL.md section 2 (400).
    BadTopic,
    /// A destination, element or parameter value is malformed (400).
    BadRequest,
    /// A post to `kn_routes` or `kn_subtopics` (400).
    ReservedTopic,
    /// Not allowed: a static route from a journal, a remote destination
    /// refused by the outbound policy, or an operation the access rules
    /// refuse an authenticated user (403).
    Forbidden,
    /// An operation the access rules refuse to anonymous: logging in may
    /// help (401).
    Unauthorized,
    /// A journal whose heartbeat is missing or stale (404).
    Expired,
    /// An event larger than the configured maximum (413).
    TooLarge,
    /// A post whose forwarding reached `max_forwards` deliveries and was
    /// stopped there: the posted event is stored, later deliveries are not
    /// made (508, the status of a detected loop).
    TooManyDeliveries,
    /// The store's file system is below its free-space reserve, or a write
    /// hit ENOSPC (507).
    DiskFull,
    /// A remote server failed or did not answer in time (502).
    Remote,
    /// A record failed its checksum or could not be decoded (500).
    Corrupt,
    /// Any other I/O failure (500).
    Io,
}

impl ErrorKind {
    /// The HTTP status code and reason phrase a server answers with.
    ///
    /// ```
    /// use kn_journal::ErrorKind;
    /// assert_eq!(ErrorKind::DiskFull.status(), (507, "Insufficient Storage"));
    /// assert_eq!(ErrorKind::Expired.status(), (404, "Expired"));
    /// ```
    pub fn status(self) -> (u16, &'static str) {
        match self {
            ErrorKind::BadTopic => (400, "Bad topic name"),
            ErrorKind::BadRequest => (400, "Bad request"),
            ErrorKind::ReservedTopic => (400, "Can't post there"),
            ErrorKind::Forbidden => (403, "Forbidden"),
            ErrorKind::Unauthorized => (401, "Unauthorized"),
            ErrorKind::Expired => (404, "Expired"),
            ErrorKind::TooLarge => (413, "Event too large"),
            ErrorKind::TooManyDeliveries => (508, "Too many deliveries"),
            ErrorKind::DiskFull => (507, "Insufficient Storage"),
            ErrorKind::Remote => (502, "Remote server failed"),
            ErrorKind::Corrupt => (500, "Corrupt record"),
            ErrorKind::Io => (500, "Internal Server Error"),
        }
    }
}

/// An error of the journal: a kind and a message that says what went wrong
/// with which input (topic, path, URL).
#[derive(Debug)]
pub struct Error {
    kind: ErrorKind,
    message: String,
    source: Option<std::io::Error>,
}

impl Error {
    /// Makes an error of `kind` with a complete, human-readable message.
    pub fn new(kind: ErrorKind, message: impl Into<String>) -> Error {
        Error { kind, message: message.into(), source: None }
    }

    /// Wraps an I/O error on `path`; ENOSPC and EDQUOT become
    /// [`ErrorKind::DiskFull`].
    pub fn io(what: &str, path: &Path, err: std::io::Error) -> Error {
        let kind = match err.raw_os_error() {
            Some(code) if code == libc_enospc() || code == libc_edquot() => ErrorKind::DiskFull,
            _ if err.kind() == std::io::ErrorKind::StorageFull => ErrorKind::DiskFull,
            _ => ErrorKind::Io,
        };
        Error { kind, message: format!("{what} '{}': {err}", path.display()), source: Some(err) }
    }

    /// The kind, which decides the protocol status.
    pub fn kind(&self) -> ErrorKind {
        self.kind
    }

    /// The human-readable message (also what `Display` prints).
    pub fn message(&self) -> &str {
        &self.message
    }
}

const fn libc_enospc() -> i32 {
    28
}

const fn libc_edquot() -> i32 {
    122
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for Error {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        self.source.as_ref().map(|e| e as _)
    }
}

/// Shorthand for results of this crate.
pub type Result<T, E = Error> = std::result::Result<T, E>;
