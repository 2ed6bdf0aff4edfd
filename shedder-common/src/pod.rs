//! `aya::Pod` for every map key and value, so the daemon can read and write them.
// SAFETY (every impl below): all of these are #[repr(C)] plain integers with explicit
// padding fields, so every bit pattern is valid and there are no uninitialised bytes.
#![allow(clippy::undocumented_unsafe_blocks)]

use crate::classmap::{ClassBlock, ClassRule};
use crate::counters::{ServiceCounters, ServiceHist};
use crate::gcra::Bucket;
use crate::globals::Globals;
use crate::ids::ServiceAddrKey;
use crate::occupancy::{Inflight, Pending, PendingSlot};
use crate::policy::{ClassPolicy, ServicePolicy};
use crate::tracking::{SeedResult, SeedSock, SockState};
use crate::{fair, flow, proof, table, work};

unsafe impl aya::Pod for Globals {}
unsafe impl aya::Pod for ClassPolicy {}
unsafe impl aya::Pod for ServicePolicy {}
unsafe impl aya::Pod for Inflight {}
unsafe impl aya::Pod for PendingSlot {}
unsafe impl aya::Pod for Pending {}
unsafe impl aya::Pod for Bucket {}
unsafe impl aya::Pod for ServiceAddrKey {}
unsafe impl aya::Pod for ClassRule {}
unsafe impl aya::Pod for ClassBlock {}
unsafe impl aya::Pod for SockState {}
unsafe impl aya::Pod for SeedSock {}
unsafe impl aya::Pod for SeedResult {}
unsafe impl aya::Pod for ServiceCounters {}
unsafe impl aya::Pod for ServiceHist {}
unsafe impl aya::Pod for table::Set {}
unsafe impl aya::Pod for fair::SourceSet {}
unsafe impl aya::Pod for fair::Fairness {}
unsafe impl aya::Pod for proof::StandingSet {}
unsafe impl aya::Pod for flow::FlowKey {}
unsafe impl aya::Pod for flow::Flow {}
unsafe impl aya::Pod for flow::AliveRing {}
unsafe impl aya::Pod for work::Ring {}
