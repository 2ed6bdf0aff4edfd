//! The `shedder` command.

use std::process::ExitCode;

use clap::Parser as _;

mod cli;

fn main() -> ExitCode {
    match cli::run(cli::Cli::parse()) {
        Ok(code) => ExitCode::from(code),
        Err(e) => {
            eprintln!("shedder: {e:#}");
            ExitCode::from(cli::exit_code(&e))
        }
    }
}
