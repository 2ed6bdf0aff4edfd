//! The TOML configuration: parsing with documented defaults, and validation that names the
//! field at fault and checks every value against the map capacities before anything is
//! written.

use std::{
    collections::{BTreeMap, HashMap, HashSet},
    fmt,
    net::IpAddr,
    path::{Path, PathBuf},
};

use serde::Deserialize;
use shedder_common::{CLASS_NAMES, MAX_ADDR_SERVICES, MAX_CLASS_RULES, MAX_SERVICES, NUM_CLASSES};

/// A configuration error: which file, which field, what is wrong.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigError {
    pub file: Option<PathBuf>,
    /// 1-based line of the offending value, when it can be found in the text.
    pub line: Option<usize>,
    /// Dotted path of the offending field, e.g. `service[0].max_limit`.
    pub field: String,
    pub message: String,
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match (&self.file, self.line) {
            (Some(file), Some(line)) => write!(f, "{}:{line}: ", file.display())?,
            (Some(file), None) => write!(f, "{}: ", file.display())?,
            (None, Some(line)) => write!(f, "line {line}: ")?,
            (None, None) => {}
        }
        if self.field.is_empty() {
            write!(f, "{}", self.message)
        } else {
            write!(f, "{}: {}", self.field, self.message)
        }
    }
}

impl std::error::Error for ConfigError {}

fn err(field: impl Into<String>, message: impl Into<String>) -> ConfigError {
    ConfigError {
        file: None,
        line: None,
        field: field.into(),
        message: message.into(),
    }
}

#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct Config {
    #[serde(default)]
    pub daemon: Daemon,
    #[serde(default)]
    pub classes: Classes,
    #[serde(default, rename = "service")]
    pub services: Vec<Service>,
    /// Fleet mode: share each service's `global_limit` with the other nodes registered in
    /// etcd (see [`crate::fleet`]). Absent: every node sheds on its own view.
    pub fleet: Option<Fleet>,
}

/// `[fleet]`: the etcd cluster this node's daemon registers with, and how the fleet shares
/// a downstream's capacity.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct Fleet {
    /// etcd client URLs (`http://host:2379`, or `https://…` with TLS).
    pub endpoints: Vec<String>,
    /// This node's name in the fleet (default: the host name); unique within the fleet.
    pub node: Option<String>,
    /// Every key shedder writes lies under this prefix; fleets sharing an etcd use distinct
    /// prefixes.
    #[serde(default = "defaults::fleet_prefix")]
    pub prefix: String,
    /// A node that stops renewing its etcd lease (it died, or lost etcd) has left the fleet,
    /// and the others' ceilings have risen, within this long of its last renewal. The lease
    /// asked of etcd is one second shorter (see [`Fleet::etcd_lease_ttl`]).
    #[serde(default = "defaults::lease_ttl_s")]
    pub lease_ttl_s: u64,
    /// The fleet shares `global_limit × safety` of each downstream.
    #[serde(default = "defaults::safety")]
    pub safety: f64,
    /// The most nodes this fleet runs: a node cut off from etcd falls back to
    /// `global_limit × safety / max_nodes`, so a fleet that has lost etcd altogether stays
    /// within the global bound.
    pub max_nodes: u32,
    /// How long a node cut off from etcd keeps its last ceiling before it moves to the
    /// static share (default: half the lease TTL). Shorter than the lease TTL, so a
    /// partitioned node has let go of its share before its lease expires and the others
    /// take it.
    pub fail_static_ms: Option<u64>,
    /// etcd request and connection timeout.
    #[serde(default = "defaults::etcd_timeout_ms")]
    pub timeout_ms: u64,
    /// A member whose lease expired (dead, or alive and cut off from etcd, holding its
    /// static share) keeps its static share reserved this long unless it registers again.
    #[serde(default = "defaults::reserve_departed_s")]
    pub reserve_departed_s: u64,
    /// etcd authentication: a user and a file holding its password (first line).
    pub username: Option<String>,
    pub password_file: Option<PathBuf>,
    /// TLS: the CA that signed the etcd servers' certificates, and an optional client
    /// certificate and key (PEM).
    pub ca_file: Option<PathBuf>,
    pub cert_file: Option<PathBuf>,
    pub key_file: Option<PathBuf>,
}

impl Fleet {
    /// The TTL of the lease asked of etcd: `lease_ttl_s` less one second, which covers
    /// etcd's expiry check (every 500 ms), the watch, one transaction and one tick, so the
    /// others have taken a dead node's share within `lease_ttl_s`.
    pub fn etcd_lease_ttl(&self) -> std::time::Duration {
        std::time::Duration::from_secs(self.lease_ttl_s.saturating_sub(1).max(1))
    }

    /// How long this node keeps its last ceiling without etcd.
    pub fn fail_static(&self) -> std::time::Duration {
        std::time::Duration::from_millis(self.fail_static_ms.unwrap_or(self.lease_ttl_s * 1000 / 2))
    }

    /// Whether the client speaks TLS.
    pub fn tls(&self) -> bool {
        self.ca_file.is_some() || self.endpoints.iter().any(|e| e.starts_with("https://"))
    }
}

#[derive(Debug, Clone, Copy, Deserialize, PartialEq, Eq, Default)]
#[serde(rename_all = "lowercase")]
pub enum Attach {
    /// Native XDP, generic XDP where the driver has none; on a veth with `rst`, TC (see
    /// [`crate::kernel::netdev::choose`]).
    #[default]
    Auto,
    /// Native (driver) XDP only.
    Native,
    /// Generic (skb) XDP only.
    Generic,
    /// TC ingress (tcx, Linux 6.6+).
    Tc,
}

impl Attach {
    pub fn parse(s: &str) -> Option<Self> {
        Some(match s {
            "auto" => Self::Auto,
            "native" => Self::Native,
            "generic" => Self::Generic,
            "tc" => Self::Tc,
            _ => return None,
        })
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Self::Auto => "auto",
            Self::Native => "native",
            Self::Generic => "generic",
            Self::Tc => "tc",
        }
    }
}

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
    /// Detach and remove the pins when the daemon stops (SIGTERM/SIGINT). With `false` the
    /// programs stay attached and the fallback limits take over after the heartbeat timeout.
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
        }
    }
}

/// One rung of the criticality ladder.
#[derive(Debug, Clone, Deserialize, PartialEq, Default)]
#[serde(deny_unknown_fields)]
pub struct Class {
    /// Source prefixes (CIDR) in this class.
    #[serde(default)]
    pub sources: Vec<String>,
    /// Fraction of the service limit this class keeps under overload (not for critical).
    pub floor: Option<f64>,
    /// Fraction of the service's max_limit this class may never exceed.
    pub ceiling: Option<f64>,
}

#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct Classes {
    #[serde(default = "defaults::critical")]
    pub critical: Class,
    #[serde(default)]
    pub high: Class,
    #[serde(default)]
    pub medium: Class,
    #[serde(default)]
    pub sheddable: Class,
}

impl Default for Classes {
    fn default() -> Self {
        Self {
            critical: defaults::critical(),
            high: Class::default(),
            medium: Class::default(),
            sheddable: Class::default(),
        }
    }
}

impl Classes {
    pub fn by_id(&self) -> [&Class; NUM_CLASSES] {
        [&self.critical, &self.high, &self.medium, &self.sheddable]
    }
}

#[derive(Debug, Clone, Copy, Deserialize, PartialEq, Eq, Default)]
#[serde(rename_all = "lowercase")]
pub enum ClassName {
    Critical,
    High,
    #[default]
    Medium,
    Sheddable,
}

impl ClassName {
    pub fn id(self) -> u32 {
        match self {
            Self::Critical => 0,
            Self::High => 1,
            Self::Medium => 2,
            Self::Sheddable => 3,
        }
    }
}

#[derive(Debug, Clone, Copy, Deserialize, PartialEq, Eq, Default)]
#[serde(rename_all = "lowercase")]
pub enum Controller {
    #[default]
    Aimd,
    Gradient2,
    Fixed,
}

#[derive(Debug, Clone, Copy, Deserialize, PartialEq, Eq, Default)]
#[serde(rename_all = "lowercase")]
pub enum Action {
    /// Answer RST|ACK: the client fails at once.
    #[default]
    Rst,
    /// Drop the SYN: the client's kernel retransmits it after about a second.
    Drop,
}

#[derive(Debug, Clone, Copy, Deserialize, PartialEq, Eq, Default)]
#[serde(rename_all = "kebab-case")]
pub enum Mode {
    #[default]
    Enforce,
    /// Count what would be shed; shed nothing.
    DryRun,
}

/// A token bucket for new connections of one class.
#[derive(Debug, Clone, Copy, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct Rate {
    pub per_second: u64,
    pub burst: u64,
}

#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct Service {
    pub name: String,
    pub ports: Vec<u16>,
    /// Destination addresses the service listens on; empty = any address.
    #[serde(default)]
    pub addresses: Vec<IpAddr>,
    #[serde(default)]
    pub default_class: ClassName,
    /// cgroup of the service, relative to the cgroup v2 mount.
    pub cgroup: Option<String>,
    #[serde(default = "defaults::target_latency_ms")]
    pub target_latency_ms: u64,
    #[serde(default)]
    pub controller: Controller,
    #[serde(default = "defaults::min_limit")]
    pub min_limit: u32,
    /// Hard ceiling of the service's concurrency limit.
    #[serde(default = "defaults::max_limit")]
    pub max_limit: u32,
    /// Limit in force when the daemon's heartbeat is stale.
    #[serde(default = "defaults::fallback_limit")]
    pub fallback_limit: u32,
    /// The limit of the `fixed` controller (default: fallback_limit).
    pub fixed_limit: Option<u32>,
    /// Expected request rate; when set, the hard ceiling is also bounded by Little's law:
    /// `target_rps × target_latency × 1.5` (seed 000 R1).
    pub target_rps: Option<f64>,
    #[serde(default)]
    pub action: Action,
    #[serde(default)]
    pub mode: Mode,
    /// Optional per-class new-connection rates, keyed by class name.
    #[serde(default)]
    pub rate: BTreeMap<String, Rate>,
    /// A new attempt from a source this service shed within this many milliseconds is a
    /// retry (counted by class; see `demote_retries`). 0 disables retry recognition.
    #[serde(default = "defaults::retry_window_ms")]
    pub retry_window_ms: u64,
    /// Decide retries one class lower (CRITICAL → HIGH → MEDIUM → SHEDDABLE; SHEDDABLE
    /// stays), so under load first attempts win (seed 001). Default true; `None` when the
    /// file does not set it (see [`Service::demotes_retries`]).
    #[serde(default)]
    pub demote_retries: Option<bool>,
    /// Fleet mode: the downstream's capacity in connections, shared by every node of the
    /// fleet that protects a service of this name (needs `[fleet]`).
    pub global_limit: Option<u32>,
}

impl Service {
    /// Whether retries are decided one class lower: as configured, default true; never
    /// while retry recognition is off (`retry_window_ms = 0`).
    pub fn demotes_retries(&self) -> bool {
        self.retry_window_ms > 0 && self.demote_retries.unwrap_or(true)
    }
}

pub mod defaults {
    use std::path::PathBuf;

    use super::Class;

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
    pub const PIN_DIR: &str = "/sys/fs/bpf/shedder";
    pub fn pin_dir() -> PathBuf {
        PIN_DIR.into()
    }
    pub fn signal_window_ms() -> u64 {
        1000
    }
    pub fn fail_static() -> bool {
        true
    }
    pub fn detach_on_exit() -> bool {
        true
    }
    pub fn syn_retransmit_window_ms() -> u64 {
        30_000
    }
    pub fn retry_window_ms() -> u64 {
        10_000
    }
    pub fn critical() -> Class {
        Class {
            sources: Vec::new(),
            floor: None,
            ceiling: Some(0.05),
        }
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
}

/// Largest concurrency limit accepted: far above any real service, far below overflow.
pub const LIMIT_CEILING: u32 = 1 << 24;

/// Longest `daemon.syn_retransmit_window_ms`: ten minutes, well past the last SYN a Linux
/// client retransmits (63 s after the first with the default `tcp_syn_retries` of 6).
pub const MAX_SYN_RETRANSMIT_WINDOW_MS: u64 = 600_000;

/// Longest `retry_window_ms` of a service: an hour. The kernel holds the window in 32-bit
/// jiffies: an hour is 3.6 million at HZ 1000, far below `u32::MAX`.
pub const MAX_RETRY_WINDOW_MS: u64 = 3_600_000;

/// The line (1-based) where the value a validation error names lies in the TOML text: the
/// key's line inside its section (`[daemon]`, the n-th `[[service]]`, `[classes]` or
/// `[classes.<name>]`), else the section's header. `None` when the field is not in the text
/// (a default).
fn locate(text: &str, field: &str) -> Option<usize> {
    let lines: Vec<&str> = text.lines().collect();
    let header = |pred: &dyn Fn(&str) -> bool, nth: usize| {
        lines
            .iter()
            .enumerate()
            .filter(|(_, l)| pred(l.trim()))
            .nth(nth)
            .map(|(i, _)| i)
    };
    let key_in = |start: usize, key: &str| {
        lines[start + 1..]
            .iter()
            .take_while(|l| !l.trim_start().starts_with('['))
            .position(|l| {
                l.trim_start()
                    .strip_prefix(key)
                    .is_some_and(|r| r.trim_start().starts_with('='))
            })
            .map(|i| start + 1 + i)
    };
    // The first path component after the section, without any `[index]`.
    let first = |rest: &str| rest.split(['.', '[']).next().unwrap_or("").to_string();
    let found = if let Some(rest) = field.strip_prefix("service[") {
        let n: usize = rest.split(']').next()?.parse().ok()?;
        let start = header(&|l| l == "[[service]]", n)?;
        let key = rest.split_once(").").map_or_else(
            || {
                rest.split_once("].")
                    .map(|(_, k)| first(k))
                    .unwrap_or_default()
            },
            |(_, k)| first(k),
        );
        key_in(start, &key).or(Some(start))
    } else if let Some(rest) = field.strip_prefix("daemon.") {
        let start = header(&|l| l == "[daemon]", 0)?;
        key_in(start, &first(rest)).or(Some(start))
    } else if let Some(rest) = field.strip_prefix("classes.") {
        let class = first(rest);
        let key = rest
            .split_once('.')
            .map(|(_, k)| first(k))
            .unwrap_or_default();
        match header(&|l| l == format!("[classes.{class}]"), 0) {
            Some(start) => key_in(start, &key).or(Some(start)),
            None => {
                let start = header(&|l| l == "[classes]", 0)?;
                key_in(start, &class).or(Some(start))
            }
        }
    } else if let Some(rest) = field.strip_prefix("fleet.") {
        let start = header(&|l| l == "[fleet]", 0)?;
        key_in(start, &first(rest)).or(Some(start))
    } else if field == "classes" {
        header(&|l| l == "[classes]", 0)
    } else if field == "service" {
        header(&|l| l == "[[service]]", 0)
    } else {
        None
    };
    found.map(|i| i + 1)
}

/// A refusal by the deserializer (a wrong type, an unknown key or value, an integer out of
/// range) as a [`ConfigError`] like the validation's: the key path (`service[0] (checkout)
/// .ports[1]`) as the field, and serde's message in the file's terms, saying what is allowed
/// (`an integer in 0..=65535` rather than `u16`).
fn shape_error(text: &str, path: &serde_path_to_error::Path, message: &str) -> ConfigError {
    use fmt::Write as _;
    use serde_path_to_error::Segment;
    let segments: Vec<&Segment> = path.iter().collect();
    let mut field = String::new();
    for (i, segment) in segments.iter().enumerate() {
        match segment {
            Segment::Seq { index } => {
                let _ = write!(field, "[{index}]");
                // A service is named as the validation names it, when its name is usable.
                if i == 1
                    && field.starts_with("service[")
                    && !matches!(segments.get(2), Some(Segment::Map { key }) if key == "name")
                    && let Some(name) = service_name(text, *index)
                {
                    let _ = write!(field, " ({name})");
                }
            }
            other => {
                if !field.is_empty() {
                    field.push('.');
                }
                let _ = write!(field, "{other}");
            }
        }
    }
    let key = segments.last().map(|s| s.to_string()).unwrap_or_default();
    let message = if let Some(rest) = message.strip_prefix("missing field `") {
        // The path is the table's; the key it lacks is in the message.
        if !field.is_empty() {
            field.push('.');
        }
        field.push_str(rest.trim_end_matches('`'));
        "missing (this key has no default)".to_string()
    } else if let Some(rest) = message.strip_prefix("unknown field `") {
        // The path ends with the unknown key already.
        let known = rest.split_once("`, ").map_or("", |(_, k)| k);
        format!("unknown key, {known}")
    } else if let Some(rest) = message.strip_prefix("unknown variant ") {
        format!("unknown value {rest}")
    } else if message == "wanted string or table" {
        // toml's refusal of a number or array where an enum's name belongs.
        match enum_values(&key) {
            Some(values) => format!("not a string, expected {values}"),
            None => "expected a string".to_string(),
        }
    } else if message == "invalid IP address syntax" {
        match value_at(text, &segments) {
            Some(toml::Value::String(v)) => {
                format!("`{v}` is not an IP address (e.g. 198.18.0.10 or 2001:db8::10)")
            }
            _ => "not an IP address (e.g. 198.18.0.10 or 2001:db8::10)".to_string(),
        }
    } else {
        let (what, expected) = message.rsplit_once(", expected ").unwrap_or((message, ""));
        let what = what
            .replace("invalid type: sequence", "invalid type: array")
            .replace("invalid type: map", "invalid type: table");
        // An integer beyond i64 reaches serde as an i128: out of range, not of another type.
        let what = match what.strip_suffix(" as i128") {
            Some(w) => w.replace("invalid type: integer", "invalid value: integer"),
            None => what,
        };
        match expected {
            "" => what,
            "u16" => format!("{what}, expected an integer in 0..={}", u16::MAX),
            "u32" => format!("{what}, expected an integer in 0..={}", u32::MAX),
            "u64" => format!("{what}, expected a non-negative integer"),
            "f64" => format!("{what}, expected a number"),
            "a sequence" => format!("{what}, expected an array"),
            "a map" => format!("{what}, expected a table"),
            "IP address" => format!("{what}, expected an IP address (e.g. 198.18.0.10)"),
            "path string" => format!("{what}, expected a path (a string)"),
            e if e.starts_with("struct ") => format!("{what}, expected a table"),
            e => format!("{what}, expected {e}"),
        }
    };
    err(field, message)
}

/// A key or table defined twice: a syntax error to toml, but one about a key, so it is
/// named like the others, the table it is in found from the headers above it.
fn duplicate_key(text: &str, span: std::ops::Range<usize>) -> ConfigError {
    let key = text.get(span.clone()).unwrap_or("");
    let start = text[..span.start].rfind('\n').map_or(0, |i| i + 1);
    let line = text[start..].lines().next().unwrap_or("").trim();
    // The table a header names, `[[x]]` as `x[n]` (counted when `count`: headers above).
    let mut arrays: HashMap<String, usize> = HashMap::new();
    let mut table_of = |header: &str, count: bool| -> Option<String> {
        if let Some(name) = header.strip_prefix("[[") {
            let name = name.split("]]").next()?.trim();
            let n = arrays.entry(name.to_string()).or_default();
            if count {
                *n += 1;
            }
            return Some(format!("{name}[{}]", n.saturating_sub(1)));
        }
        let name = header.strip_prefix('[')?.split(']').next()?.trim();
        // `[service.rate.high]` belongs to the last `[[service]]`.
        let (first, rest) = name.split_once('.').unwrap_or((name, ""));
        Some(match arrays.get(first) {
            Some(n) if !rest.is_empty() => format!("{first}[{}].{rest}", n.saturating_sub(1)),
            _ => name.to_string(),
        })
    };
    let mut table = None;
    for l in text[..start].lines() {
        if let Some(t) = table_of(l.trim(), true) {
            table = Some(t);
        }
    }
    if line.starts_with('[') {
        return err(
            table_of(line, false).unwrap_or_default(),
            "this table is already defined above",
        );
    }
    let at_line_start = line
        .strip_prefix(key)
        .is_some_and(|r| r.trim_start().starts_with(['=', '.']));
    match table {
        // A key inside an inline table has a path the headers do not tell.
        _ if !at_line_start => err("", format!("duplicate key `{key}`")),
        Some(t) => err(format!("{t}.{key}"), "this key is already set above"),
        None => err(key, "this key is already set above"),
    }
}

/// The names an enum-valued key takes, as serde lists them for an unknown one
/// (e.g. "`rst` or `drop`").
fn enum_values(key: &str) -> Option<String> {
    fn of<'de, T: Deserialize<'de>>() -> Option<String> {
        let de = serde::de::value::StrDeserializer::<serde::de::value::Error>::new("");
        let e = T::deserialize(de).err()?.to_string();
        e.split_once(", expected ").map(|(_, v)| v.to_string())
    }
    match key {
        "attach" => of::<Attach>(),
        "default_class" => of::<ClassName>(),
        "controller" => of::<Controller>(),
        "action" => of::<Action>(),
        "mode" => of::<Mode>(),
        _ => None,
    }
}

/// The value at a deserializer's path in the text, read again without the types.
fn value_at(text: &str, path: &[&serde_path_to_error::Segment]) -> Option<toml::Value> {
    use serde_path_to_error::Segment;
    let mut value = toml::Value::Table(text.parse().ok()?);
    for segment in path {
        value = match segment {
            Segment::Seq { index } => value.as_array()?.get(*index)?.clone(),
            Segment::Map { key } | Segment::Enum { variant: key } => value.get(key)?.clone(),
            Segment::Unknown => return None,
        };
    }
    Some(value)
}

/// The name of the `index`-th `[[service]]` as written, when it is a valid name.
fn service_name(text: &str, index: usize) -> Option<String> {
    let table: toml::Table = text.parse().ok()?;
    let name = table.get("service")?.get(index)?.get("name")?.as_str()?;
    valid_name(name).then(|| name.to_string())
}

/// A name that can be a metric label or an etcd key component: 1 to 64 characters from
/// `[A-Za-z0-9._-]`.
fn valid_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 64
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_' || c == '.')
}

/// A parsed IP prefix.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Prefix {
    pub addr: IpAddr,
    pub len: u32,
}

impl Prefix {
    pub fn parse(s: &str) -> Result<Self, String> {
        let (addr, len) = match s.split_once('/') {
            Some((a, l)) => (a, Some(l)),
            None => (s, None),
        };
        let addr: IpAddr = addr
            .trim()
            .parse()
            .map_err(|_| format!("`{s}` is not an IP prefix (expected e.g. 198.18.10.0/24)"))?;
        let max = if addr.is_ipv4() { 32 } else { 128 };
        let len = match len {
            Some(l) => l
                .trim()
                .parse::<u32>()
                .ok()
                .filter(|&l| l <= max)
                .ok_or_else(|| format!("`{s}`: prefix length must be 0..={max}"))?,
            None => max,
        };
        // Host bits must be zero: `198.18.10.1/24` is almost always a typo.
        let masked = mask(addr, len);
        if masked != addr {
            return Err(format!(
                "`{s}` has host bits set (did you mean {masked}/{len}?)"
            ));
        }
        Ok(Self { addr, len })
    }
}

fn mask(addr: IpAddr, len: u32) -> IpAddr {
    match addr {
        IpAddr::V4(a) => {
            let m = if len == 0 { 0 } else { u32::MAX << (32 - len) };
            IpAddr::V4((u32::from(a) & m).into())
        }
        IpAddr::V6(a) => {
            let m = if len == 0 {
                0
            } else {
                u128::MAX << (128 - len)
            };
            IpAddr::V6((u128::from(a) & m).into())
        }
    }
}

impl fmt::Display for Prefix {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.addr, self.len)
    }
}

impl Config {
    /// Parse and validate a configuration file.
    pub fn load(path: &Path) -> Result<Self, ConfigError> {
        let with_file = |mut e: ConfigError| {
            e.file = Some(path.to_path_buf());
            e
        };
        let text = std::fs::read_to_string(path)
            .map_err(|e| with_file(err("", format!("cannot read: {e}"))))?;
        Self::parse(&text).map_err(with_file)
    }

    /// Parse and validate configuration text.
    pub fn parse(text: &str) -> Result<Self, ConfigError> {
        let line_of =
            |e: &toml::de::Error| e.span().map(|s| text[..s.start].matches('\n').count() + 1);
        // Syntax first (no key to name), then the shape, with the path of the key at fault.
        let de = toml::Deserializer::parse(text).map_err(|e| {
            let mut error = match e.span() {
                Some(span) if e.message() == "duplicate key" => duplicate_key(text, span),
                _ => err("", e.message().to_string()),
            };
            error.line = line_of(&e);
            error
        })?;
        let cfg: Config = serde_path_to_error::deserialize(de).map_err(|e| {
            let path = e.path().clone();
            let e = e.into_inner();
            let mut error = shape_error(text, &path, e.message());
            error.line = line_of(&e).or_else(|| locate(text, &error.field));
            error
        })?;
        cfg.validate().map_err(|mut e| {
            e.line = locate(text, &e.field);
            e
        })?;
        Ok(cfg)
    }

    /// Whether the daemon would refuse attempts at all: some interface to attach to and
    /// some service that enforces (not dry-run).
    pub fn enforces(&self) -> bool {
        !self.daemon.interfaces.is_empty() && self.services.iter().any(|s| s.mode == Mode::Enforce)
    }

    /// Whether some enforcing service answers refused attempts with a reset, which the
    /// packet path sends back out of the interface (XDP_TX, or a TC redirect).
    pub fn sends_replies(&self) -> bool {
        self.services
            .iter()
            .any(|s| s.action == Action::Rst && s.mode == Mode::Enforce)
    }

    /// Check every value; the first problem is returned.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let d = &self.daemon;
        if d.tick_ms < 10 || d.tick_ms > 60_000 {
            return Err(err(
                "daemon.tick_ms",
                format!("{} is outside 10..=60000", d.tick_ms),
            ));
        }
        if d.heartbeat_timeout_ms < 2 * d.tick_ms {
            return Err(err(
                "daemon.heartbeat_timeout_ms",
                format!(
                    "{} must be at least twice tick_ms ({}), or every late tick drops to the fallback limits",
                    d.heartbeat_timeout_ms, d.tick_ms
                ),
            ));
        }
        if d.signal_window_ms < d.tick_ms || d.signal_window_ms > 60_000 {
            return Err(err(
                "daemon.signal_window_ms",
                format!(
                    "{} must be between tick_ms ({}) and 60000",
                    d.signal_window_ms, d.tick_ms
                ),
            ));
        }
        if d.heartbeat_timeout_ms > 3_600_000 {
            return Err(err(
                "daemon.heartbeat_timeout_ms",
                format!("{} is longer than an hour", d.heartbeat_timeout_ms),
            ));
        }
        if d.metrics_listen.parse::<std::net::SocketAddr>().is_err() {
            return Err(err(
                "daemon.metrics_listen",
                format!(
                    "`{}` is not an address:port (e.g. 127.0.0.1:9464)",
                    d.metrics_listen
                ),
            ));
        }
        if let Some(g) = &d.control_group
            && (g.is_empty() || g.contains(['/', ':', ' ']))
        {
            return Err(err(
                "daemon.control_group",
                format!("`{g}` is not a group name"),
            ));
        }
        if d.syn_retransmit_window_ms > MAX_SYN_RETRANSMIT_WINDOW_MS {
            return Err(err(
                "daemon.syn_retransmit_window_ms",
                format!(
                    "{} is outside 0..={MAX_SYN_RETRANSMIT_WINDOW_MS} (0 disables retransmit recognition)",
                    d.syn_retransmit_window_ms
                ),
            ));
        }
        for (i, iface) in d.interfaces.iter().enumerate() {
            if iface.is_empty() || iface.len() > 15 || iface.contains('/') {
                return Err(err(
                    format!("daemon.interfaces[{i}]"),
                    format!("`{iface}` is not a valid interface name"),
                ));
            }
        }
        self.validate_classes()?;
        self.validate_services()?;
        self.validate_fleet()?;
        // Last: a file with a mistake elsewhere hears of that mistake first.
        self.validate_measure_only()
    }

    /// A file without interfaces would shed nothing: refused unless it says so.
    fn validate_measure_only(&self) -> Result<(), ConfigError> {
        let d = &self.daemon;
        match (d.measure_only, d.interfaces.is_empty()) {
            (false, true) => Err(err(
                "daemon.interfaces",
                "no interface is listed, so nothing would be shed; list the interfaces that \
                 receive the services' traffic (e.g. interfaces = [\"eth0\"]), or set \
                 daemon.measure_only = true to measure, run the controllers and serve status \
                 and metrics without shedding",
            )),
            (true, false) => Err(err(
                "daemon.measure_only",
                format!(
                    "true attaches to no interface, but daemon.interfaces lists {:?}; remove \
                     measure_only to shed on them, or the interfaces to measure only",
                    d.interfaces
                ),
            )),
            _ => Ok(()),
        }
    }

    fn validate_fleet(&self) -> Result<(), ConfigError> {
        let Some(f) = &self.fleet else {
            if let Some((i, s)) = self
                .services
                .iter()
                .enumerate()
                .find(|(_, s)| s.global_limit.is_some())
            {
                return Err(err(
                    format!("service[{i}] ({}).global_limit", s.name),
                    "needs a [fleet] section (the etcd cluster the fleet shares it through)",
                ));
            }
            return Ok(());
        };
        if f.endpoints.is_empty() {
            return Err(err(
                "fleet.endpoints",
                "at least one etcd endpoint is needed",
            ));
        }
        for (i, e) in f.endpoints.iter().enumerate() {
            let rest = e
                .strip_prefix("http://")
                .or_else(|| e.strip_prefix("https://"));
            if rest.is_none_or(|r| r.is_empty() || r.contains('/')) {
                return Err(err(
                    format!("fleet.endpoints[{i}]"),
                    format!(
                        "`{e}` is not an etcd client URL (http://host:port or https://host:port)"
                    ),
                ));
            }
        }
        if let Some(n) = &f.node
            && !valid_name(n)
        {
            return Err(err(
                "fleet.node",
                format!("`{n}`: use 1 to 64 characters from [A-Za-z0-9._-]"),
            ));
        }
        if !f.prefix.starts_with('/')
            || f.prefix.len() < 2
            || f.prefix.ends_with('/')
            || f.prefix.contains(char::is_whitespace)
        {
            return Err(err(
                "fleet.prefix",
                format!(
                    "`{}` must start with `/`, not end with one, and hold no spaces",
                    f.prefix
                ),
            ));
        }
        if !(3..=300).contains(&f.lease_ttl_s) {
            return Err(err(
                "fleet.lease_ttl_s",
                format!("{} is outside 3..=300", f.lease_ttl_s),
            ));
        }
        if !(f.safety > 0.0 && f.safety <= 1.0) {
            return Err(err(
                "fleet.safety",
                format!("{} is outside (0, 1]", f.safety),
            ));
        }
        if !(1..=100_000).contains(&f.max_nodes) {
            return Err(err(
                "fleet.max_nodes",
                format!("{} is outside 1..=100000", f.max_nodes),
            ));
        }
        let fail_static = f.fail_static().as_millis() as u64;
        let lease_ms = f.etcd_lease_ttl().as_millis() as u64;
        if fail_static < self.daemon.tick_ms || fail_static >= lease_ms {
            return Err(err(
                "fleet.fail_static_ms",
                format!(
                    "{fail_static} must be at least tick_ms ({}) and below the etcd lease \
                     (lease_ttl_s less 1 s: {lease_ms} ms): a partitioned node must let go of \
                     its share before its lease expires",
                    self.daemon.tick_ms,
                ),
            ));
        }
        if f.reserve_departed_s < f.lease_ttl_s || f.reserve_departed_s > 30 * 86_400 {
            return Err(err(
                "fleet.reserve_departed_s",
                format!(
                    "{} is outside lease_ttl_s ({})..=2592000 (30 days)",
                    f.reserve_departed_s, f.lease_ttl_s
                ),
            ));
        }
        if self.daemon.heartbeat_timeout_ms >= lease_ms {
            return Err(err(
                "daemon.heartbeat_timeout_ms",
                format!(
                    "{} must be below the etcd lease (fleet.lease_ttl_s less 1 s: {lease_ms} ms) in \
                     fleet mode: a node whose daemon died must be on its fallback limit (its static \
                     share) before its lease expires and the others take its share",
                    self.daemon.heartbeat_timeout_ms
                ),
            ));
        }
        if !(100..=60_000).contains(&f.timeout_ms) {
            return Err(err(
                "fleet.timeout_ms",
                format!("{} is outside 100..=60000", f.timeout_ms),
            ));
        }
        if f.username.is_some() != f.password_file.is_some() {
            return Err(err(
                if f.username.is_some() {
                    "fleet.password_file"
                } else {
                    "fleet.username"
                },
                "etcd authentication needs both username and password_file",
            ));
        }
        if f.cert_file.is_some() != f.key_file.is_some() {
            return Err(err(
                if f.cert_file.is_some() {
                    "fleet.key_file"
                } else {
                    "fleet.cert_file"
                },
                "a client certificate needs both cert_file and key_file",
            ));
        }
        if (f.cert_file.is_some() || f.ca_file.is_some())
            && f.endpoints.iter().any(|e| e.starts_with("http://"))
        {
            return Err(err(
                "fleet.endpoints",
                "TLS files are set but an endpoint is http://; use https:// endpoints",
            ));
        }
        for (i, s) in self.services.iter().enumerate() {
            if let Some(g) = s.global_limit
                && (g == 0 || g > LIMIT_CEILING)
            {
                return Err(err(
                    format!("service[{i}] ({}).global_limit", s.name),
                    format!("{g} is outside 1..={LIMIT_CEILING}"),
                ));
            }
        }
        Ok(())
    }

    fn validate_classes(&self) -> Result<(), ConfigError> {
        let mut seen: HashMap<Prefix, &str> = HashMap::new();
        let (mut v4, mut v6) = (0u32, 0u32);
        let mut floors = 0.0;
        for (id, class) in self.classes.by_id().into_iter().enumerate() {
            let name = CLASS_NAMES[id];
            let field = |f: &str| format!("classes.{name}.{f}");
            if id == 0 {
                if class.floor.is_some() {
                    return Err(err(
                        field("floor"),
                        "critical is never shed by pressure, so it has no floor; bound it with `ceiling`",
                    ));
                }
                match class.ceiling {
                    Some(c) if c > 0.0 && c <= 1.0 => {}
                    Some(c) => {
                        return Err(err(field("ceiling"), format!("{c} is outside (0, 1]")));
                    }
                    None => {
                        return Err(err(
                            field("ceiling"),
                            "critical needs a finite ceiling (seed 000 R4: unsheddable, not unbounded)",
                        ));
                    }
                }
            } else {
                if let Some(f) = class.floor {
                    if !(0.0..=1.0).contains(&f) {
                        return Err(err(field("floor"), format!("{f} is outside [0, 1]")));
                    }
                    floors += f;
                }
                if let Some(c) = class.ceiling
                    && !(c > 0.0 && c <= 1.0)
                {
                    return Err(err(field("ceiling"), format!("{c} is outside (0, 1]")));
                }
                if let (Some(f), Some(c)) = (class.floor, class.ceiling)
                    && f > c
                {
                    return Err(err(
                        field("floor"),
                        format!("floor {f} is above the class ceiling {c}"),
                    ));
                }
            }
            for (i, s) in class.sources.iter().enumerate() {
                let p =
                    Prefix::parse(s).map_err(|m| err(format!("{}[{i}]", field("sources")), m))?;
                if let Some(other) = seen.insert(p, name) {
                    return Err(err(
                        format!("{}[{i}]", field("sources")),
                        format!("{p} is already listed under classes.{other}"),
                    ));
                }
                if p.addr.is_ipv4() {
                    v4 += 1;
                } else {
                    v6 += 1;
                }
            }
        }
        if floors > 1.0 + 1e-9 {
            return Err(err(
                "classes",
                format!("the floors add up to {floors:.2}, more than the whole limit"),
            ));
        }
        for (family, n) in [("IPv4", v4), ("IPv6", v6)] {
            if n > MAX_CLASS_RULES {
                return Err(err(
                    "classes",
                    format!("{n} {family} source prefixes; the class map holds {MAX_CLASS_RULES}"),
                ));
            }
        }
        Ok(())
    }

    fn validate_services(&self) -> Result<(), ConfigError> {
        if self.services.len() > MAX_SERVICES as usize {
            return Err(err(
                "service",
                format!(
                    "{} services; the maps hold {MAX_SERVICES}",
                    self.services.len()
                ),
            ));
        }
        let mut names = HashSet::new();
        // (address or None for any, port) → service name
        let mut bound: HashMap<(Option<IpAddr>, u16), &str> = HashMap::new();
        let mut addr_entries = 0u32;
        for (i, s) in self.services.iter().enumerate() {
            let field = |f: &str| format!("service[{i}].{f}");
            if !valid_name(&s.name) {
                return Err(err(
                    field("name"),
                    format!(
                        "`{}`: use 1 to 64 characters from [A-Za-z0-9._-] (it becomes a metric label)",
                        s.name
                    ),
                ));
            }
            let field = |f: &str| format!("service[{i}] ({}).{f}", s.name);
            if !names.insert(s.name.as_str()) {
                return Err(err(field("name"), "another service has this name"));
            }
            if s.ports.is_empty() {
                return Err(err(field("ports"), "at least one port is needed"));
            }
            for (j, &port) in s.ports.iter().enumerate() {
                if port == 0 {
                    return Err(err(
                        format!("{}[{j}]", field("ports")),
                        "port 0 is not a port",
                    ));
                }
                let targets: Vec<Option<IpAddr>> = if s.addresses.is_empty() {
                    vec![None]
                } else {
                    s.addresses.iter().copied().map(Some).collect()
                };
                for t in targets {
                    if let Some(other) = bound.insert((t, port), &s.name) {
                        let at = t.map_or("any address".to_string(), |a| a.to_string());
                        return Err(err(
                            format!("{}[{j}]", field("ports")),
                            format!(
                                "port {port} on {at} is already protected by service `{other}`"
                            ),
                        ));
                    }
                    if t.is_some() {
                        addr_entries += 1;
                    }
                }
            }
            if s.min_limit == 0 {
                return Err(err(
                    field("min_limit"),
                    "must be at least 1, so some traffic always flows and the controller can learn",
                ));
            }
            if s.max_limit > LIMIT_CEILING {
                return Err(err(
                    field("max_limit"),
                    format!("{} is above the supported {LIMIT_CEILING}", s.max_limit),
                ));
            }
            if s.max_limit < s.min_limit {
                return Err(err(
                    field("max_limit"),
                    format!("{} is below min_limit ({})", s.max_limit, s.min_limit),
                ));
            }
            if s.fallback_limit < s.min_limit || s.fallback_limit > s.max_limit {
                return Err(err(
                    field("fallback_limit"),
                    format!(
                        "{} is outside [min_limit, max_limit] = [{}, {}]",
                        s.fallback_limit, s.min_limit, s.max_limit
                    ),
                ));
            }
            if let Some(f) = s.fixed_limit
                && (f < s.min_limit || f > s.max_limit)
            {
                return Err(err(
                    field("fixed_limit"),
                    format!(
                        "{f} is outside [min_limit, max_limit] = [{}, {}]",
                        s.min_limit, s.max_limit
                    ),
                ));
            }
            if let Some(r) = s.target_rps
                && !(r > 0.0 && r.is_finite())
            {
                return Err(err(
                    field("target_rps"),
                    format!("{r} must be a positive number"),
                ));
            }
            if s.target_latency_ms == 0 || s.target_latency_ms > 600_000 {
                return Err(err(
                    field("target_latency_ms"),
                    format!("{} is outside 1..=600000", s.target_latency_ms),
                ));
            }
            if let Some(cg) = &s.cgroup
                && (cg.is_empty() || cg.split('/').any(|c| c == ".."))
            {
                return Err(err(
                    field("cgroup"),
                    format!("`{cg}` must be a path relative to the cgroup v2 mount, without `..`"),
                ));
            }
            if s.retry_window_ms > MAX_RETRY_WINDOW_MS {
                return Err(err(
                    field("retry_window_ms"),
                    format!(
                        "{} is outside 0..={MAX_RETRY_WINDOW_MS} (0 disables retry recognition)",
                        s.retry_window_ms
                    ),
                ));
            }
            if s.retry_window_ms == 0 && s.demote_retries == Some(true) {
                return Err(err(
                    field("demote_retries"),
                    "true has no effect with retry_window_ms = 0 (no attempt is recognised as a retry); \
                     give retry_window_ms a window or remove demote_retries",
                ));
            }
            for (class, rate) in &s.rate {
                let f = format!("{}.{class}", field("rate"));
                if !CLASS_NAMES.contains(&class.as_str()) {
                    return Err(err(f, format!("unknown class; use one of {CLASS_NAMES:?}")));
                }
                if shedder_common::gcra::BucketParams::new(rate.per_second, rate.burst).is_none() {
                    return Err(err(
                        f,
                        format!(
                            "per_second must be 1..=1e9 and burst at least 1 (got {} and {})",
                            rate.per_second, rate.burst
                        ),
                    ));
                }
            }
        }
        if addr_entries > MAX_ADDR_SERVICES {
            return Err(err(
                "service",
                format!(
                    "{addr_entries} (address, port) pairs; the address map holds {MAX_ADDR_SERVICES}"
                ),
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const EXAMPLE: &str = r#"
[daemon]
interfaces = ["eth0"]
attach = "auto"
metrics_listen = "127.0.0.1:9464"
control_socket = "/run/shedder/shedder.sock"
tick_ms = 200
heartbeat_timeout_ms = 3000

[classes]
critical  = { sources = ["198.18.10.0/24"], ceiling = 0.05 }
high      = { sources = ["198.18.20.0/24"], floor = 0.60 }
medium    = { sources = [], floor = 0.05 }
sheddable = { sources = ["198.18.99.0/24", "2001:db8:99::/48"], floor = 0.0 }

[[service]]
name = "checkout"
ports = [8080]
default_class = "medium"
cgroup = "system.slice/haproxy.service"
target_latency_ms = 200
controller = "aimd"
min_limit = 8
max_limit = 4000
fallback_limit = 256
action = "rst"
mode = "enforce"
rate = { sheddable = { per_second = 200, burst = 400 } }
"#;

    #[test]
    fn design_example_parses() {
        let c = Config::parse(EXAMPLE).unwrap();
        assert_eq!(c.daemon.interfaces, ["eth0"]);
        assert_eq!(c.classes.high.floor, Some(0.6));
        assert_eq!(c.services[0].max_limit, 4000);
        assert_eq!(c.services[0].rate["sheddable"].burst, 400);
    }

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

    #[test]
    fn retry_settings() {
        let svc = |extra: &str| {
            Config::parse(&format!(
                "{IFACE}syn_retransmit_window_ms = 0\n[[service]]\nname = \"a\"\nports = [80]\n{extra}"
            ))
            .unwrap()
        };
        let c = svc("retry_window_ms = 5000\ndemote_retries = false\n");
        assert_eq!(
            c.daemon.syn_retransmit_window_ms, 0,
            "0 disables, and is valid"
        );
        assert_eq!(c.services[0].retry_window_ms, 5000);
        assert!(!c.services[0].demotes_retries());
        // Retry recognition off: nothing is a retry, so nothing is demoted.
        let c = svc("retry_window_ms = 0\n");
        assert!(!c.services[0].demotes_retries());
        let c = svc("retry_window_ms = 0\ndemote_retries = false\n");
        assert!(!c.services[0].demotes_retries());
        // The bounds themselves are accepted.
        let c = Config::parse(&format!(
            "{IFACE}syn_retransmit_window_ms = 600000\n\
             [[service]]\nname = \"a\"\nports = [80]\nretry_window_ms = 3600000\n",
        ))
        .unwrap();
        assert_eq!(c.services[0].retry_window_ms, MAX_RETRY_WINDOW_MS);
    }

    /// The `[daemon]` table of a file that sheds on one interface.
    const IFACE: &str = "[daemon]\ninterfaces = [\"eth0\"]\n";

    fn error_of(toml: &str) -> String {
        Config::parse(toml).unwrap_err().to_string()
    }

    const FLEET: &str =
        "[fleet]\nendpoints = [\"http://198.18.0.21:2379\"]\nnode = \"lb-1\"\nmax_nodes = 10\n";
    const SHARED: &str = "[[service]]\nname = \"db\"\nports = [5432]\nglobal_limit = 500\n";

    #[test]
    fn fleet_section_defaults_and_shared_services() {
        let cfg = Config::parse(&format!("{IFACE}{FLEET}{SHARED}")).unwrap();
        let f = cfg.fleet.as_ref().unwrap();
        assert_eq!(f.prefix, "/shedder");
        assert_eq!(f.lease_ttl_s, 10);
        assert_eq!(f.safety, 0.9);
        assert_eq!(f.timeout_ms, 2000);
        assert_eq!(f.reserve_departed_s, 3600);
        assert_eq!(f.fail_static(), std::time::Duration::from_secs(5));
        assert!(!f.tls());
        assert_eq!(cfg.services[0].global_limit, Some(500));
        let plain = Config::parse(&format!(
            "{IFACE}[[service]]\nname = \"db\"\nports = [5432]\n"
        ))
        .unwrap();
        assert!(plain.fleet.is_none());
    }

    #[test]
    fn bad_fleet_settings_name_the_field() {
        let cases: &[(String, &str)] = &[
            (
                SHARED.to_string(),
                "line 4: service[0] (db).global_limit: needs a [fleet] section (the etcd cluster the fleet shares it through)",
            ),
            (
                format!("{FLEET}lease_ttl_s = 4\nfail_static_ms = 3000\n"),
                "line 6: fleet.fail_static_ms: 3000 must be at least tick_ms (200) and below the etcd lease (lease_ttl_s less 1 s: 3000 ms): a partitioned node must let go of its share before its lease expires",
            ),
            (
                format!("[daemon]\nheartbeat_timeout_ms = 3000\n{FLEET}lease_ttl_s = 4\n"),
                "line 2: daemon.heartbeat_timeout_ms: 3000 must be below the etcd lease (fleet.lease_ttl_s less 1 s: 3000 ms) in fleet mode: a node whose daemon died must be on its fallback limit (its static share) before its lease expires and the others take its share",
            ),
            (
                "[fleet]\nendpoints = []\nmax_nodes = 3\n".to_string(),
                "line 2: fleet.endpoints: at least one etcd endpoint is needed",
            ),
            (
                "[fleet]\nendpoints = [\"198.18.0.21:2379\"]\nmax_nodes = 3\n".to_string(),
                "line 2: fleet.endpoints[0]: `198.18.0.21:2379` is not an etcd client URL (http://host:port or https://host:port)",
            ),
            (
                format!("{FLEET}safety = 1.5\n"),
                "line 5: fleet.safety: 1.5 is outside (0, 1]",
            ),
            (
                format!("{FLEET}username = \"shedder\"\n"),
                "line 1: fleet.password_file: etcd authentication needs both username and password_file",
            ),
            (
                format!("{FLEET}ca_file = \"/etc/ca.pem\"\n"),
                "line 2: fleet.endpoints: TLS files are set but an endpoint is http://; use https:// endpoints",
            ),
            (
                format!("{FLEET}prefix = \"shedder/\"\n"),
                "line 5: fleet.prefix: `shedder/` must start with `/`, not end with one, and hold no spaces",
            ),
            (
                "[fleet]\nendpoints = [\"http://e:2379\"]\n".to_string(),
                "line 1: fleet.max_nodes: missing (this key has no default)",
            ),
            (
                format!("{FLEET}[[service]]\nname = \"db\"\nports = [5432]\nglobal_limit = 0\n"),
                "line 8: service[0] (db).global_limit: 0 is outside 1..=16777216",
            ),
        ];
        for (toml, want) in cases {
            assert_eq!(&error_of(toml), want, "{toml}");
        }
    }

    /// A table of bad files and the exact message each gets: line, field, what is wrong.
    #[test]
    fn bad_files_name_the_line_and_field() {
        let cases: &[(&str, &str)] = &[
            (
                "[daemon]\ntick_ms = 5\n",
                "line 2: daemon.tick_ms: 5 is outside 10..=60000",
            ),
            (
                "[daemon]\ntick_ms = 200\nheartbeat_timeout_ms = 300\n",
                "line 3: daemon.heartbeat_timeout_ms: 300 must be at least twice tick_ms (200), or every late tick drops to the fallback limits",
            ),
            (
                "[classes]\ncritical = { floor = 0.1, ceiling = 0.05 }\n",
                "line 2: classes.critical.floor: critical is never shed by pressure, so it has no floor; bound it with `ceiling`",
            ),
            (
                "[classes]\ncritical = { sources = [] }\n",
                "line 2: classes.critical.ceiling: critical needs a finite ceiling (seed 000 R4: unsheddable, not unbounded)",
            ),
            (
                "[classes]\nhigh = { floor = 1.5 }\n",
                "line 2: classes.high.floor: 1.5 is outside [0, 1]",
            ),
            (
                "[classes]\nhigh = { floor = 0.7 }\nmedium = { floor = 0.5 }\n",
                "line 1: classes: the floors add up to 1.20, more than the whole limit",
            ),
            (
                "[classes]\nhigh = { sources = [\"198.18.20.1/24\"] }\n",
                "line 2: classes.high.sources[0]: `198.18.20.1/24` has host bits set (did you mean 198.18.20.0/24?)",
            ),
            (
                "[classes]\nhigh = { sources = [\"198.18.20.0/33\"] }\n",
                "line 2: classes.high.sources[0]: `198.18.20.0/33`: prefix length must be 0..=32",
            ),
            (
                "[classes]\nhigh = { sources = [\"10.0.0.0/8\"] }\nsheddable = { sources = [\"10.0.0.0/8\"] }\n",
                "line 3: classes.sheddable.sources[0]: 10.0.0.0/8 is already listed under classes.high",
            ),
            (
                "[[service]]\nname = \"a b\"\nports = [1]\n",
                "line 2: service[0].name: `a b`: use 1 to 64 characters from [A-Za-z0-9._-] (it becomes a metric label)",
            ),
            (
                "[[service]]\nname = \"a\"\nports = []\n",
                "line 3: service[0] (a).ports: at least one port is needed",
            ),
            (
                "[[service]]\nname = \"a\"\nports = [80]\n[[service]]\nname = \"b\"\nports = [80]\n",
                "line 6: service[1] (b).ports[0]: port 80 on any address is already protected by service `a`",
            ),
            (
                "[[service]]\nname = \"a\"\nports = [80]\nmin_limit = 10\nmax_limit = 5\n",
                "line 5: service[0] (a).max_limit: 5 is below min_limit (10)",
            ),
            (
                "[[service]]\nname = \"a\"\nports = [80]\nmax_limit = 100\nfallback_limit = 500\n",
                "line 5: service[0] (a).fallback_limit: 500 is outside [min_limit, max_limit] = [8, 100]",
            ),
            (
                "[[service]]\nname = \"a\"\nports = [80]\nmin_limit = 0\n",
                "line 4: service[0] (a).min_limit: must be at least 1, so some traffic always flows and the controller can learn",
            ),
            (
                "[[service]]\nname = \"a\"\nports = [80]\nrate = { vip = { per_second = 1, burst = 1 } }\n",
                "line 4: service[0] (a).rate.vip: unknown class; use one of [\"critical\", \"high\", \"medium\", \"sheddable\"]",
            ),
            (
                "[[service]]\nname = \"a\"\nports = [80]\nrate = { high = { per_second = 0, burst = 1 } }\n",
                "line 4: service[0] (a).rate.high: per_second must be 1..=1e9 and burst at least 1 (got 0 and 1)",
            ),
            (
                "[daemon]\nsyn_retransmit_window_ms = 600001\n",
                "line 2: daemon.syn_retransmit_window_ms: 600001 is outside 0..=600000 (0 disables retransmit recognition)",
            ),
            (
                "[[service]]\nname = \"a\"\nports = [80]\nretry_window_ms = 3600001\n",
                "line 4: service[0] (a).retry_window_ms: 3600001 is outside 0..=3600000 (0 disables retry recognition)",
            ),
            (
                "[[service]]\nname = \"a\"\nports = [80]\ndemote_retries = true\nretry_window_ms = 0\n",
                "line 4: service[0] (a).demote_retries: true has no effect with retry_window_ms = 0 (no attempt is recognised as a retry); give retry_window_ms a window or remove demote_retries",
            ),
        ];
        for (toml, expected) in cases {
            let got = error_of(toml);
            assert_eq!(&got, expected, "for\n{toml}");
        }
    }

    /// What the deserializer refuses (wrong type, unknown key or value, integer out of
    /// range, a key set twice), named like the validation's refusals: line, key path, what
    /// is allowed.
    #[test]
    fn shape_errors_name_the_key_and_what_is_allowed() {
        const SVC: &str = "[[service]]\nname = \"checkout\"\nports = [80]\n";
        let cases: &[(String, &str)] = &[
            (
                format!("{SVC}action = \"explode\"\n"),
                "line 4: service[0] (checkout).action: unknown value `explode`, expected `rst` or `drop`",
            ),
            (
                format!("{SVC}mode = \"dryrun\"\n"),
                "line 4: service[0] (checkout).mode: unknown value `dryrun`, expected `enforce` or `dry-run`",
            ),
            (
                format!("{SVC}action = 5\n"),
                "line 4: service[0] (checkout).action: not a string, expected `rst` or `drop`",
            ),
            (
                "[daemon]\nattach = \"xdp\"\n".into(),
                "line 2: daemon.attach: unknown value `xdp`, expected one of `auto`, `native`, `generic`, `tc`",
            ),
            (
                "[[service]]\nname = \"a\"\nports = [80]\n[[service]]\nname = \"b\"\nports = [80, 70000]\n".into(),
                "line 6: service[1] (b).ports[1]: invalid value: integer `70000`, expected an integer in 0..=65535",
            ),
            (
                "[[service]]\nname = \"a\"\nports = [70000]\n".into(),
                "line 3: service[0] (a).ports[0]: invalid value: integer `70000`, expected an integer in 0..=65535",
            ),
            (
                format!("{SVC}max_limit = 5000000000\n"),
                "line 4: service[0] (checkout).max_limit: invalid value: integer `5000000000`, expected an integer in 0..=4294967295",
            ),
            (
                "[daemon]\ntick_ms = -5\n".into(),
                "line 2: daemon.tick_ms: invalid value: integer `-5`, expected a non-negative integer",
            ),
            (
                "[daemon]\nsyn_retransmit_window_ms = -1\n".into(),
                "line 2: daemon.syn_retransmit_window_ms: invalid value: integer `-1`, expected a non-negative integer",
            ),
            (
                "[daemon]\ntick_ms = 99999999999999999999\n".into(),
                "line 2: daemon.tick_ms: invalid value: integer `99999999999999999999`, expected a non-negative integer",
            ),
            (
                "[daemon]\ntick_ms = 1.5\n".into(),
                "line 2: daemon.tick_ms: invalid type: floating point `1.5`, expected a non-negative integer",
            ),
            (
                format!("{FLEET}lease_ttl_s = -1\n"),
                "line 5: fleet.lease_ttl_s: invalid value: integer `-1`, expected a non-negative integer",
            ),
            (
                "[daemon]\ndetach_on_exit = \"yes\"\n".into(),
                "line 2: daemon.detach_on_exit: invalid type: string \"yes\", expected a boolean",
            ),
            (
                format!("{SVC}demote_retries = \"yes\"\n"),
                "line 4: service[0] (checkout).demote_retries: invalid type: string \"yes\", expected a boolean",
            ),
            (
                "[classes.high]\nfloor = \"half\"\n".into(),
                "line 2: classes.high.floor: invalid type: string \"half\", expected a number",
            ),
            (
                "[daemon]\ninterfaces = \"eth0\"\n".into(),
                "line 2: daemon.interfaces: invalid type: string \"eth0\", expected an array",
            ),
            (
                "[[service]]\nname = \"a\"\nports = [\"80\"]\n".into(),
                "line 3: service[0] (a).ports[0]: invalid type: string \"80\", expected an integer in 0..=65535",
            ),
            (
                "[[service]]\nname = 5\nports = [80]\n".into(),
                "line 2: service[0].name: invalid type: integer `5`, expected a string",
            ),
            (
                format!("{SVC}addresses = [\"198.18.0.1\", \"198.18.0.300\"]\n"),
                "line 4: service[0] (checkout).addresses[1]: `198.18.0.300` is not an IP address (e.g. 198.18.0.10 or 2001:db8::10)",
            ),
            (
                format!("{SVC}rate = {{ high = {{ per_second = -1, burst = 1 }} }}\n"),
                "line 4: service[0] (checkout).rate.high.per_second: invalid value: integer `-1`, expected a non-negative integer",
            ),
            (
                format!("{SVC}[service.rate.high]\nper_second = \"fast\"\nburst = 1\n"),
                "line 5: service[0] (checkout).rate.high.per_second: invalid type: string \"fast\", expected a non-negative integer",
            ),
            (
                format!("{SVC}rate = {{ high = {{ per_sec = 1, burst = 1 }} }}\n"),
                "line 4: service[0] (checkout).rate.high.per_sec: unknown key, expected `per_second` or `burst`",
            ),
            (
                format!("{SVC}rate = {{ high = {{ per_second = 1 }} }}\n"),
                "line 4: service[0] (checkout).rate.high.burst: missing (this key has no default)",
            ),
            (
                "[daemon]\ntick = 100\n".into(),
                "line 2: daemon.tick: unknown key, expected one of `interfaces`, `measure_only`, `attach`, `metrics_listen`, `control_socket`, `control_group`, `tick_ms`, `heartbeat_timeout_ms`, `pin_dir`, `signal_window_ms`, `detach_on_exit`, `fail_static`, `kernel_debug_log`, `syn_retransmit_window_ms`",
            ),
            (
                format!("{SVC}max_limt = 5\n"),
                "line 4: service[0] (checkout).max_limt: unknown key, expected one of `name`, `ports`, `addresses`, `default_class`, `cgroup`, `target_latency_ms`, `controller`, `min_limit`, `max_limit`, `fallback_limit`, `fixed_limit`, `target_rps`, `action`, `mode`, `rate`, `retry_window_ms`, `demote_retries`, `global_limit`",
            ),
            (
                "[classes.high]\nflor = 0.5\n".into(),
                "line 2: classes.high.flor: unknown key, expected one of `sources`, `floor`, `ceiling`",
            ),
            (
                "[classes]\nhigh = { flor = 0.5 }\n".into(),
                "line 2: classes.high.flor: unknown key, expected one of `sources`, `floor`, `ceiling`",
            ),
            (
                "[classes]\nvip = { floor = 0.5 }\n".into(),
                "line 2: classes.vip: unknown key, expected one of `critical`, `high`, `medium`, `sheddable`",
            ),
            (
                format!("{FLEET}lease_ttl = 4\n"),
                "line 5: fleet.lease_ttl: unknown key, expected one of `endpoints`, `node`, `prefix`, `lease_ttl_s`, `safety`, `max_nodes`, `fail_static_ms`, `timeout_ms`, `reserve_departed_s`, `username`, `password_file`, `ca_file`, `cert_file`, `key_file`",
            ),
            (
                "[deamon]\ntick_ms = 100\n".into(),
                "line 1: deamon: unknown key, expected one of `daemon`, `classes`, `service`, `fleet`",
            ),
            (
                "[[service]]\nname = \"a\"\n".into(),
                "line 1: service[0] (a).ports: missing (this key has no default)",
            ),
            (
                "[daemon]\ntick_ms = 100\ntick_ms = 200\n".into(),
                "line 3: daemon.tick_ms: this key is already set above",
            ),
            (
                "[[service]]\nname = \"a\"\nports = [80]\n[[service]]\nname = \"b\"\nports = [81]\nports = [82]\n".into(),
                "line 7: service[1].ports: this key is already set above",
            ),
            (
                "[daemon]\ntick_ms = 100\n[daemon]\n".into(),
                "line 3: daemon: this table is already defined above",
            ),
        ];
        for (toml, expected) in cases {
            assert_eq!(&error_of(toml), expected, "for\n{toml}");
        }
    }

    /// A file that attaches to nothing sheds nothing: it must say that it means it.
    #[test]
    fn no_interface_needs_measure_only() {
        const SVC: &str = "[[service]]\nname = \"a\"\nports = [80]\n";
        let cases: &[(String, &str)] = &[
            (
                SVC.into(),
                "daemon.interfaces: no interface is listed, so nothing would be shed; list the interfaces that receive the services' traffic (e.g. interfaces = [\"eth0\"]), or set daemon.measure_only = true to measure, run the controllers and serve status and metrics without shedding",
            ),
            (
                format!("[daemon]\ntick_ms = 100\ninterfaces = []\n{SVC}"),
                "line 3: daemon.interfaces: no interface is listed, so nothing would be shed; list the interfaces that receive the services' traffic (e.g. interfaces = [\"eth0\"]), or set daemon.measure_only = true to measure, run the controllers and serve status and metrics without shedding",
            ),
            (
                format!("[daemon]\nmeasure_only = false\n{SVC}"),
                "line 1: daemon.interfaces: no interface is listed, so nothing would be shed; list the interfaces that receive the services' traffic (e.g. interfaces = [\"eth0\"]), or set daemon.measure_only = true to measure, run the controllers and serve status and metrics without shedding",
            ),
            (
                format!("[daemon]\ninterfaces = [\"eth0\"]\nmeasure_only = true\n{SVC}"),
                "line 3: daemon.measure_only: true attaches to no interface, but daemon.interfaces lists [\"eth0\"]; remove measure_only to shed on them, or the interfaces to measure only",
            ),
            (
                format!("[daemon]\nmeasure_only = \"yes\"\n{SVC}"),
                "line 2: daemon.measure_only: invalid type: string \"yes\", expected a boolean",
            ),
            (
                // A more specific mistake is reported first.
                "[daemon]\ntick_ms = 5\n".into(),
                "line 2: daemon.tick_ms: 5 is outside 10..=60000",
            ),
        ];
        for (toml, expected) in cases {
            assert_eq!(&error_of(toml), expected, "for\n{toml}");
        }
        let c = Config::parse(&format!("[daemon]\nmeasure_only = true\n{SVC}")).unwrap();
        assert!(c.daemon.measure_only && c.daemon.interfaces.is_empty());
        let c = Config::parse(&format!("[daemon]\ninterfaces = [\"eth0\"]\n{SVC}")).unwrap();
        assert!(!c.daemon.measure_only, "shedding is the default");
        // Without services too: a daemon that only serves its status.
        assert!(Config::parse("[daemon]\nmeasure_only = true\n").is_ok());
        assert!(Config::parse("").is_err());
    }

    #[test]
    fn file_errors_name_the_file() {
        let e = Config::load(Path::new("/nonexistent/shedder.toml")).unwrap_err();
        assert!(
            e.to_string()
                .starts_with("/nonexistent/shedder.toml: cannot read"),
            "{e}"
        );
        // A refusal of the deserializer is prefixed like the validation's.
        let path = std::env::temp_dir().join(format!("shedder-config-{}.toml", std::process::id()));
        std::fs::write(
            &path,
            "[[service]]\nname = \"a\"\nports = [80]\naction = \"reject\"\n",
        )
        .unwrap();
        let e = Config::load(&path).unwrap_err().to_string();
        std::fs::remove_file(&path).unwrap();
        assert_eq!(
            e,
            format!(
                "{}:4: service[0] (a).action: unknown value `reject`, expected `rst` or `drop`",
                path.display()
            )
        );
    }

    #[test]
    fn address_bound_services_may_share_a_port() {
        let c = Config::parse(&format!(
            "{IFACE}[[service]]\nname = \"a\"\nports = [80]\naddresses = [\"198.18.0.2\"]\n\
             [[service]]\nname = \"b\"\nports = [80]\naddresses = [\"198.18.0.3\"]\n\
             [[service]]\nname = \"c\"\nports = [80]\n",
        ));
        assert!(c.is_ok(), "{c:?}");
    }
}
