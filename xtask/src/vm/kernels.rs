//! The kernels booted, and making one ready to boot: its package fetched and unpacked, its
//! options checked, the modules the checks need resolved.

use std::{
    collections::HashMap,
    fs,
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{Context as _, Result, bail};

use super::{
    modules::resolve_modules,
    packages::{apt_kernel, dist_kernel},
};
use crate::cmd::run;

/// Where a kernel package comes from.
enum Source {
    /// The package the metapackage `meta` depends on, from the configured apt sources
    /// (`apt-get download`, so apt checks its signature).
    Apt { meta: &'static str },
    /// The newest generic-flavour `linux-image-<series>.*-amd64` of a dist on a Debian
    /// archive, read from the dist's `InRelease` (checked with gpgv against
    /// debian-archive-keyring) and its `main/binary-amd64/Packages.xz` (checked by SHA256);
    /// the .deb is checked against the index's SHA256 too. The security archive has the
    /// same layout (`dists/<codename>-security/main/…`, its packages under
    /// `pool/updates/main/`, which the index's `Filename` names), and debian-archive-keyring
    /// holds its signing keys (bullseye's and bookworm's sign bullseye-security).
    Dist {
        archive: &'static str,
        dist: &'static str,
    },
}

pub struct Kernel {
    /// `major.minor`: what `--kernels` names, and the prefix the release must have.
    pub series: &'static str,
    source: Source,
}

/// The kernels booted by default, oldest first. Adding one is adding a line.
pub const KERNELS: &[Kernel] = &[
    // Debian 11's kernel: bullseye itself keeps its last point release's (5.10.0-32, 11.11);
    // bullseye-security carries the updates since.
    Kernel {
        series: "5.10",
        source: Source::Dist {
            archive: "http://security.debian.org/debian-security",
            dist: "bullseye-security",
        },
    },
    Kernel {
        series: "6.1",
        source: Source::Apt {
            meta: "linux-image-amd64",
        },
    },
    Kernel {
        series: "6.12",
        source: Source::Dist {
            archive: "http://deb.debian.org/debian",
            dist: "bookworm-backports",
        },
    },
];

/// Kernel options the checks rely on, with the module that provides each where Debian may
/// build it as one. Modules are loaded (with what they depend on) before the checks run; an
/// option that is not set is reported.
const OPTIONS: &[(&str, Option<&str>)] = &[
    ("CONFIG_BPF_SYSCALL", None),
    ("CONFIG_BPF_JIT", None),
    ("CONFIG_BPF_EVENTS", None),
    ("CONFIG_DEBUG_INFO_BTF", None),
    ("CONFIG_NET_NS", None),
    ("CONFIG_IPV6", Some("ipv6")),
    ("CONFIG_VETH", Some("veth")),
    ("CONFIG_NET_SCH_INGRESS", Some("sch_ingress")),
    ("CONFIG_NET_CLS_BPF", Some("cls_bpf")),
    ("CONFIG_NET_CLS_ACT", None),
    // sock_diag: the daemon reads listeners' accept queues and open sockets through it
    // (signals, sweep, recall); without the modules its netlink socket finds no handler.
    ("CONFIG_INET_DIAG", Some("inet_diag")),
    ("CONFIG_INET_TCP_DIAG", Some("tcp_diag")),
    ("CONFIG_INET_UDP_DIAG", Some("udp_diag")),
    ("CONFIG_DEVTMPFS", None),
    ("CONFIG_TMPFS", None),
];

/// The rows of `names` (`--kernels`), each once, in the order given; all without it.
pub fn select_kernels(names: Option<&[String]>) -> Result<Vec<&'static Kernel>> {
    let Some(names) = names else {
        return Ok(KERNELS.iter().collect());
    };
    let known = || {
        KERNELS
            .iter()
            .map(|k| k.series)
            .collect::<Vec<_>>()
            .join(", ")
    };
    let mut out = Vec::new();
    for name in names.iter().map(|n| n.trim()).filter(|n| !n.is_empty()) {
        let kernel = KERNELS.iter().find(|k| k.series == name).with_context(|| {
            format!(
                "no kernel {name} in the table (xtask/src/vm/kernels.rs KERNELS has: {})",
                known()
            )
        })?;
        if !out.iter().any(|k: &&Kernel| k.series == kernel.series) {
            out.push(kernel);
        }
    }
    Ok(out)
}

/// A kernel unpacked and ready to boot.
pub struct Prepared {
    pub series: &'static str,
    /// `uname -r` of the kernel, e.g. `6.1.0-52-amd64`.
    pub release: String,
    pub package: String,
    pub vmlinuz: PathBuf,
    /// Modules to load in this order: (name, uncompressed contents).
    pub modules: Vec<(String, Vec<u8>)>,
    /// Options from [`OPTIONS`] the kernel does not have.
    pub missing_options: Vec<&'static str>,
}

/// The package of `kernel` fetched (once) and unpacked (once), its config read against
/// [`OPTIONS`], and the modules those need.
pub fn prepare_kernel(kernel: &Kernel, cache: &Path, kernels_dir: &Path) -> Result<Prepared> {
    let (package, deb) = match kernel.source {
        Source::Apt { meta } => apt_kernel(kernel.series, meta, cache)?,
        Source::Dist { archive, dist } => dist_kernel(kernel.series, archive, dist, cache)?,
    };
    let release = package
        .strip_prefix("linux-image-")
        .with_context(|| format!("{package} is not a linux-image package"))?
        .to_owned();
    let dir = kernels_dir.join(&release);
    let vmlinuz = dir.join("boot").join(format!("vmlinuz-{release}"));
    if vmlinuz.is_file() {
        eprintln!("vm-test: {release} already unpacked in {}", dir.display());
    } else {
        let part = kernels_dir.join(format!("{release}.part"));
        for d in [&part, &dir] {
            if d.exists() {
                fs::remove_dir_all(d).with_context(|| format!("removing {}", d.display()))?;
            }
        }
        run(Command::new("dpkg-deb").arg("-x").arg(&deb).arg(&part))?;
        fs::rename(&part, &dir).with_context(|| format!("renaming {}", part.display()))?;
        if !vmlinuz.is_file() {
            bail!("{} has no boot/vmlinuz-{release}", deb.display());
        }
    }
    let config_path = dir.join("boot").join(format!("config-{release}"));
    let config = kernel_config(&config_path)?;
    let modules_dir = ["lib/modules", "usr/lib/modules"]
        .iter()
        .map(|m| dir.join(m).join(&release))
        .find(|d| d.is_dir())
        .with_context(|| format!("no lib/modules/{release} in {}", dir.display()))?;
    let mut wanted = Vec::new();
    let mut missing_options = Vec::new();
    for &(option, module) in OPTIONS {
        let value = config.get(option).map(String::as_str);
        match (value, module) {
            (Some("y"), _) => {}
            (Some("m"), Some(module)) => wanted.push(module),
            (Some("m"), None) => bail!(
                "{option}=m in {}: add its module to OPTIONS",
                config_path.display()
            ),
            _ => missing_options.push(option),
        }
    }
    eprintln!(
        "vm-test: {release}: modules to load: {}",
        if wanted.is_empty() {
            "none".to_owned()
        } else {
            wanted.join(", ")
        }
    );
    if !missing_options.is_empty() {
        eprintln!(
            "vm-test: {release}: not set: {}",
            missing_options.join(", ")
        );
    }
    let modules = resolve_modules(&wanted, &modules_dir)?;
    Ok(Prepared {
        series: kernel.series,
        release,
        package,
        vmlinuz,
        modules,
        missing_options,
    })
}

/// `CONFIG_X` → value, for the options that are set.
fn kernel_config(path: &Path) -> Result<HashMap<String, String>> {
    let text = fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    Ok(text
        .lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| l.split_once('='))
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn series(kernels: &[&Kernel]) -> Vec<&'static str> {
        kernels.iter().map(|k| k.series).collect()
    }

    #[test]
    fn kernels_named_each_once_in_order() {
        assert_eq!(
            series(&select_kernels(None).unwrap()),
            ["5.10", "6.1", "6.12"]
        );
        let names = ["6.12", " 6.1 ", "6.12", "", "5.10"].map(String::from);
        assert_eq!(
            series(&select_kernels(Some(&names)).unwrap()),
            ["6.12", "6.1", "5.10"]
        );
        // Oldest first: the summary's first row is the oldest kernel.
        let all: Vec<_> = KERNELS
            .iter()
            .map(|k| super::super::checks::series_of(k.series).unwrap())
            .collect();
        assert!(all.is_sorted(), "{all:?}");
        let err = select_kernels(Some(&["5.4".into()]))
            .map(|_| ())
            .unwrap_err();
        assert!(err.to_string().contains("no kernel 5.4"), "{err}");
    }
}
