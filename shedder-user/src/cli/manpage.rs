//! `shedder manpage`: shedder(1) in roff, generated from the command line's own definition
//! (the verbs, their flags and the exit codes are those of `--help`), or with `--dir`
//! shedder(1) and the page of every verb it refers to.

use std::path::Path;

use anyhow::{Context as _, Result};
use clap::CommandFactory as _;

use super::Cli;

pub fn run(dir: Option<&Path>) -> Result<()> {
    match dir {
        None => write(&mut std::io::stdout()),
        Some(dir) => write_all(dir),
    }
}

fn write(out: &mut dyn std::io::Write) -> Result<()> {
    clap_mangen::Man::new(Cli::command()).render(out)?;
    Ok(())
}

/// shedder.1 and shedder-<verb>[-<verb>].1 for every verb, into `dir`.
fn write_all(dir: &Path) -> Result<()> {
    clap_mangen::generate_to(Cli::command(), dir)
        .with_context(|| format!("writing the manual pages into {}", dir.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_manual_names_every_verb_and_the_environment() {
        let mut out = Vec::new();
        write(&mut out).unwrap();
        let text = String::from_utf8(out).unwrap();
        assert!(text.contains(".TH shedder 1"), "{text}");
        for verb in Cli::command().get_subcommands() {
            let name = verb.get_name();
            assert!(text.contains(name), "`{name}` is not in the manual");
        }
        assert!(text.contains("SHEDDER_CONFIG") && text.contains("SHEDDER_SOCKET"));
    }

    /// Every page shedder(1) refers to is written, each naming its verb.
    #[test]
    fn a_page_per_verb() {
        let dir = std::env::temp_dir().join(format!("shedder-man-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        write_all(&dir).unwrap();
        let mut pages = vec!["shedder".to_string()];
        for verb in Cli::command().get_subcommands() {
            pages.push(format!("shedder-{}", verb.get_name()));
            for sub in verb.get_subcommands() {
                pages.push(format!("shedder-{}-{}", verb.get_name(), sub.get_name()));
            }
        }
        for page in pages {
            let path = dir.join(format!("{page}.1"));
            let text = std::fs::read_to_string(&path)
                .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
            assert!(text.contains(&format!(".TH {page} 1")), "{page}: {text}");
        }
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
