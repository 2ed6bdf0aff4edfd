//! What operators reach: the control socket, the metrics endpoint (both served on one
//! I/O runtime by [`http`]) and the state they report.

pub mod accept;
pub mod control;
pub mod http;
pub mod metrics;
pub mod state;
