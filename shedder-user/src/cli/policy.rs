//! `shedder policy validate | apply | show`.

use anyhow::{Context as _, Result};
use serde::Serialize;
use shedder::{
    api::control::ClientError,
    config::{Config, ConfigError},
};

use super::{
    PolicyCommand, count,
    paths::{self, shown},
};

/// The exit code: 2 when `validate --json` refused the file (the refusal is the output).
pub fn run(command: PolicyCommand) -> Result<u8> {
    match command {
        PolicyCommand::Validate { file, json } => {
            if json {
                let report = report(&shown(&file), &paths::parse_input(&file));
                println!("{}", serde_json::to_string_pretty(&report)?);
                return Ok(if report.ok { 0 } else { 2 });
            }
            let (cfg, _) = paths::read_config(&file)?;
            println!("{}: ok ({})", shown(&file), summary(&cfg));
        }
        PolicyCommand::Apply { file, target } => {
            // Validated here first: the error then names the file.
            let (_, text) = paths::read_config(&file)?;
            let body = target
                .client()?
                .call("PUT", "/shedding/policy", text.as_bytes())
                .map_err(|e| match e {
                    ClientError::Api(mut api) if api.status == 400 => {
                        api.error = format!("{}: {}", shown(&file), api.error);
                        ClientError::Api(api)
                    }
                    other => other,
                })?;
            let v: serde_json::Value = serde_json::from_str(&body).unwrap_or_default();
            println!(
                "{}: applied ({})",
                shown(&file),
                count(v["services"].as_u64().unwrap_or(0) as usize, "service")
            );
        }
        PolicyCommand::Show { target, json } => {
            let text = target.client()?.call("GET", "/shedding/policy", b"")?;
            if json {
                println!("{}", serde_json::to_string_pretty(&as_json(&text)?)?);
            } else {
                print!("{text}");
            }
        }
    }
    Ok(0)
}

/// `1 service, 2 interfaces`, or that it measures only.
fn summary(cfg: &Config) -> String {
    format!(
        "{}, {}",
        count(cfg.services.len(), "service"),
        if cfg.daemon.measure_only {
            "measure only: no interface".to_string()
        } else {
            count(cfg.daemon.interfaces.len(), "interface")
        }
    )
}

/// What `policy validate --json` prints.
#[derive(Debug, Serialize)]
struct Report {
    file: String,
    ok: bool,
    /// Set when `ok`.
    #[serde(skip_serializing_if = "Option::is_none")]
    services: Option<usize>,
    /// Set when `ok`; empty for a measure-only file.
    #[serde(skip_serializing_if = "Option::is_none")]
    interfaces: Option<Vec<String>>,
    /// Every problem, in the file's order; empty when `ok`.
    problems: Vec<Problem>,
}

/// One problem of a refused file: where, which key, what is wrong.
#[derive(Debug, Serialize)]
struct Problem {
    line: Option<usize>,
    column: Option<usize>,
    /// Dotted key path, e.g. `service[0] (web).max_limit`; empty for a syntax error.
    field: String,
    message: String,
}

fn report(file: &str, result: &Result<(Config, String), ConfigError>) -> Report {
    match result {
        Ok((cfg, _)) => Report {
            file: file.to_string(),
            ok: true,
            services: Some(cfg.services.len()),
            interfaces: Some(cfg.daemon.interfaces.clone()),
            problems: Vec::new(),
        },
        Err(e) => Report {
            file: file.to_string(),
            ok: false,
            services: None,
            interfaces: None,
            problems: e
                .each()
                .into_iter()
                .map(|e| Problem {
                    line: e.line,
                    column: e.column,
                    field: e.field,
                    message: e.message,
                })
                .collect(),
        },
    }
}

/// The policy's TOML as a JSON document: its tables and values as the file has them
/// (defaults left out, as in the text).
fn as_json(text: &str) -> Result<serde_json::Value> {
    let table: toml::Table = toml::from_str(text).context("the daemon's policy")?;
    Ok(serde_json::to_value(table)?)
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::*;

    const GOOD: &str =
        "[daemon]\ninterfaces = [\"eth0\"]\n\n[[service]]\nname = \"web\"\nports = [80]\n";

    fn parsed(text: &str) -> Result<(Config, String), ConfigError> {
        Config::parse_named(text, Path::new("<stdin>")).map(|c| (c, text.to_string()))
    }

    /// `policy validate --json`, accepted and refused, as a script reads it.
    #[test]
    fn validate_json_matches_the_golden_file() {
        let bad = "[daemon]\ninterfaces = [\"eth0\"]\ntick_ms = 5\n\n[[service]]\nname = \"web\"\nports = [80]\nmin_limit = 50\nmax_limit = 10\n";
        let text = format!(
            "{}\n{}\n",
            serde_json::to_string_pretty(&report("good.toml", &parsed(GOOD))).unwrap(),
            serde_json::to_string_pretty(&report("<stdin>", &parsed(bad))).unwrap()
        );
        super::super::golden::check("policy-validate.json", &text);
        let r = report("<stdin>", &parsed(bad));
        assert!(!r.ok);
        assert_eq!(r.problems.len(), 2, "{r:?}");
    }

    #[test]
    fn show_json_is_the_policy_as_a_document() {
        let v = as_json(GOOD).unwrap();
        assert_eq!(v["daemon"]["interfaces"][0], "eth0");
        assert_eq!(v["service"][0]["name"], "web");
        assert_eq!(v["service"][0]["ports"][0], 80);
        assert!(as_json("a = = 1").is_err());
    }
}
