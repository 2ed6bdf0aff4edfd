//! Builds the eBPF object (shedder-ebpf, for bpfel-unknown-none with the nightly toolchain)
//! into OUT_DIR, where `src/ebpf.rs` embeds it.
use anyhow::{Context as _, anyhow};

/// The nightly the eBPF object is built with (`-Z build-std=core` needs a nightly): pinned
/// to a date, so the object does not change with whatever `nightly` is installed.
/// `cargo xtask setup` installs it (xtask/src/setup.rs `EBPF_TOOLCHAIN`, which must be the
/// same; a test of xtask checks it), with rust-src and a bpf-linker on its LLVM.
const EBPF_TOOLCHAIN: &str = "nightly-2026-05-20";

fn main() -> anyhow::Result<()> {
    let manifest_dir = std::env::var("CARGO_MANIFEST_DIR").context("CARGO_MANIFEST_DIR")?;
    let root = std::path::Path::new(&manifest_dir)
        .parent()
        .ok_or_else(|| anyhow!("shedder-user has no parent directory"))?
        .join("shedder-ebpf");
    let root = root.to_str().context("non-UTF-8 path to shedder-ebpf")?;
    aya_build::build_ebpf(
        [aya_build::Package {
            name: "shedder-ebpf",
            root_dir: root,
            ..Default::default()
        }],
        aya_build::Toolchain::Custom(EBPF_TOOLCHAIN),
    )
}
