//! The Prometheus / OpenMetrics endpoint.
pub mod names;
