//! `pubsub-cgi`: the PubSub server as a CGI program (install it as
//! `pubsub.cgi`), and with `serve` a built-in HTTP server.

use std::process::ExitCode;

fn main() -> ExitCode {
    // Under a web server the binary is a CGI and ignores its arguments
    // entirely: `GET /kn?serve+--listen+0.0.0.0:9` reaches it as
    // `serve --listen 0.0.0.0:9` (RFC 3875's search-string rule).
    if std::env::var_os("GATEWAY_INTERFACE").is_some() {
        return kn_cgi::cgi::main();
    }
    kn_cgi::cli::main()
}
