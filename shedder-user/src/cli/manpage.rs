//! `shedder manpage`: shedder(1) in roff, generated from the command line's own definition
//! (the verbs, their flags and the exit codes are those of `--help`).

use anyhow::Result;
use clap::CommandFactory as _;

use super::Cli;

pub fn run() -> Result<()> {
    write(&mut std::io::stdout())
}

fn write(out: &mut dyn std::io::Write) -> Result<()> {
    clap_mangen::Man::new(Cli::command()).render(out)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_manual_names_every_verb_and_the_environment() {
        let mut out = Vec::new();
        write(&mut out).unwrap();
        let text = String::from_utf8(out).unwrap();
        assert!(
            text.starts_with(".ie") || text.contains(".TH shedder 1"),
            "{text}"
        );
        for verb in Cli::command().get_subcommands() {
            let name = verb.get_name();
            assert!(text.contains(name), "`{name}` is not in the manual");
        }
        assert!(text.contains("SHEDDER_CONFIG") && text.contains("SHEDDER_SOCKET"));
    }
}
