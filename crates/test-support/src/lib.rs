//! Scaffolding shared by knpubsub's integration tests (a dev-dependency
//! only; never published).
//!
//! Each test reads like a shell session:
//!
//! ```ignore
//! use kn_test_support::{Apache, Dir};
//!
//! #[test]
//! fn notify_answers_200() {
//!     if !kn_test_support::available(kn_test_support::APACHE) { return; }
//!     let dir = Dir::new("notify_answers_200");
//!     let store = dir.store("events");
//!     let apache = Apache::start(&kn_test_support::pubsub_cgi(), &store, "");
//!     let resp = kn_test_support::post_form(&apache.url(), &[("kn_to", "/t"), ("kn_payload", "x")]);
//!     assert_eq!(resp.status, 200, "{}", apache.error_log());
//! }
//! ```
//!
//! Where things live:
//!
//! * [`skip`](mod@skip): [`skip()`] and [`available`]: a test that cannot run
//!   here says so where CI shows it (`<target>/kn-skips.txt`), and fails
//!   under `CI=true`.
//! * [`dir`]: [`Dir`], a temporary directory the web server's user can
//!   traverse (files, scripts, event stores), and [`server_user`].
//! * [`bins`]: [`cargo_bin`], [`pubsub_cgi`], [`hello_cgi`] (the workspace's
//!   binaries, built on demand) and [`Serve`], `pubsub-cgi serve` on a free
//!   port from any binary path (`env!("CARGO_BIN_EXE_pubsub-cgi")` in
//!   kn-cgi's own tests).
//! * [`servers`]: [`Apache`] (2.4, `mpm_event` + `mod_cgid`) and
//!   [`Lighttpd`] (`mod_cgi`), private instances with the CGI at `/kn`,
//!   stopped with every child when dropped.
//! * [`http`]: [`get`], [`post_form`], [`post`] ([`Response`]) and
//!   [`Stream`], a raw connection read incrementally with deadlines.
//! * [`recorder`]: [`Listener`], [`Received`], [`read_request`],
//!   [`read_head_and_body`], [`form_decode`]: the server side, for
//!   listeners that stand in for a remote, a transform or a proxy.
//! * [`bins`] also has [`failpoint_cgi`], `pubsub-cgi` with faults injected
//!   on request, built into `<target>/failpoints`.
//! * [`raw`]: [`raw::Conn`], [`raw::Reply`], [`raw::Tunnel`]: a raw
//!   HTTP/1.1 keep-alive client and tunnel reader for `pubsub-cgi serve`
//!   (not re-exported at the root).
//! * [`cluster`]: what the scale-out tests' clusters (GlusterFS, CephFS)
//!   share: bounded commands, namespaces and veths, unmounting a FUSE
//!   mount whose client may hang (not re-exported at the root).
//! * [`process`]: [`wait_for`], [`process_alive`], [`run_with_stdin`],
//!   [`scratch`], [`owner`].
//!
//! The crate depends on no knpubsub library: it runs their binaries by
//! path, so any test crate (kn-journal's included) can use it without a
//! dependency cycle.
//!
//! Tests run as root on CI. Apache refuses to run its children as root, so
//! when the tests are root the servers run as `www-data`: the harness makes
//! temporary directories world-traversable, copies the CGI next to the
//! server's configuration (the checkout may sit under a private `/root`), and
//! hands the event store to that user.

#![deny(missing_docs)]

pub mod bins;
pub mod cluster;
pub mod dir;
pub mod http;
pub mod process;
pub mod raw;
pub mod recorder;
pub mod servers;
pub mod skip;

pub use bins::*;
pub use dir::*;
pub use http::*;
pub use process::*;
pub use recorder::*;
pub use servers::*;
pub use skip::*;
