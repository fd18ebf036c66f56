//! The one error type of kn-push.

use std::fmt;

/// What kind of thing went wrong.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ErrorKind {
    /// A subscription, key or parameter given by a client or an operator is
    /// malformed (bad JSON, bad base64, a point not on the curve, a bad
    /// `Urgency`).
    BadInput,
    /// The push endpoint is not one this server may send to (not `https`,
    /// not on the allowlist, a loopback or private address).
    Forbidden,
    /// The key file could not be read or written.
    Io,
    /// The cryptography refused (should not happen with valid keys).
    Crypto,
}

/// An error of kn-push: its kind and a message naming the input involved.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Error {
    kind: ErrorKind,
    message: String,
}

impl Error {
    pub(crate) fn new(kind: ErrorKind, message: impl Into<String>) -> Error {
        Error { kind, message: message.into() }
    }

    /// The kind of error.
    pub fn kind(&self) -> ErrorKind {
        self.kind
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for Error {}

/// The result type of kn-push.
pub type Result<T> = std::result::Result<T, Error>;
