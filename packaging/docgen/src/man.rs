//! Manual pages from the programs' clap definitions: clap_mangen's
//! DESCRIPTION, OPTIONS and COMMANDS, and the sections a manual page
//! has (NAME as one line, SYNOPSIS with argument names, ENVIRONMENT,
//! EXIT STATUS, EXAMPLES, FILES, SEE ALSO) from the same text `--help`
//! prints after the options (clap's `after_help`), parsed by its headings
//! instead of refilled as one "EXTRA" paragraph.

use clap::{ArgAction, Command};
use roff::{bold, italic, roman, Inline, Roff};

/// What a page adds that the command line does not say.
pub struct Extra {
    /// Installed files the program uses: (path, what it is).
    pub files: &'static [(&'static str, &'static str)],
    /// The exit status, for a program whose `--help` does not say it.
    pub exit_status: Option<&'static str>,
}

/// Every page of `cmd` (the program's, then one per subcommand, e.g.
/// `kn-topics`), as (file name, roff).
pub fn pages(cmd: Command, extra: &Extra, programs: &[String], version: &str) -> Vec<(String, String)> {
    let mut cmd = cmd.disable_help_subcommand(true);
    cmd.build();
    let mut out = Vec::new();
    let inherited = sections(&after_help(&cmd));
    collect(&cmd, None, &inherited, extra, programs, version, &mut out);
    out
}

fn collect(
    cmd: &Command,
    parent: Option<&str>,
    inherited: &[Section],
    extra: &Extra,
    programs: &[String],
    version: &str,
    out: &mut Vec<(String, String)>,
) {
    let name = cmd.get_display_name().unwrap_or(cmd.get_name()).to_string();
    out.push((format!("{name}.1"), page(cmd, parent, inherited, extra, programs, version)));
    for sub in cmd.get_subcommands().filter(|s| !s.is_hide_set()) {
        collect(sub, Some(&name), inherited, extra, programs, version, out);
    }
}

/// The `after_help` text `--help` prints (the long one if set).
fn after_help(cmd: &Command) -> String {
    cmd.get_after_long_help().or(cmd.get_after_help()).map(|s| s.to_string()).unwrap_or_default()
}

fn page(cmd: &Command, parent: Option<&str>, inherited: &[Section], extra: &Extra, programs: &[String], version: &str) -> String {
    let name = cmd.get_display_name().unwrap_or(cmd.get_name()).to_string();
    let man = clap_mangen::Man::new(cmd.clone()).source(format!("knpubsub {version}")).manual("knpubsub manual");
    let mut buf = Vec::new();
    let mut roff = Roff::default();
    roff.control("SH", ["NAME"]);
    roff.text([roman(format!("{name} - {}", short(cmd)))]);
    roff.control("SH", ["SYNOPSIS"]);
    roff.text(synopsis(cmd));
    // Writing into a Vec cannot fail.
    let _ = man.render_title(&mut buf);
    let _ = roff.to_writer(&mut buf);
    let _ = man.render_description_section(&mut buf);
    if cmd.get_arguments().any(|a| !a.is_hide_set()) {
        let _ = man.render_options_section(&mut buf);
    }
    if cmd.has_subcommands() {
        let _ = man.render_subcommands_section(&mut buf);
    }

    let own = sections(&after_help(cmd));
    let mut roff = Roff::default();
    // The program's sections; a subcommand without its own takes the
    // program's exit status and environment.
    let mut titles: Vec<&str> = own.iter().map(|s| s.title.as_str()).collect();
    for title in ["ENVIRONMENT", "EXIT STATUS"] {
        if !titles.contains(&title) && parent.is_some() && inherited.iter().any(|s| s.title == title) {
            titles.push(title);
        }
    }
    if !titles.contains(&"ENVIRONMENT") {
        titles.push("ENVIRONMENT");
    }
    if !titles.contains(&"EXIT STATUS") && extra.exit_status.is_some() {
        titles.push("EXIT STATUS");
    }
    for title in ORDER {
        if !titles.contains(title) {
            continue;
        }
        roff.control("SH", [*title]);
        let section = own.iter().find(|s| s.title == *title).or_else(|| inherited.iter().find(|s| s.title == *title));
        if let Some(section) = section {
            render_blocks(&mut roff, &section.blocks);
        } else if let (true, Some(said)) = (*title == "EXIT STATUS", extra.exit_status) {
            roff.text([roman(said)]);
        }
        if *title == "ENVIRONMENT" {
            roff.control("TP", []);
            roff.text([bold("KN_EVENTS"), roman(", and the store's other settings")]);
            roff.text([roman("The event store and its limits: knpubsub-settings(7) lists every variable with its default.")]);
        }
    }
    for section in own.iter().filter(|s| !ORDER.contains(&s.title.as_str())) {
        roff.control("SH", [section.title.as_str()]);
        render_blocks(&mut roff, &section.blocks);
    }
    if !extra.files.is_empty() {
        roff.control("SH", ["FILES"]);
        for (path, what) in extra.files {
            roff.control("TP", []);
            roff.text([bold(*path)]);
            roff.text([roman(*what)]);
        }
    }
    roff.control("SH", ["SEE ALSO"]);
    let mut see: Vec<String> = Vec::new();
    if let Some(parent) = parent {
        see.push(format!("{parent}(1)"));
    }
    see.extend(programs.iter().filter(|p| **p != name && Some(p.as_str()) != parent).map(|p| format!("{p}(1)")));
    see.push("knpubsub-settings(7)".into());
    roff.text([roman(see.join(", "))]);
    roff.control("PP", []);
    roff.text([roman(
        "The documents under /usr/share/doc/knpubsub/ (docs/DEPLOY.md.gz first) or in the source tree's docs/.",
    )]);
    let _ = roff.to_writer(&mut buf);
    String::from_utf8_lossy(&buf).into_owned()
}

/// The order of the standard sections (man-pages(7)) that come after
/// OPTIONS and COMMANDS.
const ORDER: &[&str] = &["ENVIRONMENT", "EXIT STATUS", "NOTES", "EXAMPLES"];

/// The NAME line's description: the `about` up to its first `:`, `;`
/// or sentence end, lowercased as in man pages ("kn - look after a
/// knpubsub event store").
pub fn short(cmd: &Command) -> String {
    let about = cmd.get_about().map(|s| s.to_string()).unwrap_or_default();
    let about = about.lines().next().unwrap_or("").trim();
    // "knpubsub: the PubSub server, ..." names the project first.
    let about = match about.split_once(": ") {
        Some((name, rest)) if !name.contains(' ') => rest,
        _ => about,
    };
    // "e.g. " and "i.e. " end no sentence (masked, same length).
    let masked = about.replace("e.g.", "e#g#").replace("i.e.", "i#e#");
    let end = [": ", "; ", ". ", " (", ", then"].iter().filter_map(|m| masked.find(m)).min().unwrap_or(about.len());
    let text = about[..end].trim_end_matches('.').trim();
    // "List ..." becomes "list ..."; "PubSub" and "GET" stay.
    let first = text.split(' ').next().unwrap_or("");
    if first.chars().skip(1).all(|c| c.is_lowercase()) && first.chars().count() > 1 {
        let mut chars = text.chars();
        chars.next().map(|c| c.to_lowercase().chain(chars).collect()).unwrap_or_default()
    } else {
        text.to_string()
    }
}

/// SYNOPSIS: the command, each option with its value's name, the
/// positional arguments, the subcommand.
pub fn synopsis(cmd: &Command) -> Vec<Inline> {
    let name = cmd.get_bin_name().unwrap_or(cmd.get_name()).to_string();
    let mut line = vec![bold(name)];
    let mut options: Vec<_> = cmd.get_arguments().filter(|a| !a.is_hide_set() && !a.is_positional()).collect();
    options.sort_by_key(|a| (a.is_required_set(), a.get_long().map(str::to_string)));
    for arg in options {
        if matches!(arg.get_action(), ArgAction::Help | ArgAction::HelpShort | ArgAction::HelpLong | ArgAction::Version) {
            continue;
        }
        let flag = match (arg.get_short(), arg.get_long()) {
            (_, Some(long)) => format!("--{long}"),
            (Some(short), None) => format!("-{short}"),
            (None, None) => continue,
        };
        let takes_value = arg.get_action().takes_values();
        let (open, close) = if arg.is_required_set() { ("", "") } else { ("[", "]") };
        line.push(roman(format!(" {open}")));
        line.push(bold(flag));
        if takes_value {
            let value = arg.get_value_names().map(|v| v.join(" ")).unwrap_or_else(|| arg.get_id().as_str().to_uppercase());
            line.push(roman(" "));
            line.push(italic(value));
        }
        line.push(roman(close));
    }
    for arg in cmd.get_positionals().filter(|a| !a.is_hide_set()) {
        let value = arg.get_value_names().map(|v| v.join(" ")).unwrap_or_else(|| arg.get_id().as_str().to_uppercase());
        let many = matches!(arg.get_action(), ArgAction::Append) || arg.get_num_args().is_some_and(|n| n.max_values() > 1);
        let (open, close) = if arg.is_required_set() { ("", "") } else { ("[", "]") };
        line.push(roman(format!(" {open}")));
        line.push(italic(value));
        line.push(roman(format!("{}{close}", if many { "..." } else { "" })));
    }
    if cmd.has_subcommands() {
        line.push(roman(" "));
        line.push(italic("COMMAND"));
        line.push(roman(" [ARGS]"));
    }
    line
}

/// A section of the `after_help` text.
#[derive(Debug, PartialEq)]
pub struct Section {
    /// Its man page heading (`EXIT STATUS`).
    pub title: String,
    pub blocks: Vec<Block>,
}

/// A piece of a section.
#[derive(Debug, PartialEq)]
pub enum Block {
    /// Running text, refilled.
    Text(String),
    /// Lines kept as they are (commands, tables), their common indent removed.
    Verbatim(Vec<String>),
    /// An environment list: (names, description).
    Variables(Vec<(String, String)>),
}

/// The headings `--help` texts use, and their man page sections.
const HEADINGS: &[(&str, &str)] =
    &[("Exit status", "EXIT STATUS"), ("Examples", "EXAMPLES"), ("Environment", "ENVIRONMENT"), ("CGI mode", "CGI MODE")];

/// Splits an `after_help` text into sections at its headings (a line
/// such as "Exit status: ..." or "Examples:"); text before the first
/// heading is NOTES.
pub fn sections(text: &str) -> Vec<Section> {
    let mut out: Vec<Section> = Vec::new();
    for paragraph in text.split("\n\n").map(|p| p.trim_end_matches('\n')).filter(|p| !p.trim().is_empty()) {
        let mut lines: Vec<&str> = paragraph.lines().collect();
        let mut intro = None;
        if let Some((title, rest)) = heading(lines[0]) {
            out.push(Section { title: title.to_string(), blocks: Vec::new() });
            intro = Some(rest);
            lines.remove(0);
        } else if out.is_empty() {
            out.push(Section { title: "NOTES".into(), blocks: Vec::new() });
        }
        let Some(section) = out.last_mut() else { continue };
        let mut text: Vec<String> = intro.filter(|r| !r.is_empty()).map(|r| vec![r.to_string()]).unwrap_or_default();
        let mut verbatim: Vec<&str> = Vec::new();
        for line in lines {
            if line.starts_with(' ') {
                if !text.is_empty() {
                    section.blocks.push(Block::Text(std::mem::take(&mut text).join(" ")));
                }
                verbatim.push(line);
            } else {
                if !verbatim.is_empty() {
                    section.blocks.push(indented(&section.title, std::mem::take(&mut verbatim)));
                }
                text.push(line.trim().to_string());
            }
        }
        if !text.is_empty() {
            section.blocks.push(Block::Text(text.join(" ")));
        }
        if !verbatim.is_empty() {
            section.blocks.push(indented(&section.title, verbatim));
        }
    }
    out
}

/// A heading line: ("EXIT STATUS", what follows its colon).
fn heading(line: &str) -> Option<(&'static str, &str)> {
    for (text, title) in HEADINGS {
        let Some(rest) = line.strip_prefix(text) else { continue };
        // "Exit status: ...", "Exit status (sysexits, ...):", "Examples:"
        let rest = match rest.strip_prefix(':') {
            Some(rest) => rest,
            None if rest.starts_with(" (") && rest.ends_with("):") => rest.trim_end_matches(':'),
            None => continue,
        };
        return Some((title, rest.trim()));
    }
    None
}

/// Indented lines: an environment list in ENVIRONMENT, else verbatim.
fn indented(title: &str, lines: Vec<&str>) -> Block {
    let indent = lines.iter().map(|l| l.len() - l.trim_start().len()).min().unwrap_or(0);
    if title == "ENVIRONMENT" {
        let mut vars: Vec<(String, String)> = Vec::new();
        for line in &lines {
            let depth = line.len() - line.trim_start().len();
            let line = line.trim();
            match vars.last_mut() {
                // "KN_A, KN_B," continued on the next line.
                Some((names, description)) if depth == indent && description.is_empty() && names.ends_with(',') => {
                    let (more, said) = split_names(line);
                    names.push(' ');
                    names.push_str(more);
                    description.push_str(said);
                }
                Some((_, description)) if depth > indent => {
                    if !description.is_empty() {
                        description.push(' ');
                    }
                    description.push_str(line);
                }
                _ => {
                    let (names, said) = split_names(line);
                    vars.push((names.to_string(), said.to_string()));
                }
            }
        }
        return Block::Variables(vars);
    }
    // Prose indented as a whole (a paragraph of "CGI mode:") is text;
    // commands and tables keep their lines.
    let uniform = lines.iter().all(|l| l.len() - l.trim_start().len() == indent);
    if uniform && lines.len() > 1 && !matches!(title, "EXAMPLES" | "EXIT STATUS") {
        return Block::Text(lines.iter().map(|l| l.trim()).collect::<Vec<_>>().join(" "));
    }
    Block::Verbatim(lines.iter().map(|l| l.get(indent..).unwrap_or("").to_string()).collect())
}

/// "KN_LISTEN           serve's address" -> ("KN_LISTEN", "serve's address").
fn split_names(line: &str) -> (&str, &str) {
    match line.find("  ") {
        Some(at) => (line[..at].trim(), line[at..].trim()),
        None => (line, ""),
    }
}

fn render_blocks(roff: &mut Roff, blocks: &[Block]) {
    for block in blocks {
        match block {
            Block::Text(text) => {
                roff.control("PP", []);
                roff.text([roman(text.as_str())]);
            }
            Block::Verbatim(lines) => {
                roff.control("PP", []);
                roff.control("RS", ["4"]);
                roff.control("nf", []);
                for line in lines {
                    roff.text([roman(line.as_str())]);
                }
                roff.control("fi", []);
                roff.control("RE", []);
            }
            Block::Variables(vars) => {
                for (names, description) in vars {
                    roff.control("TP", []);
                    roff.text([bold(names.as_str())]);
                    roff.text([roman(description.as_str())]);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn headings_split_the_text_into_sections() {
        let text = "Intro line\nmore.\n\nExit status: 0 on success,\n1 otherwise.\n\nExamples:\n  kn topics\n  kn stat /what";
        let s = sections(text);
        assert_eq!(s.iter().map(|s| s.title.as_str()).collect::<Vec<_>>(), ["NOTES", "EXIT STATUS", "EXAMPLES"]);
        assert_eq!(s[0].blocks, [Block::Text("Intro line more.".into())]);
        assert_eq!(s[1].blocks, [Block::Text("0 on success, 1 otherwise.".into())]);
        assert_eq!(s[2].blocks, [Block::Verbatim(vec!["kn topics".into(), "kn stat /what".into()])]);
    }

    #[test]
    fn an_environment_list_keeps_each_variable_whole() {
        let text = "Environment:\n    KN_EVENTS           the event store (both modes)\n    KN_A, KN_B,\n    KN_C                what they do,\n                        on two lines\n    KN_LONG_NAME_HERE\n                        below its name";
        let s = sections(text);
        assert_eq!(
            s[0].blocks,
            [Block::Variables(vec![
                ("KN_EVENTS".into(), "the event store (both modes)".into()),
                ("KN_A, KN_B, KN_C".into(), "what they do, on two lines".into()),
                ("KN_LONG_NAME_HERE".into(), "below its name".into()),
            ])]
        );
    }

    #[test]
    fn a_parenthesised_heading_is_a_heading() {
        let s = sections("Exit status (sysexits):\n  0   stored\n  64  bad command line");
        assert_eq!(s[0].title, "EXIT STATUS");
        assert_eq!(s[0].blocks, [Block::Text("(sysexits)".into()), Block::Verbatim(vec!["0   stored".into(), "64  bad command line".into()])]);
    }

    #[test]
    fn the_name_line_is_the_first_clause() {
        let cmd = Command::new("kn").about("Look after a knpubsub event store: list topics, print events");
        assert_eq!(short(&cmd), "look after a knpubsub event store");
        let cmd = Command::new("x").about("PubSub server. More.");
        assert_eq!(short(&cmd), "PubSub server");
        let cmd = Command::new("x").about("knpubsub: the PubSub server, as a CGI program");
        assert_eq!(short(&cmd), "the PubSub server, as a CGI program");
        let cmd = Command::new("x").about("Add a name, e.g. http://alias.example.org/kn.");
        assert_eq!(short(&cmd), "add a name, e.g. http://alias.example.org/kn");
    }
}
