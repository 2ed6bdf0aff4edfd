//! `shedder doctor`: check this host, with a fix for whatever is wrong.

use std::path::Path;

use anyhow::Result;

use super::paths::load_config;

/// The exit code is the worst verdict's.
pub fn run(config: Option<&Path>, json: bool) -> Result<u8> {
    let cfg = config.map(load_config).transpose()?;
    let checks = shedder::doctor::run(cfg.as_ref(), config);
    if json {
        println!("{}", serde_json::to_string_pretty(&checks)?);
    } else {
        print!("{}", shedder::doctor::render(&checks));
    }
    Ok(shedder::doctor::exit_code(&checks))
}
