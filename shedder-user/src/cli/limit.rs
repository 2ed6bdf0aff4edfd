//! `shedder limit set | clear`: a bounded manual limit (override) on a running daemon.

use anyhow::Result;
use shedder::api::control::OverrideRequest;

use super::LimitCommand;

pub fn run(command: LimitCommand) -> Result<()> {
    match command {
        LimitCommand::Set {
            service,
            limit,
            ttl,
            force,
            reason,
            target,
        } => {
            let request = OverrideRequest {
                limit,
                ttl_s: ttl.as_secs(),
                force,
                reason,
            };
            target.client()?.call(
                "PUT",
                &format!("/shedding/override/{service}"),
                serde_json::to_string(&request)?.as_bytes(),
            )?;
            println!("{service}: limit held at {limit} for {} s", ttl.as_secs());
        }
        LimitCommand::Clear { service, target } => {
            let body =
                target
                    .client()?
                    .call("DELETE", &format!("/shedding/override/{service}"), b"")?;
            let cleared = body.contains("true");
            println!(
                "{service}: {}",
                if cleared {
                    "override cleared; the controller resumes"
                } else {
                    "no override was in force"
                }
            );
        }
    }
    Ok(())
}
