//! `shedder completions SHELL`: a completion script generated from the command line's own
//! definition, so it never lags behind a new verb or flag.

use clap::{CommandFactory as _, ValueEnum};

use super::Cli;

/// The shells a script is made for (those a Linux node's operators use).
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Shell {
    Bash,
    Zsh,
    Fish,
}

impl From<Shell> for clap_complete::Shell {
    fn from(s: Shell) -> Self {
        match s {
            Shell::Bash => Self::Bash,
            Shell::Zsh => Self::Zsh,
            Shell::Fish => Self::Fish,
        }
    }
}

pub fn run(shell: Shell) {
    write(shell, &mut std::io::stdout());
}

fn write(shell: Shell, out: &mut dyn std::io::Write) {
    clap_complete::generate(
        clap_complete::Shell::from(shell),
        &mut Cli::command(),
        "shedder",
        out,
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_shell_completes_every_verb() {
        for shell in Shell::value_variants() {
            let mut out = Vec::new();
            write(*shell, &mut out);
            let text = String::from_utf8(out).unwrap();
            for verb in Cli::command().get_subcommands() {
                let name = verb.get_name();
                assert!(text.contains(name), "{shell:?}: `{name}` is not completed");
            }
            for deep in ["validate", "apply", "service", "json"] {
                assert!(text.contains(deep), "{shell:?}: `{deep}` is not completed");
            }
        }
    }
}
