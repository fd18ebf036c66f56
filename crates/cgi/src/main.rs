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
//! The command line is taken from `argv` here: glibc also hands it to
//! the standard library (`std::env::args`) on every start, musl does not
//! (`cargo build-cgi-musl` links with musl).
#![cfg_attr(not(test), no_main)]

#[cfg(not(test))]
#[unsafe(no_mangle)]
extern "C" fn main(argc: libc::c_int, argv: *const *const libc::c_char) -> libc::c_int {
    // SAFETY: setting a signal's disposition to ignore, before any thread.
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_IGN);
    }
    // Under a web server the binary is a CGI and ignores its arguments
    // entirely: `GET /kn?serve+--listen+0.0.0.0:9` reaches it as
    // `serve --listen 0.0.0.0:9` (RFC 3875's search-string rule).
    let status = if std::env::var_os("GATEWAY_INTERFACE").is_some() { kn_cgi::cgi::main() } else { kn_cgi::cli::main_with(args(argc, argv)) };
    std::process::exit(status.into())
}

/// The command line as the C runtime passed it.
#[cfg(not(test))]
fn args(argc: libc::c_int, argv: *const *const libc::c_char) -> Vec<std::ffi::OsString> {
    use std::os::unix::ffi::OsStrExt;
    let count = usize::try_from(argc).unwrap_or(0);
    (0..count)
        // SAFETY: the C runtime passes `argc` pointers to NUL-terminated
        // strings that live as long as the process; a null one ends them.
        .map(|i| unsafe { *argv.add(i) })
        .take_while(|p| !p.is_null())
        // SAFETY: as above: a NUL-terminated string, not null.
        .map(|p| std::ffi::OsStr::from_bytes(unsafe { std::ffi::CStr::from_ptr(p) }.to_bytes()).to_os_string())
        .collect()
}
