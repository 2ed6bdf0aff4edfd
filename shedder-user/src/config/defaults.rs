//! The value of every key a file may leave out, one function a key (serde's `default`).

use std::path::PathBuf;

pub fn metrics_listen() -> String {
    "127.0.0.1:9464".into()
}
pub fn control_socket() -> PathBuf {
    "/run/shedder/shedder.sock".into()
}
pub fn tick_ms() -> u64 {
    200
}
pub fn heartbeat_timeout_ms() -> u64 {
    3000
}
/// Default root of everything shedder pins.
pub use crate::kernel::DEFAULT_PIN_DIR as PIN_DIR;
pub fn pin_dir() -> PathBuf {
    PIN_DIR.into()
}
pub fn signal_window_ms() -> u64 {
    1000
}
pub fn fail_static() -> bool {
    true
}
/// Off: a stop or a restart (an upgrade) leaves the node protected; `shedder detach` is
/// how protection is removed.
pub fn detach_on_exit() -> bool {
    false
}
pub fn syn_retransmit_window_ms() -> u64 {
    30_000
}
pub fn retry_window_ms() -> u64 {
    10_000
}
/// One source of a class is a /24 (IPv4) or a /64 (IPv6), what one subscriber or tenant
/// is usually given: every address its own source would let one subscriber's /64 take
/// every share of its class.
pub fn source_prefix_v4() -> u8 {
    24
}
pub fn source_prefix_v6() -> u8 {
    64
}
pub fn standing_window_s() -> u64 {
    600
}
/// Answers to refused attempts from proven sources: far above what an overload refuses on
/// one node in the benchmarks (a few thousand a second), so `rst` keeps its meaning.
pub fn max_replies_proven_per_s() -> u64 {
    10_000
}
/// Answers to unproven sources: as many as the kernel's own ICMP error budget
/// (`net.ipv4.icmp_msgs_per_sec`, 1,000).
pub fn max_replies_unproven_per_s() -> u64 {
    1_000
}
/// In a flood, the part of a class's share that attempts from sources without standing
/// may hold, beside what the new clients whose handshakes complete need.
pub fn unproven_share() -> f64 {
    0.1
}
pub fn fair_share() -> bool {
    true
}
/// Admitted retries per class at most this fraction of admitted first attempts (the
/// amplification a retry storm can reach is then 1.1×).
pub fn retry_budget() -> f64 {
    0.1
}
/// The share of a service's `max_limit` the critical class may never exceed, when the file
/// does not bound it.
pub fn critical_ceiling() -> f64 {
    0.05
}
pub fn target_latency_ms() -> u64 {
    200
}
pub fn min_limit() -> u32 {
    8
}
pub fn max_limit() -> u32 {
    4096
}
pub fn fallback_limit() -> u32 {
    256
}
/// A quarter of the connections the node tracks: room for the keep-alive pools of a load
/// balancer's clients (browsers hold about six a site, upstream proxies hundreds), and for
/// four services at their ceiling at once.
pub fn max_connections() -> u32 {
    shedder_common::DEFAULT_TRACKED_SOCKETS / 4
}
/// Enough to take a class's keep-alive load back to the gate within a few seconds at the
/// default limits (a few hundred connections over), few enough that a misjudged recall
/// costs clients a reconnect each, not a storm of resets.
pub fn recall_per_second() -> u32 {
    200
}
pub fn fleet_prefix() -> String {
    "/shedder".into()
}
pub fn lease_ttl_s() -> u64 {
    10
}
pub fn safety() -> f64 {
    0.9
}
pub fn etcd_timeout_ms() -> u64 {
    2000
}
pub fn reserve_departed_s() -> u64 {
    3600
}

#[cfg(test)]
mod tests {
    use super::super::{Action, Attach, ClassName, Config, Mode, fixtures::IFACE};

    #[test]
    fn defaults_are_documented_values() {
        let c =
            Config::parse(&format!("{IFACE}[[service]]\nname = \"a\"\nports = [80]\n")).unwrap();
        assert!(!c.daemon.measure_only);
        assert_eq!(c.daemon.tick_ms, 200);
        assert_eq!(c.daemon.heartbeat_timeout_ms, 3000);
        assert_eq!(c.daemon.attach, Attach::Auto);
        assert_eq!(c.classes.critical.ceiling, Some(0.05));
        let s = &c.services[0];
        assert_eq!((s.min_limit, s.max_limit, s.fallback_limit), (8, 4096, 256));
        assert_eq!(
            (s.action, s.mode, s.default_class),
            (Action::Rst, Mode::Enforce, ClassName::Medium)
        );
        assert_eq!(c.daemon.syn_retransmit_window_ms, 30_000);
        assert_eq!((s.retry_window_ms, s.demote_retries), (10_000, None));
        assert!(s.demotes_retries(), "retries are demoted by default");
    }
}
