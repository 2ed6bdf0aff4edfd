//! Golden-file comparison for the operator-facing texts (help, status tables): a change to
//! what an operator reads must show up as a reviewed diff of `shedder-user/golden/`.

use std::path::PathBuf;

/// Compare `actual` with `golden/<name>`; with `UPDATE_GOLDEN=1` in the environment,
/// rewrite the file instead (then review the diff before committing).
pub fn check(name: &str, actual: &str) {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("golden")
        .join(name);
    if std::env::var_os("UPDATE_GOLDEN").is_some() {
        std::fs::write(&path, actual).unwrap_or_else(|e| panic!("writing {}: {e}", path.display()));
        return;
    }
    let expected = std::fs::read_to_string(&path).unwrap_or_else(|e| {
        panic!(
            "reading {}: {e} (create it with UPDATE_GOLDEN=1)",
            path.display()
        )
    });
    if actual != expected {
        let first = actual
            .lines()
            .zip(expected.lines())
            .position(|(a, e)| a != e)
            .unwrap_or_else(|| actual.lines().count().min(expected.lines().count()));
        panic!(
            "{} differs from the output, first at line {}:\n  golden: {:?}\n  actual: {:?}\n\
             If the change is intended, rerun with UPDATE_GOLDEN=1 and review the diff.",
            path.display(),
            first + 1,
            expected.lines().nth(first).unwrap_or("<end>"),
            actual.lines().nth(first).unwrap_or("<end>"),
        );
    }
}
