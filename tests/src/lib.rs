//! Support for shedder's root-only integration tests and benchmarks: crafted packets,
//! a standard test policy, BPF_PROG_TEST_RUN helpers, and network namespaces that clean up
//! after themselves (also on panic).

pub mod daemon;
pub mod flood;
pub mod flood_lab;
pub mod interrupt;
pub mod keepalive_lab;
pub mod load;
pub mod machine;
pub mod markdown;
pub mod netns;
pub mod packet;
pub mod peers;
pub mod plot;
pub mod policy;
pub mod raw;
pub mod reference;
pub mod scenario;
pub mod stats;
pub mod tcp;

use std::sync::Once;

/// Whether this process runs as root, as the tests and the benchmarks must (they load BPF
/// programs and create network namespaces).
/// The repository's root (the tests crate's parent).
pub fn repo_root() -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("tests/ has a parent")
        .to_path_buf()
}

/// A file of the repository by its path from the root; panics naming it if unreadable.
pub fn read_repo_file(rel: &str) -> String {
    std::fs::read_to_string(repo_root().join(rel)).unwrap_or_else(|e| panic!("{rel}: {e}"))
}

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
