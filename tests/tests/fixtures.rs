//! BPF_PROG_TEST_RUN fixture table for the two shed programs (katran style): each row is a
//! description, the input frame, the setup of the maps, the expected verdict (with the exact
//! output bytes for RST rows) and the decision counter that must go up by one.
//!
//! Every row runs through both the XDP and the TC program (except the few frames the kernel
//! refuses to test-run as an skb; those rows say why), each time against a freshly loaded
//! object with the standard policy (`shedder_lab::policy`) installed, so rows cannot leak
//! state (pending attempts, buckets, counters) into each other. Besides the verdict and the
//! output bytes, every run checks that exactly the expected decision counter moved (or none)
//! and that no node-wide statistic moved except STAT_FALLBACK where the row expects it.
//!
//! Parsing rows are sent to services whose every class is closed (limit 0): a frame that
//! passes there passes because the parser declined it, not because it was admitted.
//!
//! The rows stand one file per feature under `fixtures/`, in the order [`table`] lists them.
//! What they share is written once beside them, each file using only those named before it:
//! `case` (the vocabulary: [`Case`], the program, the verdict), `driver` (one row through one
//! program, and the test run that setups use too), `frames` (crafted frames), `setups` (what
//! a row does to the maps first) and `rows` (the common shapes of a row).

#[path = "fixtures/case.rs"]
mod case;
#[path = "fixtures/driver.rs"]
mod driver;
#[path = "fixtures/frames.rs"]
mod frames;
#[path = "fixtures/rows.rs"]
mod rows;
#[path = "fixtures/setups.rs"]
mod setups;

#[path = "fixtures/classes.rs"]
mod classes;
#[path = "fixtures/encapsulation.rs"]
mod encapsulation;
#[path = "fixtures/extension_headers.rs"]
mod extension_headers;
#[path = "fixtures/fair.rs"]
mod fair;
#[path = "fixtures/fallback.rs"]
mod fallback;
#[path = "fixtures/flows.rs"]
mod flows;
#[path = "fixtures/fragments.rs"]
mod fragments;
#[path = "fixtures/fuzz.rs"]
mod fuzz;
#[path = "fixtures/lengths.rs"]
mod lengths;
#[path = "fixtures/limits.rs"]
mod limits;
#[path = "fixtures/pending.rs"]
mod pending;
#[path = "fixtures/proof.rs"]
mod proof;
#[path = "fixtures/quic.rs"]
mod quic;
#[path = "fixtures/rate.rs"]
mod rate;
#[path = "fixtures/retransmits.rs"]
mod retransmits;
#[path = "fixtures/retries.rs"]
mod retries;
#[path = "fixtures/services.rs"]
mod services;
#[path = "fixtures/tcp_flags.rs"]
mod tcp_flags;
#[path = "fixtures/tunnels.rs"]
mod tunnels;
#[path = "fixtures/wire.rs"]
mod wire;

use std::sync::{
    Mutex,
    atomic::{AtomicUsize, Ordering},
};

use case::{Case, Prog};
use driver::check_guarded;

/// Every row, feature by feature.
fn table() -> Vec<Case> {
    [
        lengths::rows(),
        encapsulation::rows(),
        fragments::rows(),
        extension_headers::rows(),
        tunnels::rows(),
        tcp_flags::rows(),
        services::rows(),
        classes::rows(),
        limits::rows(),
        fallback::rows(),
        rate::rows(),
        pending::rows(),
        retransmits::rows(),
        retries::rows(),
        fair::rows(),
        proof::rows(),
        quic::rows(),
    ]
    .into_iter()
    .flatten()
    .collect()
}

/// Every row through both programs, except rows the kernel cannot run through an skb
/// program (they say why).
fn runs(table: &[Case]) -> Vec<(&Case, Prog)> {
    table
        .iter()
        .flat_map(|case| {
            let progs: &[Prog] = if case.xdp_only {
                &[Prog::Xdp]
            } else {
                &[Prog::Xdp, Prog::Tc]
            };
            progs.iter().map(move |&prog| (case, prog))
        })
        .collect()
}

/// The number `file` writes right after `lead`.
fn claimed(file: &str, lead: &str) -> usize {
    let text = shedder_tests::read_repo_file(file);
    let at = text
        .find(lead)
        .unwrap_or_else(|| panic!("{file} no longer says `{lead}N …`"));
    let rest = &text[at + lead.len()..];
    rest[..rest.find(' ').unwrap_or(0)]
        .parse()
        .unwrap_or_else(|_| panic!("{file}: `{lead}` is not followed by a number"))
}

/// The README counts the table's runs, docs/development.md its rows (no root needed: the
/// table is only built, not run).
#[test]
fn the_docs_count_the_fixture_table() {
    let table = table();
    let runs = runs(&table).len();
    let readme = claimed("README.md", "the BPF_PROG_TEST_RUN fixture table (");
    assert_eq!(
        readme, runs,
        "README.md says {readme} fixture runs; the table has {runs} (XDP and TC)"
    );
    let development = claimed(
        "docs/development.md",
        "the BPF_PROG_TEST_RUN fixture table: ",
    );
    assert_eq!(
        development,
        table.len(),
        "docs/development.md says {development} fixture frames; the table has {} rows",
        table.len()
    );
}

#[test]
fn fixture_table() {
    shedder_lab::require_root();
    let table = table();
    let jobs = runs(&table);
    // Loading the object (verifier, per-CPU maps) dominates; rows are independent (each has
    // its own maps), so they run on a few threads.
    let next = AtomicUsize::new(0);
    let failures = Mutex::new(Vec::new());
    let workers = std::thread::available_parallelism().map_or(2, |n| n.get().min(4));
    std::thread::scope(|scope| {
        for _ in 0..workers {
            scope.spawn(|| {
                while let Some(&(case, prog)) = jobs.get(next.fetch_add(1, Ordering::Relaxed)) {
                    if let Err(e) = check_guarded(case, prog) {
                        let failure = format!("[{prog:?}] {}:\n    {e}", case.desc);
                        failures.lock().unwrap().push(failure);
                    }
                }
            });
        }
    });
    let mut failures = failures.into_inner().unwrap();
    failures.sort();
    assert!(
        failures.is_empty(),
        "{} of {} fixture runs failed:\n{}",
        failures.len(),
        jobs.len(),
        failures.join("\n")
    );
}

#[test]
fn table_has_at_least_40_rows() {
    let table = table();
    eprintln!("{} rows", table.len());
    assert!(table.len() >= 40, "only {} rows", table.len());
    let mut descs: Vec<_> = table.iter().map(|c| c.desc).collect();
    descs.sort();
    descs.dedup();
    assert_eq!(descs.len(), table.len(), "row descriptions must be unique");
}
