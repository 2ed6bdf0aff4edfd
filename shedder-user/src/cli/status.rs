//! `shedder status` and `shedder top`: the daemon's state, once or refreshed.

use std::time::Duration;

use anyhow::{Context as _, Result};
use shedder::api::state::State;

use super::Target;

pub fn status(target: &Target, json: bool) -> Result<()> {
    let body = target.client()?.call("GET", "/shedding/state", b"")?;
    if json {
        println!("{body}");
    } else {
        let state: State = serde_json::from_str(&body).context("the daemon's state")?;
        print!("{}", shedder::api::state::render(&state));
    }
    Ok(())
}

pub fn top(target: &Target, interval: f64, iterations: Option<u64>) -> Result<()> {
    use std::io::{IsTerminal, Write};
    let client = target.client()?;
    let every = Duration::from_secs_f64(interval.max(0.1));
    let clear = std::io::stdout().is_terminal();
    let mut n = 0u64;
    loop {
        let body = client.call("GET", "/shedding/state", b"")?;
        let state: State = serde_json::from_str(&body).context("the daemon's state")?;
        let mut out = std::io::stdout().lock();
        if clear {
            write!(out, "\x1b[H\x1b[2J")?;
        }
        write!(out, "{}", shedder::api::state::render(&state))?;
        out.flush()?;
        n += 1;
        if iterations.is_some_and(|max| n >= max) {
            return Ok(());
        }
        std::thread::sleep(every);
    }
}
