//! The initramfs each VM boots: busybox and `/init`, `ip` and `nsenter`, the executables at
//! their host paths with every shared library they load, the command list, and the
//! kernel's modules.

use std::{
    collections::BTreeSet,
    fs::{self, File},
    io::{BufWriter, Write},
    os::unix::fs::PermissionsExt as _,
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{Context as _, Result, bail};

use super::{artifacts::Built, checks::selected, cpio::Cpio, kernels::Prepared};
use crate::cmd::capture;

/// Where the programs the tests call go inside the VM (first on its PATH).
const VM_IP: &str = "/usr/sbin/ip";
const VM_NSENTER: &str = "/usr/bin/nsenter";
const VM_PATH: &str = "/usr/sbin:/usr/bin:/sbin:/bin";

/// What an [`Entry`] holds.
enum Body {
    Dir,
    /// Contents read from this host file (following symlinks), with its permissions.
    Host(PathBuf),
    Data {
        bytes: Vec<u8>,
        mode: u32,
    },
    Symlink(String),
    CharDev {
        major: u32,
        minor: u32,
    },
}

/// A path inside the image (absolute) and what is there.
pub struct Entry {
    path: String,
    body: Body,
}

impl Entry {
    fn write_to<W: Write>(&self, cpio: &mut Cpio<W>) -> Result<()> {
        let path = &self.path;
        match &self.body {
            Body::Dir => cpio.dir(path)?,
            Body::Host(host) => {
                let bytes =
                    fs::read(host).with_context(|| format!("reading {}", host.display()))?;
                let perm = fs::metadata(host)?.permissions().mode() & 0o7777;
                cpio.file(path, perm, &bytes)?;
            }
            Body::Data { bytes, mode } => cpio.file(path, *mode, bytes)?,
            Body::Symlink(target) => cpio.symlink(path, target)?,
            Body::CharDev { major, minor } => cpio.char_dev(path, *major, *minor)?,
        }
        Ok(())
    }
}

fn data(path: &str, mode: u32, bytes: impl Into<Vec<u8>>) -> Entry {
    Entry {
        path: path.to_owned(),
        body: Body::Data {
            bytes: bytes.into(),
            mode,
        },
    }
}

/// `/init`: mounts, modules, loopback, then each line of /etc/vm/commands
/// (`<name> <command…>`) between markers, then power off.
const INIT: &str = r#"#!/bin/busybox sh
/bin/busybox --install -s /bin
export PATH=@PATH@ HOME=/root RUST_BACKTRACE=1
mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev
mkdir -p /dev/pts /dev/shm
mount -t devpts devpts /dev/pts
mount -t tmpfs tmpfs /run
mount -t tmpfs tmpfs /tmp
mount -t bpf bpf /sys/fs/bpf
mount -t cgroup2 cgroup2 /sys/fs/cgroup
mount -t tracefs tracefs /sys/kernel/tracing
mount -t debugfs debugfs /sys/kernel/debug
mkdir -p /run/netns
echo "@@VM-KERNEL $(uname -r) cpus=$(nproc)"
while read -r m; do
    [ -n "$m" ] || continue
    insmod "/lib/modules/vm/$m.ko" || echo "@@VM-MODULE-FAILED $m"
done < /etc/vm/modules
ip link set lo up
while IFS= read -r line; do
    [ -n "$line" ] || continue
    name=${line%% *}
    command=${line#* }
    start=$(cut -d' ' -f1 /proc/uptime)
    echo "@@VM-BEGIN $name"
    sh -c "$command" < /dev/null 2>&1
    rc=$?
    end=$(cut -d' ' -f1 /proc/uptime)
    echo "@@VM-END $name rc=$rc start=$start end=$end"
done < /etc/vm/commands
echo "@@VM-DONE"
sync
poweroff -f
"#;

/// Shared libraries `exe` loads (the dynamic loader included), from ldd; none if static.
fn shared_libraries(exe: &Path) -> Result<Vec<PathBuf>> {
    let out = capture(Command::new("ldd").arg(exe))?;
    let text = String::from_utf8_lossy(&out.stdout);
    if !out.status.success() {
        // "not a dynamic executable"
        return Ok(Vec::new());
    }
    let mut libs = Vec::new();
    for line in text.lines() {
        let line = line.trim();
        if line.contains("not found") {
            bail!("ldd {}: {line}", exe.display());
        }
        let path = match line.split_once("=>") {
            Some((_, right)) => right.split_whitespace().next(),
            None => line.split_whitespace().next(),
        };
        if let Some(p) = path.filter(|p| p.starts_with('/')) {
            libs.push(PathBuf::from(p));
        }
    }
    Ok(libs)
}

/// Everything but the kernel's modules: busybox, /init, ip, nsenter, the executables, their
/// libraries, the command list.
pub fn common_entries(built: &Built) -> Result<Vec<Entry>> {
    let host = |name: &str| -> Result<PathBuf> {
        let p = which::which(name).with_context(|| format!("{name} not found on PATH"))?;
        fs::canonicalize(&p).with_context(|| format!("resolving {}", p.display()))
    };
    let busybox = host("busybox")?;
    let mut executables: Vec<(String, PathBuf)> = vec![
        ("/bin/busybox".into(), busybox),
        (VM_IP.into(), host("ip")?),
        (VM_NSENTER.into(), host("nsenter")?),
    ];
    // The executables at their host paths: tests find `shedder` beside their own directory.
    for path in std::iter::once(&built.shedder).chain(built.tests.values()) {
        let abs =
            fs::canonicalize(path).with_context(|| format!("resolving {}", path.display()))?;
        executables.push((abs.to_string_lossy().into_owned(), abs));
    }
    let mut entries = vec![
        Entry {
            path: "/dev/console".into(),
            body: Body::CharDev { major: 5, minor: 1 },
        },
        Entry {
            path: "/dev/null".into(),
            body: Body::CharDev { major: 1, minor: 3 },
        },
    ];
    for d in [
        "/proc",
        "/sys",
        "/run",
        "/tmp",
        "/root",
        "/dev",
        "/var",
        "/etc",
        "/lib/modules/vm",
    ] {
        entries.push(Entry {
            path: d.into(),
            body: Body::Dir,
        });
    }
    entries.push(Entry {
        path: "/var/run".into(),
        body: Body::Symlink("../run".into()),
    });
    entries.push(data("/init", 0o755, INIT.replace("@PATH@", VM_PATH)));
    entries.push(data(
        "/etc/passwd",
        0o644,
        "root:x:0:0:root:/root:/bin/sh\n",
    ));
    entries.push(data("/etc/group", 0o644, "root:x:0:\n"));
    let mut libraries = BTreeSet::new();
    for (_, exe) in &executables {
        libraries.extend(shared_libraries(exe)?);
    }
    for (path, exe) in executables {
        entries.push(Entry {
            path,
            body: Body::Host(exe),
        });
    }
    for lib in libraries {
        entries.push(Entry {
            path: lib.to_string_lossy().into_owned(),
            body: Body::Host(lib),
        });
    }
    let mut commands = String::new();
    for check in selected() {
        let exe = fs::canonicalize(&built.tests[check.test])?;
        commands.push_str(&format!(
            "{} {} {}\n",
            check.name,
            exe.display(),
            check.args.join(" ")
        ));
    }
    entries.push(data("/etc/vm/commands", 0o644, commands));
    Ok(entries)
}

/// The image for `kernel`: `common`, then its modules and their load order.
pub fn write_initramfs(path: &Path, common: &[Entry], kernel: &Prepared) -> Result<()> {
    let file = File::create(path).with_context(|| format!("creating {}", path.display()))?;
    let mut cpio = Cpio::new(BufWriter::new(file));
    for entry in common {
        entry
            .write_to(&mut cpio)
            .with_context(|| format!("adding {} to {}", entry.path, path.display()))?;
    }
    let mut order = String::new();
    for (name, bytes) in &kernel.modules {
        cpio.file(&format!("/lib/modules/vm/{name}.ko"), 0o644, bytes)?;
        order.push_str(name);
        order.push('\n');
    }
    cpio.file("/etc/vm/modules", 0o644, order.as_bytes())?;
    cpio.finish()
        .with_context(|| format!("writing {}", path.display()))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entries_become_the_records_they_name() {
        let host = std::env::temp_dir().join(format!("shedder-initramfs-{}", std::process::id()));
        fs::write(&host, b"#!/bin/sh\n").unwrap();
        fs::set_permissions(&host, fs::Permissions::from_mode(0o750)).unwrap();
        let entries = [
            Entry {
                path: "/lib/modules/vm".into(),
                body: Body::Dir,
            },
            Entry {
                path: "/usr/bin/tool".into(),
                body: Body::Host(host.clone()),
            },
            data("/etc/group", 0o644, "root:x:0:\n"),
            Entry {
                path: "/var/run".into(),
                body: Body::Symlink("../run".into()),
            },
            Entry {
                path: "/dev/null".into(),
                body: Body::CharDev { major: 1, minor: 3 },
            },
        ];
        let mut from_entries = Cpio::new(Vec::new());
        for e in &entries {
            e.write_to(&mut from_entries).unwrap();
        }
        let _ = fs::remove_file(&host);
        let mut direct = Cpio::new(Vec::new());
        direct.dir("/lib/modules/vm").unwrap();
        // A host file keeps its permissions.
        direct.file("/usr/bin/tool", 0o750, b"#!/bin/sh\n").unwrap();
        direct.file("/etc/group", 0o644, b"root:x:0:\n").unwrap();
        direct.symlink("/var/run", "../run").unwrap();
        direct.char_dev("/dev/null", 1, 3).unwrap();
        assert!(from_entries.finish().unwrap() == direct.finish().unwrap());
    }

    #[test]
    fn init_runs_each_command_between_markers() {
        let init = INIT.replace("@PATH@", VM_PATH);
        assert!(init.starts_with("#!/bin/busybox sh\n"));
        assert!(init.contains(&format!("export PATH={VM_PATH} ")));
        // The markers `console::parse_check` reads.
        for marker in [
            "echo \"@@VM-BEGIN $name\"",
            "echo \"@@VM-END $name rc=$rc start=$start end=$end\"",
            "echo \"@@VM-DONE\"",
            "@@VM-MODULE-FAILED $m",
        ] {
            assert!(init.contains(marker), "{marker}");
        }
    }
}
