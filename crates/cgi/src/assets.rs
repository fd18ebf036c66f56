//! Files the server hands out, compiled into the binary.

/// `do_method=help`: the usage page; `{SERVER}` is replaced by the
/// server's URL.
pub const HELP_HTML: &str = include_str!("../assets/help.html");

/// The JavaScript client served by `do_method=lib` after `whoami`.
pub const CLIENT_JS: &str = include_str!("../assets/kn_client.js");

/// The `kn:` form handler added by `libform` and `lib2form`.
pub const FORM_JS: &str = include_str!("../assets/kn_form.js");
