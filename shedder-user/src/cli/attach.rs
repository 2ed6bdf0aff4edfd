//! `shedder attach`: attach with the configured fallback limits and no daemon (a static
//! limiter), or update the policy of what is attached.

use std::{path::PathBuf, time::Duration};

use anyhow::{Context as _, Result, bail};
use shedder::{
    BadInput,
    config::Attach,
    control::policy::compile,
    kernel::{self, MapWriter as _, Shedder},
};

use super::{init_logging, paths::load_config};

pub fn run(config: PathBuf, interfaces: Vec<String>, mode: Option<Attach>) -> Result<()> {
    // The choice of mode and the connections counted are logged, as by the daemon.
    init_logging();
    let cfg = load_config(&config)?;
    let mode = mode.unwrap_or(cfg.daemon.attach);
    let interfaces = if interfaces.is_empty() {
        cfg.daemon.interfaces.clone()
    } else {
        interfaces
    };
    // A validated configuration lists interfaces unless it is measure-only.
    if interfaces.is_empty() {
        bail!(BadInput(format!(
            "{}: daemon.measure_only = true attaches to no interface; give --iface to attach \
             anyway, or list daemon.interfaces instead of measure_only",
            config.display()
        )));
    }
    let pins = kernel::pins::locate(&cfg.daemon.pin_dir).context("finding the bpf filesystem")?;
    if let kernel::pins::Durability::Private(why) = &pins.durability {
        bail!(
            "the pins under {} would die when this command exits ({why}), and the programs \
             with them: run it in the host's mount namespace (e.g. `nsenter \
             --net=/var/run/netns/NAME` instead of `ip netns exec`)",
            cfg.daemon.pin_dir.display()
        );
    }
    let pin_dir = &pins.path;
    // Modes first: a refusal leaves nothing loaded or pinned.
    let modes = interfaces
        .iter()
        .map(|iface| shedder::daemon::delivering_mode(&cfg, iface, mode))
        .collect::<Result<Vec<_>>>()?;
    // Without a daemon there is no one to switch attachments over: another version's maps
    // are left to that version or to this version's daemon, which replaces them.
    if let kernel::layout::Plan::Replace { why, .. } = kernel::layout::prepare(pin_dir)? {
        bail!(
            "the maps pinned under {} are another version's ({}): start this version's \
             daemon, which replaces them without a gap, or `shedder detach` first",
            pin_dir.display(),
            why.join("; ")
        );
    }
    let mut shedder = Shedder::load_pinned(pin_dir, false).context("loading the eBPF programs")?;
    let hz = shedder
        .calibrate_hz(Duration::from_millis(100))
        .context("reading the kernel clock")?;
    shedder
        .write_compiled(&compile(&cfg, hz))
        .context("writing the policy into the maps")?;
    for (iface, mode) in interfaces.iter().zip(modes) {
        if kernel::pinned_ingress(pin_dir, iface).is_some() {
            println!("{iface}: already attached (pinned link kept; policy updated)");
            continue;
        }
        let how = shedder
            .attach(iface, mode)
            .with_context(|| format!("attaching to {iface} ({})", mode.as_str()))?;
        println!("{iface}: attached ({})", how.as_str());
    }
    // After attaching: a connection born meanwhile is seen on the wire or found here (both:
    // counted once). The fallback limits bound connections in service: without them
    // counted, they would bound only attempts not yet established. Its warning is logged
    // (and there is no status to show it in).
    let _ = kernel::seed::seed_and_report(&mut shedder, &cfg.ports_by_service());
    for problem in shedder.egress_problems() {
        println!("warning: {problem}");
    }
    println!(
        "{} service(s) protected; policy pinned under {}",
        cfg.services.len(),
        pins.describe()
    );
    println!("no daemon is stamping the heartbeat, so each service's fallback_limit is in force");
    Ok(())
}
