//! Kernel debug logs (`daemon.kernel_debug_log`): the packet path's aya-log records,
//! read from their ring buffer and re-emitted as tracing events on the target
//! `shedder::kernel`, with the numeric class, verdict and reason codes spelled out.
//!
//! The kernel side writes at most [`shedder_common::KLOG_LINES_PER_SECOND`] lines a second
//! per CPU and counts the rest (`log_suppressed` in the kernel events).

use std::{
    os::fd::{AsFd as _, AsRawFd, RawFd},
    time::Duration,
};

use aya_log::EbpfLogger;
use shedder_common::{CLASS_NAMES, Reason, VERDICT_NAMES};
use tokio::io::{Interest, unix::AsyncFd};
use tracing::{debug, error, info, warn};

/// The target of the re-emitted events (e.g. `RUST_LOG=info,shedder::kernel=off` hides them).
pub const TARGET: &str = "shedder::kernel";

/// Forwards aya-log records to tracing.
pub struct KernelLog;

impl log::Log for KernelLog {
    fn enabled(&self, _: &log::Metadata<'_>) -> bool {
        true
    }

    fn log(&self, record: &log::Record<'_>) {
        let line = spell_out(&record.args().to_string());
        // Turning `daemon.kernel_debug_log` on is the request to see these lines: the
        // kernel's debug lines come out at info, visible with the default filter.
        match record.level() {
            log::Level::Error => error!(target: TARGET, "{line}"),
            log::Level::Warn => warn!(target: TARGET, "{line}"),
            log::Level::Info | log::Level::Debug => info!(target: TARGET, "{line}"),
            log::Level::Trace => debug!(target: TARGET, "{line}"),
        }
    }

    fn flush(&self) {}
}

/// Replace `class=N`, `verdict=N` and `reason=N` by their names (the kernel writes codes:
/// formatting strings there would cost instructions on the packet path).
pub fn spell_out(line: &str) -> String {
    line.split(' ')
        .map(|word| {
            for key in ["class=", "verdict=", "reason="] {
                if let Some(code) = word.strip_prefix(key)
                    && let Some(name) = code.parse::<usize>().ok().and_then(|c| name_of(key, c))
                {
                    return format!("{key}{name}");
                }
            }
            word.to_string()
        })
        .collect::<Vec<_>>()
        .join(" ")
}

/// The name of `code` after `key` in a kernel log line; `None` for a code without one
/// (another object version's), which is left as the number.
fn name_of(key: &str, code: usize) -> Option<&'static str> {
    match key {
        "class=" => CLASS_NAMES.get(code).copied(),
        "verdict=" => VERDICT_NAMES.get(code).copied(),
        _ => Reason::from_u32(u32::try_from(code).ok()?).map(Reason::name),
    }
}

/// The logger, as a file descriptor the runtime can wait on (its ring buffer's).
struct Readable(EbpfLogger<KernelLog>);

impl AsRawFd for Readable {
    fn as_raw_fd(&self) -> RawFd {
        self.0.as_fd().as_raw_fd()
    }
}

/// Forward `logger`'s records as they come, from a task on the side-I/O runtime, until the
/// process exits.
pub fn forward(logger: EbpfLogger<KernelLog>) {
    crate::runtime::handle().spawn(async move {
        // SAFETY: the logger owns its ring buffer's fd and keeps it open, unreplaced, for as
        // long as the AsyncFd holds the logger.
        let registered =
            unsafe { AsyncFd::register_with_interest(Readable(logger), Interest::READABLE) };
        let mut fd = match registered {
            Ok(fd) => fd,
            Err(e) => {
                warn!(error = %e, "kernel log: cannot wait on its ring buffer; no kernel logs");
                return;
            }
        };
        loop {
            match fd.readable_mut().await {
                Ok(mut ready) => {
                    ready.get_inner_mut().0.flush();
                    ready.clear_ready();
                }
                Err(e) => {
                    warn!(error = %e, "kernel log: waiting failed; no more kernel logs");
                    return;
                }
            }
            // Bound the wake-up rate whatever the kernel writes.
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_are_spelled_out_and_the_rest_is_kept() {
        assert_eq!(
            spell_out(
                "shed port=8080 service=0 class=3 verdict=2 reason=5 class_inflight=7 inflight=40 limit=40 stale=0"
            ),
            "shed port=8080 service=0 class=sheddable verdict=rst reason=service_limit \
             class_inflight=7 inflight=40 limit=40 stale=0"
        );
        assert_eq!(
            spell_out("class=99 reason=12 reason=x"),
            "class=99 reason=12 reason=x",
            "unknown codes stay"
        );
        assert_eq!(spell_out(""), "");
    }
}
