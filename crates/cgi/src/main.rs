//! `pubsub-cgi`: the PubSub server as a CGI program (install it as
//! `pubsub.cgi`), and with `serve` a built-in HTTP server.
//!
//! The program starts at a C `main`, without the Rust runtime's start-up:
//! as a CGI it starts once per request, and that start-up reads and parses
//! `/proc/self/maps` to find the main thread's stack (for the stack
//! overflow message), about a tenth of a notify's CPU time. What it does
//! that matters here is done below: `SIGPIPE` is ignored (a write to a
//! vanished client fails with `EPIPE` instead of killing the process),
//! and leaving through `std::process::exit` flushes standard output.
//! Command-line arguments still reach `std::env::args` (glibc hands them
//! to the standard library on every start).
#![cfg_attr(not(test), no_main)]

#[cfg(not(test))]
#[unsafe(no_mangle)]
extern "C" fn main(_argc: libc::c_int, _argv: *const *const libc::c_char) -> libc::c_int {
    // SAFETY: setting a signal's disposition to ignore, before any thread.
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_IGN);
    }
    // Under a web server the binary is a CGI and ignores its arguments
    // entirely: `GET /kn?serve+--listen+0.0.0.0:9` reaches it as
    // `serve --listen 0.0.0.0:9` (RFC 3875's search-string rule).
    let status = if std::env::var_os("GATEWAY_INTERFACE").is_some() { kn_cgi::cgi::main() } else { kn_cgi::cli::main() };
    std::process::exit(status.into())
}
