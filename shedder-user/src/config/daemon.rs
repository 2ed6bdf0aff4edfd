//! `[daemon]`: the interfaces, the attach mode, the endpoints and the timing of the daemon.

use std::path::PathBuf;

use serde::Deserialize;

use super::{Attach, decapsulate::Decapsulate, defaults};

#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct Daemon {
    /// Interfaces to attach to. At least one, unless `measure_only`.
    #[serde(default)]
    pub interfaces: Vec<String>,
    /// Attach to no interface: measure, run the controllers and serve status and metrics,
    /// shed nothing. Stated, so that a file that forgot its interfaces is refused instead
    /// of protecting nothing.
    #[serde(default)]
    pub measure_only: bool,
    #[serde(default)]
    pub attach: Attach,
    #[serde(default = "defaults::metrics_listen")]
    pub metrics_listen: String,
    #[serde(default = "defaults::control_socket")]
    pub control_socket: PathBuf,
    /// A group whose members may use the control socket besides root.
    pub control_group: Option<String>,
    #[serde(default = "defaults::tick_ms")]
    pub tick_ms: u64,
    /// An older heartbeat puts the kernel side on the fallback limits.
    #[serde(default = "defaults::heartbeat_timeout_ms")]
    pub heartbeat_timeout_ms: u64,
    /// Where maps and links are pinned.
    #[serde(default = "defaults::pin_dir")]
    pub pin_dir: PathBuf,
    /// Percentiles of queue age and latency cover this much recent history.
    #[serde(default = "defaults::signal_window_ms")]
    pub signal_window_ms: u64,
    /// Detach and remove the pins when the daemon stops (SIGTERM/SIGINT). With `false` (the
    /// default) the programs stay attached and the fallback limits take over after the
    /// heartbeat timeout.
    #[serde(default = "defaults::detach_on_exit")]
    pub detach_on_exit: bool,
    /// Fail-static: a daemon that dies leaves the programs attached with its last limits,
    /// then the fallback limits. With `true` (the default) the daemon refuses to enforce
    /// where its pins would die with it (a private mount namespace from which the host's
    /// bpf filesystem cannot be reached); `false` accepts that: after a crash nothing is
    /// shed.
    #[serde(default = "defaults::fail_static")]
    pub fail_static: bool,
    /// Debug lines from the packet path (each shed decision, each fail-open), at most
    /// 20 a second per CPU, logged on the target `shedder::kernel`. Off: the log sites are
    /// pruned at load and cost nothing. Changes with a restart.
    #[serde(default)]
    pub kernel_debug_log: bool,
    /// A SYN repeating an attempt the packet path remembers (same addresses, ports and
    /// initial sequence number) within this many milliseconds of the attempt's first SYN is
    /// a retransmit: counted apart, not as a new attempt. 0 disables the recognition (every
    /// SYN is then a new attempt). Reloadable.
    #[serde(default = "defaults::syn_retransmit_window_ms")]
    pub syn_retransmit_window_ms: u64,
    /// An address that completed a handshake keeps its standing (its attempts are decided
    /// as proven, see `shedder_common::proof`) this many seconds after its last one.
    #[serde(default = "defaults::standing_window_s")]
    pub standing_window_s: u64,
    /// How long an admitted attempt counts as occupancy before its connection is born, in
    /// milliseconds; 0 measures it (the services' round-trip times).
    #[serde(default)]
    pub handshake_hold_ms: u64,
    /// The node's budget of answers (resets, QUIC Version Negotiation) to refused attempts
    /// from sources with standing, per second; beyond it a refusal is a drop. 0: no bound.
    #[serde(default = "defaults::max_replies_proven_per_s")]
    pub max_replies_proven_per_s: u64,
    /// The same for attempts from sources without standing (and every QUIC attempt): the
    /// bound that keeps refusals of a spoofed flood from reflecting it. 0: no bound.
    #[serde(default = "defaults::max_replies_unproven_per_s")]
    pub max_replies_unproven_per_s: u64,
    /// The tunnels this node terminates, whose inner headers the packet path decides on.
    /// None by default. Reloadable.
    #[serde(default)]
    pub decapsulate: Decapsulate,
}

impl Default for Daemon {
    fn default() -> Self {
        Self {
            interfaces: Vec::new(),
            measure_only: false,
            attach: Attach::Auto,
            metrics_listen: defaults::metrics_listen(),
            control_socket: defaults::control_socket(),
            control_group: None,
            tick_ms: defaults::tick_ms(),
            heartbeat_timeout_ms: defaults::heartbeat_timeout_ms(),
            pin_dir: defaults::pin_dir(),
            signal_window_ms: defaults::signal_window_ms(),
            detach_on_exit: defaults::detach_on_exit(),
            fail_static: defaults::fail_static(),
            kernel_debug_log: false,
            syn_retransmit_window_ms: defaults::syn_retransmit_window_ms(),
            standing_window_s: defaults::standing_window_s(),
            handshake_hold_ms: 0,
            max_replies_proven_per_s: defaults::max_replies_proven_per_s(),
            max_replies_unproven_per_s: defaults::max_replies_unproven_per_s(),
            decapsulate: Decapsulate::default(),
        }
    }
}
