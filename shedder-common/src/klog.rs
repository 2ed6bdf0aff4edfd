//! The kernel debug log's budget (`daemon.kernel_debug_log`).

/// With `daemon.kernel_debug_log`, each CPU writes at most this many kernel log lines a
/// second; the rest are counted in [`crate::STAT_LOG_SUPPRESSED`].
pub const KLOG_LINES_PER_SECOND: u32 = 20;

/// A CPU's kernel-log budget: lines written in the current second.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LogBudget {
    /// `bpf_ktime_get_ns() / 1e9` of the current window.
    pub second: u64,
    pub used: u32,
    pub _pad: u32,
}
