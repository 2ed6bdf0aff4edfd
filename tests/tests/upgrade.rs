//! An upgrade and a rollback under load, with a released version's binary: the older
//! daemon protects a service at its limit, is stopped with `detach_on_exit = false`, this
//! version's daemon starts over its pins, then the older one again. Probes at the limit run
//! all along: refusals must continue through both switches and no attempt over the limit
//! may be admitted.
//!
//! Ignored in `cargo xtask test`: it needs the older binary, which `cargo xtask
//! upgrade-check` builds from the repository's history and passes in
//! `SHEDDER_UPGRADE_FROM` (with the revision in `SHEDDER_UPGRADE_REV`).

use std::{
    io::ErrorKind,
    path::PathBuf,
    time::{Duration, Instant},
};

use shedder_lab::{
    daemon::{Daemon, busy, connect, pin_dir, probe_while, refused, shedder_bin, web_config},
    netns::Pair,
    require_root,
    tcp::TestServer,
};

const PORT: u16 = 7640;

#[test]
#[ignore = "needs an older version's binary: run `cargo xtask upgrade-check`"]
fn upgrade_and_rollback_under_load_leave_no_gap() {
    require_root();
    shedder_lab::ensure_fs();
    let older = PathBuf::from(
        std::env::var_os("SHEDDER_UPGRADE_FROM")
            .expect("SHEDDER_UPGRADE_FROM: the older shedder binary (cargo xtask upgrade-check)"),
    );
    let rev = std::env::var("SHEDDER_UPGRADE_REV").unwrap_or_else(|_| "older".into());
    let pair = Pair::new("upg");
    let _server = pair.server.run(|| TestServer::holding(PORT));
    let pins = pin_dir("upgrade");
    // Said explicitly: versions before 2026-12-06 detach on SIGTERM by default.
    let config = web_config(
        &pins,
        PORT,
        1,
        "detach_on_exit = false\nheartbeat_timeout_ms = 5000",
    ) + "retry_window_ms = 0\n";
    let mut daemon = Daemon::start_with_binary(&pair.server, "upgrade", &config, &pins, &older);
    daemon.wait_for_log("running", Duration::from_secs(20));
    // At the limit of 4: every probe below must be refused. (The in-flight counts are
    // read from the refusals, not from the maps: this version refuses to read another
    // layout's.)
    let mut held: Vec<_> = (0..4)
        .map(|i| busy(&pair, PORT, &format!("connection {i} of 4 under {rev}")))
        .collect();
    until(
        &format!("at the limit under {rev}"),
        || matches!(connect(&pair, PORT).result, Err(e) if e.kind() == ErrorKind::ConnectionRefused),
    );

    let (phases, probes) = probe_while(&pair, PORT, |probes| {
        let mut phases = Vec::new();
        let mut switch = |to: PathBuf, what: &str, adoptions: usize| {
            let before = probes.made();
            let status = daemon.terminate();
            assert!(status.success(), "{what}: stop: {status}\n{}", daemon.log());
            daemon.binary = to;
            daemon.spawn(&pair.server);
            daemon.wait_for_log_count(
                "adopted the pinned attachment",
                adoptions,
                Duration::from_secs(20),
            );
            daemon.wait_for_log_count("running services", adoptions + 1, Duration::from_secs(20));
            std::thread::sleep(Duration::from_millis(500));
            // Which way this version took over: adopting the older maps (the same layout)
            // or replacing them (another layout).
            let log = daemon.log();
            let how = match (
                adoptions,
                log.contains("the pinned maps are another version's"),
            ) {
                (1, true) => {
                    assert!(log.contains("switched to this version's maps"), "{log}");
                    " (replaced the older maps: another layout)"
                }
                (1, false) => " (adopted the older maps: the same layout)",
                _ => "",
            };
            phases.push((format!("{what}{how}"), probes.made() - before));
        };
        switch(shedder_bin(), &format!("upgrade {rev} -> this version"), 1);
        switch(older.clone(), &format!("rollback this version -> {rev}"), 2);
        phases
    });
    for (what, n) in &phases {
        assert!(*n >= 20, "{what}: the probes ran through the switch ({n})");
    }

    assert_eq!(
        probes.admitted(),
        0,
        "an attempt over the limit was admitted during {phases:?}:\n{}",
        daemon.log()
    );
    // The older version runs the service again: at the limit, one closed, one admitted.
    refused(&pair, PORT, &format!("after the rollback to {rev}"));
    held.pop();
    until(
        "one closed after the rollback, under the limit",
        || match connect(&pair, PORT).result {
            Ok(mut c) => {
                use std::io::Write as _;
                c.write_all(b"h").expect("a request");
                held.push(c);
                true
            }
            Err(_) => false,
        },
    );
    eprintln!(
        "upgrade-check: {} probes at the limit, none admitted; {phases:?}",
        probes.made()
    );
}

/// Try `done` every 50 ms until it holds (panics after 3 s, naming `what`).
fn until(what: &str, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(3);
    while !done() {
        assert!(Instant::now() < deadline, "{what}: not within 3 s");
        std::thread::sleep(Duration::from_millis(50));
    }
}
