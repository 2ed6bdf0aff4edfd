//! `shedder policy validate | apply | show`.

use anyhow::Result;
use shedder::{BadInput, api::control::ClientError, config::Config};

use super::{PolicyCommand, count, load_config};

pub fn run(command: PolicyCommand) -> Result<()> {
    match command {
        PolicyCommand::Validate { file } => {
            let cfg = load_config(&file)?;
            println!(
                "{}: ok ({}, {})",
                file.display(),
                count(cfg.services.len(), "service"),
                if cfg.daemon.measure_only {
                    "measure only: no interface".to_string()
                } else {
                    count(cfg.daemon.interfaces.len(), "interface")
                }
            );
        }
        PolicyCommand::Apply { file, target } => {
            // Validated here first: the error then names the file.
            let (_, text) = Config::read(&file).map_err(|e| BadInput(e.to_string()))?;
            let body = target
                .client()?
                .call("PUT", "/shedding/policy", text.as_bytes())
                .map_err(|e| match e {
                    ClientError::Api(mut api) if api.status == 400 => {
                        api.error = format!("{}: {}", file.display(), api.error);
                        ClientError::Api(api)
                    }
                    other => other,
                })?;
            let v: serde_json::Value = serde_json::from_str(&body).unwrap_or_default();
            println!(
                "{}: applied ({})",
                file.display(),
                count(v["services"].as_u64().unwrap_or(0) as usize, "service")
            );
        }
        PolicyCommand::Show { target } => {
            print!("{}", target.client()?.call("GET", "/shedding/policy", b"")?);
        }
    }
    Ok(())
}
