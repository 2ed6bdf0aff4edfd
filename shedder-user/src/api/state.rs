//! What the daemon reports about itself (`GET /shedding/state`, `shedder status`, `top`),
//! and its rendering as a table.

use std::fmt::Write as _;

use serde::{Deserialize, Serialize};

use crate::{
    control::controller::{Decision, Mode},
    fleet::FleetState,
    signals::{Quantiles, Reading, RetryWindow, Signals},
};
use shedder_common::Reason;

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct State {
    pub version: String,
    pub pid: u32,
    pub uptime_s: f64,
    /// The configuration file the daemon was started with.
    pub config: String,
    pub pin_dir: String,
    pub tick_ms: u64,
    pub heartbeat_timeout_ms: u64,
    /// Time since the heartbeat was stamped, when this state was served.
    pub heartbeat_age_ms: u64,
    pub attach: Vec<Attachment>,
    pub programs: Vec<ProgramCost>,
    /// Exceptional kernel events since load (`STAT_*`).
    pub kernel_events: Vec<(String, u64)>,
    /// How long the packet path holds an admitted attempt at least, in ms, and the round
    /// trips it was measured from (absent when configured).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub handshake_hold_ms: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub handshake_hold_measured: Option<HoldMeasured>,
    pub services: Vec<ServiceState>,
    /// Fleet mode: membership, shares and etcd health (absent without `[fleet]`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fleet: Option<FleetState>,
    /// What the daemon cannot do here, as an operator must know it (connections open
    /// before attach not counted, no fail-static, resets that cannot leave).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub warnings: Vec<String>,
}

/// What the handshake hold was measured from.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct HoldMeasured {
    /// The hold the round trips asked for: twice their 99th percentile, in ms.
    pub wanted_ms: f64,
    /// Established connections sampled.
    pub connections: usize,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Attachment {
    pub interface: String,
    /// xdp-native, xdp-generic, tc, or "adopted" (a pinned attachment of an earlier run).
    pub mode: String,
    /// The driver's count of frames XDP_TX failed to send (resets that did not leave),
    /// where the driver reports one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub xdp_tx_errors: Option<u64>,
}

/// A program's cost from the kernel's BPF statistics.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ProgramCost {
    pub program: String,
    pub runs: u64,
    pub run_seconds: f64,
    /// Mean cost of a run over the last tick (`None` without runs or statistics).
    pub ns_per_run: Option<f64>,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Override {
    pub limit: u32,
    pub remaining_s: f64,
    /// Who set it (`uid <n>`), and why, if they said.
    pub by: String,
    pub reason: Option<String>,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ClassState {
    pub class: String,
    pub share: u32,
    pub floor: u32,
    pub ceiling: u32,
    /// Connections of the limit the class leaves free for the classes above it.
    #[serde(default)]
    pub reserve: u32,
    /// Attempts from sources without standing the class holds at most.
    #[serde(default)]
    pub unproven_cap: u32,
    /// Keep-alive connections recalled since the daemon started (dry-run: that would have
    /// been).
    #[serde(default)]
    pub recalled: u64,
}

fn tcp() -> String {
    "tcp".into()
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ServiceState {
    pub name: String,
    /// `tcp` or `quic`.
    #[serde(default = "tcp")]
    pub protocol: String,
    pub ports: Vec<u16>,
    pub controller: String,
    pub mode: Mode,
    /// The limit in force (the controller's, or the override's).
    pub limit: u32,
    pub fallback_limit: u32,
    pub min_limit: u32,
    pub max_limit: u32,
    /// Established connections (busy or idle) the service may hold.
    #[serde(default)]
    pub max_connections: u32,
    /// Keep-alive connections of refused classes recalled a second at most (0: off).
    #[serde(default)]
    pub recall_per_second: u32,
    /// Recalls the kernel refused (not counting connections gone since the listing).
    #[serde(default)]
    pub recall_errors: u64,
    /// Connections the last sweep found in the kernel that the packet path had not seen
    /// (a client on this host, or another interface): counted, not measured.
    #[serde(default)]
    pub unseen_connections: u32,
    /// The mode in force: `enforce`, `dry-run` or `off` (the runtime switch's while one
    /// holds, else the file's).
    #[serde(default)]
    pub enforcement: String,
    /// A mode switched at run time (`shedder mode`), while it holds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mode_switch: Option<ModeSwitchState>,
    /// Fleet mode: this node's ceiling for the service (its share of `global_limit`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fleet_ceiling: Option<u32>,
    pub target_latency_ms: u64,
    #[serde(rename = "override")]
    pub override_limit: Option<Override>,
    pub decision: Option<Decision>,
    pub classes: Vec<ClassState>,
    /// Classes under a flood of attempts from sources without standing (a spoofed SYN
    /// flood, most likely): many such attempts, and what was admitted of them does not
    /// complete.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub flooded: Vec<String>,
    /// Who is refused: the heaviest sources and prefixes among the sampled refusals
    /// (absent before the first sample).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub refused: Option<RefusedState>,
    pub signals: Signals,
}

/// A mode switched at run time, for the state.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ModeSwitchState {
    pub mode: String,
    /// The file's mode, which returns when the switch ends.
    pub file_mode: String,
    /// Seconds until it expires (`None`: until cleared).
    pub remaining_s: Option<f64>,
    pub by: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}

/// The heaviest refused sources and prefixes of a service (`signals::refused`).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct RefusedState {
    /// Sampled refusals counted, with a half-life of `half_life_s`.
    pub samples: f64,
    pub half_life_s: f64,
    pub sources: Vec<RefusedEntry>,
    pub prefixes: Vec<RefusedEntry>,
}

/// A source (`198.18.0.7`) or a prefix (`198.18.0.0/24`) in a class.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct RefusedEntry {
    pub source: String,
    pub class: String,
    /// Whether the source had proven its address (completed a handshake recently): an
    /// unproven address may be forged, and blocking it may block its real owner.
    pub proven: bool,
    /// Its share of the sampled refusals (0 to 1).
    pub share: f64,
    /// How much of the share may be overstated (the summary's bound).
    pub share_error: f64,
}

fn ms(q: &Reading<Quantiles>, pick: fn(&Quantiles) -> Option<f64>) -> String {
    match q {
        Reading::Ok { value } | Reading::Stale { value, .. } => match pick(value) {
            Some(v) => format!("{v:.1}"),
            None => "idle".into(),
        },
        Reading::Missing { .. } => "n/a".into(),
    }
}

fn rate(v: f64) -> String {
    if v >= 100.0 {
        format!("{v:.0}")
    } else {
        format!("{v:.1}")
    }
}

/// The retry line of a service: how many refused attempts came back.
fn retry_line(r: &Reading<RetryWindow>) -> String {
    match r {
        Reading::Ok { value } | Reading::Stale { value, .. } => match value.ratio {
            Some(ratio) => format!(
                "retry ratio {ratio:.2} ({} retries / {} shed in {} ms)",
                value.retries, value.shed, value.window_ms
            ),
            None => format!(
                "retry ratio - (nothing shed in {} ms; {} retries)",
                value.window_ms, value.retries
            ),
        },
        Reading::Missing { reason } => format!("retry ratio n/a ({reason})"),
    }
}

/// The fleet lines of `shedder status`.
fn render_fleet(out: &mut String, f: &FleetState) {
    let contact = f
        .etcd_last_contact_s
        .map_or("never".to_string(), |s| format!("{s:.1} s ago"));
    let _ = writeln!(
        out,
        "fleet: node {} ({}) under {}  etcd {} (last answer {contact}, {} errors)  lease {} ttl {} s",
        f.node,
        f.standing,
        f.prefix,
        if f.etcd_up { "up" } else { "DOWN" },
        f.etcd_errors,
        f.lease_id.map_or("-".to_string(), |l| format!("{l:x}")),
        f.lease_ttl_s
    );
    if let Some(e) = &f.last_error {
        let _ = writeln!(out, "  last etcd error: {e}");
    }
    let _ = writeln!(
        out,
        "  members ({}): {}",
        f.members.len(),
        f.members.join(", ")
    );
    if !f.departed.is_empty() {
        let _ = writeln!(
            out,
            "  departed, static share reserved ({}): {}",
            f.departed.len(),
            f.departed.join(", ")
        );
    }
    // What the members' records held that was not believed (docs/fleet.md, "What a record
    // is believed").
    let counts = |m: &std::collections::BTreeMap<String, u64>| {
        m.iter()
            .filter(|(_, n)| **n > 0)
            .map(|(k, n)| format!("{k} {n}"))
            .collect::<Vec<_>>()
            .join(", ")
    };
    let (rejected, clamped) = (counts(&f.rejected), counts(&f.clamped));
    if !rejected.is_empty() || !clamped.is_empty() {
        let _ = writeln!(
            out,
            "  records ignored: {}  values held within bounds: {}",
            if rejected.is_empty() {
                "none"
            } else {
                &rejected
            },
            if clamped.is_empty() { "none" } else { &clamped }
        );
    }
    for s in &f.services {
        if s.disagreeing > 0 {
            let _ = writeln!(
                out,
                "  {}: {} member(s) publish another global_limit; this node keeps its own ({})",
                s.service, s.disagreeing, s.global_limit
            );
        }
        let _ = writeln!(
            out,
            "  {}: global {} budget {}  members {}  share {} (by {})  ceiling {}  claim {}  others {}  reserved {}  static {}",
            s.service,
            s.global_limit,
            s.budget,
            s.members,
            s.target,
            s.shares,
            s.ceiling,
            s.claim,
            s.others,
            s.reserved,
            s.static_share
        );
        for n in &s.nodes {
            let need: Vec<String> = n.need.iter().map(|v| format!("{v:.1}")).collect();
            let counted = if n.counted < n.claim && n.node != f.node {
                format!(" (counts {})", n.counted)
            } else {
                String::new()
            };
            let _ = writeln!(
                out,
                "    {:<16} demand {:>7.1}/s  need {:>6.1} ({})  hold {}  weight {:>5.1}%  share {:>4}  claim {:>4}{counted}",
                n.node,
                n.attempts,
                n.need.iter().sum::<f64>(),
                need.join("/"),
                n.hold_ms.map_or("-".to_string(), |h| format!("{h:.0} ms")),
                100.0 * n.weight,
                n.share,
                n.claim
            );
        }
    }
}

/// The human table of `shedder status`.
pub fn render(state: &State) -> String {
    let mut out = String::new();
    let heartbeat = if state.heartbeat_age_ms > state.heartbeat_timeout_ms {
        format!(
            "{} ms — STALE (> {} ms): the fallback limits are in force",
            state.heartbeat_age_ms, state.heartbeat_timeout_ms
        )
    } else {
        format!("{} ms", state.heartbeat_age_ms)
    };
    let attach: Vec<String> = state
        .attach
        .iter()
        .map(|a| match a.xdp_tx_errors {
            // Resets that never left: worth a look on the first line an operator reads.
            Some(n) if n > 0 => format!("{} ({}, {n} XDP_TX errors)", a.interface, a.mode),
            _ => format!("{} ({})", a.interface, a.mode),
        })
        .collect();
    let _ = writeln!(
        out,
        "shedder {}  pid {}  up {:.0} s  tick {} ms  heartbeat {heartbeat}",
        state.version, state.pid, state.uptime_s, state.tick_ms
    );
    let _ = writeln!(
        out,
        "attached: {}",
        if attach.is_empty() {
            // A configuration lists interfaces unless it is measure-only, and a daemon
            // that cannot attach to one does not start: nothing attached is measure-only.
            "nothing (measure only: daemon.measure_only = true, nothing is shed)".into()
        } else {
            attach.join(", ")
        }
    );
    for w in &state.warnings {
        let _ = writeln!(out, "WARNING: {w}");
    }
    let costs: Vec<String> = state
        .programs
        .iter()
        .filter_map(|p| match p.ns_per_run {
            Some(ns) => Some(format!("{} {ns:.0} ns/run", p.program)),
            // Idle over the last tick: the mean since load.
            None if p.runs > 0 => Some(format!(
                "{} {:.0} ns/run (mean of {} runs)",
                p.program,
                p.run_seconds * 1e9 / p.runs as f64,
                p.runs
            )),
            None => None,
        })
        .collect();
    if !costs.is_empty() {
        let _ = writeln!(out, "cost: {}", costs.join(", "));
    }
    let events: Vec<String> = state
        .kernel_events
        .iter()
        .filter(|(_, n)| *n > 0)
        .map(|(e, n)| format!("{e} {n}"))
        .collect();
    if !events.is_empty() {
        let _ = writeln!(out, "kernel events: {}", events.join(", "));
    }
    if let Some(hold) = state.handshake_hold_ms {
        let how = match &state.handshake_hold_measured {
            Some(m) => format!(
                "measured: twice the p99 round trip of {} connections asked {:.1} ms",
                m.connections, m.wanted_ms
            ),
            None => "not measured yet, or configured".into(),
        };
        let _ = writeln!(out, "handshake hold: {hold:.0} ms ({how})");
    }
    if let Some(f) = &state.fleet {
        render_fleet(&mut out, f);
    }
    for s in &state.services {
        let sig = &s.signals;
        let _ = writeln!(out);
        let ov = match &s.override_limit {
            Some(o) => format!(
                "  OVERRIDE {} ({:.0} s left, by {}{})",
                o.limit,
                o.remaining_s,
                o.by,
                o.reason
                    .as_deref()
                    .map_or(String::new(), |r| format!(": {r}"))
            ),
            None => String::new(),
        };
        let fleet = s
            .fleet_ceiling
            .map_or(String::new(), |c| format!("  fleet ceiling {c}"));
        let _ = writeln!(
            out,
            "{} ({}ports {})  {}  mode {}  limit {} [{}..{}], fallback {}{fleet}{ov}",
            s.name,
            if s.protocol == "quic" {
                "QUIC, UDP "
            } else {
                ""
            },
            s.ports
                .iter()
                .map(u16::to_string)
                .collect::<Vec<_>>()
                .join(", "),
            s.controller,
            s.mode.as_str(),
            s.limit,
            s.min_limit,
            s.max_limit,
            s.fallback_limit
        );
        match &s.mode_switch {
            Some(m) => {
                let left = m
                    .remaining_s
                    .map_or("until cleared".into(), |r| format!("{r:.0} s left"));
                let _ = writeln!(
                    out,
                    "  MODE {} (switched by {}{}; {left}; the file says {})",
                    m.mode.to_uppercase(),
                    m.by,
                    m.reason
                        .as_deref()
                        .map_or(String::new(), |r| format!(": {r}")),
                    m.file_mode
                );
            }
            None if s.enforcement != "enforce" && !s.enforcement.is_empty() => {
                let _ = writeln!(out, "  MODE {} (configured)", s.enforcement.to_uppercase());
            }
            None => {}
        }
        let _ = writeln!(
            out,
            "  queue age p50/p99 {} / {} ms   latency p50/p99 {} / {} ms   target {} ms",
            ms(&sig.queue_age, |q| q.p50_ms),
            ms(&sig.queue_age, |q| q.p99_ms),
            ms(&sig.latency, |q| q.p50_ms),
            ms(&sig.latency, |q| q.p99_ms),
            s.target_latency_ms
        );
        if let Some(d) = &s.decision {
            let _ = writeln!(
                out,
                "  last decision: {} on {}{}",
                d.action,
                d.signal.as_str(),
                d.delay_ms
                    .map_or(String::new(), |v| format!(" (delay {v:.1} ms)"))
            );
        }
        let queue = if s.protocol == "quic" {
            let q = match &sig.udp {
                Reading::Ok { value } | Reading::Stale { value, .. } => format!(
                    "{}/{} bytes in {} socket(s), {} dropped",
                    value.depth,
                    value.buffer,
                    value.sockets,
                    value.drops.map_or("n/a".into(), |d| d.to_string())
                ),
                Reading::Missing { reason } => format!("n/a ({reason})"),
            };
            format!("receive queue {q}")
        } else {
            let aq = match &sig.accept_queue {
                Reading::Ok { value } | Reading::Stale { value, .. } => {
                    format!("{}/{}", value.depth, value.backlog)
                }
                Reading::Missing { reason } => format!("n/a ({reason})"),
            };
            format!("accept queue {aq}")
        };
        let _ = writeln!(out, "  {queue}   {}", retry_line(&sig.retry));
        let _ = writeln!(
            out,
            "  {:<10} {:>6} {:>6} {:>7} {:>7} {:>8} {:>7} {:>9} {:>9} {:>8} {:>9} {:>9} {:>7}",
            "class",
            "share",
            "floor",
            "reserve",
            "ceiling",
            "inflight",
            "pending",
            "offered/s",
            "admitted/s",
            "shed/s",
            "retrans/s",
            "retries/s",
            "sources"
        );
        let inflight = sig.inflight.value();
        let pending = sig.pending.value();
        let rates = sig.rates.value();
        for (i, c) in s.classes.iter().enumerate() {
            let n = |v: Option<&[u32; 4]>| v.map_or("n/a".into(), |v| v[i].to_string());
            let r = |f: fn(&crate::signals::ClassRates) -> f64| {
                rates.map_or("n/a".into(), |r| rate(f(&r[i])))
            };
            let sources = sig
                .sources
                .value()
                .map_or("n/a".into(), |v| v[i].active.to_string());
            let _ = writeln!(
                out,
                "  {:<10} {:>6} {:>6} {:>7} {:>7} {:>8} {:>7} {:>9} {:>9} {:>8} {:>9} {:>9} {:>7}",
                c.class,
                c.share,
                c.floor,
                c.reserve,
                c.ceiling,
                n(inflight),
                n(pending),
                r(|x| x.offered),
                r(|x| x.admitted),
                r(|x| x.shed + x.dry_run),
                r(|x| x.retransmits),
                r(|x| x.retries),
                sources
            );
        }
        render_refusals(&mut out, s);
        render_unproven(&mut out, s);
        render_refused(&mut out, s);
    }
    out
}

/// Sources and prefixes shown per service in the text status.
const REFUSED_SHOWN: usize = 5;

/// The most refused sources and prefixes, when any refusal was sampled.
fn render_refused(out: &mut String, s: &ServiceState) {
    let Some(r) = &s.refused else {
        return;
    };
    if r.sources.is_empty() {
        return;
    }
    let line = |e: &RefusedEntry| {
        format!(
            "{} {} {:.0}%{}",
            e.source,
            e.class,
            e.share * 100.0,
            if e.proven {
                ""
            } else {
                " (unproven: may be forged)"
            }
        )
    };
    let _ = writeln!(
        out,
        "  most refused (share of {:.0} sampled refusals, half-life {:.0} s):",
        r.samples, r.half_life_s
    );
    for (what, entries) in [("sources", &r.sources), ("prefixes", &r.prefixes)] {
        let shown: Vec<String> = entries.iter().take(REFUSED_SHOWN).map(line).collect();
        let _ = writeln!(out, "    {what:<9} {}", shown.join(", "));
    }
}

/// Attempts from sources without standing, when there are any: what became of them, and a
/// flood, loudly, when one is under way.
fn render_unproven(out: &mut String, s: &ServiceState) {
    let Some(u) = s.signals.unproven.value() else {
        return;
    };
    let sum = |f: fn(&crate::signals::UnprovenRates) -> f64| u.rates.iter().map(f).sum::<f64>();
    let held: u32 = u.held.iter().sum();
    let caps: Vec<String> = s
        .classes
        .iter()
        .map(|c| c.unproven_cap.to_string())
        .collect();
    if !s.flooded.is_empty() {
        let _ = writeln!(
            out,
            "  SYN FLOOD ({}): {}/s unproven attempts, {}/s completing; they hold {held} (caps {}), sources with standing are decided without them",
            s.flooded.join(", "),
            rate(sum(|r| r.offered)),
            rate(sum(|r| r.completed)),
            caps.join("/")
        );
    } else if sum(|r| r.offered) > 0.0 || held > 0 {
        let _ = writeln!(
            out,
            "  unproven attempts {}/s: {}/s admitted, {}/s completing, {}/s refused ({}/s for the cap); {held} held (caps {})",
            rate(sum(|r| r.offered)),
            rate(sum(|r| r.admitted)),
            rate(sum(|r| r.completed)),
            rate(sum(|r| r.refused)),
            rate(sum(|r| r.capped)),
            caps.join("/")
        );
    }
    let disowned = sum(|r| r.disowned);
    if disowned > 0.0 {
        let _ = writeln!(
            out,
            "  disowned {}/s: proven attempts their source reset (SYNs spoofed in a client's name)",
            rate(disowned)
        );
    }
}

/// Per class with refusals: why, per second; and the retry budget's use where retries were
/// admitted.
fn render_refusals(out: &mut String, s: &ServiceState) {
    let (rates, sources) = (s.signals.rates.value(), s.signals.sources.value());
    for (i, c) in s.classes.iter().enumerate() {
        let by_reason = rates.map(|r| r[i].refused_by_reason).unwrap_or_default();
        let why: Vec<String> = Reason::ALL
            .into_iter()
            .filter(|&reason| by_reason[reason as usize] > 0.0)
            .map(|reason| format!("{} {}/s", reason.name(), rate(by_reason[reason as usize])))
            .collect();
        if !why.is_empty() {
            let _ = writeln!(out, "  refused {}: {}", c.class, why.join(", "));
        }
        if let Some(v) = sources.map(|v| v[i])
            && v.retries > 0
        {
            let _ = writeln!(
                out,
                "  retry budget {}: {} retries admitted per {} first attempts (last two epochs)",
                c.class, v.retries, v.firsts
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fixture() -> State {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/golden/state.json");
        serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
    }

    /// `golden/state.json` is a real daemon's `status --json` (two services, one
    /// override); its table must read exactly as reviewed.
    #[test]
    fn status_table_matches_the_golden_file() {
        crate::golden::check("status.txt", &render(&fixture()));
    }

    #[test]
    fn warnings_follow_the_attachments() {
        let mut s = fixture();
        s.warnings = vec!["connections open before tracking began are not counted".into()];
        let out = render(&s);
        assert_eq!(
            out.lines().nth(2),
            Some("WARNING: connections open before tracking began are not counted")
        );
        let back: State = serde_json::from_str(&serde_json::to_string(&s).unwrap()).unwrap();
        assert_eq!(back, s);
    }

    #[test]
    fn a_daemon_attached_to_nothing_says_it_only_measures() {
        let mut s = fixture();
        s.attach.clear();
        let out = render(&s);
        assert!(
            out.lines().nth(1)
                == Some(
                    "attached: nothing (measure only: daemon.measure_only = true, nothing is shed)"
                ),
            "{out}"
        );
    }

    #[test]
    fn a_stale_heartbeat_says_the_fallback_is_in_force() {
        let mut s = fixture();
        s.heartbeat_age_ms = 4_000;
        let out = render(&s);
        assert!(
            out.contains("4000 ms — STALE (> 3000 ms): the fallback limits are in force"),
            "{out}"
        );
    }

    #[test]
    fn the_retry_line_gives_the_ratio_or_says_why_there_is_none() {
        let mut s = fixture();
        let svc = &mut s.services[0].signals;
        svc.retry = Reading::Ok {
            value: RetryWindow {
                window_ms: 1000,
                shed: 40,
                retries: 10,
                ratio: Some(0.25),
            },
        };
        if let Reading::Ok { value } = &mut svc.rates {
            value[3].retransmits = 12.5;
            value[3].retries = 10.0;
        }
        let out = render(&s);
        assert!(
            out.contains("accept queue 0/64   retry ratio 0.25 (10 retries / 40 shed in 1000 ms)"),
            "{out}"
        );
        assert!(
            out.lines()
                .any(|l| l.starts_with("  sheddable") && l.contains("      12.5      10.0")),
            "{out}"
        );
        // Refusals by reason and the retry budget's use, per class that has them.
        let svc = &mut s.services[0].signals;
        if let Reading::Ok { value } = &mut svc.rates {
            value[3].refused_by_reason[Reason::Priority as usize] = 30.0;
            value[3].refused_by_reason[Reason::RetryBudget as usize] = 2.5;
        }
        svc.sources = Reading::Ok {
            value: std::array::from_fn(|c| crate::signals::ClassSources {
                active: 10 * c as u32,
                retries: if c == 3 { 4 } else { 0 },
                firsts: 40,
                ..Default::default()
            }),
        };
        let out = render(&s);
        assert!(
            out.contains("  refused sheddable: priority 30.0/s, retry_budget 2.5/s\n"),
            "{out}"
        );
        assert!(
            out.contains(
                "  retry budget sheddable: 4 retries admitted per 40 first attempts (last two epochs)"
            ),
            "{out}"
        );
        assert!(
            out.lines()
                .any(|l| l.starts_with("  sheddable") && l.ends_with("      30")),
            "{out}"
        );
        s.services[0].signals.retry = Reading::missing("first tick: no previous counters");
        let out = render(&s);
        assert!(
            out.contains("retry ratio n/a (first tick: no previous counters)"),
            "{out}"
        );
    }

    #[test]
    fn fleet_mode_adds_membership_shares_and_etcd_health() {
        let mut s = fixture();
        s.services[0].fleet_ceiling = Some(18);
        s.fleet = Some(FleetState {
            node: "lb-1".into(),
            prefix: "/shedder".into(),
            endpoints: vec!["https://198.18.0.21:2379".into()],
            standing: "member".into(),
            etcd_up: true,
            etcd_last_contact_s: Some(0.4),
            etcd_errors: 2,
            last_error: None,
            lease_id: Some(0x1f),
            lease_ttl_s: 10,
            members: vec!["lb-1".into(), "lb-2".into()],
            departed: vec!["lb-3".into()],
            services: vec![crate::fleet::ServiceShare {
                service: "api".into(),
                global_limit: 60,
                budget: 54,
                members: 2,
                target: 22,
                ceiling: 18,
                claim: 20,
                others: 22,
                reserved: 9,
                static_share: 9,
                shares: "demand".into(),
                nodes: vec![crate::fleet::NodeShare {
                    node: "lb-1".into(),
                    attempts: 120.5,
                    need: [2.0, 10.0, 36.2, 0.0],
                    hold_ms: Some(400.0),
                    weight: 22.0 / 45.0,
                    share: 22,
                    claim: 20,
                    counted: 20,
                }],
                disagreeing: 0,
            }],
            rejected: Default::default(),
            clamped: Default::default(),
        });
        let out = render(&s);
        for line in [
            "fleet: node lb-1 (member) under /shedder  etcd up (last answer 0.4 s ago, 2 errors)  lease 1f ttl 10 s",
            "  members (2): lb-1, lb-2",
            "  departed, static share reserved (1): lb-3",
            "  api: global 60 budget 54  members 2  share 22 (by demand)  ceiling 18  claim 20  others 22  reserved 9  static 9",
            "    lb-1             demand   120.5/s  need   48.2 (2.0/10.0/36.2/0.0)  hold 400 ms  weight  48.9%  share   22  claim   20",
        ] {
            assert!(out.lines().any(|l| l == line), "{line:?} not in\n{out}");
        }
        assert!(out.contains("fleet ceiling 18"), "{out}");
        assert!(!out.contains("records ignored"), "{out}");
        let again: State = serde_json::from_str(&serde_json::to_string(&s).unwrap()).unwrap();
        assert_eq!(s, again);
        // A rogue member: its record's values held within bounds, its claim counted up to
        // its share, its global_limit not followed.
        let f = s.fleet.as_mut().unwrap();
        f.rejected.insert("member".into(), 1);
        f.clamped.insert("claim".into(), 2);
        f.clamped.insert("need".into(), 1);
        f.clamped.insert("hold".into(), 0);
        f.services[0].disagreeing = 1;
        f.services[0].nodes.push(crate::fleet::NodeShare {
            node: "rogue".into(),
            attempts: 1e8,
            need: [1.0, 0.0, 0.0, 0.0],
            hold_ms: None,
            weight: 2.0 / 45.0,
            share: 2,
            claim: 54,
            counted: 2,
        });
        let out = render(&s);
        for line in [
            "  records ignored: member 1  values held within bounds: claim 2, need 1",
            "  api: 1 member(s) publish another global_limit; this node keeps its own (60)",
            "    rogue            demand 100000000.0/s  need    1.0 (1.0/0.0/0.0/0.0)  hold -  weight   4.4%  share    2  claim   54 (counts 2)",
        ] {
            assert!(out.lines().any(|l| l == line), "{line:?} not in\n{out}");
        }
    }

    #[test]
    fn state_round_trips_through_json() {
        let s = fixture();
        let again: State = serde_json::from_str(&serde_json::to_string(&s).unwrap()).unwrap();
        assert_eq!(s, again);
    }
}
