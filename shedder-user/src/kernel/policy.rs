//! What the maps are written with for a configuration: plain values, compiled from the
//! configuration by `control::policy`, written by [`super::MapWriter::write_compiled`].

use std::net::IpAddr;

use shedder_common::{Globals, ServicePolicy};

use crate::types::{Prefix, Protocol};

/// The kernel's view of one configured service.
#[derive(Clone, Debug, PartialEq)]
pub struct CompiledService {
    pub id: u32,
    pub name: String,
    pub protocol: Protocol,
    pub ports: Vec<u16>,
    pub addresses: Vec<IpAddr>,
    pub policy: ServicePolicy,
}

/// Everything to write into the maps for a configuration.
#[derive(Clone, Debug, PartialEq)]
pub struct Compiled {
    pub services: Vec<CompiledService>,
    pub class_rules: Vec<(Prefix, u32)>,
    pub globals: Globals,
    /// The decapsulation map's entries that are not empty: (index, tunnel kind), see
    /// `shedder_common::tunnel`.
    pub decap: Vec<(u32, u32)>,
}
