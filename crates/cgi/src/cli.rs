//! The command line of `pubsub-cgi` when it is not run as a CGI.

use std::process::ExitCode;

const USAGE: &str = "\
pubsub-cgi: the knpubsub PubSub server

USAGE:
    pubsub.cgi                  run under a web server (CGI/1.1); the store is
                                $KN_EVENTS, else ../kn_events beside the script
    pubsub-cgi --help           this text

A web server sets GATEWAY_INTERFACE; then every argument is ignored.
See docs/DEPLOY.md for Apache, lighttpd and nginx.
";

/// Runs the command line.
pub fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match args.first().map(String::as_str) {
        None | Some("--help") | Some("-h") | Some("help") => {
            print!("{USAGE}");
            ExitCode::SUCCESS
        }
        Some(other) => {
            eprintln!("pubsub-cgi: unknown command '{other}'\n\n{USAGE}");
            ExitCode::from(2)
        }
    }
}
