//! `shedder status` and `shedder top`: the daemon's state, once or refreshed.

use std::time::Duration;

use anyhow::{Context as _, Result};
use shedder::api::state::State;

use super::{Services, Target};

pub fn status(target: &Target, services: &Services, json: bool) -> Result<()> {
    let state = fetch(&target.client()?, services)?;
    if json {
        println!("{}", to_json(&state)?);
    } else {
        print!("{}", shedder::api::state::render(&state));
    }
    Ok(())
}

pub fn top(
    target: &Target,
    services: &Services,
    interval: f64,
    iterations: Option<u64>,
) -> Result<()> {
    use std::io::{IsTerminal, Write};
    let client = target.client()?;
    let every = Duration::from_secs_f64(interval.max(0.1));
    let clear = std::io::stdout().is_terminal();
    let mut n = 0u64;
    loop {
        let state = fetch(&client, services)?;
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

/// The daemon's state, with only the services asked for.
fn fetch(client: &shedder::api::control::Client, services: &Services) -> Result<State> {
    let body = client.call("GET", "/shedding/state", b"")?;
    let state: State = serde_json::from_str(&body).context("the daemon's state")?;
    only(state, services)
}

/// `state` with only the services asked for; a name the daemon does not protect is bad
/// input (a typo must not look like an idle service).
fn only(mut state: State, services: &Services) -> Result<State> {
    services.check(state.services.iter().map(|s| s.name.as_str()))?;
    state.services.retain(|s| services.shows(&s.name));
    Ok(state)
}

/// The state as `status --json` prints it: the daemon's own serialization, re-encoded by
/// the same type so that the fields and their order are the API's.
fn to_json(state: &State) -> Result<String> {
    Ok(serde_json::to_string_pretty(state)?)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fixture() -> State {
        let text =
            std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/golden/state.json"))
                .unwrap();
        serde_json::from_str(&text).expect("golden/state.json is a State")
    }

    fn names(v: &[&str]) -> Services {
        Services {
            names: v.iter().map(|s| s.to_string()).collect(),
        }
    }

    /// `status --json` is the API's state, whole or with the services asked for: what a
    /// script reads must show up as a reviewed diff when it changes.
    #[test]
    fn status_json_is_the_state_as_the_api_serves_it() {
        let state = fixture();
        let json = to_json(&only(state.clone(), &Services::default()).unwrap()).unwrap();
        let back: State = serde_json::from_str(&json).unwrap();
        assert_eq!(back, state);
        let web = to_json(&only(state, &names(&["web"])).unwrap()).unwrap();
        super::super::golden::check("status-service-web.json", &format!("{web}\n"));
    }

    #[test]
    fn a_service_filter_keeps_only_the_services_named() {
        let state = fixture();
        assert!(state.services.len() >= 2, "the fixture needs two services");
        let first = state.services[0].name.clone();
        let kept = only(state.clone(), &names(&[&first])).unwrap();
        assert_eq!(
            kept.services.iter().map(|s| &s.name).collect::<Vec<_>>(),
            [&first]
        );
        // Everything else about the daemon stays.
        assert_eq!(kept.heartbeat_age_ms, state.heartbeat_age_ms);
        let e = only(state, &names(&["nope"])).unwrap_err();
        assert!(e.downcast_ref::<shedder::BadInput>().is_some());
        assert!(
            e.to_string().starts_with(&format!(
                "--service nope: no such service (there are: {first}"
            )),
            "{e}"
        );
    }
}
