//! Booting a kernel under qemu: KVM where the host can, TCG otherwise; the serial console
//! to the log and the terminal, each check's result from its markers.

use std::{
    fs::{self, File, OpenOptions},
    io::{self, BufRead as _, BufReader, Write as _},
    os::fd::AsRawFd as _,
    path::Path,
    process::{Command, Stdio},
    sync::mpsc,
    thread,
    time::{Duration, Instant},
};

use anyhow::{Context as _, Result};

use super::{
    checks::{Row, selected},
    console::{Echo, parse_check, printable},
    initramfs::{Entry, write_initramfs},
    kernels::Prepared,
};
use crate::cmd::{root, show, wait_until};

/// Memory and CPUs of each VM.
pub const VM_MEMORY_MB: u32 = 2048;
pub const VM_CPUS: u32 = 2;
/// The kernel command line: serial console, leave qemu on a panic (with -no-reboot).
const VM_APPEND: &str = "console=ttyS0 panic=-1 quiet";

#[derive(Clone, Copy, PartialEq)]
pub enum Accel {
    Kvm,
    Tcg,
}

impl Accel {
    /// KVM if /dev/kvm opens read-write, answers KVM_GET_API_VERSION with 12, and the CPU
    /// has hardware virtualization (VMX or SVM). Without it, a /dev/kvm can still exist
    /// (e.g. kvm_pvm, which runs only kernels built as PVM guests), but a stock kernel
    /// cannot boot on it.
    pub fn detect() -> Self {
        const KVM_GET_API_VERSION: libc::c_ulong = 0xAE00;
        let api = OpenOptions::new()
            .read(true)
            .write(true)
            .open("/dev/kvm")
            // SAFETY: an ioctl without arguments on a file descriptor we own.
            .is_ok_and(|f| unsafe { libc::ioctl(f.as_raw_fd(), KVM_GET_API_VERSION, 0) } == 12);
        let hardware = fs::read_to_string("/proc/cpuinfo").is_ok_and(|c| {
            c.lines()
                .filter(|l| l.starts_with("flags"))
                .any(|l| l.split_whitespace().any(|f| f == "vmx" || f == "svm"))
        });
        let why = match (api, hardware) {
            (true, true) => {
                eprintln!("vm-test: /dev/kvm is usable: VMs run with -enable-kvm -cpu host");
                return Self::Kvm;
            }
            (false, _) => "/dev/kvm is missing or does not answer KVM_GET_API_VERSION",
            (true, false) => {
                "/dev/kvm exists but the CPU has no VMX/SVM (a paravirtual KVM such as kvm_pvm \
                 cannot boot stock kernels)"
            }
        };
        eprintln!("vm-test: {why}: VMs run with -accel tcg, emulated (much slower)");
        Self::Tcg
    }

    fn args(self) -> &'static [&'static str] {
        match self {
            Self::Kvm => &["-enable-kvm", "-cpu", "host"],
            Self::Tcg => &["-accel", "tcg", "-cpu", "max"],
        }
    }

    /// Seconds a VM may take by default.
    pub fn default_timeout(self) -> u64 {
        match self {
            Self::Kvm => 900,
            Self::Tcg => 3600,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Self::Kvm => "KVM",
            Self::Tcg => "TCG",
        }
    }
}

/// Boot `kernel` with its initramfs under qemu, echo and log its console, and read each
/// check's result from the markers.
pub fn boot_and_check(
    kernel: &Prepared,
    common: &[Entry],
    images: &Path,
    vm_dir: &Path,
    accel: Accel,
    timeout: Duration,
    keep: bool,
) -> Result<Row> {
    let start = Instant::now();
    let image = images.join(format!("{}.cpio", kernel.release));
    write_initramfs(&image, common, kernel)?;
    let size = fs::metadata(&image)?.len();
    eprintln!(
        "vm-test: {} ({:.0} MiB, {} modules)",
        image.display(),
        size as f64 / (1 << 20) as f64,
        kernel.modules.len()
    );
    let log_path = vm_dir.join(format!("{}.log", kernel.release));
    let mut log =
        File::create(&log_path).with_context(|| format!("creating {}", log_path.display()))?;

    let mut qemu = Command::new("qemu-system-x86_64");
    qemu.args(accel.args())
        .args([
            "-m",
            &VM_MEMORY_MB.to_string(),
            "-smp",
            &VM_CPUS.to_string(),
        ])
        .args(["-nographic", "-no-reboot", "-kernel"])
        .arg(&kernel.vmlinuz)
        .arg("-initrd")
        .arg(&image)
        .args(["-append", VM_APPEND])
        .current_dir(root())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    eprintln!("==> {}", show(&qemu));
    let mut child = qemu
        .spawn()
        .with_context(|| format!("starting `{}`", show(&qemu)))?;

    // Serial console and qemu's own messages, line by line, to the log and the terminal.
    let (tx, rx) = mpsc::channel::<String>();
    let readers: Vec<thread::JoinHandle<()>> = [
        child
            .stdout
            .take()
            .map(|s| Box::new(s) as Box<dyn io::Read + Send>),
        child
            .stderr
            .take()
            .map(|s| Box::new(s) as Box<dyn io::Read + Send>),
    ]
    .into_iter()
    .flatten()
    .map(|stream| {
        let tx = tx.clone();
        thread::spawn(move || {
            let mut reader = BufReader::new(stream);
            let mut buf = Vec::new();
            while reader.read_until(b'\n', &mut buf).is_ok_and(|n| n > 0) {
                if tx.send(printable(&String::from_utf8_lossy(&buf))).is_err() {
                    break;
                }
                buf.clear();
            }
        })
    })
    .collect();
    drop(tx);

    let tag = format!("[{}]", kernel.series);
    let deadline = start + timeout;
    let mut lines = Vec::new();
    let mut timed_out = false;
    let mut echo = Echo::default();
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match rx.recv_timeout(left) {
            Ok(line) => {
                writeln!(log, "{line}")?;
                echo.line(&tag, &line);
                lines.push(line);
            }
            Err(mpsc::RecvTimeoutError::Disconnected) => break,
            Err(mpsc::RecvTimeoutError::Timeout) => {
                timed_out = true;
                break;
            }
        }
    }
    let status = wait_until(
        &mut child,
        if timed_out { Instant::now() } else { deadline },
    )?;
    for r in readers {
        let _ = r.join();
    }
    // Whatever was still buffered.
    for line in rx.try_iter() {
        writeln!(log, "{line}")?;
        lines.push(line);
    }
    log.flush()?;
    if !keep {
        let _ = fs::remove_file(&image);
    }

    let mut notes: Vec<String> = kernel
        .missing_options
        .iter()
        .map(|o| format!("{o} is not set"))
        .collect();
    for line in &lines {
        if let Some(m) = line.split("@@VM-MODULE-FAILED ").nth(1) {
            notes.push(format!("insmod {m} failed"));
        }
    }
    let done = lines.iter().any(|l| l.contains("@@VM-DONE"));
    let ended = if timed_out {
        format!("timed out after {} s (qemu killed)", timeout.as_secs())
    } else if done {
        String::new()
    } else {
        format!(
            "the VM stopped before running every check (qemu {}; see the log for a panic)",
            status.map_or_else(|| "killed".to_owned(), |s| s.to_string())
        )
    };
    if !ended.is_empty() {
        notes.push(ended.clone());
    }
    let results = selected().map(|c| parse_check(c, &lines, &ended)).collect();
    Ok(Row {
        kernel: kernel.release.clone(),
        how: format!("VM, {}, {}", accel.name(), kernel.package),
        emulated: accel == Accel::Tcg,
        log: Some(log_path),
        notes,
        results,
        secs: start.elapsed().as_secs_f64(),
    })
}
