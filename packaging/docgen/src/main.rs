//! kn-docgen: the man pages and shell completions of knpubsub's programs,
//! rendered from the same clap definitions that parse their command lines
//! (so they say what `--help` says).
//!
//! ```text
//! cargo run -p kn-docgen -- OUT
//! ```
//!
//! writes `OUT/man1/<program>.1` (and a page per subcommand, e.g.
//! `kn-topics.1`), `OUT/bash/<program>.bash`, `OUT/zsh/_<program>` and
//! `OUT/fish/<program>.fish`. packaging/build-deb installs them.

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

fn generate(out: &Path) -> std::io::Result<Vec<PathBuf>> {
    let mut written = Vec::new();
    let man = out.join("man1");
    std::fs::create_dir_all(&man)?;
    for cmd in programs() {
        // A page for the program and one for each subcommand
        // (`kn-topics.1`, ...), as `git` has.
        clap_mangen::generate_to(cmd.clone(), &man)?;
        for (shell, dir) in [(Shell::Bash, "bash"), (Shell::Zsh, "zsh"), (Shell::Fish, "fish")] {
            let dir = out.join(dir);
            std::fs::create_dir_all(&dir)?;
            let name = cmd.get_name().to_string();
            written.push(clap_complete::generate_to(shell, &mut cmd.clone(), name, &dir)?);
        }
    }
    for entry in std::fs::read_dir(&man)? {
        written.push(entry?.path());
    }
    written.sort();
    Ok(written)
}

fn main() -> ExitCode {
    let args: Vec<_> = std::env::args_os().skip(1).collect();
    let [out] = &args[..] else {
        eprintln!("usage: kn-docgen OUT_DIR");
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
        std::fs::remove_dir_all(&dir).unwrap();
    }

    fn tempfile_dir() -> PathBuf {
        let dir = std::env::temp_dir().join(format!("kn-docgen-test-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        dir
    }
}
