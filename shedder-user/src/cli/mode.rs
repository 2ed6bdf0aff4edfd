//! `shedder mode SERVICE enforce|dry-run|off|clear`: switch a service's mode on a running
//! daemon.

use std::time::Duration;

use anyhow::Result;
use shedder::api::control::ModeRequest;

use super::Target;

pub fn run(
    service: &str,
    mode: &str,
    ttl: Option<Duration>,
    reason: Option<String>,
    target: &Target,
) -> Result<()> {
    let client = target.client()?;
    let path = format!("/shedding/mode/{service}");
    if mode == "clear" {
        let body = client.call("DELETE", &path, b"")?;
        println!(
            "{service}: {}",
            if body.contains("true") {
                "mode switch cleared; the configuration's mode is in force"
            } else {
                "no mode switch was in force"
            }
        );
        return Ok(());
    }
    let request = ModeRequest {
        mode: mode.to_string(),
        ttl_s: ttl.map(|t| t.as_secs()),
        reason,
    };
    client.call("PUT", &path, serde_json::to_string(&request)?.as_bytes())?;
    match ttl {
        Some(t) => println!("{service}: {mode} for {} s", t.as_secs()),
        None => println!("{service}: {mode} until cleared (`shedder mode {service} clear`)"),
    }
    Ok(())
}
