//! Text to [`Config`]: the TOML syntax, the shape of each section (serde), then the
//! validation; each refusal with the key path, and the line and column of the value at
//! fault from the spans toml's parser keeps.

use std::{collections::HashMap, fmt, path::Path};

use serde::Deserialize;
use toml::de::DeTable;

use super::{
    Attach,
    classes::ClassName,
    document::Config,
    error::{ConfigError, err},
    locate::{Position, Source},
    service::{Action, Controller, Mode},
    validate::valid_name,
};

/// A refusal by the deserializer (a wrong type, an unknown key or value, an integer out of
/// range) as a [`ConfigError`] like the validation's: the key path (`service[0] (checkout)
/// .ports[1]`) as the field, and serde's message in the file's terms, saying what is allowed
/// (`an integer in 0..=65535` rather than `u16`).
fn shape_error(
    source: &Source<'_>,
    path: &serde_path_to_error::Path,
    message: &str,
) -> ConfigError {
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
                    && let Some(name) = service_name(source, *index)
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
        let written = source.find(&field).filter(|f| f.exact);
        match written.and_then(|f| f.value.get_ref().as_str()) {
            Some(v) => format!("`{v}` is not an IP address (e.g. 198.18.0.10 or 2001:db8::10)"),
            None => "not an IP address (e.g. 198.18.0.10 or 2001:db8::10)".to_string(),
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

/// The name of the `index`-th `[[service]]` as written, when it is a valid name.
fn service_name(source: &Source<'_>, index: usize) -> Option<String> {
    let found = source.find(&format!("service[{index}].name"))?;
    let name = found.value.get_ref().as_str().filter(|_| found.exact)?;
    valid_name(name).then(|| name.to_string())
}

/// At most this many refusals of the deserializer after the first (each costs a parse).
const MAX_MORE_SHAPE_ERRORS: usize = 32;

/// The refusals of the deserializer after the first, which stops it. To find the next, the
/// value at fault is taken out of a copy of the document and the copy read again, until it
/// passes, a key is missing or the next refusal is about a key already named (either may
/// be the copy's doing, not a second mistake of the file's). Placed by their key paths.
fn more_shape_errors(
    text: &str,
    source: &Source<'_>,
    first: &serde_path_to_error::Path,
    first_field: &str,
) -> Vec<ConfigError> {
    let Ok(doc) = text.parse::<toml::Table>() else {
        return Vec::new();
    };
    let mut doc = toml::Value::Table(doc);
    let mut named = vec![first_field.to_string()];
    let mut more = Vec::new();
    let mut path = first.clone();
    while more.len() < MAX_MORE_SHAPE_ERRORS && take_out(&mut doc, &path) {
        let Err(e) = serde_path_to_error::deserialize::<_, Config>(doc.clone()) else {
            break;
        };
        path = e.path().clone();
        let message = e.inner().message();
        // A key missing from the copy may be one taken out (a misspelt key's right
        // spelling, a wrongly typed required key), and there is nothing to take out of it.
        if message.starts_with("missing field") {
            break;
        }
        let error = shape_error(source, &path, message);
        if named.iter().any(|n| same_key(n, &error.field)) {
            break;
        }
        named.push(error.field.clone());
        let position = source.position_of(&error.field);
        more.push(placed(error, position));
    }
    more
}

/// Whether one key path is the other or inside it.
fn same_key(a: &str, b: &str) -> bool {
    let inside = |outer: &str, inner: &str| {
        inner
            .strip_prefix(outer)
            .is_some_and(|r| r.is_empty() || r.starts_with(['.', '[', ' ']))
    };
    inside(a, b) || inside(b, a)
}

/// Take the value `path` names out of `doc`: a key is removed (its default applies, or it
/// is reported missing); an element of an array is replaced by a sibling, so that the
/// others keep their indexes (an array of one is removed). Whether anything was.
fn take_out(doc: &mut toml::Value, path: &serde_path_to_error::Path) -> bool {
    use serde_path_to_error::Segment;
    let segments: Vec<&Segment> = path.iter().collect();
    let Some((last, parents)) = segments.split_last() else {
        return false;
    };
    let mut here = doc;
    for segment in parents {
        let next = match (segment, here) {
            (Segment::Map { key }, toml::Value::Table(t)) => t.get_mut(key.as_str()),
            (Segment::Seq { index }, toml::Value::Array(a)) => a.get_mut(*index),
            _ => None,
        };
        match next {
            Some(v) => here = v,
            None => return false,
        }
    }
    match (last, here) {
        (Segment::Map { key }, toml::Value::Table(t)) => t.remove(key.as_str()).is_some(),
        (Segment::Seq { index }, toml::Value::Array(a)) if *index < a.len() => {
            match (0..a.len()).find(|&j| j != *index) {
                Some(j) => a[*index] = a[j].clone(),
                None => a.clear(),
            }
            true
        }
        _ => false,
    }
}

/// `error`, placed at `at` in the text.
fn placed(mut error: ConfigError, at: Option<Position>) -> ConfigError {
    error.line = at.map(|p| p.line);
    error.column = at.map(|p| p.column);
    error
}

impl Config {
    /// Parse and validate a configuration file.
    pub fn load(path: &Path) -> Result<Self, ConfigError> {
        Self::read(path).map(|(cfg, _)| cfg)
    }

    /// Parse and validate a configuration file, keeping its text (what the daemon shows as
    /// the policy in force). The one place a file becomes a configuration: the CLI, the
    /// daemon's start and its reload all read through here, so errors name the file alike.
    pub fn read(path: &Path) -> Result<(Self, String), ConfigError> {
        let with_file = |e: ConfigError| e.in_file(path);
        let text = std::fs::read_to_string(path)
            .map_err(|e| with_file(err("", format!("cannot read: {e}"))))?;
        let cfg = Self::parse(&text).map_err(with_file)?;
        Ok((cfg, text))
    }

    /// Parse and validate text that is not read from a path (standard input), its errors
    /// naming it as `name`.
    pub fn parse_named(text: &str, name: &Path) -> Result<Self, ConfigError> {
        Self::parse(text).map_err(|e| e.in_file(name))
    }

    /// Parse and validate configuration text.
    pub fn parse(text: &str) -> Result<Self, ConfigError> {
        let at = |span: std::ops::Range<usize>| Position::of(text, span.start);
        // Syntax first (no key to name), then the shape, with the path of the key at fault.
        let doc = DeTable::parse(text).map_err(|e| {
            let error = match e.span() {
                Some(span) if e.message() == "duplicate key" => duplicate_key(text, span),
                _ => err("", e.message().to_string()),
            };
            placed(error, e.span().map(at))
        })?;
        let de = toml::Deserializer::from(doc.clone());
        let source = Source::new(text, doc.into_inner());
        let cfg: Config = serde_path_to_error::deserialize(de).map_err(|e| {
            let path = e.path().clone();
            let e = e.into_inner();
            let error = shape_error(&source, &path, e.message());
            // toml's span where it has one (the value, the unknown key, the table lacking a
            // key), else the value the key path names.
            let position = e
                .span()
                .map(at)
                .or_else(|| source.position_of(&error.field));
            let first = placed(error, position);
            // All of them in the file's order (serde reads the keys in its own).
            let mut all = more_shape_errors(text, &source, &path, &first.field);
            all.push(first);
            all.sort_by_key(|e| (e.line, e.column));
            let mut first = all.remove(0);
            first.also = all.into();
            first
        })?;
        // A value that parsed but breaks a rule: where the text has it (or its table).
        // Every one of them, each placed.
        let mut problems = cfg.problems().into_iter().map(|e| {
            let position = source.position_of(&e.field);
            placed(e, position)
        });
        if let Some(mut first) = problems.next() {
            first.also = problems.collect();
            return Err(first);
        }
        Ok(cfg)
    }
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::super::{
        Config,
        fixtures::{FLEET, error_of},
    };

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

    /// What the deserializer refuses (wrong type, unknown key or value, integer out of
    /// range, a key set twice), named like the validation's refusals: line and column, key
    /// path, what is allowed.
    #[test]
    fn shape_errors_name_the_key_and_what_is_allowed() {
        const SVC: &str = "[[service]]\nname = \"checkout\"\nports = [80]\n";
        let cases: &[(String, &str)] = &[
            (
                format!("{SVC}action = \"explode\"\n"),
                "line 4, column 10: service[0] (checkout).action: unknown value `explode`, expected one of `refuse`, `rst`, `drop`",
            ),
            (
                format!("{SVC}mode = \"dryrun\"\n"),
                "line 4, column 8: service[0] (checkout).mode: unknown value `dryrun`, expected `enforce` or `dry-run`",
            ),
            (
                format!("{SVC}action = 5\n"),
                "line 4, column 10: service[0] (checkout).action: not a string, expected one of `refuse`, `rst`, `drop`",
            ),
            (
                "[daemon]\nattach = \"xdp\"\n".into(),
                "line 2, column 10: daemon.attach: unknown value `xdp`, expected one of `auto`, `native`, `generic`, `tc`",
            ),
            (
                "[[service]]\nname = \"a\"\nports = [80]\n[[service]]\nname = \"b\"\nports = [80, 70000]\n".into(),
                "line 6, column 14: service[1] (b).ports[1]: invalid value: integer `70000`, expected an integer in 0..=65535",
            ),
            (
                "[[service]]\nname = \"a\"\nports = [70000]\n".into(),
                "line 3, column 10: service[0] (a).ports[0]: invalid value: integer `70000`, expected an integer in 0..=65535",
            ),
            (
                format!("{SVC}max_limit = 5000000000\n"),
                "line 4, column 13: service[0] (checkout).max_limit: invalid value: integer `5000000000`, expected an integer in 0..=4294967295",
            ),
            (
                "[daemon]\ntick_ms = -5\n".into(),
                "line 2, column 11: daemon.tick_ms: invalid value: integer `-5`, expected a non-negative integer",
            ),
            (
                "[daemon]\nsyn_retransmit_window_ms = -1\n".into(),
                "line 2, column 28: daemon.syn_retransmit_window_ms: invalid value: integer `-1`, expected a non-negative integer",
            ),
            (
                "[daemon]\ntick_ms = 99999999999999999999\n".into(),
                "line 2, column 11: daemon.tick_ms: invalid value: integer `99999999999999999999`, expected a non-negative integer",
            ),
            (
                "[daemon]\ntick_ms = 1.5\n".into(),
                "line 2, column 11: daemon.tick_ms: invalid type: floating point `1.5`, expected a non-negative integer",
            ),
            (
                format!("{FLEET}lease_ttl_s = -1\n"),
                "line 5, column 15: fleet.lease_ttl_s: invalid value: integer `-1`, expected a non-negative integer",
            ),
            (
                "[daemon]\ndetach_on_exit = \"yes\"\n".into(),
                "line 2, column 18: daemon.detach_on_exit: invalid type: string \"yes\", expected a boolean",
            ),
            (
                format!("{SVC}demote_retries = \"yes\"\n"),
                "line 4, column 18: service[0] (checkout).demote_retries: invalid type: string \"yes\", expected a boolean",
            ),
            (
                "[classes.high]\nfloor = \"half\"\n".into(),
                "line 2, column 9: classes.high.floor: invalid type: string \"half\", expected a number",
            ),
            (
                "[daemon]\ninterfaces = \"eth0\"\n".into(),
                "line 2, column 14: daemon.interfaces: invalid type: string \"eth0\", expected an array",
            ),
            (
                "[[service]]\nname = \"a\"\nports = [\"80\"]\n".into(),
                "line 3, column 10: service[0] (a).ports[0]: invalid type: string \"80\", expected an integer in 0..=65535",
            ),
            (
                "[[service]]\nname = 5\nports = [80]\n".into(),
                "line 2, column 8: service[0].name: invalid type: integer `5`, expected a string",
            ),
            (
                format!("{SVC}addresses = [\"198.18.0.1\", \"198.18.0.300\"]\n"),
                "line 4, column 28: service[0] (checkout).addresses[1]: `198.18.0.300` is not an IP address (e.g. 198.18.0.10 or 2001:db8::10)",
            ),
            (
                format!("{SVC}rate = {{ high = {{ per_second = -1, burst = 1 }} }}\n"),
                "line 4, column 32: service[0] (checkout).rate.high.per_second: invalid value: integer `-1`, expected a non-negative integer",
            ),
            (
                format!("{SVC}[service.rate.high]\nper_second = \"fast\"\nburst = 1\n"),
                "line 5, column 14: service[0] (checkout).rate.high.per_second: invalid type: string \"fast\", expected a non-negative integer",
            ),
            (
                format!("{SVC}rate = {{ high = {{ per_sec = 1, burst = 1 }} }}\n"),
                "line 4, column 19: service[0] (checkout).rate.high.per_sec: unknown key, expected `per_second` or `burst`",
            ),
            (
                format!("{SVC}rate = {{ high = {{ per_second = 1 }} }}\n"),
                "line 4, column 17: service[0] (checkout).rate.high.burst: missing (this key has no default)",
            ),
            (
                "[daemon]\ntick = 100\n".into(),
                "line 2, column 1: daemon.tick: unknown key, expected one of `interfaces`, `measure_only`, `attach`, `metrics_listen`, `control_socket`, `control_group`, `tick_ms`, `heartbeat_timeout_ms`, `pin_dir`, `signal_window_ms`, `detach_on_exit`, `fail_static`, `kernel_debug_log`, `syn_retransmit_window_ms`, `standing_window_s`, `handshake_hold_ms`, `max_replies_proven_per_s`, `max_replies_unproven_per_s`, `decapsulate`",
            ),
            (
                format!("{SVC}max_limt = 5\n"),
                "line 4, column 1: service[0] (checkout).max_limt: unknown key, expected one of `name`, `protocol`, `ports`, `addresses`, `default_class`, `cgroup`, `target_latency_ms`, `controller`, `min_limit`, `max_limit`, `fallback_limit`, `max_connections`, `recall_per_second`, `fixed_limit`, `target_rps`, `action`, `mode`, `rate`, `retry_window_ms`, `demote_retries`, `fair_share`, `retry_budget`, `retry_budget_min`, `unproven_share`, `global_limit`, `active_window_ms`",
            ),
            (
                "[classes.high]\nflor = 0.5\n".into(),
                "line 2, column 1: classes.high.flor: unknown key, expected one of `sources`, `floor`, `ceiling`, `source_prefix_v4`, `source_prefix_v6`",
            ),
            (
                "[classes]\nhigh = { flor = 0.5 }\n".into(),
                "line 2, column 10: classes.high.flor: unknown key, expected one of `sources`, `floor`, `ceiling`, `source_prefix_v4`, `source_prefix_v6`",
            ),
            (
                "[classes]\nvip = { floor = 0.5 }\n".into(),
                "line 2, column 1: classes.vip: unknown key, expected one of `critical`, `high`, `medium`, `sheddable`",
            ),
            (
                format!("{FLEET}lease_ttl = 4\n"),
                "line 5, column 1: fleet.lease_ttl: unknown key, expected one of `endpoints`, `node`, `prefix`, `lease_ttl_s`, `safety`, `shares`, `max_nodes`, `fail_static_ms`, `timeout_ms`, `reserve_departed_s`, `username`, `password_file`, `ca_file`, `cert_file`, `key_file`",
            ),
            (
                "[deamon]\ntick_ms = 100\n".into(),
                "line 1, column 2: deamon: unknown key, expected one of `daemon`, `classes`, `service`, `fleet`",
            ),
            (
                "[[service]]\nname = \"a\"\n".into(),
                "line 1, column 1: service[0] (a).ports: missing (this key has no default)",
            ),
            (
                "[daemon]\ntick_ms = 100\ntick_ms = 200\n".into(),
                "line 3, column 1: daemon.tick_ms: this key is already set above",
            ),
            (
                "[[service]]\nname = \"a\"\nports = [80]\n[[service]]\nname = \"b\"\nports = [81]\nports = [82]\n".into(),
                "line 7, column 1: service[1].ports: this key is already set above",
            ),
            (
                "[daemon]\ntick_ms = 100\n[daemon]\n".into(),
                "line 3, column 2: daemon: this table is already defined above",
            ),
        ];
        for (toml, expected) in cases {
            assert_eq!(&error_of(toml), expected, "for\n{toml}");
        }
    }

    /// A file as operators write it: a comment, blank lines, two `[[service]]` tables.
    const TWO_SERVICES: &str = "\
# shedder.toml
[daemon]
interfaces = [\"eth0\"]  # the uplink

[[service]]
name = \"api\"
ports = [8080]

[[service]]
name = \"web\"
ports = [80, 443]
min_limit = 50
";

    /// Where `TWO_SERVICES` followed by `more` is refused: (line, column, key path), and the
    /// whole message.
    fn refusal(more: &str) -> ((usize, usize, String), String) {
        let e = Config::parse(&format!("{TWO_SERVICES}{more}")).unwrap_err();
        let at = (e.line.unwrap(), e.column.unwrap(), e.field.clone());
        (at, e.to_string())
    }

    #[test]
    fn a_validation_error_is_placed_at_its_value() {
        // Line 13 of the file, the value after `max_limit   = `.
        let (at, text) = refusal("max_limit   = 10\n");
        assert_eq!(at, (13, 15, "service[1] (web).max_limit".into()));
        assert_eq!(
            text,
            "line 13, column 15: service[1] (web).max_limit: 10 is below min_limit (50)"
        );
        // Columns count characters: `é` is two bytes, one column.
        let (at, _) = refusal("rate = { \"m\u{e9}dium\" = { per_second = 1, burst = 1 } }\n");
        assert_eq!(at, (13, 21, "service[1] (web).rate.m\u{e9}dium".into()));
        // A key left to its default, refused: at the header of its table.
        let (at, text) = refusal("max_limit = 100\n");
        assert_eq!(at, (9, 1, "service[1] (web).fallback_limit".into()));
        assert!(
            text.ends_with("256 is outside [min_limit, max_limit] = [50, 100]"),
            "{text}"
        );
        let (at, _) = refusal(
            "\n[fleet]\nendpoints = [\"http://e:2379\"]\nmax_nodes = 3\nusername = \"x\"\n",
        );
        if crate::config::FLEET_AVAILABLE {
            assert_eq!(at, (14, 1, "fleet.password_file".into()));
        } else {
            // A build without fleet mode refuses the section itself, at its header.
            assert_eq!(at, (14, 1, "fleet".into()));
        }
    }

    #[test]
    fn a_deserialization_error_is_placed_at_its_value() {
        // In the third [[service]], indented.
        let (at, text) =
            refusal("\n  [[service]]\n  name = \"db\"\n  ports = [5432]\n  max_limit = \"lots\"\n");
        assert_eq!(at, (17, 15, "service[2] (db).max_limit".into()));
        assert_eq!(
            text,
            "line 17, column 15: service[2] (db).max_limit: invalid type: string \"lots\", \
             expected an integer in 0..=4294967295"
        );
        // A key the table lacks: at the table's header.
        let (at, _) = refusal("\n  [[service]]\n  name = \"db\"\n");
        assert_eq!(at, (14, 3, "service[2] (db).ports".into()));
        // An element of an array written over several lines.
        let (at, _) = refusal("addresses = [\n    \"198.18.0.1\",\n    \"198.18.0.300\",\n]\n");
        assert_eq!(at, (15, 5, "service[1] (web).addresses[1]".into()));
        // An unknown key: at the key.
        let (at, _) = refusal("  max_limt = 5\n");
        assert_eq!(at, (13, 3, "service[1] (web).max_limt".into()));
    }

    /// Keys the deserializer refuses are all named, each placed, however many sections
    /// they are in; a required key of the wrong type is named once, not again as missing.
    #[test]
    fn every_refused_key_is_reported() {
        let e = Config::parse(
            "[daemon]\ninterfaces = [\"eth0\"]\ntick = 5\n\n\
             [[service]]\nname = \"a\"\nports = [80, \"x\"]\nmax_limit = \"lots\"\n\n\
             [[service]]\nname = \"b\"\nports = [81]\naction = \"reject\"\n",
        )
        .unwrap_err();
        let all: Vec<(Option<usize>, String)> =
            e.each().into_iter().map(|e| (e.line, e.field)).collect();
        assert_eq!(
            all,
            [
                (Some(3), "daemon.tick".to_string()),
                (Some(7), "service[0] (a).ports[1]".to_string()),
                (Some(8), "service[0] (a).max_limit".to_string()),
                (Some(13), "service[1] (b).action".to_string()),
            ],
            "{e}"
        );
        let e = Config::parse("[[service]]\nname = 5\nports = [80]\nmax_limt = 1\n").unwrap_err();
        let fields: Vec<String> = e.each().into_iter().map(|e| e.field).collect();
        assert_eq!(fields, ["service[0].name", "service[0].max_limt"], "{e}");
    }

    #[test]
    fn a_syntax_error_is_placed_where_toml_stops() {
        let e = Config::parse("[daemon]\ninterfaces = [\"eth0\"]\ntick_ms = = 5\n").unwrap_err();
        assert_eq!(
            (e.line, e.column, e.field.as_str()),
            (Some(3), Some(11), "")
        );
        assert_eq!(e.to_string(), format!("line 3, column 11: {}", e.message));
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
                "{}:4:10: service[0] (a).action: unknown value `reject`, expected one of `refuse`, `rst`, `drop`",
                path.display()
            )
        );
    }
}
