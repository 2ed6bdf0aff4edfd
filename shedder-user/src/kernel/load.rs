//! Loading the eBPF object (fresh, or adopting the maps an earlier run pinned).

use std::{
    path::{Path, PathBuf},
    time::Duration,
};

use aya::{
    Ebpf, EbpfLoader,
    programs::{ProgramError, Xdp, links::FdLink},
};
use shedder_common::{classmap, maps, programs};

use super::{Error, OBJECT, Result, error::verifier_reason};

/// The loaded programs and their maps.
pub struct Shedder {
    pub(super) ebpf: Ebpf,
    pub(super) pin_dir: Option<PathBuf>,
    /// Unpinned attachments, detached when dropped.
    pub(super) links: Vec<FdLink>,
    /// Egress filters attached through netlink (no tcx) without a pin directory, detached
    /// when dropped.
    pub(super) netlink_links: Vec<aya::programs::tc::SchedClassifierLink>,
    /// What the first level of the IPv4 direct class table holds (we are its only writer):
    /// known to be empty for fresh maps, read once from adopted pinned maps.
    pub(super) class_l1: Option<Vec<u32>>,
    /// Why the QUIC packet programs are not loaded (`None`: they are, and the TCP programs
    /// tail-call them).
    pub(super) quic_unavailable: Option<String>,
    /// Interfaces whose egress program did not attach, and why.
    pub(super) egress_problems: Vec<String>,
}

/// Before Linux 5.11 BPF maps and programs are charged to RLIMIT_MEMLOCK, whose default
/// (64 KiB outside systemd units that raise it) holds not even the attempt tables: lift it
/// for this process, once, as tools that load BPF do. Where that is refused (no
/// CAP_SYS_RESOURCE) loading then fails with EPERM, which `doctor`'s `memlock` check
/// explains.
fn raise_memlock() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        let charged =
            super::version::running_kernel().is_some_and(|v| v < super::version::MEMCG_BPF_KERNEL);
        if !charged {
            return;
        }
        let unlimited = libc::rlimit {
            rlim_cur: libc::RLIM_INFINITY,
            rlim_max: libc::RLIM_INFINITY,
        };
        // SAFETY: a valid rlimit for the calling process.
        if unsafe { libc::setrlimit(libc::RLIMIT_MEMLOCK, &unlimited) } != 0 {
            tracing::warn!(
                error = %std::io::Error::last_os_error(),
                "this kernel charges BPF maps to RLIMIT_MEMLOCK and it could not be raised: \
                 loading may fail (see `shedder doctor`)"
            );
        }
    });
}

/// The programs every load verifies (besides the QUIC halves): the packet programs with
/// their tracking halves, the egress program, and the three the daemon runs with
/// BPF_PROG_TEST_RUN.
const LOADED: [&str; 8] = [
    programs::XDP,
    programs::TC,
    programs::XDP_TRACK,
    programs::TC_TRACK,
    programs::EGRESS,
    programs::CLOCK,
    programs::SWEEP,
    programs::SEED,
];

/// The QUIC halves of the packet programs and of the egress program, loaded apart (see
/// `quic_unavailable`).
const QUIC: [&str; 3] = [programs::XDP_QUIC, programs::TC_QUIC, programs::EGRESS_QUIC];
/// The egress program's QUIC slot and half.
const QUIC_EGRESS: (&str, &str) = (maps::QUIC_EGRESS, programs::EGRESS_QUIC);

/// One packet hook, for a load of its program alone ([`Shedder::load_hook`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Hook {
    Xdp,
    Tc,
}

impl Hook {
    /// The hook's packet program and its QUIC half, with the tail-call slot that joins them.
    fn programs(self) -> (&'static str, &'static str, &'static str) {
        match self {
            Hook::Xdp => (programs::XDP, programs::XDP_QUIC, maps::QUIC_XDP),
            Hook::Tc => (programs::TC, programs::TC_QUIC, maps::QUIC_TC),
        }
    }

    /// The hook's tracking half and the tail-call slot that joins it.
    fn tracking(self) -> (&'static str, &'static str) {
        match self {
            Hook::Xdp => (programs::XDP_TRACK, maps::TRACK_XDP),
            Hook::Tc => (programs::TC_TRACK, maps::TRACK_TC),
        }
    }
}

/// Both hooks' tracking slots and programs.
const TRACKING: [(&str, &str); 2] = [
    (maps::TRACK_XDP, programs::XDP_TRACK),
    (maps::TRACK_TC, programs::TC_TRACK),
];

impl Shedder {
    /// Load and verify both programs with private (unpinned) maps.
    pub fn load() -> Result<Self> {
        Self::load_with(None, false)
    }

    /// Load and verify one hook's packet program (with the clock, its tracking half, the
    /// egress program, the sweep and the seed, and its QUIC half if `quic`) and nothing else, with
    /// private maps: all that BPF_PROG_TEST_RUN of that path needs, for under half the
    /// verification of [`Shedder::load`]. Nothing can be attached.
    /// Without the QUIC half its tail-call slot stays empty, so a datagram for a QUIC port
    /// passes undecided ([`Shedder::quic_unavailable`] says so): only for frames that are
    /// not UDP.
    pub fn load_hook(hook: Hook, quic: bool) -> Result<Self> {
        let mut ebpf = Self::loader(None, false)?.load(OBJECT)?;
        let (packet, quic_program, slot) = hook.programs();
        let (track, track_slot) = hook.tracking();
        for name in [
            packet,
            track,
            programs::EGRESS,
            programs::CLOCK,
            programs::SWEEP,
            programs::SEED,
        ] {
            load_program(&mut ebpf, name)?;
        }
        link_tail_calls(&mut ebpf, &[(track_slot, track)])?;
        let quic_unavailable = if quic {
            load_program(&mut ebpf, quic_program)?;
            load_program(&mut ebpf, programs::EGRESS_QUIC)?;
            link_tail_calls(&mut ebpf, &[(slot, quic_program), QUIC_EGRESS])?;
            None
        } else {
            Some("not loaded (a packet-path test load without it)".into())
        };
        Ok(Self::loaded(ebpf, None, quic_unavailable))
    }

    /// [`Shedder::load`] with the packet path's kernel debug log compiled in (for measuring
    /// what `daemon.kernel_debug_log` costs the verifier).
    pub fn load_with_kernel_log() -> Result<Self> {
        Self::load_with(None, true)
    }

    /// Load and verify both programs with maps pinned under `dir/maps/`; maps already pinned
    /// there are reused (a restarted daemon adopts the running state). With `kernel_log`,
    /// the packet path writes rate-limited debug lines (see [`Shedder::kernel_logger`]);
    /// without it, every log site is pruned by the verifier.
    /// Use it only where [`crate::kernel::layout`] found the maps there to be this
    /// version's, or nothing pinned.
    pub fn load_pinned(dir: &Path, kernel_log: bool) -> Result<Self> {
        Self::load_pinned_into(dir, super::layout::MAPS, kernel_log)
    }

    /// [`Shedder::load_pinned`] with the maps pinned under `dir/maps_sub/` (a replacement's
    /// `maps-next`), which is marked with this version's layout.
    pub fn load_pinned_into(dir: &Path, maps_sub: &str, kernel_log: bool) -> Result<Self> {
        let maps_dir = dir.join(maps_sub);
        let shedder = Self::load_with(Some((dir, &maps_dir)), kernel_log)?;
        super::layout::mark(&maps_dir)?;
        Ok(shedder)
    }

    /// Load with private maps, or with the maps pinned under `pins.1` (`pins.0` the pin
    /// directory).
    pub(super) fn load_with(pins: Option<(&Path, &Path)>, kernel_log: bool) -> Result<Self> {
        let pin_dir = pins.map(|p| p.0);
        let mut ebpf = Self::loader(pins.map(|p| p.1), kernel_log)?.load(OBJECT)?;
        for name in LOADED {
            load_program(&mut ebpf, name)?;
        }
        link_tail_calls(&mut ebpf, &TRACKING)?;
        // Optional too: a kernel whose verifier refuses the QUIC programs still has every
        // TCP path; QUIC datagrams then pass, and the reason is logged at once.
        let quic_unavailable = load_quic(&mut ebpf).err().map(|e| e.to_string());
        if let Some(why) = &quic_unavailable {
            tracing::warn!(reason = %why, "QUIC Initials will not be shed: the QUIC packet programs did not load");
        }
        Ok(Self::loaded(ebpf, pin_dir, quic_unavailable))
    }

    /// A loaded object, nothing attached yet.
    fn loaded(ebpf: Ebpf, pin_dir: Option<&Path>, quic_unavailable: Option<String>) -> Self {
        Self {
            ebpf,
            pin_dir: pin_dir.map(Path::to_path_buf),
            links: Vec::new(),
            netlink_links: Vec::new(),
            quic_unavailable,
            egress_problems: Vec::new(),
            class_l1: pin_dir.is_none().then(|| {
                vec![classmap::CLASS_CELL_NONE; shedder_common::CLASS_L1_ENTRIES as usize]
            }),
        }
    }

    /// The loader: the kernel log level set, the maps pinned under `map_dir` if given.
    fn loader(map_dir: Option<&Path>, kernel_log: bool) -> Result<EbpfLoader<'static>> {
        raise_memlock();
        let mut loader = EbpfLoader::new();
        // aya-log's level: 0 is off, Debug (4) lets the shed path's debug lines through.
        static OFF: u8 = 0;
        static DEBUG: u8 = aya_log::Level::Debug as u8;
        loader.override_global(aya_log::LEVEL, if kernel_log { &DEBUG } else { &OFF }, true);
        if let Some(map_dir) = map_dir {
            std::fs::create_dir_all(map_dir).map_err(|e| Error::Pin {
                path: map_dir.to_path_buf(),
                reason: e.to_string(),
            })?;
            for name in maps::ALL {
                loader.map_pin_path(name, map_dir.join(name));
            }
        }
        Ok(loader)
    }

    pub fn xdp(&mut self) -> Result<&mut Xdp> {
        self.xdp_program(programs::XDP)
    }

    pub(super) fn xdp_program(&mut self, name: &'static str) -> Result<&mut Xdp> {
        self.program(name)
    }

    /// The program `name`, as its type.
    pub(super) fn program<'a, T>(&'a mut self, name: &'static str) -> Result<&'a mut T>
    where
        &'a mut T: TryFrom<&'a mut aya::programs::Program, Error = ProgramError>,
    {
        self.ebpf
            .program_mut(name)
            .ok_or(Error::MissingProgram(name))?
            .try_into()
            .map_err(|source| Error::Program {
                program: name,
                source,
            })
    }

    /// Why the QUIC packet programs did not load on this kernel (`None`: they did).
    pub fn quic_unavailable(&self) -> Option<&str> {
        self.quic_unavailable.as_deref()
    }

    /// Instructions the verifier processed for each program (kernel 5.16+; `None` before):
    /// the verification complexity, tracked so a change that blows it up is noticed.
    pub fn verified_insns(&self) -> Vec<(&'static str, Option<u32>)> {
        LOADED
            .into_iter()
            .chain(QUIC.into_iter().filter(|_| self.quic_unavailable.is_none()))
            .map(|name| {
                let count = self.ebpf.program(name).and_then(|p| match p {
                    aya::programs::Program::Xdp(p) => p.info().ok(),
                    aya::programs::Program::SchedClassifier(p) => p.info().ok(),
                    _ => None,
                });
                (name, count.and_then(|i| i.verified_instruction_count()))
            })
            .collect()
    }

    /// Cumulative run time and run count of each attached program, from the kernel's BPF
    /// statistics (only counted while statistics are enabled: `aya::sys::enable_stats`).
    pub fn run_stats(&self) -> Vec<(&'static str, Duration, u64)> {
        [
            programs::XDP,
            programs::TC,
            programs::XDP_TRACK,
            programs::TC_TRACK,
            programs::EGRESS,
        ]
        .into_iter()
        .filter_map(|name| {
            let info = match self.ebpf.program(name)? {
                aya::programs::Program::Xdp(p) => p.info().ok()?,
                aya::programs::Program::SchedClassifier(p) => p.info().ok()?,
                _ => return None,
            };
            Some((name, info.run_time(), info.run_count()))
        })
        .collect()
    }
}

impl Shedder {
    pub(super) fn map_mut(&mut self, name: &'static str) -> Result<&mut aya::maps::Map> {
        self.ebpf.map_mut(name).ok_or(Error::MissingMap(name))
    }

    pub(super) fn map(&self, name: &'static str) -> Result<&aya::maps::Map> {
        self.ebpf.map(name).ok_or(Error::MissingMap(name))
    }
}

/// Load (verify) one of the object's programs, with the verifier's reason on refusal.
fn load_program(ebpf: &mut Ebpf, name: &'static str) -> Result<()> {
    let program = ebpf.program_mut(name).ok_or(Error::MissingProgram(name))?;
    let result = match program {
        aya::programs::Program::Xdp(p) => p.load(),
        aya::programs::Program::SchedClassifier(p) => p.load(),
        _ => return Err(Error::MissingProgram(name)),
    };
    result.map_err(|e| match e {
        ProgramError::LoadError {
            io_error,
            verifier_log,
        } => {
            let log = verifier_log.to_string();
            let reason = if io_error.raw_os_error() == Some(libc::E2BIG) {
                "too complex for this kernel's verifier (it gave up at its limit of \
                 processed instructions)"
                    .into()
            } else {
                verifier_reason(&log)
            };
            Error::Verifier {
                program: name,
                source: io_error,
                reason,
                log,
            }
        }
        other => Error::Program {
            program: name,
            source: other,
        },
    })
}

/// Load the QUIC programs and point the packet programs' tail-call slots at them.
fn load_quic(ebpf: &mut Ebpf) -> Result<()> {
    for name in QUIC {
        load_program(ebpf, name)?;
    }
    let [xdp, tc] = [Hook::Xdp, Hook::Tc].map(|h| {
        let (_, quic, slot) = h.programs();
        (slot, quic)
    });
    link_tail_calls(ebpf, &[xdp, tc, QUIC_EGRESS])
}

/// Point each tail-call slot at its program (a packet program's QUIC or tracking half).
/// With pinned maps the slot of a running program is replaced in place, as the pinned
/// links are.
fn link_tail_calls(ebpf: &mut Ebpf, slots: &[(&'static str, &'static str)]) -> Result<()> {
    for &(map, program) in slots {
        let fd = {
            let p = ebpf
                .program(program)
                .ok_or(Error::MissingProgram(program))?;
            let fd = match p {
                aya::programs::Program::Xdp(p) => p.fd(),
                aya::programs::Program::SchedClassifier(p) => p.fd(),
                _ => return Err(Error::MissingProgram(program)),
            };
            fd.map_err(|source| Error::Program { program, source })?
                .try_clone()
                .map_err(|e| Error::Io("duplicating a program descriptor", e))?
        };
        let mut slots: aya::maps::ProgramArray<&mut aya::maps::MapData> =
            aya::maps::ProgramArray::try_from(ebpf.map_mut(map).ok_or(Error::MissingMap(map))?)
                .map_err(|source| Error::Map { map, source })?;
        slots
            .set(0, &fd, 0)
            .map_err(|source| Error::Map { map, source })?;
    }
    Ok(())
}
