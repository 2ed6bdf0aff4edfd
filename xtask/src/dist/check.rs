//! `cargo xtask dist --check`: the package used where a user would use it.
//!
//! A run of `cargo xtask fresh-check`'s cached minimal Debian root (the host's suite,
//! under an overlay of its own, in a private mount namespace; see `crate::fresh`), with no
//! Rust and no checkout in it. There, as root: `apt-get install ./shedder_*.deb` (and
//! systemd, for systemd-analyze), then [`SCRIPT`]: `shedder --version`, `shedder policy
//! validate` of the packaged configuration, `shedder doctor` (on the example, shown; on the
//! test's own file, required to pass), `systemd-analyze verify` of
//! the packaged unit, and the daemon started with the unit's own ExecStart line, in a
//! network namespace, refusing a second connection over a limit of one (the first holds an
//! unanswered request, so it is in flight) between two
//! namespaces joined by a veth pair (198.18.77.0/24). The script removes its namespaces
//! and stops what it started on every exit; the run's bpffs (and any pin in it) and the
//! overlay go when the run is unmounted.
//!
//! Then the static tarball on Debian 11: a minimal bullseye root (debootstrap, cached
//! under `~/.cache/shedder/dist-root/bullseye`), under an overlay, where the unpacked
//! binary runs `--version`, `policy validate` of its example, `doctor` and `manpage`
//! ([`BULLSEYE_SCRIPT`]).
//!
//! Last, the OCI image, loaded from its archive and run on the host with podman the way
//! deploy/kubernetes/shedder.yaml runs it (`image-check.sh`, beside this file): ready,
//! refusing over its limit on a veth between namespaces, and still refusing after `podman
//! kill`, its pins left on the host's bpffs. /sys/fs/bpf is made a shared mount first, in
//! this process's private mount namespace only, as it is on a systemd host, so that the
//! container's rslave bind of it (HostToContainer) is the host's bpffs.

use std::{
    fs,
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{Context as _, Result, bail};

use crate::{
    cmd::{home, require_root, target_dir},
    fresh::{
        HOST_DEPS,
        base::base_root,
        chroot::{in_root, tee},
        host::{Host, read_host},
        mounts::{private_mount_namespace, remove_tree},
        run::RunRoot,
        signals::catch_signals,
    },
    setup,
};

/// The oldest Debian the static tarball is for.
const OLDEST_SUITE: &str = "bullseye";

/// Run inside the bullseye root with the tarball's directory name as $1.
const BULLSEYE_SCRIPT: &str = r#"set -eu
step() { printf '\n=== %s\n' "$*"; }
D="/root/$1"
step "Debian $(cat /etc/debian_version), $(ldd --version | head -n 1)"
step "shedder --version"
"$D/bin/shedder" --version
step "shedder policy validate (the tarball's example)"
"$D/bin/shedder" policy validate "$D/shedder.toml"
step "shedder doctor"
"$D/bin/shedder" doctor
step "shedder manpage, completions"
"$D/bin/shedder" manpage > /tmp/shedder.1
head -n 3 /tmp/shedder.1
"$D/bin/shedder" completions bash | wc -l
step "the static binary runs on Debian 11"
"#;

/// Run inside the root with the package file's name as $1.
const SCRIPT: &str = r#"set -eu
export DEBIAN_FRONTEND=noninteractive
DEB="$1"
step() { printf '\n=== %s\n' "$*"; }

step "apt-get install ./$DEB systemd"
apt-get update -qq
apt-get install -y --no-install-recommends "/root/$DEB" systemd

step "installed files"
dpkg -L shedder | sort
test -x /usr/bin/shedder
grep -qx /etc/shedder/shedder.toml /var/lib/dpkg/info/shedder.conffiles
for f in /lib/systemd/system/shedder.service /usr/share/shedder/grafana/shedder.json \
    /usr/share/shedder/prometheus/alerts.yml /usr/share/shedder/prometheus/scrape.yml \
    /usr/share/bash-completion/completions/shedder /usr/share/zsh/vendor-completions/_shedder \
    /usr/share/fish/vendor_completions.d/shedder.fish /usr/share/man/man1/shedder.1.gz \
    /usr/share/doc/shedder/copyright; do
    test -s "$f" || { echo "missing: $f"; exit 1; }
done
if [ -e /etc/systemd/system/multi-user.target.wants/shedder.service ]; then
    echo "the package enabled the unit"; exit 1
fi

step "shedder --version"
shedder --version

step "shedder policy validate /etc/shedder/shedder.toml"
shedder policy validate /etc/shedder/shedder.toml

step "shedder doctor (the packaged example)"
# The example's services are made up (their cgroups do not exist here): its failures are
# shown, not required to pass. doctor runs strictly on the test's own file below.
shedder doctor || echo "(doctor: exit $?; the example's made-up services)"

step "systemd-analyze verify /lib/systemd/system/shedder.service"
out=$(systemd-analyze verify --man=no /lib/systemd/system/shedder.service 2>&1) || {
    echo "$out"; exit 1; }
if echo "$out" | grep shedder.service; then exit 1; fi
echo "nothing to say about shedder.service"

step "the unit's ExecStart refuses a connection over the limit"
EXEC=$(sed -n 's/^ExecStart=//p' /lib/systemd/system/shedder.service)
echo "ExecStart: $EXEC"
case "$EXEC" in /usr/bin/shedder\ *) ;; *) echo "ExecStart does not run /usr/bin/shedder"; exit 1;; esac
S=shd-pkg-s-$$ C=shd-pkg-c-$$
DAEMON= SERVER=
cleanup() {
    set +e
    [ -n "$DAEMON" ] && kill -TERM "$DAEMON" && wait "$DAEMON"
    [ -n "$SERVER" ] && kill "$SERVER" && wait "$SERVER"
    ip netns del "$S" 2>/dev/null
    ip netns del "$C" 2>/dev/null
    rm -rf /sys/fs/bpf/shedder
}
trap cleanup EXIT
ip netns add "$S"
ip netns add "$C"
ip -n "$S" link add pkg-s type veth peer name pkg-c netns "$C"
ip -n "$S" addr add 198.18.77.1/24 dev pkg-s
ip -n "$C" addr add 198.18.77.2/24 dev pkg-c
for n in "$S" "$C"; do ip -n "$n" link set lo up; done
ip -n "$S" link set pkg-s up
ip -n "$C" link set pkg-c up
cat > /etc/shedder/shedder.toml <<'TOML'
[daemon]
interfaces = ["pkg-s"]

[[service]]
name = "web"
ports = [8080]
controller = "fixed"
min_limit = 1
fixed_limit = 1
fallback_limit = 1
action = "drop"
TOML
nsenter --net=/var/run/netns/"$S" python3 -c '
import socket
s = socket.socket()
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("198.18.77.1", 8080))
s.listen(16)
held = []
while True:
    c = s.accept()[0]
    c.recv(1)  # the request, never answered: the connection is busy
    held.append(c)
' &
SERVER=$!
sleep 0.5
step "shedder doctor (the test's file, in the server's namespace)"
nsenter --net=/var/run/netns/"$S" shedder doctor
step "the daemon, by the unit's ExecStart"
nsenter --net=/var/run/netns/"$S" $EXEC > /root/daemon.log 2>&1 &
DAEMON=$!
ready=
for i in $(seq 1 100); do
    if nsenter --net=/var/run/netns/"$S" curl -sf http://127.0.0.1:9464/readyz >/dev/null; then
        ready=1; break
    fi
    kill -0 "$DAEMON" 2>/dev/null || break
    sleep 0.2
done
if [ -z "$ready" ]; then echo "the daemon is not ready:"; cat /root/daemon.log; exit 1; fi
echo "daemon ready"
nsenter --net=/var/run/netns/"$C" python3 -c '
import socket, sys, time
first = socket.create_connection(("198.18.77.1", 8080), timeout=3)
first.sendall(b"h")
print("first connection: admitted, a request in flight")
time.sleep(1)  # the kernel counts it in flight once the server has read the request
try:
    second = socket.create_connection(("198.18.77.1", 8080), timeout=3)
except (socket.timeout, ConnectionRefusedError) as e:
    print("second connection: refused (%s)" % type(e).__name__)
    sys.exit(0)
print("second connection: admitted over a limit of 1")
sys.exit(1)
'
shedder status
step "package checks passed"
"#;

pub fn run_check(dist: &Path) -> Result<()> {
    require_root("dist --check (chroot, namespaces, XDP)")?;
    let debs: Vec<String> = fs::read_dir(dist)
        .with_context(|| format!("listing {} (run `cargo xtask dist` first)", dist.display()))?
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .filter(|n| n.starts_with("shedder_") && n.ends_with("_amd64.deb"))
        .collect();
    let [deb] = debs.as_slice() else {
        bail!(
            "want one shedder_*_amd64.deb in {}, found {debs:?}",
            dist.display()
        );
    };
    setup::ensure(HOST_DEPS)?;
    let logs = target_dir().join("dist-check");
    fs::create_dir_all(&logs)?;
    private_mount_namespace()?;
    catch_signals();
    let host = read_host()?;
    let cache = home()?.join(".cache/shedder");
    let base = base_root(&host, &cache, false, &logs)?;
    let mut run = RunRoot::new(&cache, false)?;
    let result = (|| {
        run.prepare_plain(&base, &host)?;
        fs::copy(dist.join(deb), run.merged.join("root").join(deb))?;
        fs::write(run.merged.join("root/check-package.sh"), SCRIPT)?;
        let log = logs.join("package.log");
        tee(
            in_root(
                &run.merged,
                &host,
                &format!("exec sh /root/check-package.sh {deb}"),
            ),
            &log,
            false,
        )
    })();
    let finished = run.finish();
    result?;
    finished?;
    eprintln!("dist --check: {deb} passed in a fresh Debian root");
    drop(run);

    let tarballs: Vec<String> = fs::read_dir(dist)?
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .filter(|n| n.starts_with("shedder-") && n.ends_with("-x86_64-linux-musl.tar.gz"))
        .collect();
    let [tarball] = tarballs.as_slice() else {
        bail!(
            "want one shedder-*-x86_64-linux-musl.tar.gz in {}, found {tarballs:?}",
            dist.display()
        );
    };
    let oldest = oldest_root(&host, &cache, &logs)?;
    let mut run = RunRoot::new(&cache, false)?;
    let result = (|| {
        run.prepare_plain(&oldest, &host)?;
        crate::cmd::run(
            Command::new("tar")
                .arg("-xzf")
                .arg(dist.join(tarball))
                .arg("-C")
                .arg(run.merged.join("root")),
        )?;
        let name = tarball.trim_end_matches(".tar.gz");
        fs::write(run.merged.join("root/check-static.sh"), BULLSEYE_SCRIPT)?;
        tee(
            in_root(
                &run.merged,
                &host,
                &format!("exec sh /root/check-static.sh {name}"),
            ),
            &logs.join("static.log"),
            false,
        )
    })();
    let finished = run.finish();
    result?;
    finished?;
    eprintln!("dist --check: {tarball} runs on Debian 11 ({OLDEST_SUITE})");

    check_image(dist, &logs)
}

/// The image check's own dependency: runc (see image-check.sh).
const IMAGE_DEPS: &[setup::Dep] = &[
    setup::dep(
        "podman",
        setup::Probe::Runs("podman", &["--version"]),
        "podman",
    ),
    setup::dep("runc", setup::Probe::Runs("runc", &["--version"]), "runc"),
];

fn check_image(dist: &Path, logs: &Path) -> Result<()> {
    let archives: Vec<String> = fs::read_dir(dist)?
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .filter(|n| n.starts_with("shedder-") && n.ends_with("-oci.tar"))
        .collect();
    let [archive] = archives.as_slice() else {
        bail!(
            "want one shedder-*-oci.tar in {}, found {archives:?}",
            dist.display()
        );
    };
    setup::ensure(IMAGE_DEPS)?;
    let version = archive
        .trim_start_matches("shedder-")
        .trim_end_matches("-oci.tar");
    let tag = super::image_tag(version);
    crate::cmd::run(
        Command::new("podman")
            .args(["load", "--quiet", "-i"])
            .arg(dist.join(archive)),
    )?;
    crate::cmd::run(Command::new("mount").args(["--make-shared", "/sys/fs/bpf"]))?;
    let mut c = Command::new("sh");
    c.args(["-c", IMAGE_SCRIPT, "image-check", &tag]);
    tee(c, &logs.join("image.log"), false)?;
    eprintln!("dist --check: {archive} runs as the DaemonSet runs it, and fails static");
    Ok(())
}

const IMAGE_SCRIPT: &str = include_str!("image-check.sh");

/// A minimal root of [`OLDEST_SUITE`] from the host's mirror, made once.
fn oldest_root(host: &Host, cache: &Path, logs: &Path) -> Result<PathBuf> {
    let roots = cache.join("dist-root");
    let dir = roots.join(OLDEST_SUITE);
    let stamp = format!(
        "suite {OLDEST_SUITE}\nmirror {}\nvariant minbase\n",
        host.mirror
    );
    let stamp_file = ".shedder-dist-root";
    if fs::read_to_string(dir.join(stamp_file)).is_ok_and(|s| s == stamp) {
        return Ok(dir);
    }
    fs::create_dir_all(&roots)?;
    let partial = roots.join(format!("{OLDEST_SUITE}.partial"));
    remove_tree(&partial)?;
    let mut debootstrap = Command::new("debootstrap");
    debootstrap
        .args(["--variant=minbase", OLDEST_SUITE])
        .arg(&partial)
        .arg(&host.mirror);
    tee(debootstrap, &logs.join("oldest-root.log"), false)?;
    fs::write(partial.join(stamp_file), stamp)?;
    remove_tree(&dir)?;
    fs::rename(&partial, &dir)?;
    Ok(dir)
}
