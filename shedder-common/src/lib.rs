//! The kernel/user contract of shedder: map keys and values, counter indices, class and
//! verdict ids, capacities, and the pure arithmetic both sides run (admission decision,
//! token bucket, RST checksums).
//!
//! Every map value is `#[repr(C)]` with explicit padding fields, holds no `bool` or
//! `Option`, and has a size asserted at compile time, so the eBPF object and the daemon
//! can never disagree about a layout silently.
//!
//! One module per concern. The items of the contract's modules are re-exported here, so
//! that `shedder_common::ServicePolicy` names an item wherever it is kept.
#![no_std]
// Inline assembly on BPF (see `mask`) is behind this feature; the eBPF build is on nightly.
#![cfg_attr(target_arch = "bpf", feature(asm_experimental_arch))]

#[cfg(test)]
extern crate std;

// The contract: ids and capacities, what the daemon writes, what the packet path keeps and
// counts, and the names both sides find the maps and programs by.
pub mod classmap;
pub mod counters;
pub mod demotion;
pub mod globals;
pub mod headers;
pub mod ids;
pub mod klog;
pub mod layout;
pub mod maps;
pub mod occupancy;
pub mod policy;
pub mod programs;
pub mod reasons;
pub mod stats;
pub mod tracking;

// The arithmetic both sides run, with the records and tables it works on.
pub mod admit;
pub mod csum;
pub mod fair;
pub mod flow;
pub mod frag;
pub mod gcra;
pub mod handshake;
pub mod hist;
pub mod mask;
pub mod proof;
pub mod quic;
pub mod refusal;
pub mod table;
pub mod tunnel;
pub mod work;

#[cfg(feature = "user")]
mod pod;

pub use classmap::{CLASS_L1_ENTRIES, CLASS_L2_BLOCKS, ClassBlock, ClassRule, MAX_CLASS_RULES};
pub use counters::*;
pub use demotion::*;
pub use gcra::Bucket;
pub use globals::*;
pub use headers::*;
pub use ids::*;
pub use klog::*;
pub use layout::*;
pub use occupancy::*;
pub use policy::*;
pub use reasons::*;
pub use stats::*;
pub use table::SYN_SETS;
pub use tracking::*;
