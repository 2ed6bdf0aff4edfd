//! The tracking tracepoints' record layouts, checked against the running kernel.

use shedder_common::programs;

/// Check that the running kernel's `sock` tracepoint records have the layout the tracking
/// programs read (see `shedder_common::tp`). A missing optional tracepoint (see
/// [`programs::OPTIONAL_TRACEPOINTS`]) is returned, not an error; a missing required one, or
/// any with another layout, is an error.
pub fn check_tracepoint_formats() -> Result<Vec<&'static str>, String> {
    use shedder_common::tp;
    /// (field, offset, size) as in `shedder_common::tp`.
    type Layout = [(&'static str, usize, usize)];
    let checks: [(&str, &Layout); 4] = [
        ("inet_sock_set_state", &tp::state::FIELDS),
        ("sock_recv_length", &tp::length::FIELDS),
        ("sock_send_length", &tp::length::FIELDS),
        ("sk_data_ready", &tp::data::FIELDS),
    ];
    let mut missing = Vec::new();
    for (event, fields) in checks {
        let path = format!(
            "{}/events/sock/{event}/format",
            crate::kernel::sysfs::TRACEFS
        );
        let text = match std::fs::read_to_string(&path) {
            Ok(text) => text,
            Err(e)
                if e.kind() == std::io::ErrorKind::NotFound
                    && programs::OPTIONAL_TRACEPOINTS.contains(&event) =>
            {
                missing.push(event);
                continue;
            }
            Err(e) => {
                return Err(format!(
                    "cannot read {path}: {e} (this kernel lacks the sock:{event} tracepoint)"
                ));
            }
        };
        let found = parse_format(&text);
        for &(name, offset, size) in fields {
            match found.iter().find(|(n, _, _)| n == name) {
                Some(&(_, o, s)) if o == offset && s == size => {}
                Some(&(_, o, s)) => {
                    return Err(format!(
                        "sock:{event} field `{name}` is at offset {o} size {s} on this kernel, \
                         shedder reads offset {offset} size {size}"
                    ));
                }
                None => {
                    return Err(format!("sock:{event} has no field `{name}` on this kernel"));
                }
            }
        }
    }
    Ok(missing)
}

/// What is lost without the optional tracepoints in `missing` (empty: nothing).
pub fn missing_tracepoints_note(missing: &[&str]) -> Option<String> {
    let latency: Vec<String> = missing
        .iter()
        .filter(|t| **t != DATA_EVENT)
        .map(|t| format!("sock:{t}"))
        .collect();
    let mut notes = Vec::new();
    if !latency.is_empty() {
        notes.push(format!(
            "this kernel has no {} (Linux {} and later have them): in-flight connections are \
             counted, but accept-queue age and response latency are not measured, so the aimd \
             and gradient2 controllers have no latency signal and hold each service at its \
             fallback_limit; use controller = \"fixed\" to choose the limit, or a kernel ≥ {}",
            latency.join(" or "),
            programs::LATENCY_TRACEPOINTS_SINCE,
            programs::LATENCY_TRACEPOINTS_SINCE,
        ));
    }
    if missing.contains(&DATA_EVENT) {
        notes.push(format!(
            "this kernel has no sock:{DATA_EVENT} (Linux {} and later have it): every \
             established connection counts as work in flight, idle keep-alive connections \
             included, so a pool of idle connections fills the limit; and the age of requests \
             still in service is not measured (only completed ones), so a service whose answers \
             stop is seen only as they complete; set max_limit above the idle connections a \
             service holds, or run a kernel ≥ {}",
            programs::DATA_TRACEPOINT_SINCE,
            programs::DATA_TRACEPOINT_SINCE,
        ));
    }
    (!notes.is_empty()).then(|| notes.join("; "))
}

/// The tracepoint that tells when a request arrives (see `shedder_common::work`).
pub const DATA_EVENT: &str = "sk_data_ready";

/// `(name, offset, size)` of each field line of a tracefs `format` file.
pub(super) fn parse_format(text: &str) -> Vec<(String, usize, usize)> {
    let mut out = Vec::new();
    for line in text.lines() {
        let mut name = None;
        let mut offset = None;
        let mut size = None;
        for part in line.split(';') {
            let part = part.trim();
            if let Some(decl) = part.strip_prefix("field:") {
                // `unsigned short common_type` or `__u8 saddr[4]`: the last word, sans array.
                name = decl
                    .split_whitespace()
                    .last()
                    .map(|n| n.split('[').next().unwrap_or(n).to_string());
            } else if let Some(v) = part.strip_prefix("offset:") {
                offset = v.parse().ok();
            } else if let Some(v) = part.strip_prefix("size:") {
                size = v.parse().ok();
            }
        }
        if let (Some(n), Some(o), Some(s)) = (name, offset, size) {
            out.push((n, o, s));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tracefs_format_lines_parse() {
        let text = "name: x\nformat:\n\tfield:unsigned short common_type;\toffset:0;\tsize:2;\tsigned:0;\n\tfield:__u8 saddr_v6[16];\toffset:40;\tsize:16;\tsigned:0;\n\nprint fmt: \"%d\"\n";
        assert_eq!(
            parse_format(text),
            [
                ("common_type".to_string(), 0, 2),
                ("saddr_v6".to_string(), 40, 16)
            ]
        );
    }
}
