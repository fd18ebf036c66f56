//! kn-docgen: the man pages and shell completions of knpubsub's programs,
//! rendered from the same clap definitions that parse their command lines
//! (so they say what `--help` says), the settings reference from the
//! store's settings table, and the package's copyright file from
//! Cargo.lock.
//!
//! ```text
//! cargo run -p kn-docgen -- OUT
//! cargo run -p kn-docgen -- settings > docs/SETTINGS.md
//! cargo run -p kn-docgen -- copyright packaging/deb/copyright
//! ```
//!
//! The first writes `OUT/man1/<program>.1` (and a page per subcommand,
//! e.g. `kn-topics.1`), `OUT/man7/knpubsub-settings.7`,
//! `OUT/bash/<program>.bash`, `OUT/zsh/_<program>` and
//! `OUT/fish/<program>.fish`; packaging/build-deb installs them. The
//! second prints docs/SETTINGS.md; the third prints the Debian copyright
//! file: the given header, then the licence of every crate linked into
//! the installed programs (see `copyright.rs`).

mod copyright;
mod man;
mod settings;

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use clap::CommandFactory;
use clap_complete::Shell;

// The sensors' and kn's command lines are defined in their src/bin files
// (a `Cli` each, `pub(crate)` for this); compiled here as modules, their
// `main`s unused.
#[allow(dead_code)]
#[path = "../../../crates/sensors/src/bin/kn.rs"]
mod kn;
#[allow(dead_code)]
#[path = "../../../crates/sensors/src/bin/kn-feed.rs"]
mod kn_feed;
#[allow(dead_code)]
#[path = "../../../crates/sensors/src/bin/kn-mail.rs"]
mod kn_mail;
#[allow(dead_code)]
#[path = "../../../crates/sensors/src/bin/kn-post.rs"]
mod kn_post;
#[allow(dead_code)]
#[path = "../../../crates/sensors/src/bin/kn-replay.rs"]
mod kn_replay;

/// Every installed program's command line, named as installed.
fn programs() -> Vec<clap::Command> {
    let commands = [
        ("pubsub-cgi", kn_cgi::cli::Cli::command()),
        ("kn", kn::Cli::command()),
        ("kn-feed", kn_feed::Cli::command()),
        ("kn-mail", kn_mail::Cli::command()),
        ("kn-post", kn_post::Cli::command()),
        ("kn-replay", kn_replay::Cli::command()),
    ];
    commands.into_iter().map(|(name, cmd)| cmd.name(name).bin_name(name)).collect()
}

/// The files each installed program uses (its FILES section; its
/// subcommands' pages repeat it), and the exit status of a program whose
/// `--help` does not give it.
fn extra(program: &str) -> man::Extra {
    const STORE: (&str, &str) = ("/var/lib/knpubsub/kn_events", "The event store of the Debian package (KN_EVENTS).");
    const DEFAULTS: (&str, &str) = ("/etc/default/knpubsub", "Settings of the knpubsub service and its maintenance timers.");
    match program {
        "pubsub-cgi" => man::Extra {
            files: &[
                ("/usr/lib/cgi-bin/pubsub.cgi", "The program as a CGI (a link to /usr/bin/pubsub-cgi)."),
                ("/etc/apache2/conf-available/knpubsub.conf", "/kn under Apache, as pubsub.cgi (enabled by the package)."),
                ("/etc/apache2/conf-available/knpubsub-proxy.conf", "/kn under Apache, forwarded to the knpubsub service."),
                ("/lib/systemd/system/knpubsub.service", "The knpubsub service: pubsub-cgi serve."),
                DEFAULTS,
                STORE,
                ("/etc/knpubsub/", "Access rules (KN_ACCESS_RULES) and token keys (KN_TOKEN_KEYS)."),
            ],
            exit_status: Some(
                "As a CGI: 0, the request's outcome being in its answer. As serve: 0 when it stopped on SIGTERM or \
                 Ctrl-C, 1 when it could not start or failed, 2 for a bad command line or setting.",
            ),
        },
        "kn" => man::Extra {
            files: &[
                STORE,
                ("/lib/systemd/system/knpubsub-gc.timer", "Runs kn gc every 10 minutes (knpubsub-gc.service)."),
                ("/lib/systemd/system/knpubsub-compact.timer", "Runs kn compact every night (knpubsub-compact.service)."),
                DEFAULTS,
            ],
            exit_status: None,
        },
        _ => man::Extra { files: &[STORE], exit_status: None },
    }
}

fn generate(out: &Path) -> std::io::Result<Vec<PathBuf>> {
    let mut written = Vec::new();
    let man = out.join("man1");
    std::fs::create_dir_all(&man)?;
    let names: Vec<String> = programs().iter().map(|c| c.get_name().to_string()).collect();
    let version = env!("CARGO_PKG_VERSION");
    for cmd in programs() {
        // A page for the program and one for each subcommand
        // (`kn-topics.1`, ...), as `git` has.
        let name = cmd.get_name().to_string();
        for (file, page) in man::pages(cmd.clone(), &extra(&name), &names, version) {
            std::fs::write(man.join(file), page)?;
        }
        for (shell, dir) in [(Shell::Bash, "bash"), (Shell::Zsh, "zsh"), (Shell::Fish, "fish")] {
            let dir = out.join(dir);
            std::fs::create_dir_all(&dir)?;
            let name = cmd.get_name().to_string();
            written.push(clap_complete::generate_to(shell, &mut cmd.clone(), name, &dir)?);
        }
    }
    let man7 = out.join("man7");
    std::fs::create_dir_all(&man7)?;
    std::fs::write(man7.join("knpubsub-settings.7"), settings::man_page(&settings::settings(), version))?;
    for dir in [&man, &man7] {
        for entry in std::fs::read_dir(dir)? {
            written.push(entry?.path());
        }
    }
    written.sort();
    Ok(written)
}

const USAGE: &str = "usage: kn-docgen OUT_DIR | kn-docgen settings | kn-docgen copyright HEADER";

fn main() -> ExitCode {
    let args: Vec<_> = std::env::args_os().skip(1).collect();
    let args: Vec<&str> = args.iter().map(|a| a.to_str().unwrap_or("")).collect();
    match args[..] {
        ["settings"] => {
            print!("{}", settings::markdown(&settings::settings()));
            return ExitCode::SUCCESS;
        }
        ["copyright", header] => {
            return match copyright::render(Path::new(header)) {
                Ok(text) => {
                    print!("{text}");
                    ExitCode::SUCCESS
                }
                Err(e) => {
                    eprintln!("kn-docgen copyright: {e}");
                    ExitCode::from(1)
                }
            };
        }
        _ => {}
    }
    let [out] = &args[..] else {
        eprintln!("{USAGE}");
        return ExitCode::from(64);
    };
    match generate(Path::new(out)) {
        Ok(written) => {
            for path in written {
                println!("{}", path.display());
            }
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("kn-docgen: cannot write to {}: {e}", Path::new(out).display());
            ExitCode::from(73)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_program_is_named_as_installed_and_its_definition_is_valid() {
        let names: Vec<_> = programs().iter().map(|c| c.get_name().to_string()).collect();
        assert_eq!(names, ["pubsub-cgi", "kn", "kn-feed", "kn-mail", "kn-post", "kn-replay"]);
        for cmd in programs() {
            cmd.debug_assert();
        }
    }

    #[test]
    fn man_pages_and_completions_are_written_for_every_program_and_subcommand() {
        let dir = tempfile_dir();
        let written = generate(&dir).unwrap();
        for name in ["pubsub-cgi", "kn", "kn-feed", "kn-mail", "kn-post", "kn-replay"] {
            let page = std::fs::read_to_string(dir.join("man1").join(format!("{name}.1"))).unwrap();
            assert!(page.contains(&format!(".TH {name} 1")), "{name}.1:\n{page}");
            assert!(dir.join("bash").join(format!("{name}.bash")).is_file(), "{name}: {written:?}");
            assert!(dir.join("zsh").join(format!("_{name}")).is_file(), "{name}");
            assert!(dir.join("fish").join(format!("{name}.fish")).is_file(), "{name}");
        }
        // A subcommand's page, and the --help text in the pages.
        assert!(dir.join("man1/pubsub-cgi-serve.1").is_file());
        assert!(dir.join("man1/kn-topics.1").is_file());
        let serve = std::fs::read_to_string(dir.join("man1/pubsub-cgi-serve.1")).unwrap();
        assert!(serve.contains("\\-\\-listen"), "{serve}");
        assert!(dir.join("man7/knpubsub-settings.7").is_file());
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn pubsub_cgi_page_has_a_manuals_sections_and_one_row_per_variable() {
        let names: Vec<String> = programs().iter().map(|c| c.get_name().to_string()).collect();
        let pages = man::pages(programs().remove(0), &extra("pubsub-cgi"), &names, "0");
        let (_, page) = pages.iter().find(|(file, _)| file == "pubsub-cgi.1").unwrap();
        for section in ["NAME", "SYNOPSIS", "DESCRIPTION", "ENVIRONMENT", "\"EXIT STATUS\"", "FILES", "\"SEE ALSO\""] {
            assert!(page.contains(&format!(".SH {section}\n")), "no {section}:\n{page}");
        }
        assert!(!page.contains(".SH EXTRA"), "{page}");
        // Each variable of --help's environment list heads a row of its own.
        let help = kn_cgi::cli::Cli::command().render_long_help().to_string();
        let listed: Vec<&str> = help.lines().filter_map(|l| l.strip_prefix("    KN_")).map(|l| l.split_whitespace().next().unwrap_or("")).collect();
        assert!(listed.len() >= 10, "{help}");
        let rows: Vec<&str> = page.lines().collect();
        for name in listed {
            let name = format!("KN_{}", name.trim_end_matches(','));
            // (roff escapes nothing in a variable's name.)
            let row = rows.windows(2).any(|w| w[0] == ".TP" && w[1].contains(&name));
            assert!(row, "{name} heads no row:\n{page}");
        }
        let serve = pages.iter().find(|(file, _)| file == "pubsub-cgi-serve.1").map(|(_, p)| p).unwrap();
        let synopsis = serve.split(".SH SYNOPSIS").nth(1).unwrap().split(".SH").next().unwrap();
        assert!(synopsis.contains("\\-\\-listen\\fR \\fIADDR"), "{synopsis}");
    }

    fn tempfile_dir() -> PathBuf {
        let dir = std::env::temp_dir().join(format!("kn-docgen-test-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        dir
    }
}
