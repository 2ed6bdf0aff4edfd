//! Where the benchmark's node and its client run on this machine's CPUs, for the backends
//! whose point is that refusing competes with serving.
//!
//! With two CPUs or more, the node (the backend's threads, its kernel packet processing,
//! HAProxy, the shedder daemon) runs on CPU 0 and the load generator on CPU 1. A veth
//! delivers to the receiving side on the sending CPU, so the server's side of the pair
//! processes its packets in a NAPI thread of its own (GRO on, threaded NAPI), pinned to
//! the node's CPU: SYNs, handshakes and refusals by XDP or the kernel then take that CPU
//! from serving, as on a real node whose NIC interrupts share the service's cores. The
//! client's veth sends without TSO, so that every frame takes that path (veth hands a TSO
//! frame that GRO cannot merge to the sender's CPU instead).

use std::collections::BTreeSet;

use anyhow::{Context as _, Result, bail};
use shedder_lab::{
    load::{online_cpus, pin_task},
    netns::{IFACE, Pair},
};

/// The CPUs of the node and of the client.
#[derive(Clone, Copy, Debug, serde::Serialize)]
pub struct Placement {
    pub node_cpu: usize,
    pub client_cpu: usize,
}

/// NAPI kernel threads of the pair's interfaces now (`napi/<IFACE>-<id>`; the benchmark's
/// pair is the only one while it runs).
fn napi_threads() -> BTreeSet<i32> {
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return BTreeSet::new();
    };
    let prefix = format!("napi/{IFACE}-");
    dir.flatten()
        .filter_map(|e| e.file_name().to_string_lossy().parse::<i32>().ok())
        .filter(|pid| {
            std::fs::read_to_string(format!("/proc/{pid}/comm"))
                .is_ok_and(|c| c.starts_with(&prefix))
        })
        .collect()
}

impl Placement {
    /// Pin the pair's NAPI threads to the node's CPU again: attaching or detaching XDP may
    /// make them anew.
    pub fn pin_napi(&self) -> Result<()> {
        for pid in napi_threads() {
            pin_task(pid, self.node_cpu)
                .with_context(|| format!("pinning NAPI thread {pid} to CPU {}", self.node_cpu))?;
        }
        Ok(())
    }
}

/// Lay the pair out as the module says; an error if this machine has one CPU, or the
/// kernel makes no NAPI thread for the server's veth.
pub fn place(pair: &Pair) -> Result<Placement> {
    if online_cpus() < 2 {
        bail!("placing the node and the client on CPUs of their own needs 2 CPUs");
    }
    let placement = Placement {
        node_cpu: 0,
        client_cpu: 1,
    };
    pair.client.exec(&["ethtool", "-K", IFACE, "tso", "off"]);
    pair.server.exec(&["ethtool", "-K", IFACE, "gro", "on"]);
    let before = napi_threads();
    pair.server.exec(&[
        "sh",
        "-c",
        &format!("echo 1 > /sys/class/net/{IFACE}/threaded"),
    ]);
    if napi_threads().difference(&before).next().is_none() {
        bail!("the server's veth made no NAPI thread with threaded NAPI on");
    }
    placement.pin_napi()?;
    Ok(placement)
}
