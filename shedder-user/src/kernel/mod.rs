//! Loading the eBPF object, attaching it, and reading and writing its maps.
//!
//! One file per concern: [`load`], [`attach`], [`maps`], the [`clock`], the [`pins`],
//! [`seed`]ing connections open before attach, the tracked connections ([`conns`]), the
//! kernel debug log ([`klog`]), the sockets by sock_diag ([`diag`]), the interfaces
//! ([`netdev`]), the policy's map values ([`policy`], [`classmap`]), [`version`]s and the
//! pseudo-filesystems ([`sysfs`]).

/// The eBPF object built by build.rs.
pub static OBJECT: &[u8] = aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/shedder"));

/// An XDP program that returns XDP_PASS and nothing else
/// ([`shedder_common::programs::BASELINE_XDP`]) and a TC classifier that returns TC_ACT_OK
/// and nothing else ([`shedder_common::programs::BASELINE_TC`]): the baselines
/// `cargo xtask bench xdp` measures the shed path and the egress program against. Never
/// attached.
pub static BASELINE_OBJECT: &[u8] =
    aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/shedder-baseline"));

/// Default root of everything shedder pins.
pub const DEFAULT_PIN_DIR: &str = "/sys/fs/bpf/shedder";

pub mod attach;
pub mod classmap;
pub mod clock;
pub mod conns;
pub mod diag;
pub mod error;
pub mod klog;
pub mod layout;
pub mod load;
pub mod maps;
pub mod netdev;
pub mod netns;
pub mod pins;
pub mod policy;
pub mod refusals;
pub mod seed;
pub mod sysfs;
pub mod version;

pub use attach::{
    AttachMode, Attached, EGRESS_PIN_PREFIX, INGRESS_NETLINK_PREFIX, egress_pin_name,
    pinned_ingress, unpin_all,
};
pub use error::{Error, Result};
pub use load::{Hook, Shedder};
pub use maps::{MapReader, MapWriter, PinnedMaps, addr_key};
