//! shedder's lab: the ground the root-only integration tests and the benchmarks stand on
//! (network namespaces that clean up after themselves, also on panic; real TCP; the real
//! daemon in a namespace; the standard test policy; crafted packets), and the lab built on
//! it (the open-loop load generator and the backend of known capacity, the peers shedder is
//! compared with, the overload, flood and keep-alive labs, the machine's description and the
//! charts). Its binaries (`src/bin/`) are the benchmarks, the demo and the verifier report.
//! The integration tests (the `shedder-tests` crate) use it; it uses nothing of theirs.

pub mod daemon;
pub mod flood;
pub mod flood_lab;
pub mod interrupt;
pub mod keepalive_lab;
pub mod load;
pub mod machine;
pub mod netns;
pub mod packet;
pub mod peers;
pub mod plot;
pub mod policy;
pub mod scenario;
pub mod stats;
pub mod tcp;

use std::sync::Once;

/// Whether this process runs as root, as the tests and the benchmarks must (they load BPF
/// programs and create network namespaces).
pub fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() == 0 }
}

/// Panic with a clear message unless running as root (the tests load BPF programs and
/// create network namespaces).
pub fn require_root() {
    if !is_root() {
        panic!(
            "this test needs root (BPF programs, network namespaces): run `cargo xtask test` as root"
        );
    }
}

/// Mount bpffs and tracefs where they are missing. Idempotent.
pub fn ensure_fs() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        shedder::kernel::sysfs::ensure_bpffs().expect("mounting bpffs");
    });
}
