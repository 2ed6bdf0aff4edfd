//! What only shedder's integration tests use; the ground they share with the benchmarks
//! (namespaces, the daemon harness, the test policy, crafted packets, the load generator and
//! the peers) is the lab's (`shedder-lab`).

pub mod markdown;
pub mod raw;
pub mod reference;

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
