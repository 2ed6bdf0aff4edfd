//! The deployment files in `deploy/` (no root needed): every metric and label the alert
//! rules and the dashboard use is one the daemon exports (`shedder::api::metrics::names`);
//! the alerts page on floor-class shedding and on goodput, never on the best-effort
//! shedding level, which is shedding doing its job; the example configuration validates
//! and documents every option; the systemd unit keeps what the daemon needs
//! (capabilities, writable pins, reload by SIGHUP, restart).

use shedder_tests::{read_repo_file, repo_root};
use std::{
    collections::{BTreeMap, BTreeSet},
    net::IpAddr,
    path::{Path, PathBuf},
    process::Command,
};

use serde::Deserialize;
use serde_json::Value as Json;
use shedder::{
    api::metrics::names::{METRICS, exposed_names},
    config::{self, Config},
};
use shedder_common::{CLASS_NAMES, Reason, STAT_NAMES, VERDICT_NAMES, programs};

const ALERTS: &str = "deploy/prometheus/alerts.yml";
/// promtool unit tests of the rules.
const ALERTS_TESTS: [&str; 2] = [
    "deploy/prometheus/alerts_test.yml",
    "deploy/prometheus/alerts_weekly_test.yml",
];
const SCRAPE: &str = "deploy/prometheus/scrape.yml";
const DASHBOARD: &str = "deploy/grafana/shedder.json";
const CONFIG: &str = "deploy/shedder.toml";
const UNIT: &str = "deploy/shedder.service";

/// Labels Prometheus adds to every scraped series.
const TARGET_LABELS: [&str; 2] = ["instance", "job"];
/// Classes whose shedding pages (a floor above best-effort).
const FLOOR_CLASSES: [&str; 2] = ["critical", "high"];
/// Metrics that are not shedder's but may appear in the rules.
const OTHER_METRICS: [&str; 1] = ["up"];

/// Histogram bucket bounds as the exposition spells them (`0.2`, `1.0`, `+Inf`).
fn buckets() -> Vec<String> {
    shedder::api::metrics::BUCKETS
        .iter()
        .map(|b| format!("{b:?}"))
        .chain(["+Inf".to_string()])
        .collect()
}

// ---------------------------------------------------------------------------------------
// A PromQL scanner: enough to find every vector selector, its matchers, and the label
// names of by/without/on/ignoring/group_* clauses. Strings, durations and ranges
// (`[5m]`, `[$__rate_interval]`), numbers and Grafana variables are skipped.

#[derive(Debug, Clone)]
struct Matcher {
    label: String,
    op: String,
    value: String,
}

#[derive(Debug, Clone)]
struct Selector {
    metric: String,
    matchers: Vec<Matcher>,
}

#[derive(Debug, Default)]
struct Scanned {
    selectors: Vec<Selector>,
    grouping_labels: Vec<String>,
}

const GROUPING: [&str; 6] = [
    "by",
    "without",
    "on",
    "ignoring",
    "group_left",
    "group_right",
];
const KEYWORDS: [&str; 23] = [
    "and",
    "or",
    "unless",
    "offset",
    "bool",
    "atan2",
    "start",
    "end",
    "inf",
    "nan",
    "sum",
    "min",
    "max",
    "avg",
    "group",
    "stddev",
    "stdvar",
    "count",
    "count_values",
    "bottomk",
    "topk",
    "quantile",
    "limitk",
];

fn is_ident_start(c: char) -> bool {
    c.is_ascii_alphabetic() || c == '_' || c == ':'
}

fn is_ident(c: char) -> bool {
    c.is_ascii_alphanumeric() || c == '_' || c == ':'
}

struct Scanner<'a> {
    s: &'a [char],
    i: usize,
}

impl Scanner<'_> {
    fn peek(&self) -> Option<char> {
        self.s.get(self.i).copied()
    }

    fn skip_ws(&mut self) {
        while self.peek().is_some_and(char::is_whitespace) {
            self.i += 1;
        }
    }

    fn ident(&mut self) -> String {
        let start = self.i;
        while self.peek().is_some_and(is_ident) {
            self.i += 1;
        }
        self.s[start..self.i].iter().collect()
    }

    /// A quoted string starting at the current quote; returns its content.
    fn string(&mut self) -> Result<String, String> {
        let quote = self.peek().ok_or("expected a string")?;
        if !matches!(quote, '"' | '\'' | '`') {
            return Err(format!("expected a quoted string at offset {}", self.i));
        }
        self.i += 1;
        let mut out = String::new();
        while let Some(c) = self.peek() {
            self.i += 1;
            if c == quote {
                return Ok(out);
            }
            if c == '\\' && quote != '`' {
                if let Some(n) = self.peek() {
                    self.i += 1;
                    out.push(n);
                }
                continue;
            }
            out.push(c);
        }
        Err("unterminated string".into())
    }

    fn matchers(&mut self) -> Result<Vec<Matcher>, String> {
        // At `{`.
        self.i += 1;
        let mut out = Vec::new();
        loop {
            self.skip_ws();
            match self.peek() {
                Some('}') => {
                    self.i += 1;
                    return Ok(out);
                }
                Some(',') => {
                    self.i += 1;
                    continue;
                }
                Some(c) if is_ident_start(c) => {}
                other => return Err(format!("unexpected {other:?} in a label matcher list")),
            }
            let label = self.ident();
            self.skip_ws();
            let op = ["=~", "!~", "!=", "="]
                .into_iter()
                .find(|op| {
                    op.chars()
                        .enumerate()
                        .all(|(k, c)| self.s.get(self.i + k) == Some(&c))
                })
                .ok_or_else(|| format!("label `{label}`: expected =, !=, =~ or !~"))?;
            self.i += op.len();
            self.skip_ws();
            let value = self.string()?;
            out.push(Matcher {
                label,
                op: op.to_string(),
                value,
            });
        }
    }

    fn label_list(&mut self) -> Result<Vec<String>, String> {
        // At `(`.
        self.i += 1;
        let mut out = Vec::new();
        loop {
            self.skip_ws();
            match self.peek() {
                Some(')') => {
                    self.i += 1;
                    return Ok(out);
                }
                Some(',') => self.i += 1,
                Some(c) if is_ident_start(c) => out.push(self.ident()),
                other => return Err(format!("unexpected {other:?} in a label list")),
            }
        }
    }
}

fn scan(expr: &str) -> Result<Scanned, String> {
    let chars: Vec<char> = expr.chars().collect();
    let mut sc = Scanner { s: &chars, i: 0 };
    let mut out = Scanned::default();
    while let Some(c) = sc.peek() {
        match c {
            '#' => {
                while sc.peek().is_some_and(|c| c != '\n') {
                    sc.i += 1;
                }
            }
            '"' | '\'' | '`' => {
                sc.string()?;
            }
            '[' => {
                while sc.peek().is_some_and(|c| c != ']') {
                    sc.i += 1;
                }
                sc.i += 1;
            }
            '{' => {
                // A selector without a metric name: `{__name__="..."}`.
                let matchers = sc.matchers()?;
                let metric = matchers
                    .iter()
                    .find(|m| m.label == "__name__" && m.op == "=")
                    .map(|m| m.value.clone())
                    .ok_or("a selector without a metric name")?;
                out.selectors.push(Selector { metric, matchers });
            }
            '$' => {
                sc.i += 1;
                if sc.peek() == Some('{') {
                    while sc.peek().is_some_and(|c| c != '}') {
                        sc.i += 1;
                    }
                    sc.i += 1;
                } else {
                    sc.ident();
                }
            }
            c if c.is_ascii_digit() || c == '.' => {
                while sc
                    .peek()
                    .is_some_and(|c| c.is_ascii_alphanumeric() || c == '.')
                {
                    sc.i += 1;
                }
            }
            c if is_ident_start(c) => {
                let word = sc.ident();
                let at = sc.i;
                sc.skip_ws();
                let next = sc.peek();
                if GROUPING.contains(&word.as_str()) {
                    if next == Some('(') {
                        out.grouping_labels.extend(sc.label_list()?);
                    }
                } else if next == Some('(') || KEYWORDS.contains(&word.as_str()) {
                    // A function or aggregation call, or an operator keyword.
                    sc.i = at;
                } else {
                    let matchers = if next == Some('{') {
                        sc.matchers()?
                    } else {
                        sc.i = at;
                        Vec::new()
                    };
                    out.selectors.push(Selector {
                        metric: word,
                        matchers,
                    });
                }
            }
            _ => sc.i += 1,
        }
    }
    Ok(out)
}

/// The values a label can take on a metric, where they are a fixed enumeration.
fn enumeration(metric_base: &str, label: &str) -> Option<Vec<String>> {
    let v = |xs: &[&str]| Some(xs.iter().map(|s| s.to_string()).collect());
    match (metric_base, label) {
        (_, "class") => v(&CLASS_NAMES),
        (_, "verdict") => v(&VERDICT_NAMES),
        (_, "reason") => v(&Reason::ALL.map(Reason::name)),
        (_, "resource") => v(&["cpu", "memory", "io"]),
        (_, "kind") => v(&["some", "full"]),
        ("shedder_controller_mode", "mode") => v(&["normal", "shedding", "recovering"]),
        ("shedder_attach_mode", "mode") => v(&["xdp-native", "xdp-generic", "tc"]),
        (_, "event") => v(&STAT_NAMES),
        (_, "program") => v(&[
            programs::XDP,
            programs::TC,
            programs::CLOCK,
            programs::XDP_TRACK,
            programs::TC_TRACK,
            programs::EGRESS,
        ]),
        (_, "le") => Some(buckets()),
        _ => None,
    }
}

/// The alternatives of a matcher value that is a plain list (`a|b|c`), or None for a
/// regex this check does not interpret.
fn alternatives(m: &Matcher) -> Option<Vec<String>> {
    let plain = |s: &str| {
        !s.is_empty()
            && s.chars()
                .all(|c| c.is_ascii_alphanumeric() || "_-.+".contains(c))
    };
    match m.op.as_str() {
        "=" | "!=" => Some(vec![m.value.clone()]),
        _ => {
            let alts: Vec<String> = m.value.split('|').map(str::to_string).collect();
            alts.iter().all(|a| plain(a)).then_some(alts)
        }
    }
}

/// Which of `all` a selector's matchers on `label` admit (all of them without a matcher
/// or with a regex this check cannot interpret).
fn admitted(sel: &Selector, label: &str, all: &[&str]) -> BTreeSet<String> {
    let mut set: BTreeSet<String> = all.iter().map(|s| s.to_string()).collect();
    for m in sel.matchers.iter().filter(|m| m.label == label) {
        let Some(alts) = alternatives(m) else {
            continue;
        };
        match m.op.as_str() {
            "=" | "=~" => set.retain(|v| alts.contains(v)),
            _ => set.retain(|v| !alts.contains(v)),
        }
    }
    set
}

/// (metric base name, labels, is a histogram bucket) of every exposed series name.
fn exposed() -> BTreeMap<String, (&'static str, Vec<&'static str>, bool)> {
    let mut out = BTreeMap::new();
    for name in exposed_names() {
        let (base, _, labels, _) = METRICS
            .iter()
            .filter(|(base, ..)| name.starts_with(base))
            .max_by_key(|(base, ..)| base.len())
            .expect("an exposed name comes from METRICS");
        let bucket = name.ends_with("_bucket");
        out.insert(name, (*base, labels.to_vec(), bucket));
    }
    out
}

fn all_label_names() -> BTreeSet<String> {
    METRICS
        .iter()
        .flat_map(|(_, _, labels, _)| labels.iter())
        .chain(TARGET_LABELS.iter())
        .chain(["le"].iter())
        .map(|s| s.to_string())
        .collect()
}

/// Check one expression's metric names, label names and label values; problems are
/// appended to `errors`, each naming `context` and the expression.
fn check_expr(context: &str, expr: &str, errors: &mut Vec<String>) -> Scanned {
    let scanned = match scan(expr) {
        Ok(s) => s,
        Err(e) => {
            errors.push(format!("{context}: cannot scan `{expr}`: {e}"));
            return Scanned::default();
        }
    };
    let exposed = exposed();
    let all_labels = all_label_names();
    let mut fail = |msg: String| errors.push(format!("{context}: {msg}\n    in: {}", expr.trim()));
    for sel in &scanned.selectors {
        let allowed: Vec<String>;
        let base: &str;
        // The daemon's own names, and the standard process_* ones it exports too.
        if let Some((b, labels, bucket)) = exposed.get(&sel.metric) {
            base = b;
            allowed = labels
                .iter()
                .chain(TARGET_LABELS.iter())
                .chain(bucket.then_some(&"le"))
                .map(|s| s.to_string())
                .collect();
        } else if sel.metric.starts_with("shedder_") || sel.metric.starts_with("process_") {
            fail(format!(
                "`{}` is not a metric the daemon exports (shedder::api::metrics::names::exposed_names())",
                sel.metric
            ));
            continue;
        } else if OTHER_METRICS.contains(&sel.metric.as_str()) {
            base = "";
            allowed = TARGET_LABELS.iter().map(|s| s.to_string()).collect();
        } else {
            fail(format!(
                "`{}` is neither a shedder metric nor one of {OTHER_METRICS:?} (a typo, or a PromQL word this check does not know)",
                sel.metric
            ));
            continue;
        }
        for m in &sel.matchers {
            if m.label == "__name__" {
                continue;
            }
            if !allowed.contains(&m.label) {
                fail(format!(
                    "`{}` has no label `{}` (its labels: {allowed:?})",
                    sel.metric, m.label
                ));
                continue;
            }
            if m.value.contains('$') {
                continue;
            }
            if let (Some(values), Some(alts)) = (enumeration(base, &m.label), alternatives(m)) {
                for a in alts {
                    if !values.contains(&a) {
                        fail(format!(
                            "`{}{{{}{}\"{}\"}}`: `{a}` is not a value of `{}` (one of {values:?})",
                            sel.metric, m.label, m.op, m.value, m.label
                        ));
                    }
                }
            }
        }
    }
    for l in &scanned.grouping_labels {
        if !all_labels.contains(l) {
            fail(format!(
                "grouping label `{l}` is not a label of any shedder metric"
            ));
        }
    }
    scanned
}

fn assert_no_errors(errors: &[String]) {
    assert!(
        errors.is_empty(),
        "{} problem(s):\n{}",
        errors.len(),
        errors.join("\n")
    );
}

#[test]
fn the_scanner_finds_selectors_matchers_and_grouping_labels() {
    let s = scan(
        r#"sum by (instance, service) (rate(shedder_connection_attempts_total{class=~"critical|high", verdict!="pass"}[5m] offset 1w)) / on (service) group_left () max(shedder_limit) > 0.5 and up{job="shedder"} == 0 # shedder_not_a_metric"#,
    )
    .unwrap();
    let names: Vec<&str> = s.selectors.iter().map(|s| s.metric.as_str()).collect();
    assert_eq!(
        names,
        ["shedder_connection_attempts_total", "shedder_limit", "up"]
    );
    assert_eq!(s.selectors[0].matchers.len(), 2);
    assert_eq!(s.selectors[0].matchers[0].value, "critical|high");
    assert_eq!(
        admitted(&s.selectors[0], "class", &CLASS_NAMES),
        BTreeSet::from(["critical".to_string(), "high".to_string()])
    );
    assert_eq!(
        admitted(&s.selectors[0], "verdict", &VERDICT_NAMES).len(),
        3
    );
    assert_eq!(s.grouping_labels, ["instance", "service", "service"]);

    // And it reports what is wrong.
    let mut errors = Vec::new();
    check_expr(
        "self-test",
        r#"rate(shedder_conection_attempts_total[5m]) + shedder_limit{clas="high"} + shedder_inflight{class="hihg"} + sum by (servce) (shedder_limit) + shedder_latency_seconds_bucket{le="1"}"#,
        &mut errors,
    );
    assert_eq!(errors.len(), 5, "{errors:#?}");
}

// ---------------------------------------------------------------------------------------
// Prometheus rule files.

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RuleFile {
    groups: Vec<RuleGroup>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RuleGroup {
    name: String,
    #[allow(dead_code)]
    interval: Option<String>,
    rules: Vec<Rule>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Rule {
    alert: Option<String>,
    record: Option<String>,
    expr: String,
    #[serde(rename = "for")]
    for_: Option<String>,
    #[allow(dead_code)]
    keep_firing_for: Option<String>,
    #[serde(default)]
    labels: BTreeMap<String, String>,
    #[serde(default)]
    annotations: BTreeMap<String, String>,
}

impl Rule {
    fn name(&self) -> &str {
        self.alert
            .as_deref()
            .or(self.record.as_deref())
            .unwrap_or("?")
    }
    fn severity(&self) -> &str {
        self.labels.get("severity").map_or("", String::as_str)
    }
}

fn rules() -> Vec<(String, Rule)> {
    let file: RuleFile = serde_yaml_ng::from_str(&read_repo_file(ALERTS))
        .unwrap_or_else(|e| panic!("{ALERTS}: {e}"));
    file.groups
        .into_iter()
        .flat_map(|g| {
            let name = g.name;
            g.rules.into_iter().map(move |r| (name.clone(), r))
        })
        .collect()
}

/// A selector counting shed attempts: connection attempts whose verdict matcher admits
/// drop or rst (a selector without a verdict matcher counts all attempts: the offered
/// load, not shedding).
fn shed_classes(sel: &Selector) -> Option<BTreeSet<String>> {
    if sel.metric != "shedder_connection_attempts_total"
        || !sel.matchers.iter().any(|m| m.label == "verdict")
    {
        return None;
    }
    let verdicts = admitted(sel, "verdict", &VERDICT_NAMES);
    (verdicts.contains("drop") || verdicts.contains("rst"))
        .then(|| admitted(sel, "class", &CLASS_NAMES))
}

fn minutes(duration: &str) -> f64 {
    let (n, unit) = duration.split_at(
        duration
            .find(|c: char| c.is_alphabetic())
            .unwrap_or(duration.len()),
    );
    let n: f64 = n.parse().unwrap_or(0.0);
    match unit {
        "s" => n / 60.0,
        "m" => n,
        "h" => n * 60.0,
        "d" => n * 1440.0,
        "w" => n * 10080.0,
        _ => 0.0,
    }
}

#[test]
fn alert_rules_use_only_exported_metrics_and_labels() {
    let mut errors = Vec::new();
    let rules = rules();
    assert!(!rules.is_empty());
    for (group, rule) in &rules {
        check_expr(
            &format!("{ALERTS}: {group}/{}", rule.name()),
            &rule.expr,
            &mut errors,
        );
    }
    // The promtool unit tests feed series by name: they must be real ones too.
    let mut series = 0;
    for file in ALERTS_TESTS {
        let tests: serde_yaml_ng::Value = serde_yaml_ng::from_str(&read_repo_file(file)).unwrap();
        for test in tests["tests"].as_sequence().expect("tests") {
            for s in test["input_series"].as_sequence().into_iter().flatten() {
                let sel = s["series"].as_str().expect("series");
                check_expr(&format!("{file}: input series"), sel, &mut errors);
                series += 1;
            }
        }
    }
    assert!(series > 10);
    assert_no_errors(&errors);
}

#[test]
fn alerts_follow_r6_page_on_floor_classes_and_goodput_never_on_the_shedding_level() {
    let mut errors = Vec::new();
    let rules = rules();
    let (mut floor_page, mut goodput_page, mut anomaly_ticket) = (None, None, None);
    for (_, rule) in &rules {
        let Some(name) = &rule.alert else {
            continue;
        };
        let severity = rule.severity();
        if !["page", "ticket"].contains(&severity) {
            errors.push(format!(
                "{name}: severity `{severity}` (want page or ticket)"
            ));
        }
        for a in ["summary", "description"] {
            if rule.annotations.get(a).is_none_or(|s| s.trim().is_empty()) {
                errors.push(format!("{name}: no `{a}` annotation"));
            }
        }
        let scanned = check_expr(name, &rule.expr, &mut Vec::new());
        let sheds: Vec<BTreeSet<String>> =
            scanned.selectors.iter().filter_map(shed_classes).collect();
        let floor_only = |classes: &BTreeSet<String>| {
            !classes.is_empty() && classes.iter().all(|c| FLOOR_CLASSES.contains(&c.as_str()))
        };
        if severity == "page" {
            // Page on shedding only where every shedding selector is limited to the floor
            // classes: shedding best-effort work is the mechanism, not an incident.
            for classes in &sheds {
                if !floor_only(classes) {
                    errors.push(format!(
                        "{name} pages on shedding of {classes:?}: only {FLOOR_CLASSES:?} may page\n    in: {}",
                        rule.expr.trim()
                    ));
                }
            }
            if !sheds.is_empty() && sheds.iter().all(floor_only) {
                let sustained = rule.for_.as_deref().map_or(0.0, minutes);
                if sustained >= 2.0 {
                    floor_page = Some(name.clone());
                } else {
                    errors.push(format!(
                        "{name}: pages on shedding without `for:` of a few minutes"
                    ));
                }
            }
            let goodput = scanned.selectors.iter().any(|s| {
                s.metric == "shedder_latency_seconds_bucket"
                    && s.matchers.iter().any(|m| m.label == "le" && m.op == "=")
            });
            if goodput && rule.expr.contains("rate(") {
                goodput_page = Some(name.clone());
            }
        } else {
            // Best-effort shedding may raise a ticket only against a baseline (anomalous
            // versus the same time last week), never on its level.
            let best_effort = sheds
                .iter()
                .any(|classes| classes.iter().any(|c| !FLOOR_CLASSES.contains(&c.as_str())));
            if best_effort {
                if rule.expr.contains("offset") {
                    anomaly_ticket = Some(name.clone());
                } else {
                    errors.push(format!(
                        "{name}: alerts on the best-effort shedding level without a baseline (offset)"
                    ));
                }
            }
        }
    }
    if floor_page.is_none() {
        errors.push("no page on sustained shedding of the critical or high classes".into());
    }
    if goodput_page.is_none() {
        errors.push(
            "no page on goodput (a rate of shedder_latency_seconds_bucket at an `le`)".into(),
        );
    }
    if anomaly_ticket.is_none() {
        errors.push("no ticket on shed rate anomalous versus its baseline".into());
    }
    // Operations: a stale heartbeat, overflowing accept queues, a full socket map, and the
    // fleet's etcd and records.
    let uses = |metric: &str, event: Option<&str>| {
        rules.iter().any(|(_, r)| {
            r.alert.is_some()
                && scan(&r.expr).unwrap().selectors.iter().any(|s| {
                    s.metric == metric
                        && event.is_none_or(|e| {
                            s.matchers
                                .iter()
                                .any(|m| m.label == "event" && m.value == e)
                        })
                })
        })
    };
    for (metric, event) in [
        ("shedder_heartbeat_age_seconds", None),
        ("shedder_listen_overflows_total", None),
        ("shedder_kernel_events_total", Some("untracked_sockets")),
        // Fleet mode: etcd out of reach, records no honest node publishes, nodes that
        // disagree on a downstream's capacity.
        ("shedder_fleet_etcd_up", None),
        ("shedder_fleet_records_rejected_total", None),
        ("shedder_fleet_record_values_clamped_total", None),
        ("shedder_fleet_global_limit_disagreement", None),
    ] {
        if !uses(metric, event) {
            errors.push(format!("no alert on {metric} {event:?}"));
        }
    }
    assert_no_errors(&errors);
}

#[test]
fn scrape_config_matches_the_daemon_and_the_rules() {
    let scrape: serde_yaml_ng::Value = serde_yaml_ng::from_str(&read_repo_file(SCRAPE)).unwrap();
    let cfg = Config::parse(&read_repo_file(CONFIG)).unwrap();
    let port = cfg
        .daemon
        .metrics_listen
        .rsplit_once(':')
        .map(|(_, p)| p.to_string())
        .unwrap();
    let jobs = scrape["scrape_configs"]
        .as_sequence()
        .expect("scrape_configs");
    let job = jobs
        .iter()
        .find(|j| j["metrics_path"].as_str() == Some("/metrics"))
        .expect("a job scraping /metrics");
    let name = job["job_name"].as_str().unwrap();
    let targets: Vec<&str> = job["static_configs"]
        .as_sequence()
        .into_iter()
        .flatten()
        .flat_map(|c| c["targets"].as_sequence().into_iter().flatten())
        .filter_map(|t| t.as_str())
        .collect();
    assert!(
        targets.iter().any(|t| t.ends_with(&format!(":{port}"))),
        "no target on the metrics port {port}: {targets:?}"
    );
    // Rules that select on the job name use this job's.
    for (_, rule) in rules() {
        for sel in scan(&rule.expr).unwrap().selectors {
            for m in sel.matchers.iter().filter(|m| m.label == "job") {
                assert_eq!(m.value, name, "{}: job name", rule.name());
            }
        }
    }
}

/// `promtool`: $PROMTOOL, else where `cargo xtask setup` unpacks it, else on the PATH.
fn promtool() -> PathBuf {
    let candidates = [
        std::env::var_os("PROMTOOL").map(PathBuf::from),
        std::env::var_os("HOME")
            .map(|h| PathBuf::from(h).join(".local/share/shedder/tools/promtool")),
        Some(PathBuf::from("promtool")),
    ];
    candidates
        .into_iter()
        .flatten()
        .find(|p| {
            Command::new(p)
                .arg("--version")
                .output()
                .is_ok_and(|o| o.status.success())
        })
        .expect("promtool not found: `cargo xtask setup` (run by `cargo xtask test`) unpacks it")
}

/// Every alert rule has a promtool unit test in which it fires (a rule never seen to
/// fire may never fire: a typo in a label, a `for` longer than the data can hold), and one
/// in which it stays quiet.
#[test]
fn every_alert_rule_has_a_promtool_test_that_fires_it_and_one_that_does_not() {
    let mut fired = BTreeSet::new();
    let mut quiet = BTreeSet::new();
    for file in ALERTS_TESTS {
        let tests: serde_yaml_ng::Value = serde_yaml_ng::from_str(&read_repo_file(file)).unwrap();
        for test in tests["tests"].as_sequence().expect("tests") {
            for t in test["alert_rule_test"].as_sequence().into_iter().flatten() {
                let name = t["alertname"].as_str().expect("alertname").to_string();
                let fires = t["exp_alerts"].as_sequence().is_some_and(|a| !a.is_empty());
                if fires { &mut fired } else { &mut quiet }.insert(name);
            }
        }
    }
    let mut missing = Vec::new();
    for (group, rule) in rules() {
        let Some(alert) = &rule.alert else { continue };
        if !fired.contains(alert) {
            missing.push(format!("{group}/{alert}: no test in which it fires"));
        }
        if !quiet.contains(alert) {
            missing.push(format!("{group}/{alert}: no test in which it stays quiet"));
        }
    }
    assert!(
        missing.is_empty(),
        "alert rules without promtool unit tests ({ALERTS_TESTS:?}):\n{}",
        missing.join("\n")
    );
}

#[test]
fn promtool_accepts_the_rules_and_their_unit_tests() {
    let dir = repo_root().join("deploy/prometheus");
    let promtool = promtool();
    for args in [
        &["check", "rules", "alerts.yml"][..],
        &["test", "rules", "alerts_test.yml", "alerts_weekly_test.yml"][..],
    ] {
        let out = Command::new(&promtool)
            .args(args)
            .current_dir(&dir)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "promtool {}:\n{}{}",
            args.join(" "),
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

// ---------------------------------------------------------------------------------------
// The Grafana dashboard.

fn dashboard() -> Json {
    serde_json::from_str(&read_repo_file(DASHBOARD)).unwrap_or_else(|e| panic!("{DASHBOARD}: {e}"))
}

/// Every string under an `expr` key, with the title of the panel it is in.
fn exprs(v: &Json, panel: &str, out: &mut Vec<(String, String)>) {
    match v {
        Json::Object(map) => {
            let panel = map
                .get("title")
                .and_then(Json::as_str)
                .unwrap_or(panel)
                .to_string();
            for (k, v) in map {
                match (k.as_str(), v) {
                    ("expr", Json::String(s)) => out.push((panel.clone(), s.clone())),
                    _ => exprs(v, &panel, out),
                }
            }
        }
        Json::Array(items) => items.iter().for_each(|i| exprs(i, panel, out)),
        _ => {}
    }
}

fn panels(d: &Json) -> Vec<&Json> {
    let mut out = Vec::new();
    for p in d["panels"].as_array().expect("panels") {
        out.push(p);
        out.extend(p["panels"].as_array().into_iter().flatten());
    }
    out
}

#[test]
fn dashboard_uses_only_exported_metrics_and_labels() {
    let d = dashboard();
    let mut found = Vec::new();
    exprs(&d["panels"], "", &mut found);
    assert!(found.len() > 20, "only {} expressions", found.len());
    let mut errors = Vec::new();
    for (panel, expr) in &found {
        check_expr(&format!("{DASHBOARD}: panel `{panel}`"), expr, &mut errors);
    }
    // Template variables: label_values(<selector>, <label>).
    for var in d["templating"]["list"].as_array().expect("templating.list") {
        let query = match &var["query"] {
            Json::String(s) => s.clone(),
            Json::Object(o) => o
                .get("query")
                .and_then(Json::as_str)
                .unwrap_or("")
                .to_string(),
            _ => String::new(),
        };
        let Some(inner) = query
            .strip_prefix("label_values(")
            .and_then(|q| q.strip_suffix(')'))
        else {
            continue;
        };
        let (selector, label) = inner.rsplit_once(',').unwrap_or(("", inner));
        let context = format!("{DASHBOARD}: variable `{}`", var["name"]);
        if !selector.is_empty() {
            check_expr(&context, selector, &mut errors);
        }
        if !all_label_names().contains(label.trim()) {
            errors.push(format!("{context}: `{}` is not a label", label.trim()));
        }
    }
    assert_no_errors(&errors);
}

#[test]
fn dashboard_covers_the_key_metrics_and_is_well_formed() {
    let d = dashboard();
    assert!(d["schemaVersion"].as_u64().unwrap_or(0) >= 36);
    let mut found = Vec::new();
    exprs(&d["panels"], "", &mut found);
    let used: BTreeSet<String> = found
        .iter()
        .flat_map(|(_, e)| scan(e).unwrap().selectors)
        .map(|s| s.metric)
        .collect();
    let required = [
        "shedder_connection_attempts_total",
        "shedder_limit",
        "shedder_inflight",
        "shedder_queue_age_seconds_bucket",
        "shedder_latency_seconds_bucket",
        "shedder_accept_queue_depth",
        "shedder_accept_queue_backlog",
        "shedder_pressure_stall_ratio",
        "shedder_controller_mode",
        "shedder_heartbeat_age_seconds",
        "shedder_attach_mode",
        "shedder_program_ns_per_run",
        "shedder_kernel_events_total",
        "process_cpu_seconds_total",
        "process_resident_memory_bytes",
        "process_open_fds",
        "process_max_fds",
        "shedder_config_last_reload_successful",
        "shedder_fleet_etcd_up",
        "shedder_fleet_departed",
    ];
    let missing: Vec<&str> = required
        .into_iter()
        .filter(|m| !used.contains(*m))
        .collect();
    assert!(
        missing.is_empty(),
        "the dashboard does not show {missing:?}"
    );
    for h in [
        "shedder_queue_age_seconds_bucket",
        "shedder_latency_seconds_bucket",
    ] {
        assert!(
            found
                .iter()
                .any(|(_, e)| e.contains("histogram_quantile(0.99") && e.contains(h)),
            "no p99 of {h}"
        );
    }
    // Offered, admitted and shed rates by class.
    for verdicts in [None, Some("pass"), Some("drop")] {
        assert!(
            found.iter().any(|(_, e)| {
                e.contains("by (class")
                    && e.contains("rate(")
                    && scan(e).unwrap().selectors.iter().any(|s| {
                        s.metric == "shedder_connection_attempts_total"
                            && match verdicts {
                                None => !s.matchers.iter().any(|m| m.label == "verdict"),
                                Some(v) => {
                                    s.matchers.iter().any(|m| m.label == "verdict")
                                        && admitted(s, "verdict", &VERDICT_NAMES).contains(v)
                                }
                            }
                    })
            }),
            "no rate by class of attempts with verdict {verdicts:?}"
        );
    }

    // The service variable.
    let vars = d["templating"]["list"].as_array().unwrap();
    let service = vars
        .iter()
        .find(|v| v["name"] == "service")
        .expect("a `service` template variable");
    let q = service["query"]["query"]
        .as_str()
        .or(service["query"].as_str())
        .unwrap();
    assert!(
        q.starts_with("label_values(shedder_limit") && q.trim_end_matches(')').ends_with("service"),
        "service variable: {q}"
    );

    // Panels: unique ids, a data source, targets with refIds, no two overlapping.
    let all = panels(&d);
    let mut ids = BTreeSet::new();
    let mut rects = Vec::new();
    for p in &all {
        let title = p["title"].as_str().unwrap_or("?");
        assert!(
            ids.insert(p["id"].as_u64().expect("panel id")),
            "duplicate id: {title}"
        );
        let g = &p["gridPos"];
        let rect: Vec<u64> = ["x", "y", "w", "h"]
            .iter()
            .map(|k| {
                g[k].as_u64()
                    .unwrap_or_else(|| panic!("{title}: gridPos.{k}"))
            })
            .collect();
        assert!(rect[0] + rect[2] <= 24, "{title}: wider than the grid");
        if p["type"] == "row" {
            continue;
        }
        assert!(p["datasource"].is_object(), "{title}: no datasource");
        let targets = p["targets"].as_array().expect("targets");
        assert!(!targets.is_empty(), "{title}: no targets");
        for t in targets {
            assert!(
                t["refId"].is_string() && t["expr"].is_string(),
                "{title}: target"
            );
        }
        rects.push((title, rect));
    }
    for (i, (a, ra)) in rects.iter().enumerate() {
        for (b, rb) in &rects[i + 1..] {
            let overlap = ra[0] < rb[0] + rb[2]
                && rb[0] < ra[0] + ra[2]
                && ra[1] < rb[1] + rb[3]
                && rb[1] < ra[1] + ra[3];
            assert!(!overlap, "panels `{a}` and `{b}` overlap");
        }
    }
}

// ---------------------------------------------------------------------------------------
// The example configuration.

/// The field names serde expects in a table, from the message for an unknown field.
fn fields_of(table: &str) -> Vec<String> {
    let e = Config::parse(&format!("{table}\nzz_not_a_field = 1\n")).unwrap_err();
    let msg = e.to_string();
    let list = msg
        .split("expected one of ")
        .nth(1)
        .unwrap_or_else(|| panic!("unexpected message: {msg}"));
    list.split('`')
        .skip(1)
        .step_by(2)
        .map(str::to_string)
        .collect()
}

/// The paragraph (run of non-blank lines) holding the first `key =` line, commented out
/// or not.
fn paragraph_of<'a>(text: &'a str, key: &str) -> Option<Vec<&'a str>> {
    let lines: Vec<&str> = text.lines().collect();
    let is_key = |l: &str| {
        let l = l.trim_start().trim_start_matches('#').trim_start();
        l.strip_prefix(key)
            .is_some_and(|rest| rest.trim_start().starts_with('='))
    };
    let at = lines.iter().position(|l| is_key(l))?;
    let start = lines[..at]
        .iter()
        .rposition(|l| l.trim().is_empty())
        .map_or(0, |b| b + 1);
    let end = lines[at..]
        .iter()
        .position(|l| l.trim().is_empty())
        .map_or(lines.len(), |e| at + e);
    Some(lines[start..end].to_vec())
}

fn in_documentation_range(addr: IpAddr) -> bool {
    match addr {
        IpAddr::V4(a) => {
            let o = a.octets();
            o[0] == 198 && (o[1] & 0xfe) == 18
        }
        IpAddr::V6(a) => {
            let s = a.segments();
            s[0] == 0x2001 && s[1] == 0x0db8
        }
    }
}

#[test]
fn example_config_validates_and_uses_documentation_addresses() {
    let cfg = Config::parse(&read_repo_file(CONFIG)).unwrap_or_else(|e| panic!("{CONFIG}: {e}"));
    assert!(
        (2..=4).contains(&cfg.services.len()),
        "{} services",
        cfg.services.len()
    );
    for class in cfg.classes.by_id() {
        for s in &class.sources {
            let p = config::Prefix::parse(s).unwrap();
            assert!(
                in_documentation_range(p.addr),
                "{s}: use 198.18.0.0/15 or 2001:db8::/32"
            );
        }
    }
    for s in &cfg.services {
        for a in &s.addresses {
            assert!(in_documentation_range(*a), "{}: address {a}", s.name);
        }
    }
    assert!(
        cfg.classes.high.floor.unwrap_or(0.0) > 0.0,
        "the example should give high a floor (the alerts page on its shedding)"
    );
}

#[test]
fn example_config_documents_every_option_with_its_default() {
    let text = read_repo_file(CONFIG);
    let mut errors = Vec::new();
    for (table, fields) in [
        ("[daemon]", fields_of("[daemon]")),
        (
            "[[service]]",
            fields_of("[[service]]\nname = \"x\"\nports = [1]"),
        ),
        (
            "[fleet]",
            fields_of("[fleet]\nendpoints = [\"http://e:2379\"]\nmax_nodes = 1"),
        ),
    ] {
        assert!(fields.len() >= 8, "{table}: {fields:?}");
        for f in fields {
            match paragraph_of(&text, &f) {
                None => errors.push(format!("{table} {f} is not in {CONFIG}")),
                Some(par) => {
                    let comments: String = par
                        .iter()
                        .filter_map(|l| l.split_once('#').map(|(_, c)| c))
                        .collect::<Vec<_>>()
                        .join(" ");
                    if !comments.contains("default") && !comments.contains("required") {
                        errors.push(format!(
                            "{table} {f}: no comment giving its default:\n{}",
                            par.join("\n")
                        ));
                    }
                }
            }
        }
    }
    for f in ["sources", "floor", "ceiling"] {
        if !text.contains(&format!("{f} =")) {
            errors.push(format!("classes: `{f}` is not shown"));
        }
    }
    // The defaults quoted are the real ones.
    let defaults = [
        ("metrics_listen", config::defaults::metrics_listen()),
        (
            "control_socket",
            config::defaults::control_socket().display().to_string(),
        ),
        ("tick_ms", config::defaults::tick_ms().to_string()),
        (
            "heartbeat_timeout_ms",
            config::defaults::heartbeat_timeout_ms().to_string(),
        ),
        ("pin_dir", config::defaults::pin_dir().display().to_string()),
        (
            "signal_window_ms",
            config::defaults::signal_window_ms().to_string(),
        ),
        (
            "detach_on_exit",
            config::defaults::detach_on_exit().to_string(),
        ),
        (
            "target_latency_ms",
            config::defaults::target_latency_ms().to_string(),
        ),
        ("min_limit", config::defaults::min_limit().to_string()),
        ("max_limit", config::defaults::max_limit().to_string()),
        (
            "fallback_limit",
            config::defaults::fallback_limit().to_string(),
        ),
        (
            "syn_retransmit_window_ms",
            config::defaults::syn_retransmit_window_ms().to_string(),
        ),
        (
            "retry_window_ms",
            config::defaults::retry_window_ms().to_string(),
        ),
        ("demote_retries", "default true".to_string()),
        ("prefix", config::defaults::fleet_prefix()),
        ("lease_ttl_s", config::defaults::lease_ttl_s().to_string()),
        ("safety", config::defaults::safety().to_string()),
        (
            "timeout_ms",
            config::defaults::etcd_timeout_ms().to_string(),
        ),
        (
            "reserve_departed_s",
            config::defaults::reserve_departed_s().to_string(),
        ),
    ];
    for (key, value) in defaults {
        let par = paragraph_of(&text, key).unwrap_or_default().join("\n");
        if !par
            .lines()
            .filter(|l| l.trim_start().starts_with('#'))
            .any(|l| l.contains(&value))
        {
            errors.push(format!(
                "{key}: the comment does not give the default {value}:\n{par}"
            ));
        }
    }
    assert_no_errors(&errors);
}

// ---------------------------------------------------------------------------------------
// The systemd unit.

/// (section, key) → values, in order; continuation lines joined.
fn unit() -> BTreeMap<(String, String), Vec<String>> {
    let text = read_repo_file(UNIT);
    let mut out: BTreeMap<(String, String), Vec<String>> = BTreeMap::new();
    let mut section = String::new();
    let mut pending = String::new();
    for line in text.lines() {
        let line = line.trim();
        if pending.is_empty() && (line.is_empty() || line.starts_with('#') || line.starts_with(';'))
        {
            continue;
        }
        if let Some(l) = line.strip_suffix('\\') {
            pending.push_str(l);
            pending.push(' ');
            continue;
        }
        let line = format!("{pending}{line}");
        pending.clear();
        if line.starts_with('[') && line.ends_with(']') {
            section = line[1..line.len() - 1].to_string();
            continue;
        }
        let (k, v) = line
            .split_once('=')
            .unwrap_or_else(|| panic!("{UNIT}: not a setting: {line}"));
        out.entry((section.clone(), k.trim().to_string()))
            .or_default()
            .push(v.trim().to_string());
    }
    out
}

#[test]
fn unit_runs_the_daemon_with_the_capabilities_and_paths_it_needs() {
    let u = unit();
    let get = |key: &str| -> Vec<String> {
        u.get(&("Service".to_string(), key.to_string()))
            .cloned()
            .unwrap_or_default()
    };
    let one = |key: &str| -> String {
        let v = get(key);
        assert_eq!(v.len(), 1, "{UNIT}: {key}= {v:?}");
        v[0].clone()
    };
    let yes = |v: &str| ["yes", "true", "1", "on"].contains(&v.to_ascii_lowercase().as_str());

    let start = one("ExecStart");
    let config_path = start
        .split_once(" run --config ")
        .map(|(bin, cfg)| {
            assert_eq!(bin, "/usr/bin/shedder");
            cfg.trim().to_string()
        })
        .unwrap_or_else(|| panic!("ExecStart={start}: want `shedder run --config FILE`"));
    assert_eq!(config_path, "/etc/shedder/shedder.toml");
    let reload = get("ExecReload");
    assert!(
        reload
            .iter()
            .any(|r| r.contains("kill") && r.contains("-HUP") && r.contains("$MAINPID")),
        "ExecReload={reload:?}: want SIGHUP to $MAINPID"
    );
    for r in reload.iter().chain(get("ExecStartPre").iter()) {
        if r.contains("policy validate") {
            assert!(r.ends_with(&config_path), "{r}: validates another file");
        }
    }
    assert!(
        ["on-failure", "always", "on-abnormal"].contains(&one("Restart").as_str()),
        "Restart="
    );
    assert!(get("RestartSec").len() == 1, "RestartSec=");
    assert_eq!(one("KillSignal"), "SIGTERM");

    // sd_notify: ready after the first tick, and a watchdog the tick loop feeds, longer
    // than the heartbeat's timeout (a hang is restarted, a slow tick is not).
    assert_eq!(one("Type"), "notify");
    assert_eq!(one("NotifyAccess"), "main");
    let cfg = Config::parse(&read_repo_file(CONFIG)).unwrap();
    let watchdog_ms = minutes(&one("WatchdogSec")) * 60_000.0;
    assert!(
        watchdog_ms >= 3.0 * cfg.daemon.heartbeat_timeout_ms as f64,
        "WatchdogSec= ({watchdog_ms} ms) under three heartbeat timeouts ({} ms)",
        cfg.daemon.heartbeat_timeout_ms
    );
    // Room for the endpoints' connections beside the maps, programs and links.
    let nofile: usize = one("LimitNOFILE").parse().expect("LimitNOFILE= a number");
    let connections = shedder::api::metrics::CONNECTIONS + shedder::api::control::CONNECTIONS;
    assert!(
        nofile >= 4 * connections,
        "LimitNOFILE={nofile} leaves little room beside {connections} connections"
    );

    for key in ["CapabilityBoundingSet", "AmbientCapabilities"] {
        let caps: Vec<String> = get(key)
            .iter()
            .flat_map(|v| v.split_whitespace().map(str::to_string))
            .collect();
        for cap in ["CAP_BPF", "CAP_NET_ADMIN", "CAP_PERFMON"] {
            assert!(
                caps.iter().any(|c| c == cap),
                "{key}= lacks {cap}: {caps:?}"
            );
        }
    }
    assert!(yes(&one("NoNewPrivileges")), "NoNewPrivileges=");
    if cfg.daemon.control_group.is_some() {
        assert!(
            get("CapabilityBoundingSet").join(" ").contains("CAP_CHOWN"),
            "daemon.control_group needs CAP_CHOWN (the socket is chowned to the group)"
        );
    }

    // The pins must land on the host's bpffs, writable, and outlive the process.
    let rw: Vec<String> = get("ReadWritePaths")
        .iter()
        .flat_map(|v| {
            v.split_whitespace()
                .map(|p| p.trim_start_matches('-').to_string())
        })
        .collect();
    assert!(
        rw.iter().any(|p| cfg.daemon.pin_dir.starts_with(p)),
        "pin_dir {} is not under ReadWritePaths={rw:?}",
        cfg.daemon.pin_dir.display()
    );
    assert!(
        rw.iter().any(|p| p == "/sys/fs/bpf"),
        "ReadWritePaths={rw:?}"
    );
    let runtime = one("RuntimeDirectory");
    assert_eq!(runtime, "shedder");
    assert!(
        !get("RuntimeDirectoryPreserve").is_empty(),
        "RuntimeDirectoryPreserve="
    );
    let socket_dir = cfg.daemon.control_socket.parent().unwrap();
    assert!(
        socket_dir == Path::new("/run").join(&runtime)
            || rw.iter().any(|p| socket_dir.starts_with(p)),
        "control socket {} is not writable",
        cfg.daemon.control_socket.display()
    );
    for (key, why) in [
        ("ProtectKernelTunables", "mounts /sys/fs/bpf read-only"),
        ("PrivateBPF", "a private bpffs: pins die with the process"),
        (
            "PrivateNetwork",
            "the programs attach to the host's interfaces",
        ),
    ] {
        for v in get(key) {
            assert!(!yes(&v), "{key}={v}: {why}");
        }
    }
    for v in get("ProcSubset") {
        assert_ne!(v, "pid", "ProcSubset=pid hides /proc/mounts");
    }
    for v in get("ProtectSystem") {
        assert!(v != "full" || !rw.is_empty(), "ProtectSystem={v}");
    }
    let filter = get("SystemCallFilter").join(" ");
    if !filter.is_empty() {
        for call in ["bpf", "perf_event_open"] {
            assert!(
                filter.split_whitespace().any(|c| c == call),
                "SystemCallFilter= denies {call}"
            );
        }
    }
    if let Some(families) = get("RestrictAddressFamilies").first() {
        for f in ["AF_NETLINK", "AF_INET", "AF_UNIX"] {
            assert!(families.contains(f), "RestrictAddressFamilies= lacks {f}");
        }
    }
}

/// `systemd-analyze verify` finds nothing to say about the unit (a misspelt key or a bad
/// value is only a warning to systemd, which then ignores the line). The binary's path is
/// pointed at one that exists; skipped where systemd is not installed.
#[test]
fn systemd_analyze_verifies_the_unit() {
    let Ok(version) = Command::new("systemd-analyze").arg("--version").output() else {
        eprintln!("systemd-analyze not installed: skipped");
        return;
    };
    assert!(version.status.success());
    let dir = std::env::temp_dir().join(format!("shedder-unit-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let unit = dir.join("shedder.service");
    std::fs::write(
        &unit,
        read_repo_file(UNIT).replace("/usr/bin/shedder", "/bin/true"),
    )
    .unwrap();
    let out = Command::new("systemd-analyze")
        .args(["verify", "--man=no"])
        .arg(&unit)
        .output()
        .unwrap();
    let _ = std::fs::remove_dir_all(&dir);
    let said: Vec<String> = String::from_utf8_lossy(&out.stderr)
        .lines()
        .chain(String::from_utf8_lossy(&out.stdout).lines())
        .filter(|l| l.contains("shedder.service"))
        .map(str::to_string)
        .collect();
    assert!(
        out.status.success() && said.is_empty(),
        "systemd-analyze verify {UNIT}:\n{}",
        said.join("\n")
    );
}
