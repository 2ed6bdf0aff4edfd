//! The operator surface as an SRE meets it: the `shedder` verbs against a running daemon
//! (exit codes, refusals that change nothing), the control socket's permissions, and the
//! metrics endpoint read by the reference OpenMetrics parser.

use std::{
    io::{Read, Write},
    net::{SocketAddr, TcpStream},
    os::unix::fs::PermissionsExt,
    path::{Path, PathBuf},
    process::Command,
    time::Duration,
};

use shedder_lab::{
    daemon::{Daemon, admitted, busy, pin_dir, refused, settle, shedder_bin, web_config},
    netns::{IFACE, Pair},
    policy::{CLIENT_V4, SERVER_V4},
    require_root,
    tcp::TestServer,
};

// Tracking sees every namespace's sockets on a protected port: ports unique to this file.
const VERBS_PORT: u16 = 7610;
const METRICS_PORT: u16 = 7611;
const PERMS_PORT: u16 = 7612;
const STALL_PORT: u16 = 7614;
const METRICS_LISTEN_PORT: u16 = 9464;

/// A service `web` on `port` with a fixed limit of 4, in [1, 100], fallback 2; resets. The
/// control socket is `socket`, the metrics endpoint on the server's address.
fn config(pins: &Path, socket: &Path, port: u16, extra_daemon: &str) -> String {
    web_config(
        pins,
        port,
        2,
        &format!(
            "control_socket = \"{}\"\nmetrics_listen = \"{SERVER_V4}:{METRICS_LISTEN_PORT}\"\n{extra_daemon}",
            socket.display()
        ),
    )
}

/// A directory of this test's own (0755, so unprivileged users can reach the socket).
fn scratch(tag: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("shedder-op-{}-{tag}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("scratch dir");
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    dir
}

struct Scratch(PathBuf);
impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

struct Run {
    code: i32,
    stdout: String,
    stderr: String,
}

impl std::fmt::Debug for Run {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "exit {}\n--- stdout\n{}--- stderr\n{}",
            self.code, self.stdout, self.stderr
        )
    }
}

/// Run `shedder args...`, optionally through `setpriv` with `as_user` options.
fn shedder(bin: &Path, as_user: &[&str], args: &[&str]) -> Run {
    let mut c = if as_user.is_empty() {
        Command::new(bin)
    } else {
        let mut c = Command::new("setpriv");
        c.args(as_user).arg(bin);
        c
    };
    let out = c.args(args).output().expect("run shedder");
    Run {
        code: out.status.code().unwrap_or(-1),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}

/// `shedder args` with `env` set and `stdin` on its standard input (as root).
fn shedder_with(bin: &Path, env: &[(&str, &str)], stdin: &str, args: &[&str]) -> Run {
    use std::process::Stdio;
    let mut child = Command::new(bin)
        .args(args)
        .envs(env.iter().copied())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run shedder");
    child
        .stdin
        .take()
        .unwrap()
        .write_all(stdin.as_bytes())
        .expect("write stdin");
    let out = child.wait_with_output().expect("wait for shedder");
    Run {
        code: out.status.code().unwrap_or(-1),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}

fn ok(r: Run) -> Run {
    assert_eq!(r.code, 0, "{r:?}");
    r
}

fn status_json(bin: &Path, socket: &str) -> serde_json::Value {
    let r = ok(shedder(bin, &[], &["status", "--json", "--socket", socket]));
    serde_json::from_str(&r.stdout).unwrap_or_else(|e| panic!("status --json: {e}\n{r:?}"))
}

fn limit_of(bin: &Path, socket: &str) -> u64 {
    status_json(bin, socket)["services"][0]["limit"]
        .as_u64()
        .expect("services[0].limit")
}

#[test]
fn verbs_drive_the_running_daemon_and_bad_input_changes_nothing() {
    require_root();
    shedder_lab::ensure_fs();
    let pair = Pair::new("opverb");
    let _server = pair.server.run(|| TestServer::holding(VERBS_PORT));
    let dir = scratch("verbs");
    let _cleanup = Scratch(dir.clone());
    let pins = pin_dir("opverb");
    let sock = dir.join("ctl.sock");
    let s = sock.to_str().unwrap();
    let bin = shedder_bin();
    let cfg = config(&pins, &sock, VERBS_PORT, "");
    let daemon = Daemon::start(&pair.server, "opverb", &cfg, &pins);
    daemon.wait_for_log("running", Duration::from_secs(10));

    // status, human and JSON.
    let r = ok(shedder(&bin, &[], &["status", "--socket", s]));
    assert!(r.stdout.contains("web (ports 7610)"), "{r:?}");
    assert!(r.stdout.contains("limit 4 [1..100], fallback 2"), "{r:?}");
    assert!(
        r.stdout.contains(&format!("attached: {IFACE} (tc)")),
        "{r:?}"
    );
    assert_eq!(limit_of(&bin, s), 4);

    // policy show prints the policy in force, as a configuration that validates.
    let r = ok(shedder(&bin, &[], &["policy", "show", "--socket", s]));
    let shown = shedder::config::Config::parse(&r.stdout)
        .unwrap_or_else(|e| panic!("policy show is not a valid configuration: {e}\n{r:?}"));
    assert_eq!(shown.services[0].fixed_limit, Some(4));

    // The command line's habits, end to end: the socket and the configuration from the
    // environment, a service filter, JSON of every read, a policy on standard input.
    let env_cfg = dir.join("env.toml");
    std::fs::write(&env_cfg, &cfg).unwrap();
    let by_env = [("SHEDDER_SOCKET", s)];
    let r = ok(shedder_with(
        &bin,
        &by_env,
        "",
        &["status", "-s", "web", "--json"],
    ));
    let v: serde_json::Value = serde_json::from_str(&r.stdout).unwrap();
    assert_eq!(v["services"].as_array().map(Vec::len), Some(1), "{r:?}");
    let r = shedder_with(&bin, &by_env, "", &["status", "--service", "nope"]);
    assert_eq!(r.code, 2, "{r:?}");
    assert_eq!(
        r.stderr,
        "shedder: --service nope: no such service (there are: web)\n"
    );
    // The socket named by the configuration SHEDDER_CONFIG names.
    let by_config = [("SHEDDER_CONFIG", env_cfg.to_str().unwrap())];
    let r = ok(shedder_with(
        &bin,
        &by_config,
        "",
        &["policy", "show", "--json"],
    ));
    let v: serde_json::Value = serde_json::from_str(&r.stdout).unwrap();
    assert_eq!(v["service"][0]["name"], "web", "{r:?}");
    let r = ok(shedder_with(
        &bin,
        &by_config,
        "",
        &["counters", "--json", "-s", "web"],
    ));
    let v: serde_json::Value = serde_json::from_str(&r.stdout).unwrap();
    assert!(v.is_array(), "{r:?}");
    let r = ok(shedder_with(&bin, &[], &cfg, &["policy", "validate", "-"]));
    assert_eq!(r.stdout, "<stdin>: ok (1 service, 1 interface)\n");

    // An override holds the limit, and the kernel enforces it as soon as the verb returns.
    let r = ok(shedder(
        &bin,
        &[],
        &[
            "limit",
            "set",
            "web",
            "2",
            "--ttl",
            "5m",
            "--reason",
            "test drill",
            "--socket",
            s,
        ],
    ));
    assert_eq!(r.stdout, "web: limit held at 2 for 300 s\n");
    let r = ok(shedder(&bin, &[], &["status", "--socket", s]));
    assert!(r.stdout.contains("OVERRIDE 2"), "{r:?}");
    assert_eq!(limit_of(&bin, s), 2);
    let mut held = vec![
        busy(&pair, VERBS_PORT, "first under the override of 2"),
        busy(&pair, VERBS_PORT, "second under the override of 2"),
    ];
    settle(&pins, 2);
    refused(&pair, VERBS_PORT, "third under the override of 2");

    // Who is refused: the client, which had proven its address (its connections completed),
    // in the status the next tick publishes, as JSON and as text.
    let deadline = std::time::Instant::now() + Duration::from_secs(3);
    let top = loop {
        let v = status_json(&bin, s);
        let top = v["services"][0]["refused"]["sources"][0].clone();
        if !top.is_null() || std::time::Instant::now() > deadline {
            break top;
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    assert_eq!(top["source"], CLIENT_V4.to_string(), "{top}");
    assert_eq!(top["proven"], true, "{top}");
    let class = top["class"].as_str().expect("a class").to_string();
    assert!(
        shedder_common::CLASS_NAMES.contains(&class.as_str()),
        "{top}"
    );
    let r = ok(shedder(&bin, &[], &["status", "--socket", s]));
    assert!(
        r.stdout
            .contains(&format!("sources   {CLIENT_V4} {class} 100%")),
        "{r:?}"
    );

    // A runtime mode switch: audited, shown, kept through `policy apply`, cleared.
    let enforcement = || status_json(&bin, s)["services"][0]["enforcement"].clone();
    let r = ok(shedder(
        &bin,
        &[],
        &["mode", "web", "dry-run", "--reason", "drill", "--socket", s],
    ));
    assert_eq!(
        r.stdout,
        "web: dry-run until cleared (`shedder mode web clear`)\n"
    );
    assert_eq!(enforcement(), "dry-run");
    let r = ok(shedder(&bin, &[], &["status", "--socket", s]));
    assert!(
        r.stdout.contains("MODE DRY-RUN (switched by uid 0")
            && r.stdout
                .contains(": drill; until cleared; the file says enforce)"),
        "{r:?}"
    );
    held.push(busy(&pair, VERBS_PORT, "third, in dry-run"));
    ok(shedder_with(
        &bin,
        &[],
        &cfg,
        &["policy", "apply", "-", "--socket", s],
    ));
    assert_eq!(
        enforcement(),
        "dry-run",
        "the switch outlives a policy apply"
    );
    ok(shedder(&bin, &[], &["mode", "web", "off", "--socket", s]));
    assert_eq!(enforcement(), "off");
    held.push(busy(&pair, VERBS_PORT, "fourth, switched off"));
    let r = ok(shedder(&bin, &[], &["mode", "web", "clear", "--socket", s]));
    assert_eq!(
        r.stdout,
        "web: mode switch cleared; the configuration's mode is in force\n"
    );
    assert_eq!(enforcement(), "enforce");
    refused(&pair, VERBS_PORT, "enforcing again, over the override of 2");
    held.truncate(2);
    settle(&pins, 2);
    // One that expires: back to the file's mode by itself.
    ok(shedder(
        &bin,
        &[],
        &["mode", "web", "off", "--ttl", "1s", "--socket", s],
    ));
    assert_eq!(enforcement(), "off");
    std::thread::sleep(Duration::from_millis(1500));
    assert_eq!(enforcement(), "enforce", "expired");
    let log = daemon.log();
    assert!(
        log.contains("mode switched") && log.contains("by=expiry"),
        "audited:\n{log}"
    );
    for (args, message) in [
        (&["mode", "web", "bypass"][..], "invalid value 'bypass'"),
        (&["mode", "nosuch", "off"][..], "no service named `nosuch`"),
        (
            &["mode", "web", "off", "--ttl", "0s"][..],
            "ttl_s 0: between 1 s and 604800 s",
        ),
    ] {
        let mut a = args.to_vec();
        a.extend(["--socket", s]);
        let r = shedder(&bin, &[], &a);
        assert_eq!(r.code, 2, "{args:?}: {r:?}");
        assert!(r.stderr.contains(message), "{args:?}: {r:?}");
    }
    assert_eq!(enforcement(), "enforce");

    // Refusals: exit 2, a message naming the problem, nothing changed.
    let bad: &[(&[&str], &str)] = &[
        (
            &["limit", "set", "web", "1000"],
            "shedder: limit 1000 is outside [min_limit, max_limit] = [1, 100] of `web`\n",
        ),
        (
            &["limit", "set", "web", "0"],
            "shedder: limit 0 is outside [min_limit, max_limit] = [1, 100] of `web`\n",
        ),
        (
            &["limit", "set", "web", "50"],
            "shedder: limit 50 is more than 4x away from the limit in force (2); \
             repeat with --force (API: \"force\": true) to do it anyway\n",
        ),
        (
            &["limit", "set", "nosuch", "3"],
            "shedder: no service named `nosuch`\n",
        ),
        (
            &["limit", "set", "web", "3", "--ttl", "25h"],
            "shedder: ttl 90000 s is outside 1 s to 24 h (86400 s)\n",
        ),
        // clap's own messages: checked by their key phrase.
        (
            &["limit", "set", "web", "3", "--ttl", "5d"],
            "the unit must be s, m or h",
        ),
        (&["limit", "set", "web", "lots"], "invalid value 'lots'"),
    ];
    for (args, message) in bad {
        let mut a = args.to_vec();
        a.extend(["--socket", s]);
        let r = shedder(&bin, &[], &a);
        assert_eq!(r.code, 2, "{args:?}: {r:?}");
        if message.starts_with("shedder: ") {
            assert_eq!(r.stderr, *message, "{args:?}");
        } else {
            assert!(
                r.stderr.contains(message),
                "{args:?} should say {message:?}: {r:?}"
            );
        }
        assert_eq!(r.stdout, "", "{args:?}");
        assert_eq!(limit_of(&bin, s), 2, "{args:?} changed the limit");
    }
    // --force allows the large step.
    ok(shedder(
        &bin,
        &[],
        &["limit", "set", "web", "50", "--force", "--socket", s],
    ));
    assert_eq!(limit_of(&bin, s), 50);
    let r = ok(shedder(
        &bin,
        &[],
        &["limit", "clear", "web", "--socket", s],
    ));
    assert_eq!(r.stdout, "web: override cleared; the controller resumes\n");
    let r = ok(shedder(
        &bin,
        &[],
        &["limit", "clear", "web", "--socket", s],
    ));
    assert_eq!(r.stdout, "web: no override was in force\n");
    assert_eq!(limit_of(&bin, s), 4);
    let r = ok(shedder(&bin, &[], &["status", "--socket", s]));
    assert!(!r.stdout.contains("OVERRIDE"), "{r:?}");

    // A bad policy is refused with its line, column (the value's, after `fixed_limit = `)
    // and field, and the running one stays.
    let bad_file = dir.join("bad.toml");
    std::fs::write(
        &bad_file,
        cfg.replace("fixed_limit = 4", "fixed_limit = 1000"),
    )
    .unwrap();
    let line = cfg
        .lines()
        .position(|l| l.starts_with("fixed_limit"))
        .unwrap()
        + 1;
    let r = shedder(
        &bin,
        &[],
        &["policy", "validate", bad_file.to_str().unwrap()],
    );
    assert_eq!(r.code, 2, "{r:?}");
    assert!(
        r.stderr.contains(&format!(
            "bad.toml:{line}:15: service[0] (web).fixed_limit: 1000 is outside"
        )),
        "{r:?}"
    );
    let r = shedder(
        &bin,
        &[],
        &["policy", "apply", bad_file.to_str().unwrap(), "--socket", s],
    );
    assert_eq!(r.code, 2, "{r:?}");
    assert!(r.stderr.contains("fixed_limit"), "{r:?}");
    // The same from standard input: refused before the daemon hears of it, by line.
    let bad = std::fs::read_to_string(&bad_file).unwrap();
    let r = shedder_with(&bin, &[], &bad, &["policy", "apply", "-", "--socket", s]);
    assert_eq!(r.code, 2, "{r:?}");
    assert!(
        r.stderr.contains(&format!(
            "<stdin>:{line}:15: service[0] (web).fixed_limit: 1000 is outside"
        )),
        "{r:?}"
    );
    let r2 = ok(shedder(&bin, &[], &["policy", "show", "--socket", s]));
    assert_eq!(
        shedder::config::Config::parse(&r2.stdout).unwrap().services[0].fixed_limit,
        Some(4),
        "the refused policy must not be in force"
    );
    assert_eq!(limit_of(&bin, s), 4);
    // Valid, but it changes what only a restart can: the daemon refuses it, by field.
    let restart_file = dir.join("restart.toml");
    std::fs::write(
        &restart_file,
        cfg.replace(&format!(":{METRICS_LISTEN_PORT}"), ":9465")
            .replace("fixed_limit = 4", "fixed_limit = 5"),
    )
    .unwrap();
    let r = shedder(
        &bin,
        &[],
        &[
            "policy",
            "apply",
            restart_file.to_str().unwrap(),
            "--socket",
            s,
        ],
    );
    assert_eq!(r.code, 2, "{r:?}");
    assert_eq!(
        r.stderr,
        format!(
            "shedder: {}: daemon.metrics_listen changes only with a restart\n",
            restart_file.display()
        )
    );
    assert_eq!(
        limit_of(&bin, s),
        4,
        "nothing of the refused policy is in force"
    );

    // A good one is put in force without detaching: 6 admitted, the 7th reset.
    let good_file = dir.join("good.toml");
    std::fs::write(
        &good_file,
        cfg.replace("fixed_limit = 4", "fixed_limit = 6"),
    )
    .unwrap();
    let good = good_file.to_str().unwrap();
    let r = ok(shedder(&bin, &[], &["policy", "validate", good]));
    assert_eq!(r.stdout, format!("{good}: ok (1 service, 1 interface)\n"));
    let r = ok(shedder(
        &bin,
        &[],
        &["policy", "apply", good, "--socket", s],
    ));
    assert_eq!(r.stdout, format!("{good}: applied (1 service)\n"));
    assert_eq!(limit_of(&bin, s), 6);
    for i in 2..6 {
        held.push(busy(&pair, VERBS_PORT, &format!("connection {i} under 6")));
    }
    settle(&pins, 6);
    refused(&pair, VERBS_PORT, "the seventh under 6");

    // Every change is in the audit log with who made it.
    let log = daemon.log();
    for needle in [
        "override set",
        "override cleared",
        "policy applied",
        "uid 0",
    ] {
        assert!(log.contains(needle), "audit log lacks {needle:?}:\n{log}");
    }
    assert!(log.contains("control change refused"), "{log}");

    // top: the status table, refreshed.
    let r = ok(shedder(
        &bin,
        &[],
        &[
            "top",
            "--interval",
            "0.2",
            "--iterations",
            "2",
            "--socket",
            s,
        ],
    ));
    assert!(r.stdout.matches("web (ports 7610)").count() >= 2, "{r:?}");

    // doctor, in the daemon's namespace, with its configuration: JSON, one entry per check.
    let out = Command::new("nsenter")
        .arg(format!("--net=/var/run/netns/{}", pair.server.name))
        .arg(&bin)
        .args(["doctor", "--json", "--config"])
        .arg(&daemon.config)
        .output()
        .expect("run doctor");
    let checks: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "doctor --json: {e}\n{}",
            String::from_utf8_lossy(&out.stderr)
        )
    });
    let check = |name: &str| -> (String, String) {
        let c = checks
            .as_array()
            .unwrap()
            .iter()
            .find(|c| c["name"] == name)
            .unwrap_or_else(|| panic!("doctor has no `{name}` check: {checks}"));
        (
            c["status"].as_str().unwrap().into(),
            c["detail"].as_str().unwrap().into(),
        )
    };
    for name in [
        "kernel",
        "capabilities",
        "bpffs",
        "interface",
        "fail-static",
    ] {
        assert_eq!(check(name).0, "ok", "{name}: {:?}", check(name));
    }
    let (status, detail) = check("attachment");
    assert_eq!(status, "ok", "{detail}");
    assert!(detail.contains(IFACE), "{detail}");
    let (status, detail) = check("daemon");
    assert_eq!(status, "ok", "{detail}");
    assert!(detail.contains("alive"), "{detail}");
    assert_eq!(check("control socket").0, "ok");
    let worst = checks
        .as_array()
        .unwrap()
        .iter()
        .any(|c| c["status"] == "fail");
    assert_eq!(out.status.code(), Some(if worst { 1 } else { 0 }));

    // detach: through the daemon, which exits cleanly and leaves nothing pinned.
    drop(held);
    let r = ok(shedder(&bin, &[], &["detach", "--socket", s]));
    assert_eq!(r.stdout, "the daemon is stopping and detaching\n");
    let mut daemon = daemon;
    let status = daemon.terminate_or_wait();
    assert!(status.success(), "{}", daemon.log());
    assert!(!pins.exists(), "pins removed by detach");
    let r = shedder(&bin, &[], &["status", "--socket", s]);
    assert_eq!(r.code, 3, "no daemon after detach: {r:?}");
}

/// 64 clients that each send half a request line and stall, on the metrics endpoint and on
/// the control socket: a scrape and `shedder status` still answer at once, and a stalled
/// client is cut off once the head timeout passes. A chunked request body is read as such.
#[test]
fn stalled_clients_do_not_block_the_endpoints() {
    require_root();
    shedder_lab::ensure_fs();
    let pair = Pair::new("opstall");
    let dir = scratch("stall");
    let _cleanup = Scratch(dir.clone());
    let pins = pin_dir("opstall");
    let sock = dir.join("ctl.sock");
    let s = sock.to_str().unwrap();
    let bin = shedder_bin();
    let daemon = Daemon::start(
        &pair.server,
        "opstall",
        &config(&pins, &sock, STALL_PORT, ""),
        &pins,
    );
    daemon.wait_for_log("running", Duration::from_secs(10));
    // The daemon publishes its first figures before it says "running".
    let metrics = SocketAddr::new(SERVER_V4.into(), METRICS_LISTEN_PORT);
    assert!(
        pair.server
            .run(|| http_get(metrics, "/metrics"))
            .1
            .contains("shedder_heartbeat_age_seconds"),
        "no figures at \"running\""
    );

    // Stalled clients in every place but one of each endpoint's cap.
    let metrics_cap = shedder::api::metrics::CONNECTIONS;
    let control_cap = shedder::api::control::CONNECTIONS;
    let stall_metrics = || {
        let mut c = TcpStream::connect(metrics).expect("connect to metrics");
        c.write_all(b"GET /metr").unwrap();
        c
    };
    let mut stalled_tcp: Vec<TcpStream> = pair
        .server
        .run(|| (1..metrics_cap).map(|_| stall_metrics()).collect());
    let mut stalled_unix: Vec<std::os::unix::net::UnixStream> = (1..control_cap)
        .map(|_| {
            let mut c = std::os::unix::net::UnixStream::connect(&sock).expect("connect");
            c.write_all(b"GET /shed").unwrap();
            c
        })
        .collect();

    let t = std::time::Instant::now();
    let (head, body) = pair.server.run(|| http_get(metrics, "/metrics"));
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    assert!(body.contains("shedder_heartbeat_age_seconds"), "{body}");
    let scrape = t.elapsed();
    let t = std::time::Instant::now();
    let r = ok(shedder(&bin, &[], &["status", "--socket", s]));
    assert!(r.stdout.contains("web (ports 7614)"), "{r:?}");
    let status = t.elapsed();
    println!(
        "with {} and {} stalled clients: scrape {scrape:?}, status {status:?}",
        metrics_cap - 1,
        control_cap - 1
    );
    assert!(
        scrape < Duration::from_secs(2) && status < Duration::from_secs(2),
        "scrape {scrape:?}, status {status:?}"
    );

    // A chunked body: the policy in force, sent back in two chunks, is applied.
    let policy = ok(shedder(&bin, &[], &["policy", "show", "--socket", s])).stdout;
    let mut c = std::os::unix::net::UnixStream::connect(&sock).expect("connect");
    let half = policy.len() / 2;
    write!(
        c,
        "PUT /shedding/policy HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n{:x}\r\n{}\r\n{:x}\r\n{}\r\n0\r\n\r\n",
        half,
        &policy[..half],
        policy.len() - half,
        &policy[half..]
    )
    .unwrap();
    let mut answer = String::new();
    c.read_to_string(&mut answer).unwrap();
    assert!(
        answer.starts_with("HTTP/1.1 200"),
        "chunked policy: {answer}"
    );

    // Past the cap a client waits in the backlog (not refused) until the head timeout
    // (5 s) cuts the stalled ones off, then is answered.
    stalled_tcp.push(pair.server.run(stall_metrics));
    let t = std::time::Instant::now();
    let (head, _) = pair.server.run(|| http_get(metrics, "/metrics"));
    assert!(head.starts_with("HTTP/1.1 200"), "past the cap: {head}");
    println!(
        "past the cap of {metrics_cap}: answered after {:?}",
        t.elapsed()
    );

    // The stalled ones are cut off after the head timeout (5 s).
    std::thread::sleep(Duration::from_secs(1));
    let mut buf = [0u8; 256];
    for c in stalled_tcp.iter_mut().take(4) {
        c.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
        assert!(
            c.read(&mut buf).is_ok(),
            "a stalled metrics client is answered or closed, not left hanging"
        );
    }
    for c in stalled_unix.iter_mut().take(4) {
        c.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
        assert!(
            c.read(&mut buf).is_ok(),
            "a stalled control client is answered or closed, not left hanging"
        );
    }
}

/// GET `path` from `addr` over plain HTTP/1.1; (status line, headers+body).
fn http_get(addr: SocketAddr, path: &str) -> (String, String) {
    let mut c = TcpStream::connect_timeout(&addr, Duration::from_secs(2)).expect("connect");
    // Past an endpoint's cap the answer comes within the head timeout (5 s).
    c.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    write!(
        c,
        "GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut raw = String::new();
    c.read_to_string(&mut raw).expect("read answer");
    let (head, body) = raw.split_once("\r\n\r\n").expect("HTTP head");
    (head.to_string(), body.to_string())
}

/// The reference parser (Python prometheus_client, from Debian) turned into JSON:
/// `[{"name", "type", "samples": [{"name", "labels", "value"}]}]`.
const PARSE: &str = r#"
import json, sys
from prometheus_client.openmetrics.parser import text_string_to_metric_families
out = []
for f in text_string_to_metric_families(sys.stdin.read()):
    out.append({"name": f.name, "type": f.type, "samples": [
        {"name": s.name, "labels": s.labels, "value": s.value} for s in f.samples]})
print(json.dumps(out))
"#;

fn parse_openmetrics(text: &str) -> serde_json::Value {
    let mut child = Command::new("/usr/bin/python3")
        .args(["-c", PARSE])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("python3 (cargo xtask test installs python3-prometheus-client)");
    child
        .stdin
        .take()
        .unwrap()
        .write_all(text.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "the OpenMetrics parser rejected the exposition: {}\n{text}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("parser output")
}

fn samples<'a>(
    families: &'a serde_json::Value,
    family: &str,
) -> (&'a str, &'a Vec<serde_json::Value>) {
    let f = families
        .as_array()
        .unwrap()
        .iter()
        .find(|f| f["name"] == family)
        .unwrap_or_else(|| panic!("no family {family}"));
    (
        f["type"].as_str().unwrap(),
        f["samples"].as_array().unwrap(),
    )
}

fn sum_where(samples: &[serde_json::Value], name: &str, labels: &[(&str, &str)]) -> f64 {
    samples
        .iter()
        .filter(|s| s["name"] == name && labels.iter().all(|(k, v)| s["labels"][k] == *v))
        .map(|s| s["value"].as_f64().unwrap())
        .sum()
}

#[test]
fn metrics_scrape_is_valid_openmetrics_and_counts_what_happened() {
    require_root();
    shedder_lab::ensure_fs();
    let pair = Pair::new("opmet");
    let _server = pair.server.run(|| TestServer::holding(METRICS_PORT));
    let dir = scratch("metrics");
    let _cleanup = Scratch(dir.clone());
    let pins = pin_dir("opmet");
    // Without fair shares a new attempt after a refusal is a retry (with them, one client
    // address is the whole class and never a retrier).
    let cfg = config(&pins, &dir.join("ctl.sock"), METRICS_PORT, "") + "fair_share = false\n";
    let daemon = Daemon::start(&pair.server, "opmet", &cfg, &pins);
    daemon.wait_for_log("running", Duration::from_secs(10));

    // Four admitted connections that each exchange data, two reset.
    let mut held: Vec<TcpStream> = (0..4)
        .map(|i| admitted(&pair, METRICS_PORT, &format!("connection {i}")))
        .collect();
    for c in &mut held {
        c.write_all(b"ping").unwrap();
        let mut b = [0u8; 4];
        c.read_exact(&mut b).unwrap();
        // And a request the server holds: work in flight.
        c.write_all(b"h").unwrap();
    }
    settle(&pins, 4);
    refused(&pair, METRICS_PORT, "fifth");
    refused(&pair, METRICS_PORT, "sixth");
    std::thread::sleep(Duration::from_millis(400)); // a tick or more: the snapshot is fresh

    let addr = SocketAddr::from((SERVER_V4, METRICS_LISTEN_PORT));
    let (head, body) = pair.server.run(|| http_get(addr, "/metrics"));
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    assert!(
        head.to_ascii_lowercase()
            .contains("content-type: application/openmetrics-text"),
        "{head}"
    );
    assert!(body.ends_with("# EOF\n"), "{body}");
    let families = parse_openmetrics(&body);

    // The client's first attempt came before any handshake of its had completed: an
    // unproven one, counted apart; the three after it and the two refused were proven.
    let (kind, s) = samples(&families, "shedder_connection_attempts");
    assert_eq!(kind, "counter");
    let name = "shedder_connection_attempts_total";
    assert_eq!(
        sum_where(s, name, &[("service", "web"), ("verdict", "pass")]),
        3.0,
        "{body}"
    );
    assert_eq!(
        sum_where(s, name, &[("service", "web"), ("verdict", "rst")]),
        2.0,
        "{body}"
    );
    let (kind, s) = samples(&families, "shedder_unproven_attempts");
    assert_eq!(kind, "counter");
    assert_eq!(
        sum_where(
            s,
            "shedder_unproven_attempts_total",
            &[("service", "web"), ("verdict", "pass")]
        ),
        1.0,
        "{body}"
    );
    let (_, s) = samples(&families, "shedder_unproven_completed");
    assert_eq!(
        sum_where(s, "shedder_unproven_completed_total", &[("service", "web")]),
        1.0,
        "{body}"
    );
    let (_, s) = samples(&families, "shedder_syn_flood");
    assert_eq!(
        sum_where(s, "shedder_syn_flood", &[("service", "web")]),
        0.0
    );

    // The sixth came from the source refused just before: a retry (a new connection, not
    // a retransmitted SYN: the reset made the client fail at once, without resending).
    let (kind, s) = samples(&families, "shedder_retries");
    assert_eq!(kind, "counter");
    assert_eq!(
        sum_where(s, "shedder_retries_total", &[("service", "web")]),
        1.0,
        "{body}"
    );
    let (kind, s) = samples(&families, "shedder_syn_retransmits");
    assert_eq!(kind, "counter");
    assert_eq!(
        sum_where(s, "shedder_syn_retransmits_total", &[("service", "web")]),
        0.0,
        "{body}"
    );
    let (kind, _) = samples(&families, "shedder_retry_ratio");
    assert_eq!(kind, "gauge");

    let (kind, s) = samples(&families, "shedder_limit");
    assert_eq!(kind, "gauge");
    assert_eq!(sum_where(s, "shedder_limit", &[("service", "web")]), 4.0);
    let (_, s) = samples(&families, "shedder_inflight");
    assert_eq!(sum_where(s, "shedder_inflight", &[("service", "web")]), 4.0);

    // Four accepted connections were each dequeued once: the queue-age histogram counts
    // them, its +Inf bucket equals its count, and the latency histogram saw the echoes.
    let (kind, s) = samples(&families, "shedder_queue_age_seconds");
    assert_eq!(kind, "histogram");
    let count = sum_where(s, "shedder_queue_age_seconds_count", &[("service", "web")]);
    assert_eq!(count, 4.0, "{body}");
    let inf = sum_where(
        s,
        "shedder_queue_age_seconds_bucket",
        &[("service", "web"), ("le", "+Inf")],
    );
    assert_eq!(inf, count);
    let (_, s) = samples(&families, "shedder_latency_seconds");
    assert!(sum_where(s, "shedder_latency_seconds_count", &[("service", "web")]) >= 4.0);

    let (_, s) = samples(&families, "shedder_heartbeat_age_seconds");
    let age = sum_where(s, "shedder_heartbeat_age_seconds", &[]);
    assert!((0.0..1.0).contains(&age), "heartbeat age {age}");

    // The exposition and the documented catalogue (names.rs, which deploy/ is checked
    // against) agree: every family exported is documented with its type and labels, and
    // every documented family is exported.
    let documented = shedder::api::metrics::names::METRICS;
    for f in families.as_array().unwrap() {
        let name = f["name"].as_str().unwrap();
        let (_, kind, labels, _) = documented
            .iter()
            .find(|m| m.0 == name)
            .unwrap_or_else(|| panic!("{name} is exported but not in names.rs"));
        assert_eq!(f["type"], *kind, "{name}");
        for sample in f["samples"].as_array().unwrap() {
            for key in sample["labels"].as_object().unwrap().keys() {
                assert!(
                    labels.contains(&key.as_str()) || key == "le",
                    "{name} has label {key}, not documented"
                );
            }
        }
    }
    for (name, ..) in documented {
        // PSI needs a cgroup per service; this test's service has none. The fleet families
        // exist only in fleet mode (tests/tests/fleet.rs checks them).
        let optional = name.starts_with("shedder_pressure_") || name.starts_with("shedder_fleet_");
        let present = families
            .as_array()
            .unwrap()
            .iter()
            .any(|f| f["name"] == *name);
        assert!(present || optional, "{name} is documented but not exported");
    }

    // Alive and ready (ticking, heartbeat fresh); anything else is a 404.
    for path in ["/healthz", "/readyz"] {
        let (head, body) = pair.server.run(|| http_get(addr, path));
        assert!(head.starts_with("HTTP/1.1 200"), "{path}: {head}\n{body}");
    }
    let (head, _) = pair.server.run(|| http_get(addr, "/nope"));
    assert!(head.starts_with("HTTP/1.1 404"), "{head}");
    drop(held);
}

#[test]
fn the_control_socket_admits_root_and_the_control_group_only() {
    require_root();
    shedder_lab::ensure_fs();
    let pair = Pair::new("opperm");
    let _server = pair.server.run(|| TestServer::holding(PERMS_PORT));
    let dir = scratch("perms");
    let _cleanup = Scratch(dir.clone());
    // A copy of the binary any user can run, wherever the checkout is.
    let bin = dir.join("shedder");
    std::fs::copy(shedder_bin(), &bin).expect("copy shedder");
    std::fs::set_permissions(&bin, std::fs::Permissions::from_mode(0o755)).unwrap();
    let pins = pin_dir("opperm");
    let sock = dir.join("ctl.sock");
    let s = sock.to_str().unwrap();

    // No daemon: exit 3 with a hint.
    let r = shedder(&bin, &[], &["status", "--socket", s]);
    assert_eq!(r.code, 3, "{r:?}");
    assert!(r.stderr.contains("shedder run"), "{r:?}");

    let cfg = config(&pins, &sock, PERMS_PORT, "control_group = \"nogroup\"");
    let daemon = Daemon::start(&pair.server, "opperm", &cfg, &pins);
    daemon.wait_for_log("running", Duration::from_secs(10));
    let meta = std::fs::metadata(&sock).expect("socket");
    assert_eq!(meta.permissions().mode() & 0o777, 0o660);

    let stranger = ["--reuid=4242", "--regid=4242", "--clear-groups"];
    let member = ["--reuid=4242", "--regid=4242", "--groups=65534"];
    let primary = ["--reuid=nobody", "--regid=nogroup", "--clear-groups"];
    // CAP_DAC_OVERRIDE gets past the file mode; the daemon's peer check still refuses.
    let capable = [
        "--reuid=4242",
        "--regid=4242",
        "--clear-groups",
        "--inh-caps=+dac_override",
        "--ambient-caps=+dac_override",
    ];

    let r = shedder(&bin, &stranger, &["status", "--socket", s]);
    assert_eq!(r.code, 4, "{r:?}");
    assert!(r.stderr.contains("permission denied"), "{r:?}");

    let r = shedder(&bin, &capable, &["limit", "set", "web", "2", "--socket", s]);
    assert_eq!(r.code, 4, "{r:?}");
    assert!(r.stderr.contains("uid 4242"), "{r:?}");
    assert!(r.stderr.contains("may not use the control API"), "{r:?}");
    assert!(daemon.log().contains("control request refused"));
    assert_eq!(
        limit_of(&shedder_bin(), s),
        4,
        "the refused request changed nothing"
    );

    for who in [&member[..], &primary[..]] {
        let r = shedder(&bin, who, &["status", "--socket", s]);
        assert_eq!(r.code, 0, "{who:?}: {r:?}");
        assert!(r.stdout.contains("web (ports 7612)"), "{r:?}");
    }
    ok(shedder(
        &bin,
        &member,
        &["limit", "set", "web", "3", "--socket", s],
    ));
    assert_eq!(limit_of(&shedder_bin(), s), 3);
    assert!(
        daemon.log().contains("uid 4242"),
        "the audit log names the caller"
    );
}

const KLOG_PORT: u16 = 7613;

#[test]
fn kernel_debug_log_names_each_shed_decision_and_is_rate_limited() {
    require_root();
    shedder_lab::ensure_fs();
    let pair = Pair::new("opklog");
    let _server = pair.server.run(|| TestServer::holding(KLOG_PORT));
    let dir = scratch("klog");
    let _cleanup = Scratch(dir.clone());
    let pins = pin_dir("opklog");
    let sock = dir.join("ctl.sock");
    // One client address is the whole class, so with fair shares it is never taken for a
    // retrier; without them a new attempt after a refusal is a retry, as this test needs.
    let cfg = config(&pins, &sock, KLOG_PORT, "kernel_debug_log = true")
        .replace("fixed_limit = 4", "fixed_limit = 1")
        + "fair_share = false\n";
    let daemon = Daemon::start(&pair.server, "opklog", &cfg, &pins);
    daemon.wait_for_log("kernel debug log on", Duration::from_secs(10));

    let _held = busy(&pair, KLOG_PORT, "the one connection the limit allows");
    settle(&pins, 1);
    // Far more refusals than the budget of 20 lines a second per CPU.
    const ATTEMPTS: usize = 300;
    for _ in 0..ATTEMPTS {
        refused(&pair, KLOG_PORT, "over the limit of 1");
    }
    let want = format!("shed port={KLOG_PORT} service=0 class=medium verdict=rst reason=priority");
    daemon.wait_for_log(&want, Duration::from_secs(5));
    std::thread::sleep(Duration::from_millis(300)); // the forwarder drains its buffer

    // After the first refusal the same source's attempts are retries, decided (and logged)
    // one class lower: count every shed line of the service.
    let log = daemon.log();
    let written = log
        .matches(&format!("shed port={KLOG_PORT} service=0 class="))
        .count();
    assert!(
        log.contains(&format!(
            "shed port={KLOG_PORT} service=0 class=sheddable verdict=rst reason=service_limit"
        )) && log.contains("retry=1"),
        "the retries are logged as demoted:\n{log}"
    );
    let status = status_json(&shedder_bin(), sock.to_str().unwrap());
    let suppressed = status["kernel_events"]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e[0] == "log_suppressed")
        .and_then(|e| e[1].as_u64())
        .expect("log_suppressed in kernel_events") as usize;
    // Every shed decision was either written or counted as suppressed.
    assert_eq!(
        written + suppressed,
        ATTEMPTS,
        "written {written}, suppressed {suppressed}"
    );
    assert!(suppressed > 0, "the budget held back nothing");
    assert!(
        written >= 20,
        "fewer lines than one second's budget: {written}"
    );
}
