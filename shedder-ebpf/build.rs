//! Rebuild the eBPF object when the linker changes (aya-template convention).
use which::which;

fn main() {
    let bpf_linker = which("bpf-linker").expect(
        "bpf-linker not found on PATH: run `cargo xtask setup` (or `cargo xtask test`) first",
    );
    println!("cargo:rerun-if-changed={}", bpf_linker.display());
}
