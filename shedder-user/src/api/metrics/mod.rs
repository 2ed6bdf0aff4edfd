//! The Prometheus / OpenMetrics endpoint on `daemon.metrics_listen` (`GET /metrics`), with
//! `GET /healthz` (alive) and `GET /readyz` (see [`readiness`]) beside it.
//!
//! Values come from the snapshot the daemon takes each tick: cumulative kernel counters and
//! histograms, the limits and signals. Histograms are re-bucketed from the kernel's
//! log-linear buckets to the fixed `le` bounds below; a kernel bucket is counted under an
//! `le` once it lies wholly below it, so a bound may lag by at most one kernel bucket (≤ 1/8
//! of the value).

pub mod names;
pub mod process;

use std::{
    net::TcpListener,
    sync::{Arc, Mutex},
    time::Instant,
};

use prometheus_client::{
    collector::Collector,
    encoding::{DescriptorEncoder, EncodeMetric as _, NoLabelSet},
    metrics::{MetricType, counter::ConstCounter, gauge::ConstGauge},
    registry::Registry,
};
use shedder_common::{
    CLASS_NAMES, NUM_CLASSES, NUM_VERDICTS, Reason, VERDICT_NAMES, VERDICT_PASS, decision_index,
    hist,
};

use crate::{
    api::state::State,
    control::controller::Mode,
    signals::{Cumulative, netstat::ListenCounters},
};

/// Histogram bounds (seconds) of the exported queue-age and latency histograms.
pub const BUCKETS: [f64; 13] = [
    0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0, 10.0,
];

/// What a scrape reports.
#[derive(Clone, Debug)]
pub struct Snapshot {
    pub state: State,
    /// Per service, the cumulative kernel counters and histograms of the last tick.
    pub services: Vec<Cumulative>,
    pub listen: Option<ListenCounters>,
    /// The namespace's UDP errors.
    pub udp_errors: Option<crate::signals::snmp::UdpCounters>,
    /// When the heartbeat was last stamped.
    pub heartbeat: Instant,
    /// How the last reload went.
    pub reload: Reload,
}

/// The last reload of the configuration (SIGHUP or `policy apply`), reported as
/// Prometheus reports its own: whether the last attempt succeeded, and when one last did
/// (the start counts as one, the configuration having been loaded then).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Reload {
    pub successful: bool,
    /// Seconds since the Unix epoch.
    pub success_time_s: f64,
}

impl Reload {
    /// The configuration loaded at start.
    pub fn started() -> Self {
        Self {
            successful: true,
            success_time_s: unix_now(),
        }
    }

    /// A reload was attempted now.
    pub fn attempted(&mut self, ok: bool) {
        self.successful = ok;
        if ok {
            self.success_time_s = unix_now();
        }
    }
}

fn unix_now() -> f64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64())
}

pub type Shared = Arc<Mutex<Option<Snapshot>>>;

#[derive(Debug)]
struct ShedderCollector(Shared);

type Labels = Vec<(&'static str, String)>;

/// One series per item that has a value, labelled `label = name(item)`.
fn one_label<T>(
    items: &[T],
    label: &'static str,
    name: impl Fn(&T) -> &String,
    value: &dyn Fn(&T) -> Option<f64>,
) -> Vec<(Labels, f64)> {
    items
        .iter()
        .filter_map(|x| value(x).map(|v| (vec![(label, name(x).clone())], v)))
        .collect()
}

fn family<F>(
    encoder: &mut DescriptorEncoder<'_>,
    name: &str,
    help: &str,
    kind: MetricType,
    series: &[(Labels, F)],
    mut encode: impl FnMut(prometheus_client::encoding::MetricEncoder<'_>, &F) -> std::fmt::Result,
) -> std::fmt::Result {
    let mut m = encoder.encode_descriptor(name, help, None, kind)?;
    for (labels, value) in series {
        encode(m.encode_family(labels)?, value)?;
    }
    Ok(())
}

fn help(name: &str) -> &'static str {
    names::METRICS
        .iter()
        .find(|m| m.0 == name)
        .map_or("", |m| m.3)
}

fn gauges(
    encoder: &mut DescriptorEncoder<'_>,
    name: &str,
    series: &[(Labels, f64)],
) -> std::fmt::Result {
    family(
        encoder,
        name,
        help(name),
        MetricType::Gauge,
        series,
        |f, v| ConstGauge::new(*v).encode(f),
    )
}

fn counters(
    encoder: &mut DescriptorEncoder<'_>,
    name: &str,
    series: &[(Labels, f64)],
) -> std::fmt::Result {
    family(
        encoder,
        name,
        help(name),
        MetricType::Counter,
        series,
        |f, v| ConstCounter::new(*v).encode(f),
    )
}

/// Whether a (verdict, reason) pair can happen, so its series is exported from zero on.
fn possible(verdict: u32, reason: Reason) -> bool {
    if verdict == VERDICT_PASS {
        (reason as u32) < Reason::Ceiling as u32
    } else {
        reason as u32 >= Reason::Ceiling as u32
    }
}

impl Collector for ShedderCollector {
    fn encode(&self, mut encoder: DescriptorEncoder<'_>) -> Result<(), std::fmt::Error> {
        let Some(snap) = self.0.lock().map(|s| s.clone()).unwrap_or(None) else {
            return Ok(());
        };
        let st = &snap.state;
        let svc = |i: usize| st.services[i].name.clone();

        // Connection attempts, from sources with standing and without.
        let attempts = decision_series(&snap.services, &svc, |c| c.counters.as_ref());
        counters(&mut encoder, "shedder_connection_attempts", &attempts)?;
        let unproven = decision_series(&snap.services, &svc, |c| c.unproven.as_ref());
        counters(&mut encoder, "shedder_unproven_attempts", &unproven)?;
        for (name, pick) in [
            (
                "shedder_syn_retransmits",
                (|c: &Cumulative| c.retransmits) as fn(&Cumulative) -> Option<[u64; NUM_CLASSES]>,
            ),
            ("shedder_retries", |c: &Cumulative| c.retries),
            ("shedder_unproven_completed", |c: &Cumulative| {
                c.completed_unproven
            }),
            ("shedder_disowned_attempts", |c: &Cumulative| c.disowned),
        ] {
            let series = per_class_counts(&snap.services, &svc, pick);
            counters(&mut encoder, name, &series)?;
        }

        let per_service = |f: &dyn Fn(&crate::api::state::ServiceState) -> Option<f64>| {
            one_label(&st.services, "service", |s| &s.name, f)
        };
        gauges(
            &mut encoder,
            "shedder_limit",
            &per_service(&|s| Some(s.limit as f64)),
        )?;
        gauges(
            &mut encoder,
            "shedder_fallback_limit",
            &per_service(&|s| Some(s.fallback_limit as f64)),
        )?;
        type ServiceGauge = fn(&crate::api::state::ServiceState) -> Option<f64>;
        for (name, f) in [
            (
                "shedder_min_limit",
                (|s| Some(s.min_limit as f64)) as ServiceGauge,
            ),
            ("shedder_max_limit", |s| Some(s.max_limit as f64)),
            ("shedder_target_latency_seconds", |s| {
                Some(s.target_latency_ms as f64 / 1000.0)
            }),
            ("shedder_max_connections", |s| {
                (s.protocol == "tcp").then_some(s.max_connections as f64)
            }),
            ("shedder_recall_per_second", |s| {
                (s.protocol == "tcp").then_some(s.recall_per_second as f64)
            }),
            ("shedder_waiting_requests", |s| {
                s.signals.waiting.value().map(|w| w.requests as f64)
            }),
            ("shedder_oldest_waiting_seconds", |s| {
                let w = s.signals.waiting.value()?;
                Some(w.oldest_ms.unwrap_or(0.0) / 1000.0)
            }),
        ] {
            gauges(&mut encoder, name, &per_service(&f))?;
        }
        let mut enforcement = Vec::new();
        let mut waiting = Vec::new();
        for s in &st.services {
            enforcement.push((
                vec![("service", s.name.clone()), ("mode", s.enforcement.clone())],
                1.0,
            ));
            if let Some(w) = s.signals.waiting.value() {
                for (q, v) in [("0.5", w.p50_ms), ("0.9", w.p90_ms), ("0.99", w.p99_ms)] {
                    waiting.push((
                        vec![("service", s.name.clone()), ("quantile", q.to_string())],
                        v.unwrap_or(0.0) / 1000.0,
                    ));
                }
            }
        }
        gauges(&mut encoder, "shedder_enforcement", &enforcement)?;
        gauges(&mut encoder, "shedder_waiting_age_seconds", &waiting)?;
        let per_class =
            |f: &dyn Fn(&crate::api::state::ServiceState, usize) -> Option<f64>| -> Vec<(Labels, f64)> {
                let mut out = Vec::new();
                for s in &st.services {
                    for (c, name) in CLASS_NAMES.iter().enumerate() {
                        if let Some(v) = f(s, c) {
                            out.push((
                                vec![("service", s.name.clone()), ("class", name.to_string())],
                                v,
                            ));
                        }
                    }
                }
                out
            };
        counters(
            &mut encoder,
            "shedder_recalled_connections",
            &per_class(&|s, c| {
                (s.protocol == "tcp")
                    .then(|| s.classes.get(c).map(|x| x.recalled as f64))
                    .flatten()
            }),
        )?;
        counters(
            &mut encoder,
            "shedder_recall_errors",
            &per_service(&|s| (s.protocol == "tcp").then_some(s.recall_errors as f64)),
        )?;
        gauges(
            &mut encoder,
            "shedder_connections_unseen",
            &per_service(&|s| (s.protocol == "tcp").then_some(s.unseen_connections as f64)),
        )?;
        gauges(
            &mut encoder,
            "shedder_class_limit",
            &per_class(&|s, c| s.classes.get(c).map(|x| x.share as f64)),
        )?;
        gauges(
            &mut encoder,
            "shedder_class_floor",
            &per_class(&|s, c| s.classes.get(c).map(|x| x.floor as f64)),
        )?;
        gauges(
            &mut encoder,
            "shedder_class_reserve",
            &per_class(&|s, c| s.classes.get(c).map(|x| x.reserve as f64)),
        )?;
        gauges(
            &mut encoder,
            "shedder_inflight",
            &per_class(&|s, c| s.signals.inflight.value().map(|v| v[c] as f64)),
        )?;
        gauges(
            &mut encoder,
            "shedder_connections",
            &per_class(&|s, c| s.signals.connections.value().map(|v| v[c] as f64)),
        )?;
        gauges(
            &mut encoder,
            "shedder_pending",
            &per_class(&|s, c| s.signals.pending.value().map(|v| v[c] as f64)),
        )?;
        gauges(
            &mut encoder,
            "shedder_unproven_held",
            &per_class(&|s, c| s.signals.unproven.value().map(|v| v.held[c] as f64)),
        )?;
        gauges(
            &mut encoder,
            "shedder_class_unproven_cap",
            &per_class(&|s, c| s.classes.get(c).map(|x| x.unproven_cap as f64)),
        )?;
        gauges(
            &mut encoder,
            "shedder_syn_flood",
            &per_class(&|s, c| {
                Some(if s.flooded.iter().any(|f| f == CLASS_NAMES[c]) {
                    1.0
                } else {
                    0.0
                })
            }),
        )?;
        gauges(
            &mut encoder,
            "shedder_class_active_sources",
            &per_class(&|s, c| s.signals.sources.value().map(|v| v[c].active as f64)),
        )?;
        gauges(
            &mut encoder,
            "shedder_class_retry_share",
            &per_class(&|s, c| {
                let v = s.signals.sources.value()?[c];
                (v.firsts > 0).then(|| v.retries as f64 / v.firsts as f64)
            }),
        )?;

        for (name, kind) in [
            ("shedder_queue_age_seconds", hist::KIND_QUEUE_AGE),
            ("shedder_latency_seconds", hist::KIND_LATENCY),
        ] {
            let mut series = Vec::new();
            for (i, c) in snap.services.iter().enumerate() {
                let (Some(h), Some(sums)) = (&c.histograms, &c.sums_us) else {
                    continue;
                };
                let start = hist::index(kind, 0) as usize;
                let counts = &h[start..start + hist::BUCKETS as usize];
                series.push((
                    vec![("service", svc(i))],
                    rebucket(counts, sums[kind as usize]),
                ));
            }
            family(
                &mut encoder,
                name,
                help(name),
                MetricType::Histogram,
                &series,
                |mut f, (sum, count, buckets)| {
                    f.encode_histogram::<NoLabelSet>(*sum, *count, buckets, None)
                },
            )?;
        }

        gauges(
            &mut encoder,
            "shedder_retry_ratio",
            &per_service(&|s| s.signals.retry.value().and_then(|r| r.ratio)),
        )?;
        gauges(
            &mut encoder,
            "shedder_accept_queue_depth",
            &per_service(&|s| s.signals.accept_queue.value().map(|q| q.depth as f64)),
        )?;
        gauges(
            &mut encoder,
            "shedder_accept_queue_backlog",
            &per_service(&|s| s.signals.accept_queue.value().map(|q| q.backlog as f64)),
        )?;
        gauges(
            &mut encoder,
            "shedder_service_protocol",
            &st.services
                .iter()
                .map(|s| {
                    (
                        vec![
                            ("service", s.name.clone()),
                            ("protocol", s.protocol.clone()),
                        ],
                        1.0,
                    )
                })
                .collect::<Vec<_>>(),
        )?;
        gauges(
            &mut encoder,
            "shedder_udp_receive_queue_bytes",
            &per_service(&|s| s.signals.udp.value().map(|q| q.depth as f64)),
        )?;
        gauges(
            &mut encoder,
            "shedder_udp_receive_buffer_bytes",
            &per_service(&|s| s.signals.udp.value().map(|q| q.buffer as f64)),
        )?;
        counters(
            &mut encoder,
            "shedder_udp_receive_drops",
            &snap
                .services
                .iter()
                .enumerate()
                .filter_map(|(i, c)| Some((vec![("service", svc(i))], c.udp_drops? as f64)))
                .collect::<Vec<_>>(),
        )?;
        if let Some(u) = snap.udp_errors {
            counters(
                &mut encoder,
                "shedder_udp_receive_buffer_errors",
                &[(Vec::new(), u.receive_buffer_errors as f64)],
            )?;
            counters(
                &mut encoder,
                "shedder_udp_errors",
                &[(Vec::new(), u.errors as f64)],
            )?;
        }
        if let Some(l) = snap.listen {
            counters(
                &mut encoder,
                "shedder_listen_overflows",
                &[(Vec::new(), l.overflows as f64)],
            )?;
            counters(
                &mut encoder,
                "shedder_listen_drops",
                &[(Vec::new(), l.drops as f64)],
            )?;
            for (name, v) in [
                ("shedder_syncookies_sent", l.syncookies_sent),
                ("shedder_syncookies_received", l.syncookies_received),
                ("shedder_syncookies_failed", l.syncookies_failed),
            ] {
                counters(&mut encoder, name, &[(Vec::new(), v as f64)])?;
            }
        }
        if let Some(hold) = st.handshake_hold_ms {
            gauges(
                &mut encoder,
                "shedder_handshake_hold_seconds",
                &[(Vec::new(), hold / 1000.0)],
            )?;
        }

        let mut stall = Vec::new();
        let mut avg10 = Vec::new();
        for s in &st.services {
            let p = &s.signals.pressure;
            for (resource, r) in [("cpu", &p.cpu), ("memory", &p.memory), ("io", &p.io)] {
                let Some(w) = r.value() else { continue };
                let labels = |kind: &str| {
                    vec![
                        ("service", s.name.clone()),
                        ("resource", resource.to_string()),
                        ("kind", kind.to_string()),
                    ]
                };
                stall.push((labels("some"), w.some_ratio));
                avg10.push((labels("some"), w.some_avg10));
                if let (Some(ratio), Some(a)) = (w.full_ratio, w.full_avg10) {
                    stall.push((labels("full"), ratio));
                    avg10.push((labels("full"), a));
                }
            }
        }
        gauges(&mut encoder, "shedder_pressure_stall_ratio", &stall)?;
        gauges(&mut encoder, "shedder_pressure_avg10", &avg10)?;

        let mut modes = Vec::new();
        for s in &st.services {
            for m in [Mode::Normal, Mode::Shedding, Mode::Recovering] {
                modes.push((
                    vec![
                        ("service", s.name.clone()),
                        ("mode", m.as_str().to_string()),
                    ],
                    if s.mode == m { 1.0 } else { 0.0 },
                ));
            }
        }
        gauges(&mut encoder, "shedder_controller_mode", &modes)?;
        gauges(
            &mut encoder,
            "shedder_override",
            &per_service(&|s| Some(if s.override_limit.is_some() { 1.0 } else { 0.0 })),
        )?;
        gauges(
            &mut encoder,
            "shedder_config_last_reload_successful",
            &[(Vec::new(), if snap.reload.successful { 1.0 } else { 0.0 })],
        )?;
        gauges(
            &mut encoder,
            "shedder_config_last_reload_success_timestamp_seconds",
            &[(Vec::new(), snap.reload.success_time_s)],
        )?;
        gauges(
            &mut encoder,
            "shedder_heartbeat_age_seconds",
            &[(Vec::new(), snap.heartbeat.elapsed().as_secs_f64())],
        )?;
        let attach: Vec<(Labels, f64)> = st
            .attach
            .iter()
            .map(|a| {
                (
                    vec![("interface", a.interface.clone()), ("mode", a.mode.clone())],
                    1.0,
                )
            })
            .collect();
        gauges(&mut encoder, "shedder_attach_mode", &attach)?;
        let tx_errors: Vec<(Labels, f64)> = st
            .attach
            .iter()
            .filter_map(|a| {
                a.xdp_tx_errors
                    .map(|n| (vec![("interface", a.interface.clone())], n as f64))
            })
            .collect();
        counters(&mut encoder, "shedder_xdp_tx_errors", &tx_errors)?;
        let program = |f: &dyn Fn(&crate::api::state::ProgramCost) -> Option<f64>| {
            one_label(&st.programs, "program", |p| &p.program, f)
        };
        counters(
            &mut encoder,
            "shedder_program_run_seconds",
            &program(&|p| Some(p.run_seconds)),
        )?;
        counters(
            &mut encoder,
            "shedder_program_runs",
            &program(&|p| Some(p.runs as f64)),
        )?;
        gauges(
            &mut encoder,
            "shedder_program_ns_per_run",
            &program(&|p| p.ns_per_run),
        )?;
        let events: Vec<(Labels, f64)> = st
            .kernel_events
            .iter()
            .map(|(e, n)| (vec![("event", e.clone())], *n as f64))
            .collect();
        counters(&mut encoder, "shedder_kernel_events", &events)?;
        if let Some(f) = &st.fleet {
            fleet_metrics(&mut encoder, f)?;
        }
        let info =
            prometheus_client::metrics::info::Info::new(vec![("version", st.version.clone())]);
        let m = encoder.encode_descriptor(
            "shedder_build",
            help("shedder_build"),
            None,
            MetricType::Info,
        )?;
        info.encode(m)?;
        Ok(())
    }
}

/// The `shedder_fleet_*` families (fleet mode only).
fn fleet_metrics(
    encoder: &mut DescriptorEncoder<'_>,
    f: &crate::fleet::FleetState,
) -> std::fmt::Result {
    let one = |v: f64| [(Vec::new(), v)];
    gauges(
        encoder,
        "shedder_fleet_members",
        &one(f.members.len() as f64),
    )?;
    gauges(
        encoder,
        "shedder_fleet_departed",
        &one(f.departed.len() as f64),
    )?;
    let standing: Vec<(Labels, f64)> = ["joining", "member", "fail-static", "static"]
        .iter()
        .map(|s| {
            (
                vec![("standing", s.to_string())],
                if f.standing == *s { 1.0 } else { 0.0 },
            )
        })
        .collect();
    gauges(encoder, "shedder_fleet_standing", &standing)?;
    gauges(
        encoder,
        "shedder_fleet_etcd_up",
        &one(if f.etcd_up { 1.0 } else { 0.0 }),
    )?;
    if let Some(s) = f.etcd_last_contact_s {
        gauges(encoder, "shedder_fleet_etcd_last_contact_seconds", &one(s))?;
    }
    counters(
        encoder,
        "shedder_fleet_etcd_errors",
        &one(f.etcd_errors as f64),
    )?;
    // What the members' records held that was not believed, every label from zero (a
    // counter that appears only when first incremented hides that increase from rate()).
    let by = |label: &'static str, names: &[&str], m: &std::collections::BTreeMap<String, u64>| {
        names
            .iter()
            .map(|n| {
                (
                    vec![(label, n.to_string())],
                    m.get(*n).copied().unwrap_or(0) as f64,
                )
            })
            .collect::<Vec<(Labels, f64)>>()
    };
    counters(
        encoder,
        "shedder_fleet_records_rejected",
        &by("record", &crate::fleet::trust::RECORDS, &f.rejected),
    )?;
    let fields: Vec<&str> = crate::fleet::trust::Field::ALL
        .iter()
        .map(|f| f.as_str())
        .collect();
    counters(
        encoder,
        "shedder_fleet_record_values_clamped",
        &by("field", &fields, &f.clamped),
    )?;
    for (name, pick) in [
        (
            "shedder_fleet_global_limit",
            (|s: &crate::fleet::ServiceShare| s.global_limit)
                as fn(&crate::fleet::ServiceShare) -> u32,
        ),
        ("shedder_fleet_share", |s| s.target),
        ("shedder_fleet_ceiling", |s| s.ceiling),
        ("shedder_fleet_claim", |s| s.claim),
        ("shedder_fleet_reserved", |s| s.reserved),
        ("shedder_fleet_static_share", |s| s.static_share),
        ("shedder_fleet_global_limit_disagreement", |s| s.disagreeing),
    ] {
        let series = one_label(&f.services, "service", |s| &s.service, &|s| {
            Some(pick(s) as f64)
        });
        gauges(encoder, name, &series)?;
    }
    // Every member's demand and share, as this node computed them.
    for (name, pick) in [
        (
            "shedder_fleet_node_demand",
            (|n: &crate::fleet::NodeShare| n.attempts) as fn(&crate::fleet::NodeShare) -> f64,
        ),
        ("shedder_fleet_node_need", |n| n.need.iter().sum()),
        ("shedder_fleet_node_weight", |n| n.weight),
        ("shedder_fleet_node_share", |n| n.share as f64),
        ("shedder_fleet_node_claim", |n| n.claim as f64),
        ("shedder_fleet_node_claim_counted", |n| n.counted as f64),
    ] {
        let series: Vec<(Labels, f64)> = f
            .services
            .iter()
            .flat_map(|s| {
                s.nodes.iter().map(move |n| {
                    (
                        vec![("service", s.service.clone()), ("node", n.node.clone())],
                        pick(n),
                    )
                })
            })
            .collect();
        gauges(encoder, name, &series)?;
    }
    Ok(())
}

/// One series per (service, class, verdict, reason) of a service's decision counters (`pick`:
/// those of proven or of unproven attempts), with every series that can happen from zero on
/// (see [`possible`]); services whose counters were not read are left out.
fn decision_series(
    services: &[Cumulative],
    name: &dyn Fn(usize) -> String,
    pick: fn(&Cumulative) -> Option<&[u64; shedder_common::COUNTERS_PER_SERVICE]>,
) -> Vec<(Labels, f64)> {
    let mut out = Vec::new();
    for (i, c) in services.iter().enumerate() {
        let Some(c) = pick(c) else { continue };
        for class in 0..CLASS_NAMES.len() as u32 {
            for verdict in 0..NUM_VERDICTS {
                for reason in Reason::ALL {
                    let n = c[decision_index(class, verdict, reason as u32) as usize];
                    if n > 0 || possible(verdict, reason) {
                        out.push((
                            vec![
                                ("service", name(i)),
                                ("class", CLASS_NAMES[class as usize].to_string()),
                                ("verdict", VERDICT_NAMES[verdict as usize].to_string()),
                                ("reason", reason.name().to_string()),
                            ],
                            n as f64,
                        ));
                    }
                }
            }
        }
    }
    out
}

/// One series per (service, class) of a per-class kernel counter, every class from zero on
/// (a counter that appears only when first incremented hides its first increase from
/// `rate()`); services whose counters were not read are left out.
fn per_class_counts(
    services: &[Cumulative],
    name: &dyn Fn(usize) -> String,
    pick: fn(&Cumulative) -> Option<[u64; NUM_CLASSES]>,
) -> Vec<(Labels, f64)> {
    let mut out = Vec::new();
    for (i, c) in services.iter().enumerate() {
        let Some(counts) = pick(c) else { continue };
        for (class, n) in CLASS_NAMES.iter().zip(counts) {
            out.push((
                vec![("service", name(i)), ("class", class.to_string())],
                n as f64,
            ));
        }
    }
    out
}

/// (sum in seconds, count, cumulative (le, count) pairs) from kernel buckets.
fn rebucket(counts: &[u64], sum_us: u64) -> (f64, u64, Vec<(f64, u64)>) {
    // prometheus-client sums the per-bucket counts into the cumulative
    // `le` series itself and prints an upper bound of `f64::MAX` as `+Inf`,
    // so each kernel bucket lands, uncumulated, in the first exported
    // bucket that holds all of its values.
    let total: u64 = counts.iter().sum();
    let mut out: Vec<(f64, u64)> = BUCKETS.iter().map(|le| (*le, 0)).collect();
    out.push((f64::MAX, 0));
    for (i, c) in counts.iter().enumerate() {
        let hi_us = hist::range(i as u32).1;
        let slot = BUCKETS
            .iter()
            .position(|le| hi_us <= (le * 1e6).round() as u64)
            .unwrap_or(BUCKETS.len());
        out[slot].1 += c;
    }
    (sum_us as f64 / 1e6, total, out)
}

/// The registry the endpoint encodes.
pub fn registry(shared: Shared) -> Registry {
    let mut registry = Registry::default();
    registry.register_collector(Box::new(ShedderCollector(shared)));
    registry.register_collector(Box::new(process::ProcessCollector));
    registry
}

/// Encode the current metrics (OpenMetrics text).
pub fn encode(registry: &Registry) -> String {
    let mut out = String::new();
    if prometheus_client::encoding::text::encode(&mut out, registry).is_err() {
        out.clear();
        out.push_str("# EOF\n");
    }
    out
}

/// Connections the metrics endpoint serves at once; more wait in its backlog. A scrape is
/// one short connection: 64 covers several Prometheus servers, probes and people with
/// room to spare, and bounds what a flood of idle connections can hold.
pub const CONNECTIONS: usize = 64;

/// Serve `GET /metrics` on `listener`, each connection on a task of its own (see
/// [`crate::api::http`]), so that idle or slow clients cannot keep a scrape waiting.
pub fn serve(listener: TcpListener, shared: Shared) {
    let registry = Arc::new(registry(shared.clone()));
    let make = move || {
        listener.set_nonblocking(true)?;
        tokio::net::TcpListener::from_std(listener)
    };
    crate::api::http::accept_loop("the metrics endpoint", CONNECTIONS, make, move |conn| {
        let (registry, shared) = (registry.clone(), shared.clone());
        crate::api::http::serve_connection(conn, move |req| {
            let answer = answer(&req, &registry, &shared);
            async move { answer }
        });
    });
}

fn answer(
    req: &hyper::Request<hyper::body::Incoming>,
    registry: &Registry,
    shared: &Shared,
) -> crate::api::http::Answer {
    use crate::api::http::answer as reply;
    if req.method() != hyper::Method::GET {
        return reply(405, "text/plain", "shedder serves GET only\n");
    }
    match req.uri().path() {
        "/metrics" => {}
        // Liveness: the process runs and its endpoint answers (a restart cures nothing
        // more that this can see).
        "/healthz" => return reply(200, "text/plain", "ok\n"),
        "/readyz" => {
            let snap = shared.lock().ok().and_then(|s| s.clone());
            return match readiness(snap.as_ref()) {
                Ok(()) => reply(200, "text/plain", "ready\n"),
                Err(why) => reply(503, "text/plain", format!("not ready: {why}\n")),
            };
        }
        _ => {
            return reply(
                404,
                "text/plain",
                "shedder serves GET /metrics, /healthz and /readyz\n",
            );
        }
    }
    // Before the first tick there is nothing to report: an empty exposition would read as
    // a daemon with no services and no refusals, so the scrape fails instead (`up` 0).
    if shared.lock().map_or(true, |s| s.is_none()) {
        return reply(
            503,
            "text/plain",
            "shedder is starting: no figures until its first tick has run\n",
        );
    }
    reply(
        200,
        "application/openmetrics-text; version=1.0.0; charset=utf-8",
        encode(registry),
    )
}

/// Whether the daemon is ready (`/readyz`): its first tick has run (attached, limits
/// written, figures published; a start that cannot attach never gets here), and the
/// heartbeat is fresh, so the packet path uses the daemon's limits rather than the
/// fallback ones. A stuck tick loop or a heartbeat that cannot be stamped makes it stale.
pub fn readiness(snap: Option<&Snapshot>) -> Result<(), String> {
    let snap = snap.ok_or("starting: the first tick has not run")?;
    let age = snap.heartbeat.elapsed();
    let timeout = std::time::Duration::from_millis(snap.state.heartbeat_timeout_ms);
    if age > timeout {
        return Err(format!(
            "the heartbeat is {} ms old, past heartbeat_timeout_ms ({}): the packet path uses \
             the fallback limits",
            age.as_millis(),
            timeout.as_millis()
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A scrape before the daemon's first tick fails (503) instead of answering an empty
    /// exposition that reads as a healthy node with no services.
    #[test]
    fn a_scrape_before_the_first_tick_is_refused() {
        use std::io::{Read as _, Write as _};
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
        let addr = listener.local_addr().expect("address");
        serve(listener, Shared::default());
        let get = |path: &str| {
            let mut s = std::net::TcpStream::connect(addr).expect("connect");
            s.set_read_timeout(Some(std::time::Duration::from_secs(10)))
                .expect("timeout");
            write!(
                s,
                "GET {path} HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n"
            )
            .expect("request");
            let mut answer = String::new();
            s.read_to_string(&mut answer).expect("answer");
            answer
        };
        let starting = get("/metrics");
        assert!(starting.starts_with("HTTP/1.1 503"), "{starting}");
        assert!(starting.contains("shedder is starting"), "{starting}");
        assert!(get("/other").starts_with("HTTP/1.1 404"));
        // Alive, not ready.
        assert!(get("/healthz").starts_with("HTTP/1.1 200"));
        let ready = get("/readyz");
        assert!(ready.starts_with("HTTP/1.1 503"), "{ready}");
        assert!(ready.contains("first tick"), "{ready}");
    }

    #[test]
    fn rebucketing_is_per_bucket_and_conservative() {
        let mut counts = vec![0u64; hist::BUCKETS as usize];
        counts[hist::bucket(500) as usize] += 3; // 0.5 ms
        counts[hist::bucket(30_000) as usize] += 2; // 30 ms
        counts[hist::bucket(3_000_000) as usize] += 1; // 3 s
        counts[hist::bucket(500_000_000) as usize] += 1; // 500 s: past every bound
        let (sum, count, b) = rebucket(&counts, 1_500 + 60_000 + 3_000_000 + 500_000_000);
        assert_eq!(count, 7);
        assert!((sum - 503.0615).abs() < 1e-9);
        // The encoder accumulates, so the per-bucket counts must add to the total.
        assert_eq!(b.iter().map(|(_, c)| c).sum::<u64>(), 7);
        let cumulative = |le: f64| {
            b.iter()
                .filter(|(l, _)| *l <= le)
                .map(|(_, c)| c)
                .sum::<u64>()
        };
        assert_eq!(cumulative(0.001), 3);
        assert_eq!(cumulative(0.02), 3);
        assert_eq!(cumulative(0.05), 5);
        assert_eq!(cumulative(5.0), 6);
        assert_eq!(b.last().unwrap(), &(f64::MAX, 1), "+Inf bucket is f64::MAX");
    }

    #[test]
    fn histogram_encodes_cumulative_buckets_and_inf() {
        let mut counts = vec![0u64; hist::BUCKETS as usize];
        counts[hist::bucket(500) as usize] += 3;
        counts[hist::bucket(30_000) as usize] += 2;
        let (sum, count, buckets) = rebucket(&counts, 61_500);
        let mut out = String::new();
        let mut reg = Registry::default();
        struct H(f64, u64, Vec<(f64, u64)>);
        impl std::fmt::Debug for H {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("H")
            }
        }
        impl Collector for H {
            fn encode(&self, mut enc: DescriptorEncoder<'_>) -> Result<(), std::fmt::Error> {
                let mut m = enc.encode_descriptor("h_seconds", "h", None, MetricType::Histogram)?;
                m.encode_histogram::<NoLabelSet>(self.0, self.1, &self.2, None)
            }
        }
        reg.register_collector(Box::new(H(sum, count, buckets)));
        prometheus_client::encoding::text::encode(&mut out, &reg).unwrap();
        assert!(out.contains("h_seconds_bucket{le=\"0.001\"} 3\n"), "{out}");
        assert!(out.contains("h_seconds_bucket{le=\"0.05\"} 5\n"), "{out}");
        assert!(out.contains("h_seconds_bucket{le=\"+Inf\"} 5\n"), "{out}");
        assert!(out.contains("h_seconds_count 5\n"), "{out}");
    }

    /// The golden state (two services, web and api) with `web` shedding: its retries and
    /// retransmits per class and its retry ratio are exported; `api` shed nothing in the
    /// window, so it has no ratio (never NaN), but its counters are there from zero.
    #[test]
    fn retry_series_are_encoded() {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/golden/state.json");
        let mut state: State =
            serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
        state.services[0].signals.retry = crate::signals::Reading::Ok {
            value: crate::signals::RetryWindow {
                window_ms: 1000,
                shed: 8,
                retries: 2,
                ratio: Some(0.25),
            },
        };
        let web = Cumulative {
            counters: Some([0; shedder_common::COUNTERS_PER_SERVICE]),
            retransmits: Some([0, 0, 4, 9]),
            retries: Some([0, 1, 0, 2]),
            ..Default::default()
        };
        let api = Cumulative {
            counters: Some([0; shedder_common::COUNTERS_PER_SERVICE]),
            retransmits: Some([0; NUM_CLASSES]),
            retries: Some([0; NUM_CLASSES]),
            ..Default::default()
        };
        let shared: Shared = Arc::new(Mutex::new(Some(Snapshot {
            state,
            services: vec![web, api],
            listen: None,
            udp_errors: Some(crate::signals::snmp::UdpCounters {
                receive_buffer_errors: 3,
                errors: 5,
            }),
            heartbeat: Instant::now(),
            reload: Reload {
                successful: false,
                success_time_s: 1_700_000_000.0,
            },
        })));
        let out = encode(&registry(shared));
        for line in [
            "shedder_udp_receive_buffer_errors_total{} 3.0",
            "shedder_udp_errors_total{} 5.0",
            "shedder_config_last_reload_successful{} 0.0",
            "shedder_config_last_reload_success_timestamp_seconds{} 1700000000.0",
            "shedder_service_protocol{service=\"web\",protocol=\"tcp\"} 1.0",
            "# TYPE shedder_syn_retransmits counter",
            "shedder_syn_retransmits_total{service=\"web\",class=\"medium\"} 4.0",
            "shedder_syn_retransmits_total{service=\"web\",class=\"sheddable\"} 9.0",
            "shedder_syn_retransmits_total{service=\"api\",class=\"critical\"} 0.0",
            "# TYPE shedder_retries counter",
            "shedder_retries_total{service=\"web\",class=\"high\"} 1.0",
            "shedder_retries_total{service=\"web\",class=\"sheddable\"} 2.0",
            "shedder_retries_total{service=\"api\",class=\"sheddable\"} 0.0",
            "# TYPE shedder_retry_ratio gauge",
            "shedder_retry_ratio{service=\"web\"} 0.25",
        ] {
            assert!(out.lines().any(|l| l == line), "no `{line}` in\n{out}");
        }
        assert!(
            !out.contains("shedder_retry_ratio{service=\"api\"}"),
            "{out}"
        );
        assert!(!out.contains("NaN"), "{out}");
        // Every family exported is in the catalogue with its type.
        for (name, kind) in out.lines().filter_map(|l| {
            let rest = l.strip_prefix("# TYPE ")?;
            rest.split_once(' ')
        }) {
            assert!(
                names::METRICS.iter().any(|m| m.0 == name && m.1 == kind),
                "{name} ({kind}) is not in names.rs"
            );
        }
        // The process's own figures, under the names every exporter uses.
        for family in [
            "process_cpu_seconds_total",
            "process_resident_memory_bytes",
            "process_virtual_memory_bytes",
            "process_open_fds",
            "process_max_fds",
            "process_start_time_seconds",
        ] {
            assert!(
                out.lines().any(|l| l.starts_with(family)),
                "no {family} in\n{out}"
            );
        }
    }

    /// Ready once a tick has run, and while the heartbeat is within its timeout.
    #[test]
    fn ready_after_the_first_tick_while_the_heartbeat_is_fresh() {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/golden/state.json");
        let mut state: State =
            serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
        state.heartbeat_timeout_ms = 3000;
        let at = |age_ms: u64| Snapshot {
            state: state.clone(),
            services: Vec::new(),
            listen: None,
            udp_errors: None,
            heartbeat: Instant::now() - std::time::Duration::from_millis(age_ms),
            reload: Reload::started(),
        };
        assert!(readiness(None).unwrap_err().contains("first tick"));
        assert_eq!(readiness(Some(&at(200))), Ok(()));
        let stale = readiness(Some(&at(3500))).unwrap_err();
        assert!(stale.contains("fallback limits"), "{stale}");
    }

    #[test]
    fn a_refused_reload_keeps_the_time_of_the_last_success() {
        let mut r = Reload {
            successful: true,
            success_time_s: 5.0,
        };
        r.attempted(false);
        assert_eq!(
            r,
            Reload {
                successful: false,
                success_time_s: 5.0
            }
        );
        r.attempted(true);
        assert!(r.successful && r.success_time_s > 1e9, "{r:?}");
    }

    #[test]
    fn possible_series() {
        assert!(possible(VERDICT_PASS, Reason::UnderLimit));
        assert!(!possible(VERDICT_PASS, Reason::Ceiling));
        assert!(possible(1, Reason::Ceiling));
        assert!(possible(1, Reason::Connections));
        assert!(!possible(1, Reason::UnderLimit));
    }
}
