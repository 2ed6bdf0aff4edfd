//! Every metric the daemon exports (OpenMetrics text on `daemon.metrics_listen`), with its
//! type and labels. Labels take only configured names (services, classes, interfaces,
//! programs) and fixed enumerations — never client addresses or ports, which would make the label
//! sets unbounded and put client data into the monitoring system.
//!
//! The alert rules and the dashboard in `deploy/` use these names; a test checks them.
//!
//! Every name starts with `shedder_`, but for the standard `process_*` families
//! ([`super::process`]), which keep the names every exporter uses so that existing
//! dashboards and alerts apply unchanged.

/// (name without the `_total`/`_bucket` suffixes, type, labels, help)
pub const METRICS: &[(&str, &str, &[&str], &str)] = &[
    (
        "shedder_connection_attempts",
        "counter",
        &["service", "class", "verdict", "reason"],
        "Unique new connection attempts decided by the packet path (verdict pass, drop, rst, dry_run); retransmitted SYNs are not counted here.",
    ),
    (
        "shedder_unproven_attempts",
        "counter",
        &["service", "class", "verdict", "reason"],
        "Unique new connection attempts from sources without standing (no handshake completed from the address within daemon.standing_window_s, or its tokens spent), and refusals of addresses disputed by a recent disowning reset: decided apart, held within the class's unproven cap, and not in shedder_connection_attempts. Reason unproven: refused because the class held its cap of them.",
    ),
    (
        "shedder_unproven_completed",
        "counter",
        &["service", "class"],
        "Connections born of unproven attempts: new clients proving themselves. Many unproven attempts and few of these: a spoofed flood.",
    ),
    (
        "shedder_disowned_attempts",
        "counter",
        &["service", "class"],
        "Proven attempts whose source answered the server's SYN-ACK with a reset: SYNs spoofed in the name of a client with standing, retired at once.",
    ),
    (
        "shedder_unproven_held",
        "gauge",
        &["service", "class"],
        "Admitted unproven attempts still in handshake.",
    ),
    (
        "shedder_class_unproven_cap",
        "gauge",
        &["service", "class"],
        "The most admitted unproven attempts the class holds at once (its bounded unproven part).",
    ),
    (
        "shedder_syn_flood",
        "gauge",
        &["service", "class"],
        "1 while the class is under a flood of unproven attempts: many, and what was admitted of them did not complete (held for 5 s after the last such tick).",
    ),
    (
        "shedder_handshake_hold_seconds",
        "gauge",
        &[],
        "How long the packet path holds an admitted attempt at least before its connection is born (measured from the protected connections' round trips unless daemon.handshake_hold_ms sets it).",
    ),
    (
        "shedder_syncookies_sent",
        "counter",
        &[],
        "SYN cookies the kernel sent in the namespace (TcpExt SyncookiesSent): a listener's SYN queue was full.",
    ),
    (
        "shedder_syncookies_received",
        "counter",
        &[],
        "SYN cookies the kernel accepted back (TcpExt SyncookiesRecv).",
    ),
    (
        "shedder_syncookies_failed",
        "counter",
        &[],
        "SYN cookies that failed the kernel's check (TcpExt SyncookiesFailed).",
    ),
    (
        "shedder_syn_retransmits",
        "counter",
        &["service", "class"],
        "Retransmitted SYNs (same addresses, ports and initial sequence number within daemon.syn_retransmit_window_ms), by the class of the attempt they repeat; not in shedder_connection_attempts.",
    ),
    (
        "shedder_retries",
        "counter",
        &["service", "class"],
        "New attempts from a source the service shed within its retry_window_ms, by the attempt's own class (before demotion); each is also in shedder_connection_attempts.",
    ),
    (
        "shedder_retry_ratio",
        "gauge",
        &["service"],
        "Retries per shed attempt (dropped, reset, or shed in dry-run) over the signal window: near 0 refused clients stay away, near 1 they come back; absent while nothing was shed in the window.",
    ),
    (
        "shedder_limit",
        "gauge",
        &["service"],
        "The service's concurrency limit in force (controller output or manual override).",
    ),
    (
        "shedder_fallback_limit",
        "gauge",
        &["service"],
        "The limit the packet path falls back to when the heartbeat is stale.",
    ),
    (
        "shedder_min_limit",
        "gauge",
        &["service"],
        "The configured floor of the service's limit (min_limit).",
    ),
    (
        "shedder_max_limit",
        "gauge",
        &["service"],
        "The configured hard ceiling of the service's limit (max_limit); in fleet mode see also shedder_fleet_ceiling.",
    ),
    (
        "shedder_target_latency_seconds",
        "gauge",
        &["service"],
        "The latency objective the adaptive controllers hold the delay to (target_latency_ms).",
    ),
    (
        "shedder_enforcement",
        "gauge",
        &["service", "mode"],
        "1 for the service's enforcement mode in force: enforce, dry-run (count what would be shed, shed nothing) or off (pass everything); a runtime switch (`shedder mode`) wins over the file.",
    ),
    (
        "shedder_max_connections",
        "gauge",
        &["service"],
        "Established connections, busy or idle, the service may hold before every attempt is refused (max_connections).",
    ),
    (
        "shedder_recall_per_second",
        "gauge",
        &["service"],
        "Keep-alive connections of refused classes the daemon may recall a second (recall_per_second; 0: off).",
    ),
    (
        "shedder_recall_errors",
        "counter",
        &["service"],
        "Recalls the kernel refused (connections already gone are not errors).",
    ),
    (
        "shedder_connections_unseen",
        "gauge",
        &["service"],
        "Connections the last sweep found in the kernel's sockets that the packet path had not seen (a client on this host, or packets on an interface shedder is not attached to): counted from socket statistics, their requests and latency not measured.",
    ),
    (
        "shedder_recalled_connections",
        "counter",
        &["service", "class"],
        "Keep-alive connections recalled (closed with a reset so that their next request meets the gate) while their class was over its bound; in dry-run, those that would have been.",
    ),
    (
        "shedder_connections",
        "gauge",
        &["service", "class"],
        "Established TCP connections, busy or idle, counted by the kernel.",
    ),
    (
        "shedder_waiting_requests",
        "gauge",
        &["service"],
        "Requests received and not yet answered (busy connections), every class; absent on kernels without sock:sk_data_ready.",
    ),
    (
        "shedder_waiting_age_seconds",
        "gauge",
        &["service", "quantile"],
        "How long the requests in service have waited so far, at the 0.5, 0.9 and 0.99 quantiles; the controller's delay includes the 0.9.",
    ),
    (
        "shedder_oldest_waiting_seconds",
        "gauge",
        &["service"],
        "The longest any request in service has waited so far (at least 1.07 s when one is older than the kernel's ring resolves).",
    ),
    (
        "shedder_class_limit",
        "gauge",
        &["service", "class"],
        "The class's share of the service limit.",
    ),
    (
        "shedder_class_floor",
        "gauge",
        &["service", "class"],
        "Connections the class keeps whatever the service's pressure.",
    ),
    (
        "shedder_class_reserve",
        "gauge",
        &["service", "class"],
        "Connections of the service limit the class leaves free for the classes above it.",
    ),
    (
        "shedder_inflight",
        "gauge",
        &["service", "class"],
        "Work in flight, counted by the kernel: connections holding a request not yet answered (every established connection on kernels without sock:sk_data_ready).",
    ),
    (
        "shedder_pending",
        "gauge",
        &["service", "class"],
        "Admitted attempts not yet established.",
    ),
    (
        "shedder_class_active_sources",
        "gauge",
        &["service", "class"],
        "Sources (addresses, or the class's source prefixes) that sent the class an attempt in the last whole epoch (about a second); the class's fair share is split among them.",
    ),
    (
        "shedder_class_retry_share",
        "gauge",
        &["service", "class"],
        "Retries admitted per first attempt admitted, over the last two epochs; the retry budget (retry_budget) caps it. Absent while no first attempt was admitted.",
    ),
    (
        "shedder_queue_age_seconds",
        "histogram",
        &["service"],
        "Accept-queue age: ESTABLISHED to the application's first read, measured by the kernel.",
    ),
    (
        "shedder_latency_seconds",
        "histogram",
        &["service"],
        "Response latency: a read to the next write on the same connection, measured by the kernel.",
    ),
    (
        "shedder_accept_queue_depth",
        "gauge",
        &["service"],
        "Connections waiting for accept() on the service's listeners (sock_diag).",
    ),
    (
        "shedder_accept_queue_backlog",
        "gauge",
        &["service"],
        "Capacity of the service's accept queues.",
    ),
    (
        "shedder_service_protocol",
        "gauge",
        &["service", "protocol"],
        "1 for each service, labelled with what its connections are: tcp or quic.",
    ),
    (
        "shedder_udp_receive_queue_bytes",
        "gauge",
        &["service"],
        "A QUIC service's datagrams waiting to be read, in bytes charged to its sockets' receive buffers (sock_diag).",
    ),
    (
        "shedder_udp_receive_buffer_bytes",
        "gauge",
        &["service"],
        "The receive buffers of a QUIC service's sockets (SO_RCVBUF), summed.",
    ),
    (
        "shedder_udp_receive_drops",
        "counter",
        &["service"],
        "Datagrams a QUIC service's sockets dropped (mostly full receive buffers), counted since the daemon started.",
    ),
    (
        "shedder_udp_receive_buffer_errors",
        "counter",
        &[],
        "UDP datagrams dropped in the namespace because a socket's receive buffer was full (Udp RcvbufErrors and Udp6RcvbufErrors).",
    ),
    (
        "shedder_udp_errors",
        "counter",
        &[],
        "UDP datagrams the namespace could not deliver, for any reason (Udp InErrors and Udp6InErrors).",
    ),
    (
        "shedder_listen_overflows",
        "counter",
        &[],
        "Connections dropped because an accept queue was full (TcpExt ListenOverflows).",
    ),
    (
        "shedder_listen_drops",
        "counter",
        &[],
        "All drops at listening sockets (TcpExt ListenDrops).",
    ),
    (
        "shedder_pressure_stall_ratio",
        "gauge",
        &["service", "resource", "kind"],
        "Share of the last tick the service's cgroup stalled on the resource (PSI).",
    ),
    (
        "shedder_pressure_avg10",
        "gauge",
        &["service", "resource", "kind"],
        "The kernel's 10 s PSI average for the service's cgroup, percent.",
    ),
    (
        "shedder_controller_mode",
        "gauge",
        &["service", "mode"],
        "1 for the controller's current mode (normal, shedding, recovering).",
    ),
    (
        "shedder_override",
        "gauge",
        &["service"],
        "1 while a manual limit override is in force.",
    ),
    (
        "shedder_config_last_reload_successful",
        "gauge",
        &[],
        "1 if the last reload of the configuration (SIGHUP or policy apply) was put in force, 0 if it was refused (the configuration before it stays in force).",
    ),
    (
        "shedder_config_last_reload_success_timestamp_seconds",
        "gauge",
        &[],
        "When the configuration in force was last loaded (the start, or a reload that succeeded), in seconds since the Unix epoch.",
    ),
    (
        "shedder_heartbeat_age_seconds",
        "gauge",
        &[],
        "Time since the daemon last stamped the heartbeat.",
    ),
    (
        "shedder_attach_mode",
        "gauge",
        &["interface", "mode"],
        "1 for how each interface is attached (xdp-native, xdp-generic, tc).",
    ),
    (
        "shedder_xdp_tx_errors",
        "counter",
        &["interface"],
        "Frames XDP_TX failed to send (resets that never left), from the driver's statistics, where it reports them.",
    ),
    (
        "shedder_program_run_seconds",
        "counter",
        &["program"],
        "Time the kernel spent running each program (BPF statistics).",
    ),
    (
        "shedder_program_runs",
        "counter",
        &["program"],
        "Runs of each program (BPF statistics).",
    ),
    (
        "shedder_program_ns_per_run",
        "gauge",
        &["program"],
        "Mean cost of one run over the last tick: the cost of saying no.",
    ),
    (
        "shedder_kernel_events",
        "counter",
        &["event"],
        "Exceptional packet-path and tracking events: fallback decisions, fail-open paths (rst_errors, missing_policy, untracked_sockets, pending_miss), token buckets spent by two CPUs at once (rate_contended), suppressed log lines; what the parser dropped by rule (fragments_dropped, ext_chain_dropped, nested_tunnels_dropped) and passed undecided (esp_passed, unknown_header_passed, tunnels_passed, tunnels_unparsed); attempts decided inside tunnels and in fragments.",
    ),
    ("shedder_build", "info", &["version"], "The shedder build."),
    (
        "process_cpu_seconds",
        "counter",
        &[],
        "User and system CPU time the daemon spent, in seconds.",
    ),
    (
        "process_resident_memory_bytes",
        "gauge",
        &[],
        "The daemon's resident memory (VmRSS), in bytes.",
    ),
    (
        "process_virtual_memory_bytes",
        "gauge",
        &[],
        "The daemon's virtual memory (VmSize), in bytes.",
    ),
    (
        "process_open_fds",
        "gauge",
        &[],
        "File descriptors the daemon holds open (maps, programs, links, sockets).",
    ),
    (
        "process_max_fds",
        "gauge",
        &[],
        "The most file descriptors the daemon may hold open (RLIMIT_NOFILE, soft).",
    ),
    (
        "process_start_time_seconds",
        "gauge",
        &[],
        "When the daemon started, in seconds since the Unix epoch.",
    ),
    (
        "shedder_fleet_members",
        "gauge",
        &[],
        "Fleet mode: live members of this node's fleet in etcd (this node included once registered).",
    ),
    (
        "shedder_fleet_standing",
        "gauge",
        &["standing"],
        "Fleet mode: 1 for this node's standing (joining, member, fail-static: etcd unreachable and the last ceilings kept, static: etcd unreachable past fleet.fail_static_ms and the static shares in force).",
    ),
    (
        "shedder_fleet_etcd_up",
        "gauge",
        &[],
        "Fleet mode: 1 when the last exchange with etcd succeeded.",
    ),
    (
        "shedder_fleet_etcd_last_contact_seconds",
        "gauge",
        &[],
        "Fleet mode: seconds since etcd last answered this node (absent: never).",
    ),
    (
        "shedder_fleet_etcd_errors",
        "counter",
        &[],
        "Fleet mode: failed etcd sessions (connection, lease, watch or transaction errors).",
    ),
    (
        "shedder_fleet_global_limit",
        "gauge",
        &["service"],
        "Fleet mode: the downstream's capacity the fleet shares (global_limit, as this node is configured: another member's value is never followed).",
    ),
    (
        "shedder_fleet_global_limit_disagreement",
        "gauge",
        &["service"],
        "Fleet mode: live members that publish another global_limit for the service than this node's (each node keeps its own; make the configurations agree).",
    ),
    (
        "shedder_fleet_records_rejected",
        "counter",
        &["record"],
        "Fleet mode: records under the fleet's prefix ignored whole (record member or departed): not JSON of the expected shape, or naming another node than their key.",
    ),
    (
        "shedder_fleet_record_values_clamped",
        "counter",
        &["field"],
        "Fleet mode: values in other members' records not believed as published and counted within bounds, once per record published (field claim, max_limit, attempts, admitted, established, hold, need, reserve, since, reserved).",
    ),
    (
        "shedder_fleet_share",
        "gauge",
        &["service"],
        "Fleet mode: this node's share of global_limit × safety among the live members (by demand, or equal: fleet.shares), at most its max_limit.",
    ),
    (
        "shedder_fleet_node_demand",
        "gauge",
        &["service", "node"],
        "Fleet mode: each live member's published demand: unique attempts per second, refused ones included (mean over the last 1.5 s).",
    ),
    (
        "shedder_fleet_node_need",
        "gauge",
        &["service", "node"],
        "Fleet mode: the connections each live member's attempts would hold if all were admitted (attempts per second × its measured hold), as far as the member proved them (what its share is computed from).",
    ),
    (
        "shedder_fleet_node_weight",
        "gauge",
        &["service", "node"],
        "Fleet mode: each live member's share as a fraction of the budget the live members divide.",
    ),
    (
        "shedder_fleet_node_share",
        "gauge",
        &["service", "node"],
        "Fleet mode: each live member's share of the budget, as this node computes it from the members' records.",
    ),
    (
        "shedder_fleet_node_claim",
        "gauge",
        &["service", "node"],
        "Fleet mode: each live member's published claim (the most connections it says it may hold).",
    ),
    (
        "shedder_fleet_node_claim_counted",
        "gauge",
        &["service", "node"],
        "Fleet mode: how much of each other member's claim this node counts against the room it raises into (its claim up to the share this node's views granted it; below the claim: a claim not believed).",
    ),
    (
        "shedder_fleet_ceiling",
        "gauge",
        &["service"],
        "Fleet mode: the ceiling in force on this node (its share once the other members' claims leave room for it; the static share without etcd).",
    ),
    (
        "shedder_fleet_claim",
        "gauge",
        &["service"],
        "Fleet mode: what this node published as its claim (the most connections it may hold).",
    ),
    (
        "shedder_fleet_reserved",
        "gauge",
        &["service"],
        "Fleet mode: connections kept free for members whose lease expired without their leaving cleanly (their static shares, until they register again or fleet.reserve_departed_s passes).",
    ),
    (
        "shedder_fleet_departed",
        "gauge",
        &[],
        "Fleet mode: departed members whose static share is reserved.",
    ),
    (
        "shedder_fleet_static_share",
        "gauge",
        &["service"],
        "Fleet mode: the ceiling of a node cut off from etcd, and the cap of the kernel's fallback limit: global_limit × safety / max_nodes.",
    ),
];

/// Every name as it appears in the exposition (counters end in `_total`, histograms have
/// `_bucket`, `_sum`, `_count`, infos `_info`).
pub fn exposed_names() -> Vec<String> {
    let mut out = Vec::new();
    for (name, kind, _, _) in METRICS {
        match *kind {
            "counter" => out.push(format!("{name}_total")),
            "histogram" => {
                for s in ["_bucket", "_sum", "_count"] {
                    out.push(format!("{name}{s}"));
                }
            }
            "info" => out.push(format!("{name}_info")),
            _ => out.push(name.to_string()),
        }
    }
    out
}
