//! nftables: a SYN rate limit.

use std::{io::Write, process::Stdio};

use super::nsenter;
use crate::netns::Netns;

/// The table [`Nft`] installs.
const NFT_TABLE: &str = "shedder_peer";
/// Its named counter of dropped SYNs.
const NFT_COUNTER: &str = "syn_dropped";

/// An nftables table `inet shedder_peer` in a namespace, deleted on drop.
pub struct Nft {
    ns_name: String,
    ruleset: String,
}

impl Nft {
    /// Drop new TCP connection attempts (SYN without ACK, IPv4 and IPv6) to `port` above
    /// `rate_per_sec` per second, counting them. The token bucket holds a tenth of a
    /// second's worth of SYNs (at least 5), so short clumps of arrivals within the rate
    /// pass. Panics with nft's output if the ruleset is rejected.
    pub fn syn_rate_limit(ns: &Netns, port: u16, rate_per_sec: u32) -> Self {
        let burst = (rate_per_sec / 10).max(5);
        let ruleset = format!(
            "table inet {NFT_TABLE} {{\n\
             \tcounter {NFT_COUNTER} {{\n\
             \t}}\n\
             \tchain input {{\n\
             \t\ttype filter hook input priority filter; policy accept;\n\
             \t\ttcp dport {port} tcp flags & (syn | ack) == syn \
             limit rate over {rate_per_sec}/second burst {burst} packets \
             counter name \"{NFT_COUNTER}\" drop\n\
             \t}}\n\
             }}\n"
        );
        let mut child = nsenter(&ns.name, "nft")
            .args(["-f", "-"])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn nft");
        child
            .stdin
            .take()
            .expect("nft stdin")
            .write_all(ruleset.as_bytes())
            .expect("write the ruleset to nft");
        let out = child.wait_with_output().expect("wait for nft");
        if !out.status.success() {
            panic!(
                "nft -f rejected the ruleset ({}): {}\n{ruleset}",
                out.status,
                String::from_utf8_lossy(&out.stderr)
            );
        }
        Self {
            ns_name: ns.name.clone(),
            ruleset,
        }
    }

    /// The ruleset as installed (`nft -f` input).
    pub fn ruleset(&self) -> &str {
        &self.ruleset
    }

    /// SYNs dropped so far (the named counter's packets).
    pub fn dropped(&self) -> u64 {
        let out = nsenter(&self.ns_name, "nft")
            .args(["-j", "list", "table", "inet", NFT_TABLE])
            .output()
            .expect("spawn nft");
        assert!(
            out.status.success(),
            "nft -j list table failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let json: serde_json::Value =
            serde_json::from_slice(&out.stdout).expect("nft -j prints JSON");
        json["nftables"]
            .as_array()
            .into_iter()
            .flatten()
            .find_map(|item| {
                let c = item.get("counter")?;
                (c["name"] == NFT_COUNTER).then(|| c["packets"].as_u64())?
            })
            .unwrap_or_else(|| panic!("no counter {NFT_COUNTER} in {json}"))
    }
}

impl Drop for Nft {
    fn drop(&mut self) {
        // Fails harmlessly when the namespace is already gone.
        let _ = nsenter(&self.ns_name, "nft")
            .args(["delete", "table", "inet", NFT_TABLE])
            .stderr(Stdio::null())
            .status();
    }
}
