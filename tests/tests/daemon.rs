//! The daemon as an operator runs it (`shedder run`, in the server's namespace): fail-static
//! when it is killed, adoption without a gap when it restarts, clean detach on SIGTERM,
//! reload that keeps the last good policy, systemd notification and the reload metrics.

use std::time::{Duration, Instant};

use shedder::kernel::{MapReader, PinnedMaps};
use shedder_common::STAT_FALLBACK;
use shedder_lab::{
    daemon::{Daemon, busy, hold, pin_dir, probe_while, refused, settle, web_config},
    netns::{IFACE, Pair},
    require_root,
    tcp::TestServer,
};

// Tracking sees every namespace's sockets on a protected port, so tests that may run at
// once use different ports.
const KILL_PORT: u16 = 7600;
const RESTART_PORT: u16 = 7601;
const HUP_PORT: u16 = 7602;
const NOTIFY_PORT: u16 = 7603;

/// A service on `port` with a fixed live limit of 4 and a fallback limit of 1; resets.
/// Retry recognition is off: these tests count limits with one client address, whose
/// attempts after a refusal would otherwise be retries, decided one class lower
/// (tests/tests/retries.rs covers that).
fn config(pin_dir: &std::path::Path, port: u16, heartbeat_timeout_ms: u64) -> String {
    web_config(
        pin_dir,
        port,
        1,
        &format!("heartbeat_timeout_ms = {heartbeat_timeout_ms}"),
    ) + "retry_window_ms = 0\n"
}

#[test]
fn killed_daemon_keeps_its_limits_until_the_heartbeat_times_out_then_falls_back() {
    require_root();
    shedder_lab::ensure_fs();
    let pair = Pair::new("dkill");
    let _server = pair.server.run(|| TestServer::holding(KILL_PORT));
    let pins = pin_dir("kill");
    let mut daemon = Daemon::start(&pair.server, "kill", &config(&pins, KILL_PORT, 1500), &pins);
    daemon.wait_for_log("running", Duration::from_secs(10));

    // The live limit, 4: four admitted, the fifth reset.
    let mut held = hold(&pair, &pins, KILL_PORT, 4);
    refused(&pair, KILL_PORT, "fifth connection at the live limit");

    daemon.kill();
    let killed = Instant::now();
    // Fail-static: the last limits stay in force. Still 4 in flight: refused; one closed:
    // admitted again under the live limit of 4.
    refused(&pair, KILL_PORT, "right after the kill");
    held.pop();
    settle(&pins, 3);
    held.push(busy(
        &pair,
        KILL_PORT,
        "after the kill, under the live limit",
    ));
    assert!(
        killed.elapsed() < Duration::from_millis(1500),
        "the checks above must finish before the heartbeat times out"
    );

    // After the heartbeat timeout the fallback limit (1) is in force.
    std::thread::sleep(
        Duration::from_millis(1500).saturating_sub(killed.elapsed()) + Duration::from_millis(500),
    );
    held.truncate(1);
    settle(&pins, 1);
    refused(&pair, KILL_PORT, "one in flight, fallback limit 1");
    held.clear();
    settle(&pins, 0);
    let _one = busy(&pair, KILL_PORT, "none in flight, fallback limit 1");
    refused(&pair, KILL_PORT, "second under the fallback limit 1");
    let s = PinnedMaps::open(&pins).expect("pinned maps");
    assert!(
        s.stats().expect("stats")[STAT_FALLBACK as usize] > 0,
        "decisions were taken on the fallback limits"
    );
}

#[test]
fn restart_adopts_the_pinned_attachment_without_a_gap_and_sigterm_detaches() {
    use std::os::unix::fs::MetadataExt;
    require_root();
    shedder_lab::ensure_fs();
    let pair = Pair::new("drst");
    let _server = pair.server.run(|| TestServer::holding(RESTART_PORT));
    let pins = pin_dir("restart");
    // Told to detach on SIGTERM (the default leaves protection in place).
    let mut daemon = Daemon::start(
        &pair.server,
        "restart",
        &config(&pins, RESTART_PORT, 3000)
            .replace("[daemon]\n", "[daemon]\ndetach_on_exit = true\n"),
        &pins,
    );
    daemon.wait_for_log("running", Duration::from_secs(10));
    let mut held = hold(&pair, &pins, RESTART_PORT, 4);
    let link = pins.join("links").join(IFACE);
    let inode = std::fs::metadata(&link).expect("pinned link").ino();
    let program_of = |link: &std::path::Path| {
        let l: aya::programs::links::FdLink = aya::programs::links::PinnedLink::from_pin(link)
            .expect("open the pinned link")
            .into();
        l.info().expect("link info").program_id()
    };
    let first_program = program_of(&link);

    // Probe continuously while the daemon dies and a new one starts: at the limit, every
    // probe must be reset; one admitted probe would be a moment without protection.
    let ((), probes) = probe_while(&pair, RESTART_PORT, |_| {
        daemon.kill();
        std::thread::sleep(Duration::from_millis(300));
        daemon.spawn(&pair.server);
        daemon.wait_for_log("adopted the pinned attachment", Duration::from_secs(10));
        std::thread::sleep(Duration::from_millis(300));
    });
    assert!(probes.made() > 20, "the probe ran through the restart");
    assert_eq!(probes.admitted(), 0, "no gap in protection");
    assert_eq!(
        std::fs::metadata(&link).expect("pinned link").ino(),
        inode,
        "the new daemon kept the pinned attachment"
    );
    assert_ne!(
        program_of(&link),
        first_program,
        "the link now runs the new daemon's program (updated in place)"
    );
    // The new daemon enforces: still refused at 4; one closed, one admitted.
    refused(&pair, RESTART_PORT, "after the restart, at the limit");
    held.pop();
    settle(&pins, 3);
    held.push(busy(
        &pair,
        RESTART_PORT,
        "after the restart, under the limit",
    ));

    // SIGTERM: clean exit, everything detached and unpinned.
    let status = daemon.terminate();
    assert!(status.success(), "exit status {status}\n{}", daemon.log());
    assert!(!pins.exists(), "pins removed");
    held.push(busy(&pair, RESTART_PORT, "unprotected after the detach"));
}

#[test]
fn sighup_reload_applies_a_good_policy_and_keeps_it_when_the_next_is_bad() {
    require_root();
    shedder_lab::ensure_fs();
    let pair = Pair::new("dhup");
    let _server = pair.server.run(|| TestServer::holding(HUP_PORT));
    let pins = pin_dir("hup");
    // The product's default, said here: the harness makes its daemons detach on a stop.
    let cfg =
        config(&pins, HUP_PORT, 3000).replace("[daemon]\n", "[daemon]\ndetach_on_exit = false\n");
    let mut daemon = Daemon::start(&pair.server, "hup", &cfg, &pins);
    daemon.wait_for_log("running", Duration::from_secs(10));
    let mut held = hold(&pair, &pins, HUP_PORT, 4);
    refused(&pair, HUP_PORT, "at the limit of 4");

    daemon.rewrite_config(&cfg.replace("fixed_limit = 4", "fixed_limit = 6"));
    daemon.hangup();
    daemon.wait_for_log("configuration reloaded", Duration::from_secs(5));
    held.push(busy(&pair, HUP_PORT, "fifth under the new limit of 6"));
    held.push(busy(&pair, HUP_PORT, "sixth under the new limit of 6"));
    settle(&pins, 6);
    refused(&pair, HUP_PORT, "at the new limit of 6");

    // A bad file is refused and the running policy stays.
    daemon.rewrite_config(&cfg.replace("fixed_limit = 4", "fixed_limit = 1000"));
    daemon.hangup();
    daemon.wait_for_log("reload refused", Duration::from_secs(5));
    assert!(
        daemon.log().contains("fixed_limit"),
        "the refusal names the field:\n{}",
        daemon.log()
    );
    refused(&pair, HUP_PORT, "still the limit of 6");
    held.pop();
    settle(&pins, 5);
    held.push(busy(
        &pair,
        HUP_PORT,
        "under the limit of 6 after the refused reload",
    ));

    // With detach_on_exit = false (the default) SIGTERM (`systemctl stop`) leaves
    // protection in place: still attached, still refusing at the limit until the heartbeat
    // times out.
    let status = daemon.terminate();
    assert!(status.success(), "exit status {status}\n{}", daemon.log());
    assert!(
        pins.join("links").join(IFACE).exists(),
        "still attached after a stop"
    );
    refused(&pair, HUP_PORT, "after a stop, at the last limit of 6");
}

const LAYOUT_PORT: u16 = 7604;

/// Pin a one-entry array of `u32` at `path` (replacing what is there), holding `value`: a
/// map of another version.
fn pin_foreign_array(path: &std::path::Path, value: u32) {
    use aya::maps::{Array, Map, MapData};
    let def = aya_obj::Map::new_from_params(2, 4, 4, 1, 0);
    let mut map = Map::Array(MapData::create(def, "foreign", None).expect("create a map"));
    Array::<&mut MapData, u32>::try_from(&mut map)
        .expect("an array")
        .set(0, value, 0)
        .expect("set");
    let _ = std::fs::remove_file(path);
    map.pin(path).expect("pin");
}

/// A restart over maps pinned by another version (another layout marker, a map of another
/// size) never reuses them: the new daemon loads its own beside them, counts the
/// connections in service into them, switches the pinned attachment over without a gap and
/// removes the old set. Tools that read the pins refuse another version's maps.
#[test]
fn restart_over_another_versions_maps_replaces_them_without_a_gap() {
    use shedder_common::{LAYOUT, maps};
    use std::os::unix::fs::MetadataExt;
    require_root();
    shedder_lab::ensure_fs();
    let pair = Pair::new("dlay");
    let _server = pair.server.run(|| TestServer::holding(LAYOUT_PORT));
    let pins = pin_dir("layout");
    let mut daemon = Daemon::start(
        &pair.server,
        "layout",
        &config(&pins, LAYOUT_PORT, 3000)
            .replace("[daemon]\n", "[daemon]\ndetach_on_exit = true\n"),
        &pins,
    );
    daemon.wait_for_log("running", Duration::from_secs(10));
    let mut held = hold(&pair, &pins, LAYOUT_PORT, 4);
    let link = pins.join("links").join(IFACE);
    let inode = std::fs::metadata(&link).expect("pinned link").ino();
    daemon.kill();

    // Another version's pins: a newer layout's marker, and a map resized.
    let map_dir = pins.join("maps");
    pin_foreign_array(&map_dir.join(maps::LAYOUT), LAYOUT + 1);
    pin_foreign_array(&map_dir.join(maps::STATS), 0);
    // And what a start interrupted before its switch leaves: maps beside them, in no use.
    std::fs::create_dir_all(pins.join("maps-next")).expect("mkdir");
    pin_foreign_array(&pins.join("maps-next").join(maps::STATS), 0);
    let refused_read = PinnedMaps::open(&pins).err().map(|e| e.to_string());
    assert!(
        refused_read
            .as_deref()
            .is_some_and(|e| e.contains("not this version's") && e.contains("SHEDDER_STATS")),
        "the tools refuse another version's maps: {refused_read:?}"
    );

    let ((), probes) = probe_while(&pair, LAYOUT_PORT, |_| {
        daemon.spawn(&pair.server);
        // (The log is appended to: the first daemon's "running" is in it already.)
        daemon.wait_for_log("switched to this version's maps", Duration::from_secs(10));
        std::thread::sleep(Duration::from_millis(300));
    });
    let log = daemon.log();
    assert_eq!(log.matches("running services").count(), 2, "{log}");
    assert!(
        log.contains("the pinned maps are another version's")
            && log.contains(&format!("pinned by layout {}", LAYOUT + 1))
            && log.contains("SHEDDER_STATS: type 2, this version's 6, value size 4"),
        "the replacement and its reasons are logged:\n{log}"
    );
    assert!(probes.made() > 20, "the probe ran through the restart");
    assert_eq!(
        probes.admitted(),
        0,
        "no attempt over the limit admitted while the maps were replaced"
    );
    assert_eq!(
        std::fs::metadata(&link).expect("pinned link").ino(),
        inode,
        "the pinned attachment was switched, not recreated"
    );
    assert!(
        !pins.join("maps-next").exists(),
        "nothing left beside the maps"
    );
    assert!(
        log.contains("interrupted before switching to new maps: removed them"),
        "the interrupted replacement's maps removed first:\n{log}"
    );
    let stats = aya::maps::MapInfo::from_pin(map_dir.join(maps::STATS)).expect("stats pin");
    assert_eq!(
        (stats.value_size(), stats.max_entries()),
        (8, 32),
        "the resized map was replaced, not reused"
    );
    let s = PinnedMaps::open(&pins).expect("this version's maps now");
    s.stats().expect("this version's statistics map");
    drop(s);
    // The new maps count what is in service: still refused at 4; one closed, one admitted.
    refused(&pair, LAYOUT_PORT, "after the replacement, at the limit");
    held.pop();
    settle(&pins, 3);
    held.push(busy(
        &pair,
        LAYOUT_PORT,
        "after the replacement, under the limit",
    ));
    let status = daemon.terminate();
    assert!(status.success(), "exit status {status}\n{}", daemon.log());
    assert!(!pins.exists(), "pins removed");
}

/// GET `path` from the daemon's metrics endpoint (its default, 127.0.0.1:9464, in the
/// server's namespace): (status line, body).
fn scrape(pair: &Pair, path: &str) -> (String, String) {
    use std::io::{Read as _, Write as _};
    pair.server.run(|| {
        let mut c = std::net::TcpStream::connect("127.0.0.1:9464").expect("connect to metrics");
        c.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        write!(
            c,
            "GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
        )
        .unwrap();
        let mut raw = String::new();
        c.read_to_string(&mut raw).expect("answer");
        let (head, body) = raw.split_once("\r\n\r\n").expect("HTTP head");
        (
            head.lines().next().unwrap_or("").to_string(),
            body.to_string(),
        )
    })
}

/// Under systemd (`Type=notify`, `WatchdogSec=`): READY=1 once the first tick ran (ready on
/// /readyz too), WATCHDOG=1 from the tick loop, RELOADING=1 then READY=1 around a SIGHUP
/// reload (whose outcome the reload metrics report), STOPPING=1 on SIGTERM.
#[test]
fn systemd_is_notified_of_readiness_reloads_the_watchdog_and_the_stop() {
    use std::os::unix::net::UnixDatagram;
    require_root();
    shedder_lab::ensure_fs();
    let pair = Pair::new("dnotify");
    let pins = pin_dir("notify");
    let dir = std::env::temp_dir().join(format!("shedder-notify-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let socket = dir.join("notify");
    let _ = std::fs::remove_file(&socket);
    let systemd = UnixDatagram::bind(&socket).expect("bind the notification socket");
    systemd
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    let cfg = web_config(
        &pins,
        NOTIFY_PORT,
        1,
        &format!("control_socket = \"{}\"", dir.join("ctl.sock").display()),
    );
    let mut daemon = Daemon::start_with_env(
        &pair.server,
        "notify",
        &cfg,
        &pins,
        &[
            ("NOTIFY_SOCKET", socket.to_str().unwrap()),
            ("WATCHDOG_USEC", "400000"),
        ],
    );
    // The next notification that is not a watchdog ping (counting the pings).
    let log = daemon.log.clone();
    let mut pings = 0;
    let mut next = || loop {
        let mut buf = [0u8; 256];
        let n = systemd.recv(&mut buf).unwrap_or_else(|e| {
            let log = std::fs::read_to_string(&log).unwrap_or_default();
            panic!("no notification ({e}):\n{log}")
        });
        let msg = String::from_utf8_lossy(&buf[..n]).into_owned();
        if msg == "WATCHDOG=1\n" {
            pings += 1;
        } else {
            return msg;
        }
    };
    assert_eq!(next(), "READY=1\n");
    let (head, body) = scrape(&pair, "/readyz");
    assert!(head.contains(" 200"), "ready at READY=1: {head} {body}");
    let (_, metrics) = scrape(&pair, "/metrics");
    assert!(
        metrics.contains("shedder_config_last_reload_successful{} 1"),
        "{metrics}"
    );

    daemon.rewrite_config(&cfg.replace("fixed_limit = 4", "fixed_limit = 1000"));
    daemon.hangup();
    let reloading = next();
    assert!(
        reloading.starts_with("RELOADING=1\nMONOTONIC_USEC="),
        "{reloading}"
    );
    assert_eq!(next(), "READY=1\n", "a refused reload ends too");
    // The refusal is in the metrics from the next tick (100 ms).
    std::thread::sleep(Duration::from_millis(300));
    let (_, metrics) = scrape(&pair, "/metrics");
    assert!(
        metrics.contains("shedder_config_last_reload_successful{} 0"),
        "{metrics}"
    );

    let status = daemon.terminate();
    assert!(status.success(), "{status}");
    assert_eq!(next(), "STOPPING=1\n");
    // Pinged at least every quarter of 400 ms over the run (over a second).
    assert!(pings >= 4, "{pings} watchdog pings");
    let _ = std::fs::remove_dir_all(&dir);
}
