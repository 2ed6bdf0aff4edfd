//! What the controller sees of each service, once per tick: kernel-measured accept-queue age
//! and response latency over the last window, in-flight connections, offered / admitted /
//! shed rates per class (and the SYN retransmits and retries beside them), the retry ratio
//! over the window, accept-queue depth, listen overflows and cgroup pressure; for QUIC
//! services the UDP sockets' receive queues and drops, and the namespace's UDP errors.
//!
//! A source that cannot be read is reported as [`Reading::Missing`] with the reason, or as
//! [`Reading::Stale`] (the last value and its age) for a short while after a failure; a
//! value is never invented as zero.

pub mod netstat;
pub mod psi;
pub mod refused;
pub mod snmp;

mod reader;
mod reading;
mod waiting;

pub use reader::{Cumulative, SignalReader};
pub use reading::*;
pub use waiting::{Waiting, span_ms, waiting};
