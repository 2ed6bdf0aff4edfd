//! The TOML configuration: parsing with documented defaults, and validation that names the
//! field at fault and checks every value against the map capacities before anything is
//! written.
//!
//! One file a concern: the sections' types ([`daemon`](Daemon) and its
//! [`decapsulate`](Decapsulate), [`classes`](Classes), [`service`](Service),
//! [`fleet`](Fleet)) and the whole file ([`Config`]); their [`defaults`]; the parsing of
//! a text ([`Config::parse`]); the rules across keys ([`Config::validate`]); and the error
//! both report ([`ConfigError`]).

mod classes;
mod daemon;
mod decapsulate;
pub mod defaults;
mod document;
mod error;
#[cfg(test)]
mod fixtures;
mod fleet;
mod locate;
mod parse;
mod service;
mod validate;

pub use crate::types::{Attach, Prefix, Protocol};
pub use classes::{Class, ClassName, Classes};
pub use daemon::Daemon;
pub use decapsulate::{Decapsulate, MAX_TUNNEL_PORTS};
pub use document::Config;
pub use error::ConfigError;
pub use fleet::{FLEET_AVAILABLE, FLEET_UNAVAILABLE, Fleet, Shares};
pub use service::{Action, Controller, Mode, Rate, Service, socket_serves};
pub use validate::{LIMIT_CEILING, MAX_RETRY_WINDOW_MS, MAX_SYN_RETRANSMIT_WINDOW_MS, valid_name};
