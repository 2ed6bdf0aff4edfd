//! The Debian package, built with `dpkg-deb --build` from a laid-out tree.

use std::{
    fs,
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{Context as _, Result, bail};

use super::{Inputs, Layout, lay_out, needed, set_mode};
use crate::cmd::{run, stdout};

/// Where the package puts each file (Debian's paths).
pub(crate) const LAYOUT: Layout = Layout {
    bin: "usr/bin/shedder",
    unit: "lib/systemd/system/shedder.service",
    config: "etc/shedder/shedder.toml",
    share: "usr/share/shedder",
    bash: "usr/share/bash-completion/completions/shedder",
    zsh: "usr/share/zsh/vendor-completions/_shedder",
    fish: "usr/share/fish/vendor_completions.d/shedder.fish",
    man1: "usr/share/man/man1",
    doc: "usr/share/doc/shedder",
};

/// After installing: reload systemd's units, restart the daemon on an upgrade if it was
/// running (it adopts its pins), and otherwise say how to start it. Nothing is enabled or
/// started on a first install: the example configuration sheds on eth0 for made-up
/// services.
const POSTINST: &str = r#"#!/bin/sh
set -e
if [ "$1" = configure ]; then
    if [ -d /run/systemd/system ]; then
        systemctl daemon-reload >/dev/null || true
        if [ -n "$2" ]; then
            # An upgrade: a running daemon is restarted and adopts its pinned programs.
            systemctl try-restart shedder.service || true
        fi
    fi
    if [ -z "$2" ]; then
        cat <<'MSG'
shedder is installed but not enabled. Set daemon.interfaces, the classes and the
services in /etc/shedder/shedder.toml, then:
    shedder policy validate /etc/shedder/shedder.toml
    shedder doctor --config /etc/shedder/shedder.toml
    systemctl enable --now shedder
MSG
    fi
fi
exit 0
"#;

/// Before removing (not upgrading): stop the daemon.
const PRERM: &str = r#"#!/bin/sh
set -e
if [ "$1" = remove ] && [ -d /run/systemd/system ]; then
    systemctl stop shedder.service || true
fi
exit 0
"#;

/// After removing: let systemd forget the unit.
const POSTRM: &str = r#"#!/bin/sh
set -e
if [ -d /run/systemd/system ]; then
    systemctl daemon-reload >/dev/null || true
fi
exit 0
"#;

/// The Debian package of each shared library the binary needs.
fn package_of(library: &str) -> Option<&'static str> {
    match library {
        "libc.so.6"
        | "libm.so.6"
        | "libpthread.so.0"
        | "libdl.so.2"
        | "librt.so.1"
        | "ld-linux-x86-64.so.2" => Some("libc6"),
        "libgcc_s.so.1" => Some("libgcc-s1"),
        _ => None,
    }
}

/// The newest `GLIBC_x.y` symbol version in `objdump -T` output.
fn newest_glibc(dynamic_symbols: &str) -> Option<(u32, u32)> {
    dynamic_symbols
        .split(|c: char| c.is_whitespace() || c == '(' || c == ')')
        .filter_map(|w| w.strip_prefix("GLIBC_"))
        .filter_map(|v| {
            let mut p = v.split('.');
            Some((p.next()?.parse().ok()?, p.next()?.parse().ok()?))
        })
        .max()
}

/// `Depends:` from what the binary needs: libc6 at the newest glibc symbol version it
/// uses, libgcc-s1 if it links libgcc_s. An unknown library is an error, not a guess.
fn depends(bin: &Path) -> Result<String> {
    let mut deps: Vec<String> = Vec::new();
    for lib in needed(bin)? {
        let pkg = package_of(&lib)
            .with_context(|| format!("{} needs {lib}: which Debian package?", bin.display()))?;
        if !deps.iter().any(|d| d.starts_with(pkg)) {
            deps.push(pkg.to_string());
        }
    }
    let symbols = stdout(Command::new("objdump").arg("-T").arg(bin))?;
    let (major, minor) = newest_glibc(&symbols)
        .with_context(|| format!("no GLIBC_ symbol version in {}", bin.display()))?;
    for d in &mut deps {
        if d == "libc6" {
            *d = format!("libc6 (>= {major}.{minor})");
        }
    }
    if !deps.iter().any(|d| d.starts_with("libc6")) {
        bail!("{} does not link libc.so.6", bin.display());
    }
    Ok(deps.join(", "))
}

/// Installed-Size: the tree's size in KiB.
fn installed_kib(root: &Path) -> Result<u64> {
    let out = stdout(
        Command::new("du")
            .args(["-s", "-k", "--exclude=DEBIAN"])
            .arg(root),
    )?;
    out.split_whitespace()
        .next()
        .and_then(|n| n.parse().ok())
        .context("du printed no size")
}

pub(crate) fn build(inputs: &Inputs, work: &Path, dist: &Path) -> Result<PathBuf> {
    let root = work.join("deb");
    lay_out(&inputs.glibc_bin, &root, &LAYOUT)?;
    let depends = depends(&root.join(LAYOUT.bin))?;
    let debian = root.join("DEBIAN");
    fs::create_dir_all(&debian)?;
    let control = format!(
        "Package: shedder\n\
         Version: {version}\n\
         Architecture: amd64\n\
         Maintainer: shedder developers <shedder@users.noreply.github.com>\n\
         Installed-Size: {size}\n\
         Depends: {depends}\n\
         Suggests: ethtool, bpftool, prometheus\n\
         Section: net\n\
         Priority: optional\n\
         Homepage: https://github.com/shedder/shedder\n\
         Description: kernel-edge load shedder for TCP and QUIC services\n \
         XDP/TC eBPF programs refuse new TCP SYNs and QUIC Initials per service and\n \
         class when the service is over its limit; a daemon measures each service's\n \
         pressure (accept-queue age, latency, in-flight connections, PSI) and sets the\n \
         limits. CLI, Prometheus metrics, and fleet mode over etcd.\n",
        version = inputs.version,
        size = installed_kib(&root)?,
    );
    fs::write(debian.join("control"), control)?;
    fs::write(debian.join("conffiles"), format!("/{}\n", LAYOUT.config))?;
    for (name, text) in [("postinst", POSTINST), ("prerm", PRERM), ("postrm", POSTRM)] {
        fs::write(debian.join(name), text)?;
        set_mode(&debian.join(name), 0o755)?;
    }
    let file = format!("shedder_{}_amd64.deb", inputs.version);
    run(Command::new("dpkg-deb")
        .args(["--root-owner-group", "-Zxz", "--build"])
        .arg(&root)
        .arg(dist.join(&file)))?;
    let contents = stdout(
        Command::new("dpkg-deb")
            .arg("--contents")
            .arg(dist.join(&file)),
    )?;
    eprintln!("dist: {file}:\n{contents}");
    Ok(PathBuf::from(file))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_newest_glibc_version_wins() {
        let t = "0000 DF *UND* 0000 (GLIBC_2.2.5) memcpy\n\
                 0000 DF *UND* 0000 (GLIBC_2.34) __libc_start_main\n\
                 0000 DF *UND* 0000 (GLIBC_2.9) pipe2\n\
                 0000 DF *UND* 0000 (GCC_3.0) _Unwind_Resume\n";
        assert_eq!(newest_glibc(t), Some((2, 34)));
        assert_eq!(newest_glibc("nothing"), None);
    }

    #[test]
    fn libraries_map_to_packages() {
        assert_eq!(package_of("libc.so.6"), Some("libc6"));
        assert_eq!(package_of("libgcc_s.so.1"), Some("libgcc-s1"));
        assert_eq!(package_of("libssl.so.3"), None);
    }
}
