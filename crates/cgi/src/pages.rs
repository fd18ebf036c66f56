//! The browser pages of `www/` (a chat, a topic browser, a ping page, their
//! scripts and style sheet), built into the binary, so that an installed
//! `pubsub-cgi serve` serves them from any working directory; `serve
//! --static DIR` serves a directory instead.
//!
//! The pages are a static of the binary, file contents and names as they
//! were at build time: nothing is read, decompressed or indexed when the
//! program starts, so a CGI process, which never serves them, pays nothing
//! for them. (The JavaScript client itself is `do_method=lib`, see
//! [`assets`](crate::assets).)

use std::path::Path;

use include_dir::{include_dir, Dir};

/// `www/` of the source tree (the build script reruns when it changes).
static PAGES: Dir<'static> = include_dir!("$CARGO_MANIFEST_DIR/../../www");

/// The contents of the built-in file at `relative` (e.g. `js/chat.js`),
/// if there is one.
///
/// ```
/// use std::path::Path;
///
/// let index = kn_cgi::pages::get(Path::new("index.html")).unwrap();
/// assert!(index.starts_with(b"<!DOCTYPE html>"));
/// assert!(kn_cgi::pages::get(Path::new("js/chat.js")).is_some());
/// assert!(kn_cgi::pages::get(Path::new("js")).is_none(), "a directory is no page");
/// assert!(kn_cgi::pages::get(Path::new("missing.html")).is_none());
/// ```
pub fn get(relative: &Path) -> Option<&'static [u8]> {
    PAGES.get_file(relative).map(|file| file.contents())
}
