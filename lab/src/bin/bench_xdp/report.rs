//! The figures: a row per subject against the baseline of its kind, and the RST path
//! estimated on the repeated basis.

use serde::Serialize;
use shedder_lab::machine::Machine;

use super::{
    connection,
    measure::Subject,
    programs::{Hook, Method, XDP_DROP, XDP_PASS, XDP_TX, action_name},
};

#[derive(Debug, Serialize)]
pub struct Row {
    pub path: &'static str,
    pub hook: Hook,
    /// An empty program's row: the baseline of its hook's rows.
    pub baseline: bool,
    pub method: Method,
    /// What the program returned, every run.
    pub action: String,
    /// Median nanoseconds per packet.
    pub ns: f64,
    /// The median of the baseline measured by the same method.
    pub baseline_ns: f64,
    pub ratio: f64,
    pub target: Option<f64>,
    pub pass: Option<bool>,
    pub samples: usize,
    /// From a source with standing: a repeated call runs at most 255 times.
    pub proven: bool,
}

#[derive(Debug, Serialize)]
pub struct Report {
    pub machine: Machine,
    pub repeat: u32,
    pub rounds: usize,
    pub single_calls: usize,
    pub rows: Vec<Row>,
    pub rst_estimate: Option<RstEstimate>,
    /// Instructions the verifier processed per program (verification complexity).
    pub verified_insns: Vec<(String, Option<u32>)>,
    /// The same with `daemon.kernel_debug_log` (XDP and TC only).
    pub verified_insns_logging: Vec<(String, Option<u32>)>,
    /// What one whole connection costs, protected and not.
    pub connection: connection::ConnectionCost,
}

/// The RST path on the repeated basis, estimated: the repeated SYN-drop figure plus what
/// the reset costs over the drop when both are measured single-shot.
#[derive(Debug, Serialize)]
pub struct RstEstimate {
    pub ns: f64,
    pub ratio: f64,
}

/// The empty XDP program's figure by `method` (on a SYN's frame: the first one measured).
pub fn xdp_baseline(rows: &[Row], method: Method) -> Option<f64> {
    rows.iter()
        .find(|r| r.hook == Hook::Xdp && r.method == method && r.baseline)
        .map(|r| r.ns)
}

pub fn estimate_rst(rows: &[Row]) -> Option<RstEstimate> {
    let find = |method, action: u32, baseline: bool| {
        rows.iter()
            .find(|r| {
                r.hook == Hook::Xdp
                    && r.method == method
                    && r.action == action_name(Hook::Xdp, action)
                    && r.baseline == baseline
            })
            .map(|r| r.ns)
    };
    let base = find(Method::Repeated, XDP_PASS, true)?;
    let drop = find(Method::Repeated, XDP_DROP, false)?;
    let drop_single = find(Method::SingleShot, XDP_DROP, false)?;
    let rst_single = find(Method::SingleShot, XDP_TX, false)?;
    let ns = drop + (rst_single - drop_single);
    Some(RstEstimate {
        ns,
        ratio: ns / base,
    })
}

/// What picks a row's baseline.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Kind {
    pub hook: Hook,
    pub method: Method,
    /// The row is a baseline.
    pub baseline: bool,
    /// Its frame is a QUIC Initial's (1,200 bytes and more), not a TCP segment's.
    pub initial: bool,
}

impl Kind {
    pub fn of(s: &Subject) -> Self {
        Self {
            hook: s.hook,
            method: s.method,
            baseline: s.baseline,
            initial: s.frame.len() >= shedder_common::quic::MIN_INITIAL_DATAGRAM,
        }
    }
}

/// Of `kinds`, the baseline a row of kind `k` is compared with: the first empty program of
/// the same hook, measured by the same method on a frame of the same kind.
pub fn baseline_of(kinds: &[Kind], k: Kind) -> Option<usize> {
    kinds.iter().position(|b| {
        b.baseline && b.hook == k.hook && b.method == k.method && b.initial == k.initial
    })
}

pub fn rows(subjects: &[Subject]) -> Vec<Row> {
    let kinds: Vec<Kind> = subjects.iter().map(Kind::of).collect();
    subjects
        .iter()
        .zip(&kinds)
        .map(|(s, &k)| {
            let baseline_ns = baseline_of(&kinds, k).map_or(f64::NAN, |i| subjects[i].median());
            let ns = s.median();
            let ratio = ns / baseline_ns;
            Row {
                path: s.label,
                hook: s.hook,
                baseline: s.baseline,
                method: s.method,
                action: action_name(s.hook, s.action),
                ns,
                baseline_ns,
                ratio,
                target: s.target,
                pass: s.target.map(|t| ratio <= t),
                samples: s.samples.len(),
                proven: s.proven,
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{paths::TARGET_SYN, programs::TCX_NEXT};

    fn kind(hook: Hook, method: Method, baseline: bool, initial: bool) -> Kind {
        Kind {
            hook,
            method,
            baseline,
            initial,
        }
    }

    #[test]
    fn each_row_is_compared_with_the_empty_program_of_its_own_hook() {
        let kinds = [
            kind(Hook::Xdp, Method::Repeated, true, false),
            kind(Hook::Xdp, Method::Repeated, true, true),
            kind(Hook::Xdp, Method::Repeated, false, false),
            kind(Hook::Xdp, Method::SingleShot, true, false),
            kind(Hook::Xdp, Method::SingleShot, false, false),
            kind(Hook::TcEgress, Method::Repeated, true, false),
            kind(Hook::TcEgress, Method::Repeated, false, false),
        ];
        let base = |i: usize| baseline_of(&kinds, kinds[i]);
        assert_eq!(base(2), Some(0), "an XDP path, repeated");
        assert_eq!(base(1), Some(1), "the QUIC frame's baseline is its own");
        assert_eq!(base(4), Some(3), "an XDP path, single-shot");
        assert_eq!(base(6), Some(5), "an egress path: the empty classifier");
        assert_eq!(base(5), Some(5));
        // An egress row has no target, but is no baseline: without the empty classifier
        // it has none, not an XDP one and not itself.
        assert_eq!(baseline_of(&kinds[..5], kinds[6]), None);
    }

    fn row(hook: Hook, baseline: bool, method: Method, action: u32, ns: f64) -> Row {
        Row {
            path: "row",
            hook,
            baseline,
            method,
            action: action_name(hook, action),
            ns,
            baseline_ns: f64::NAN,
            ratio: f64::NAN,
            target: (!baseline && hook == Hook::Xdp).then_some(TARGET_SYN),
            pass: None,
            samples: 1,
            proven: false,
        }
    }

    #[test]
    fn the_egress_rows_are_no_xdp_baseline() {
        // Egress rows first: none of them may be taken for the XDP baselines, though they
        // have no target either (and TC_ACT_OK would be 0, as XDP_ABORTED).
        let rows = vec![
            row(Hook::TcEgress, true, Method::Repeated, TCX_NEXT, 5.0),
            row(Hook::TcEgress, false, Method::Repeated, TCX_NEXT, 30.0),
            row(Hook::Xdp, true, Method::Repeated, XDP_PASS, 10.0),
            row(Hook::Xdp, false, Method::Repeated, XDP_DROP, 25.0),
            row(Hook::Xdp, true, Method::SingleShot, XDP_PASS, 100.0),
            row(Hook::Xdp, false, Method::SingleShot, XDP_DROP, 130.0),
            row(Hook::Xdp, false, Method::SingleShot, XDP_TX, 160.0),
        ];
        assert_eq!(xdp_baseline(&rows, Method::Repeated), Some(10.0));
        assert_eq!(xdp_baseline(&rows, Method::SingleShot), Some(100.0));
        let e = estimate_rst(&rows).expect("an estimate");
        assert_eq!(e.ns, 25.0 + (160.0 - 130.0));
        assert_eq!(e.ratio, 5.5);
    }
}
