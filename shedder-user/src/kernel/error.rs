//! What can go wrong between the daemon and the kernel.

use std::path::PathBuf;

use aya::programs::ProgramError;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("loading the eBPF object: {0}")]
    Object(#[from] aya::EbpfError),
    #[error("the eBPF object has no program `{0}`")]
    MissingProgram(&'static str),
    #[error("the eBPF object has no map `{0}`")]
    MissingMap(&'static str),
    #[error(
        "the kernel verifier rejected `{program}`: {reason} ({source}); shedder is validated \
         on Linux {} and later (`shedder doctor` checks this kernel). \
         The verifier's log:\n{log}",
        crate::kernel::version::MIN_KERNEL
    )]
    Verifier {
        program: &'static str,
        source: std::io::Error,
        /// The log's last line that is not a statistic: usually why.
        reason: String,
        log: String,
    },
    #[error("program `{program}`: {source}")]
    Program {
        program: &'static str,
        #[source]
        source: ProgramError,
    },
    #[error("attaching to interface `{iface}` ({mode}): {source}")]
    Attach {
        iface: String,
        mode: &'static str,
        #[source]
        source: ProgramError,
    },
    #[error("map `{map}`: {source}")]
    Map {
        map: &'static str,
        #[source]
        source: aya::maps::MapError,
    },
    #[error("{0} is out of range: {1}")]
    Range(&'static str, String),
    #[error("pinning under {path}: {reason}")]
    Pin { path: PathBuf, reason: String },
    #[error("connection tracking: {0}")]
    Tracing(String),
    #[error(
        "service `{service}` is a QUIC service, but this kernel did not load shedder's QUIC \
         programs ({why}); TCP services are protected, QUIC ones cannot be"
    )]
    QuicUnavailable { service: String, why: String },
    #[error("{0}: {1}")]
    Io(&'static str, #[source] std::io::Error),
    #[error("the pinned maps' layout: {0}")]
    Layout(String),
}

/// The last line of a verifier log that says something other than its statistics.
pub(super) fn verifier_reason(log: &str) -> String {
    const STATS: [&str; 4] = [
        "verification time",
        "stack depth",
        "processed ",
        "max_states",
    ];
    log.lines()
        .map(str::trim)
        .rev()
        .find(|l| !l.is_empty() && !STATS.iter().any(|s| l.starts_with(s)))
        .map_or_else(|| "no reason in the log".into(), str::to_string)
}

impl Error {
    /// The verifier gave up on a program as too complex for this kernel (it processed its
    /// limit of instructions, E2BIG): a newer kernel's verifier prunes more.
    pub fn too_complex(&self) -> bool {
        matches!(self, Error::Verifier { source, .. } if source.raw_os_error() == Some(libc::E2BIG))
    }
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn verifier_reason_is_the_last_line_before_the_statistics() {
        // Linux 6.1 on an index whose bounds it lost (the mask LLVM had dropped).
        let log = "3482: (0f) r0 += r9\nvalue -9223372036854775744 makes map_value pointer be out of bounds\nverification time 52253 usec\nstack depth 272+0\nprocessed 622 insns (limit 1000000) max_states_per_insn 1 total_states 45 peak_states 45 mark_read 17\n";
        assert_eq!(
            verifier_reason(log),
            "value -9223372036854775744 makes map_value pointer be out of bounds"
        );
        let too_big = "processed 1000001 insns (limit 1000000) max_states_per_insn 36\n";
        assert_eq!(verifier_reason(too_big), "no reason in the log");
        let e = Error::Verifier {
            program: "shedder_xdp",
            source: std::io::Error::from_raw_os_error(libc::E2BIG),
            reason: verifier_reason(too_big),
            log: too_big.into(),
        };
        assert!(e.too_complex());
        let text = e.to_string();
        assert!(
            text.starts_with("the kernel verifier rejected `shedder_xdp`: "),
            "{text}"
        );
        assert!(text.contains("shedder doctor"), "{text}");
    }
}
