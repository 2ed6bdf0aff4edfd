//! The machine a benchmark ran on, for its report.

use serde::Serialize;

/// Kernel, architecture, CPU model and count.
#[derive(Clone, Debug, Serialize)]
pub struct Machine {
    pub kernel: String,
    pub arch: String,
    pub cpu: String,
    pub nproc: usize,
}

impl std::fmt::Display for Machine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "Linux {} {}, {}, {} CPU(s)",
            self.kernel, self.arch, self.cpu, self.nproc
        )
    }
}

/// This machine.
pub fn machine() -> Machine {
    // SAFETY: a zeroed utsname is a valid out-parameter.
    let mut u: libc::utsname = unsafe { std::mem::zeroed() };
    let field = |f: &[libc::c_char]| -> String {
        let bytes: Vec<u8> = f
            .iter()
            .take_while(|&&c| c != 0)
            .map(|&c| c as u8)
            .collect();
        String::from_utf8_lossy(&bytes).into_owned()
    };
    // SAFETY: uname fills the struct it is given.
    let (kernel, arch) = if unsafe { libc::uname(&mut u) } == 0 {
        (field(&u.release), field(&u.machine))
    } else {
        ("unknown".into(), "unknown".into())
    };
    let cpu = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|info| {
            info.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split_once(':'))
                .map(|(_, v)| v.trim().to_string())
        })
        .unwrap_or_else(|| "unknown".into());
    let nproc = std::thread::available_parallelism().map_or(1, |n| n.get());
    Machine {
        kernel,
        arch,
        cpu,
        nproc,
    }
}
