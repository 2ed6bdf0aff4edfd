//! Loading the eBPF object, attaching it, and reading and writing its maps.

use std::{
    net::IpAddr,
    path::{Path, PathBuf},
    time::Duration,
};

use aya::{
    Ebpf, EbpfLoader,
    maps::{Array, HashMap, LpmTrie, MapData, PerCpuArray, lpm_trie::Key},
    programs::{
        ProgramError, SchedClassifier, TcAttachType, TestRun, TestRunOptions, Xdp, XdpMode,
        links::{FdLink, LinkType, PinnedLink},
        tc,
    },
};
use shedder_common::{
    CLASS_L2_BLOCKS, CLOCK_STAMP_HEARTBEAT, COUNTERS_PER_SERVICE, ClassBlock, ClassRule, Globals,
    HIST_PER_SERVICE, Inflight, NUM_CLASSES, NUM_REASONS, NUM_STATS, NUM_VERDICTS,
    PORT_HAS_ADDR_SERVICES, PORT_SERVICE_MASK, SEED_BATCH, SeedResult, SeedSock, ServiceAddrKey,
    ServiceCounters, ServiceHist, ServicePolicy, classmap, decision_index, hist, maps, programs,
};

/// The eBPF object built by build.rs.
pub static OBJECT: &[u8] = aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/shedder"));

/// An XDP program that returns XDP_PASS and nothing else (program `baseline_xdp`): the
/// baseline `cargo xtask bench xdp` measures the shed path against. Never attached.
pub static BASELINE_OBJECT: &[u8] =
    aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/shedder-baseline"));

/// Default root of everything shedder pins.
pub const DEFAULT_PIN_DIR: &str = "/sys/fs/bpf/shedder";

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("loading the eBPF object: {0}")]
    Object(#[from] aya::EbpfError),
    #[error("the eBPF object has no program `{0}`")]
    MissingProgram(&'static str),
    #[error("the eBPF object has no map `{0}`")]
    MissingMap(&'static str),
    #[error(
        "the kernel verifier rejected `{program}`: {reason} ({source}); shedder is validated \
         on Linux {} and later (`shedder doctor` checks this kernel). \
         The verifier's log:\n{log}",
        crate::doctor::MIN_KERNEL
    )]
    Verifier {
        program: &'static str,
        source: std::io::Error,
        /// The log's last line that is not a statistic: usually why.
        reason: String,
        log: String,
    },
    #[error("program `{program}`: {source}")]
    Program {
        program: &'static str,
        #[source]
        source: ProgramError,
    },
    #[error("attaching to interface `{iface}` ({mode}): {source}")]
    Attach {
        iface: String,
        mode: &'static str,
        #[source]
        source: ProgramError,
    },
    #[error("map `{map}`: {source}")]
    Map {
        map: &'static str,
        #[source]
        source: aya::maps::MapError,
    },
    #[error("{0} is out of range: {1}")]
    Range(&'static str, String),
    #[error("pinning under {path}: {reason}")]
    Pin { path: PathBuf, reason: String },
    #[error("connection tracking: {0}")]
    Tracing(String),
    #[error("{0}: {1}")]
    Io(&'static str, #[source] std::io::Error),
}

/// The last line of a verifier log that says something other than its statistics.
fn verifier_reason(log: &str) -> String {
    const STATS: [&str; 4] = [
        "verification time",
        "stack depth",
        "processed ",
        "max_states",
    ];
    log.lines()
        .map(str::trim)
        .rev()
        .find(|l| !l.is_empty() && !STATS.iter().any(|s| l.starts_with(s)))
        .map_or_else(|| "no reason in the log".into(), str::to_string)
}

impl Error {
    /// The verifier gave up on a program as too complex for this kernel (it processed its
    /// limit of instructions, E2BIG): a newer kernel's verifier prunes more.
    pub fn too_complex(&self) -> bool {
        matches!(self, Error::Verifier { source, .. } if source.raw_os_error() == Some(libc::E2BIG))
    }
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

/// How to attach to an interface: the configuration's `daemon.attach`. [`Shedder::attach`]
/// does what it names (`Auto`: native XDP, else generic); which one delivers the configured
/// action is [`crate::netdev::choose`]'s decision.
pub use crate::config::Attach as AttachMode;

/// How a program ended up attached.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Attached {
    XdpNative,
    XdpGeneric,
    Tc,
}

impl Attached {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::XdpNative => "xdp-native",
            Self::XdpGeneric => "xdp-generic",
            Self::Tc => "tc",
        }
    }
}

/// The loaded programs and their maps.
pub struct Shedder {
    ebpf: Ebpf,
    pin_dir: Option<PathBuf>,
    /// Unpinned attachments, detached when dropped.
    links: Vec<FdLink>,
    /// What the first level of the IPv4 direct class table holds (we are its only writer):
    /// known to be empty for fresh maps, read once from adopted pinned maps.
    class_l1: Option<Vec<u32>>,
    /// Why the seeding iterator (counting connections open before attach) did not load.
    seed_unavailable: Option<String>,
}

/// Load the seeding iterator (`iter/tcp`, Linux 5.9+; the socket-cookie helper in tracing
/// programs, 5.12+), or say why it cannot be.
fn load_seed(ebpf: &mut Ebpf) -> std::result::Result<(), String> {
    let btf = aya::Btf::from_sys_fs().map_err(|e| format!("kernel BTF: {e}"))?;
    let prog: &mut aya::programs::Iter = ebpf
        .program_mut(programs::SEED)
        .ok_or_else(|| format!("the eBPF object has no program `{}`", programs::SEED))?
        .try_into()
        .map_err(|e: ProgramError| e.to_string())?;
    prog.load("tcp", &btf).map_err(|e| match e {
        ProgramError::LoadError {
            io_error,
            verifier_log,
        } => format!(
            "the verifier rejected `{}`: {} ({io_error})",
            programs::SEED,
            verifier_reason(&verifier_log.to_string())
        ),
        other => other.to_string(),
    })
}

impl Shedder {
    /// Load and verify both programs with private (unpinned) maps.
    pub fn load() -> Result<Self> {
        Self::load_with(None, false)
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
    pub fn load_pinned(dir: &Path, kernel_log: bool) -> Result<Self> {
        Self::load_with(Some(dir), kernel_log)
    }

    fn load_with(pin_dir: Option<&Path>, kernel_log: bool) -> Result<Self> {
        let mut loader = EbpfLoader::new();
        // aya-log's level: 0 is off, Debug (4) lets the shed path's debug lines through.
        let level: u8 = if kernel_log {
            aya_log::Level::Debug as u8
        } else {
            0
        };
        loader.override_global(aya_log::LEVEL, &level, true);
        let map_dir = pin_dir.map(|d| d.join("maps"));
        if let Some(map_dir) = &map_dir {
            std::fs::create_dir_all(map_dir).map_err(|e| Error::Pin {
                path: map_dir.clone(),
                reason: e.to_string(),
            })?;
            for name in maps::ALL {
                loader.map_pin_path(name, map_dir.join(name));
            }
        }
        let mut ebpf = loader.load(OBJECT)?;
        let tracking = programs::TRACEPOINTS.map(|(name, _, _)| name);
        for name in [programs::XDP, programs::TC, programs::CLOCK]
            .into_iter()
            .chain(tracking)
        {
            let program = ebpf.program_mut(name).ok_or(Error::MissingProgram(name))?;
            let result = match program {
                aya::programs::Program::Xdp(p) => p.load(),
                aya::programs::Program::SchedClassifier(p) => p.load(),
                aya::programs::Program::TracePoint(p) => p.load(),
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
            })?;
        }
        // Optional: without it shedder still tracks every connection born after attach,
        // and says that older ones are not counted.
        let seed_unavailable = load_seed(&mut ebpf).err();
        Ok(Self {
            ebpf,
            pin_dir: pin_dir.map(Path::to_path_buf),
            links: Vec::new(),
            seed_unavailable,
            class_l1: pin_dir.is_none().then(|| {
                vec![classmap::CLASS_CELL_NONE; shedder_common::CLASS_L1_ENTRIES as usize]
            }),
        })
    }

    pub fn xdp(&mut self) -> Result<&mut Xdp> {
        self.xdp_program(programs::XDP)
    }

    fn xdp_program(&mut self, name: &'static str) -> Result<&mut Xdp> {
        self.program(name)
    }

    /// The program `name`, as its type.
    fn program<'a, T>(&'a mut self, name: &'static str) -> Result<&'a mut T>
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

    /// Instructions the verifier processed for each program (kernel 5.16+; `None` before):
    /// the verification complexity, tracked so a change that blows it up is noticed.
    pub fn verified_insns(&self) -> Vec<(&'static str, Option<u32>)> {
        [programs::XDP, programs::TC, programs::CLOCK]
            .into_iter()
            .chain(programs::TRACEPOINTS.map(|(name, _, _)| name))
            .chain(self.seed_unavailable.is_none().then_some(programs::SEED))
            .map(|name| {
                let count = self.ebpf.program(name).and_then(|p| match p {
                    aya::programs::Program::Xdp(p) => p.info().ok(),
                    aya::programs::Program::SchedClassifier(p) => p.info().ok(),
                    aya::programs::Program::TracePoint(p) => p.info().ok(),
                    aya::programs::Program::Iter(p) => p.info().ok(),
                    _ => None,
                });
                (name, count.and_then(|i| i.verified_instruction_count()))
            })
            .collect()
    }

    /// Cumulative run time and run count of each attached program, from the kernel's BPF
    /// statistics (only counted while statistics are enabled: `aya::sys::enable_stats`).
    pub fn run_stats(&self) -> Vec<(&'static str, Duration, u64)> {
        [programs::XDP, programs::TC]
            .into_iter()
            .chain(programs::TRACEPOINTS.map(|(name, _, _)| name))
            .filter_map(|name| {
                let info = match self.ebpf.program(name)? {
                    aya::programs::Program::Xdp(p) => p.info().ok()?,
                    aya::programs::Program::SchedClassifier(p) => p.info().ok()?,
                    aya::programs::Program::TracePoint(p) => p.info().ok()?,
                    _ => return None,
                };
                Some((name, info.run_time(), info.run_count()))
            })
            .collect()
    }

    /// The kernel's jiffies, read by running the clock program; with `stamp_heartbeat` the
    /// program also records them as the daemon's heartbeat.
    pub fn clock(&mut self, stamp_heartbeat: bool) -> Result<u64> {
        let mut frame = [0u8; 64];
        if stamp_heartbeat {
            frame[0] = CLOCK_STAMP_HEARTBEAT;
        }
        let prog = self.xdp_program(programs::CLOCK)?;
        prog.test_run(TestRunOptions {
            data_in: Some(&frame),
            ..Default::default()
        })
        .map_err(|source| Error::Program {
            program: programs::CLOCK,
            source,
        })?;
        Ok(self.globals()?.clock_jiffies)
    }

    /// Stamp the heartbeat: the packet path's adaptive limits stay in force for the
    /// configured timeout from now.
    pub fn heartbeat(&mut self) -> Result<u64> {
        self.clock(true)
    }

    /// Measure the kernel's HZ over `window` (at least 50 ms), snapped to the usual
    /// CONFIG_HZ values when within 5% of one.
    pub fn calibrate_hz(&mut self, window: std::time::Duration) -> Result<u32> {
        let window = window.max(std::time::Duration::from_millis(50));
        let j0 = self.clock(false)?;
        let t0 = std::time::Instant::now();
        std::thread::sleep(window);
        let j1 = self.clock(false)?;
        let secs = t0.elapsed().as_secs_f64();
        let measured = (j1.saturating_sub(j0)) as f64 / secs;
        Ok(snap_hz(measured))
    }

    pub fn tc(&mut self) -> Result<&mut SchedClassifier> {
        self.program(programs::TC)
    }

    /// Attach to `iface` in the calling thread's network namespace. With a pin directory,
    /// the link is pinned at `dir/links/<iface>` so it outlives this process.
    pub fn attach(&mut self, iface: &str, mode: AttachMode) -> Result<Attached> {
        let attach_err = |mode| attach_error(iface, mode);
        let (attached, link): (Attached, FdLink) = match mode {
            AttachMode::Native | AttachMode::Generic | AttachMode::Auto => {
                let xdp = self.xdp()?;
                let (attached, id) = match mode {
                    AttachMode::Generic => (
                        Attached::XdpGeneric,
                        xdp.attach(iface, XdpMode::Skb)
                            .map_err(attach_err("xdp generic"))?,
                    ),
                    AttachMode::Native => (
                        Attached::XdpNative,
                        xdp.attach(iface, XdpMode::Driver)
                            .map_err(attach_err("xdp native"))?,
                    ),
                    _ => match xdp.attach(iface, XdpMode::Driver) {
                        Ok(id) => (Attached::XdpNative, id),
                        Err(_) => (
                            Attached::XdpGeneric,
                            xdp.attach(iface, XdpMode::Skb)
                                .map_err(attach_err("xdp generic after native failed"))?,
                        ),
                    },
                };
                let link = xdp.take_link(id).map_err(attach_err("xdp"))?;
                let link: FdLink =
                    link.try_into()
                        .map_err(|e: aya::programs::links::LinkError| Error::Pin {
                            path: PathBuf::from(iface),
                            reason: format!("XDP attached through netlink, not a bpf link: {e}"),
                        })?;
                (attached, link)
            }
            AttachMode::Tc => {
                // tcx needs no qdisc; the legacy path (kernel < 6.6) needs clsact.
                let _ = tc::qdisc_add_clsact(iface);
                let prog = self.tc()?;
                let id = prog
                    .attach(iface, TcAttachType::Ingress)
                    .map_err(attach_err("tc ingress"))?;
                let link = prog.take_link(id).map_err(attach_err("tc ingress"))?;
                let link: FdLink =
                    link.try_into()
                        .map_err(|e: aya::programs::links::LinkError| Error::Pin {
                            path: PathBuf::from(iface),
                            reason: format!(
                                "this kernel has no tcx (Linux {} and later): the TC \
                                 program could only be attached through netlink, which shedder \
                                 cannot pin, adopt or detach as a bpf link, so it was detached \
                                 again; use attach = \"native\" or \"generic\" (XDP) on this \
                                 kernel ({e})",
                                crate::doctor::TCX_KERNEL
                            ),
                        })?;
                (Attached::Tc, link)
            }
        };
        self.keep_link(iface, link)?;
        Ok(attached)
    }

    /// Attach the tracking programs to the `sock` tracepoints (in-flight connections,
    /// accept-queue age, response latency), after checking the running kernel's record
    /// layouts. With a pin directory the links are pinned as `links/tp-<tracepoint>`; links
    /// already pinned there are kept (a restarted daemon adopts them).
    ///
    /// Returns the optional tracepoints this kernel lacks (see
    /// [`missing_tracepoints_note`]), which are left unattached.
    pub fn attach_tracking(&mut self) -> Result<Vec<&'static str>> {
        crate::sysfs::ensure_tracefs().map_err(|e| Error::Tracing(e.to_string()))?;
        let missing = check_tracepoint_formats().map_err(Error::Tracing)?;
        for (program, category, name) in programs::TRACEPOINTS {
            if missing.contains(&name) {
                continue;
            }
            let pin_name = format!("tp-{name}");
            if let Some(dir) = &self.pin_dir
                && dir.join("links").join(&pin_name).exists()
            {
                continue;
            }
            let prog: &mut aya::programs::TracePoint = self.program(program)?;
            let id = prog
                .attach(category, name)
                .map_err(|source| Error::Program { program, source })?;
            let link = prog
                .take_link(id)
                .map_err(|source| Error::Program { program, source })?;
            let link: FdLink = link
                .try_into()
                .map_err(|e: aya::programs::links::LinkError| {
                    Error::Tracing(format!(
                        "{category}:{name} attached without a bpf link: {e}"
                    ))
                })?;
            self.keep_link(&pin_name, link)?;
        }
        Ok(missing)
    }

    /// The reader of the packet path's log records (written only when loaded with
    /// `kernel_log`); forward it with [`crate::klog::forward`].
    pub fn kernel_logger(&mut self) -> Result<aya_log::EbpfLogger<crate::klog::KernelLog>> {
        aya_log::EbpfLogger::init_with_logger(&mut self.ebpf, crate::klog::KernelLog)
            .map_err(|e| Error::Tracing(format!("kernel log: {e}")))
    }

    /// Take over the attachment pinned at `links/<iface>` by an earlier run: the link is
    /// pointed at this instance's program with BPF_LINK_UPDATE, atomically, so no packet
    /// goes unprotected, and the program that runs is the one this daemon loaded (its
    /// version, its log level, its run-time statistics).
    pub fn adopt(&mut self, iface: &str) -> Result<Attached> {
        let dir = self.pin_dir.clone().ok_or_else(|| Error::Pin {
            path: PathBuf::from(iface),
            reason: "adopting needs a pin directory".into(),
        })?;
        let path = dir.join("links").join(iface);
        let pin_err = |reason: String| Error::Pin {
            path: path.clone(),
            reason,
        };
        let link: FdLink = PinnedLink::from_pin(&path)
            .map_err(|e| pin_err(e.to_string()))?
            .into();
        let kind = link
            .info()
            .and_then(|i| i.link_type())
            .map_err(|e| pin_err(e.to_string()))?;
        let attach_err = |mode| attach_error(iface, mode);
        let wrong = |e: aya::programs::links::LinkError| pin_err(e.to_string());
        match kind {
            LinkType::Xdp => {
                let xdp = self.xdp()?;
                let id = xdp
                    .attach_to_link(link.try_into().map_err(wrong)?)
                    .map_err(attach_err("xdp link update"))?;
                // The pin holds the attachment; our handle can go.
                drop(xdp.take_link(id));
                let native = crate::netdev::ifindex(iface)
                    .and_then(|i| crate::netdev::netlink::xdp_attachment(i).ok().flatten())
                    .is_some_and(|a| a.mode == crate::netdev::netlink::XDP_ATTACHED_DRV);
                Ok(if native {
                    Attached::XdpNative
                } else {
                    Attached::XdpGeneric
                })
            }
            LinkType::Tcx => {
                let tc = self.tc()?;
                let id = tc
                    .attach_to_link(link.try_into().map_err(wrong)?)
                    .map_err(attach_err("tc link update"))?;
                drop(tc.take_link(id));
                Ok(Attached::Tc)
            }
            other => Err(pin_err(format!(
                "a {other:?} link, not an XDP or TC attachment"
            ))),
        }
    }

    fn keep_link(&mut self, iface: &str, link: FdLink) -> Result<()> {
        match &self.pin_dir {
            Some(dir) => {
                let links = dir.join("links");
                std::fs::create_dir_all(&links).map_err(|e| Error::Pin {
                    path: links.clone(),
                    reason: e.to_string(),
                })?;
                let path = links.join(iface);
                let pinned: PinnedLink = link.pin(&path).map_err(|e| Error::Pin {
                    path: path.clone(),
                    reason: e.to_string(),
                })?;
                // The pin holds the attachment; our copy of the fd can go.
                drop(pinned);
            }
            None => {
                // Unpinned: the attachment lives as long as this process holds the fd.
                self.links.push(link);
            }
        }
        Ok(())
    }

    /// Why connections open before attach cannot be counted on this kernel, if they cannot.
    pub fn seed_unavailable(&self) -> Option<&str> {
        self.seed_unavailable.as_deref()
    }

    /// Hand `batch` (socket cookie, connection) to the seeding iterator and open it: the
    /// returned link, opened with [`IterLink::into_file`] on a thread in the network
    /// namespace the connections belong to and read to the end, counts them (one
    /// [`SeedResult`] per socket found; see [`parse_seed_results`]). Call
    /// [`Shedder::seed_clear`] with the same batch afterwards.
    pub fn seed_prepare(
        &mut self,
        batch: &[(u64, SeedSock)],
    ) -> Result<aya::programs::iter::IterLink> {
        if let Some(why) = &self.seed_unavailable {
            return Err(Error::Tracing(format!("seeding unavailable: {why}")));
        }
        if batch.len() > SEED_BATCH as usize {
            return Err(Error::Range(
                "seed batch",
                format!("{} > {SEED_BATCH}", batch.len()),
            ));
        }
        {
            let mut map: HashMap<&mut MapData, u64, SeedSock> = self
                .map_mut(maps::SEED)?
                .try_into()
                .map_err(map_err(maps::SEED))?;
            for (cookie, sock) in batch {
                map.insert(cookie, sock, 0).map_err(map_err(maps::SEED))?;
            }
        }
        let program = programs::SEED;
        let prog: &mut aya::programs::Iter = self.program(program)?;
        let id = prog
            .attach()
            .map_err(|source| Error::Program { program, source })?;
        prog.take_link(id)
            .map_err(|source| Error::Program { program, source })
    }

    /// Remove `batch` from the seeding iterator's table again.
    pub fn seed_clear(&mut self, batch: &[(u64, SeedSock)]) -> Result<()> {
        let mut map: HashMap<&mut MapData, u64, SeedSock> = self
            .map_mut(maps::SEED)?
            .try_into()
            .map_err(map_err(maps::SEED))?;
        for (cookie, _) in batch {
            // Absent only if never inserted: nothing to undo.
            let _ = map.remove(cookie);
        }
        Ok(())
    }

    fn map_mut(&mut self, name: &'static str) -> Result<&mut aya::maps::Map> {
        self.ebpf.map_mut(name).ok_or(Error::MissingMap(name))
    }

    fn map(&self, name: &'static str) -> Result<&aya::maps::Map> {
        self.ebpf.map(name).ok_or(Error::MissingMap(name))
    }
}

/// The seeding iterator's output: one [`SeedResult`] per socket it found.
pub fn parse_seed_results(bytes: &[u8]) -> Vec<SeedResult> {
    const N: usize = core::mem::size_of::<SeedResult>();
    bytes
        .chunks_exact(N)
        .map(|c| {
            let u64_at = |o: usize| u64::from_ne_bytes(c[o..o + 8].try_into().expect("8 bytes"));
            SeedResult {
                cookie: u64_at(0),
                service: u16::from_ne_bytes([c[8], c[9]]),
                class: c[10],
                outcome: c[11],
                _pad: 0,
            }
        })
        .collect()
}

/// A random non-zero 64-bit seed from the kernel's generator.
fn random_seed() -> Result<u64> {
    use std::io::Read as _;
    let mut b = [0u8; 8];
    std::fs::File::open("/dev/urandom")
        .and_then(|mut f| f.read_exact(&mut b))
        .map_err(|e| Error::Io("reading /dev/urandom for the table seed", e))?;
    Ok(u64::from_ne_bytes(b) | 1)
}

fn map_err(map: &'static str) -> impl Fn(aya::maps::MapError) -> Error {
    move |source| Error::Map { map, source }
}

impl Shedder {
    pub fn set_globals(&mut self, globals: &Globals) -> Result<()> {
        let mut m: Array<&mut MapData, Globals> =
            Array::try_from(self.map_mut(maps::GLOBALS)?).map_err(map_err(maps::GLOBALS))?;
        m.set(0, globals, 0).map_err(map_err(maps::GLOBALS))
    }

    /// Protect `port` with service `service` (any destination address); `None` unprotects it.
    pub fn set_port(&mut self, port: u16, service: Option<u32>) -> Result<()> {
        let value = match service {
            Some(id) => {
                check_service(id)?;
                id + 1
            }
            None => 0,
        };
        let mut m: Array<&mut MapData, u32> =
            Array::try_from(self.map_mut(maps::PORTS)?).map_err(map_err(maps::PORTS))?;
        let old = m.get(&(port as u32), 0).map_err(map_err(maps::PORTS))?;
        m.set(port as u32, (old & PORT_HAS_ADDR_SERVICES) | value, 0)
            .map_err(map_err(maps::PORTS))
    }

    /// Protect `addr:port` with service `service`, taking precedence over the port's
    /// any-address service.
    pub fn set_addr_service(&mut self, addr: IpAddr, port: u16, service: u32) -> Result<()> {
        check_service(service)?;
        let key = addr_key(addr, port);
        {
            let mut m: HashMap<&mut MapData, ServiceAddrKey, u32> =
                HashMap::try_from(self.map_mut(maps::ADDR_SERVICES)?)
                    .map_err(map_err(maps::ADDR_SERVICES))?;
            m.insert(key, service + 1, 0)
                .map_err(map_err(maps::ADDR_SERVICES))?;
        }
        let mut m: Array<&mut MapData, u32> =
            Array::try_from(self.map_mut(maps::PORTS)?).map_err(map_err(maps::PORTS))?;
        let old = m.get(&(port as u32), 0).map_err(map_err(maps::PORTS))?;
        m.set(port as u32, old | PORT_HAS_ADDR_SERVICES, 0)
            .map_err(map_err(maps::PORTS))
    }

    pub fn set_policy(&mut self, service: u32, policy: &ServicePolicy) -> Result<()> {
        check_service(service)?;
        let mut m: Array<&mut MapData, ServicePolicy> =
            Array::try_from(self.map_mut(maps::POLICIES)?).map_err(map_err(maps::POLICIES))?;
        m.set(service, policy, 0).map_err(map_err(maps::POLICIES))
    }

    pub fn set_inflight(&mut self, service: u32, inflight: &Inflight) -> Result<()> {
        check_service(service)?;
        let mut m: Array<&mut MapData, Inflight> =
            Array::try_from(self.map_mut(maps::INFLIGHT)?).map_err(map_err(maps::INFLIGHT))?;
        m.set(service, inflight, 0).map_err(map_err(maps::INFLIGHT))
    }

    /// Insert one rule into the trie of its family (the direct table is rebuilt by
    /// [`Shedder::replace_class_rules`]).
    fn insert_class_rule(&mut self, addr: IpAddr, prefix_len: u32, class: u32) -> Result<()> {
        if class as usize >= NUM_CLASSES {
            return Err(Error::Range("class", class.to_string()));
        }
        let rule = ClassRule { class };
        match addr {
            IpAddr::V4(a) => {
                if prefix_len > 32 {
                    return Err(Error::Range("IPv4 prefix length", prefix_len.to_string()));
                }
                let mut m: LpmTrie<&mut MapData, [u8; 4], ClassRule> =
                    LpmTrie::try_from(self.map_mut(maps::CLASS_V4)?)
                        .map_err(map_err(maps::CLASS_V4))?;
                m.insert(&Key::new(prefix_len, a.octets()), rule, 0)
                    .map_err(map_err(maps::CLASS_V4))
            }
            IpAddr::V6(a) => {
                if prefix_len > 128 {
                    return Err(Error::Range("IPv6 prefix length", prefix_len.to_string()));
                }
                let mut m: LpmTrie<&mut MapData, [u8; 16], ClassRule> =
                    LpmTrie::try_from(self.map_mut(maps::CLASS_V6)?)
                        .map_err(map_err(maps::CLASS_V6))?;
                m.insert(&Key::new(prefix_len, a.octets()), rule, 0)
                    .map_err(map_err(maps::CLASS_V6))
            }
        }
    }
}

/// Reading the maps, from a loaded [`Shedder`] or from the maps pinned by another process
/// ([`PinnedMaps`]).
pub trait MapReader {
    /// The map called `name`.
    fn map_named(&self, name: &'static str) -> Result<&aya::maps::Map>;

    fn globals(&self) -> Result<Globals> {
        let m: Array<&MapData, Globals> =
            Array::try_from(self.map_named(maps::GLOBALS)?).map_err(map_err(maps::GLOBALS))?;
        m.get(&0, 0).map_err(map_err(maps::GLOBALS))
    }

    /// The policy in the map for a service.
    fn policy(&self, service: u32) -> Result<ServicePolicy> {
        check_service(service)?;
        let m: Array<&MapData, ServicePolicy> =
            Array::try_from(self.map_named(maps::POLICIES)?).map_err(map_err(maps::POLICIES))?;
        m.get(&service, 0).map_err(map_err(maps::POLICIES))
    }

    /// A decision counter summed over CPUs.
    fn counter(&self, service: u32, class: u32, verdict: u32, reason: u32) -> Result<u64> {
        check_service(service)?;
        if class as usize >= NUM_CLASSES || verdict >= NUM_VERDICTS || reason >= NUM_REASONS {
            return Err(Error::Range(
                "counter",
                format!("class {class} verdict {verdict} reason {reason}"),
            ));
        }
        Ok(self.counters(service)?[decision_index(class, verdict, reason) as usize])
    }

    /// Every decision counter of a service summed over CPUs, indexed by `decision_index`
    /// (one map lookup).
    fn counters(&self, service: u32) -> Result<[u64; COUNTERS_PER_SERVICE]> {
        Ok(self.service_counters(service)?.n)
    }

    /// All of a service's counters summed over CPUs, in one map lookup: the decision
    /// counters (`n`, unique attempts), the retransmitted SYNs and the retries per class.
    fn service_counters(&self, service: u32) -> Result<ServiceCounters> {
        check_service(service)?;
        let m: PerCpuArray<&MapData, ServiceCounters> =
            PerCpuArray::try_from(self.map_named(maps::COUNTERS)?)
                .map_err(map_err(maps::COUNTERS))?;
        let per_cpu = m.get(&service, 0).map_err(map_err(maps::COUNTERS))?;
        let mut out = ServiceCounters::default();
        let add = |o: &mut [u64], v: &[u64]| o.iter_mut().zip(v).for_each(|(o, v)| *o += v);
        for cpu in per_cpu.iter() {
            add(&mut out.n, &cpu.n);
            add(&mut out.retransmits, &cpu.retransmits);
            add(&mut out.retries, &cpu.retries);
        }
        Ok(out)
    }

    /// Established connections per class of a service, as the kernel counts them.
    fn inflight(&self, service: u32) -> Result<Inflight> {
        check_service(service)?;
        let m: Array<&MapData, Inflight> =
            Array::try_from(self.map_named(maps::INFLIGHT)?).map_err(map_err(maps::INFLIGHT))?;
        m.get(&service, 0).map_err(map_err(maps::INFLIGHT))
    }

    /// Admitted attempts not yet established, per epoch slot.
    fn pending(&self, service: u32) -> Result<shedder_common::Pending> {
        check_service(service)?;
        let m: Array<&MapData, shedder_common::Pending> =
            Array::try_from(self.map_named(maps::PENDING)?).map_err(map_err(maps::PENDING))?;
        m.get(&service, 0).map_err(map_err(maps::PENDING))
    }

    /// A service's cumulative histograms summed over CPUs, indexed by `hist::index`
    /// (one map lookup).
    fn histograms(&self, service: u32) -> Result<Vec<u64>> {
        Ok(self.histograms_with_sums(service)?.0)
    }

    /// The histograms and the sum of the observations per kind (µs).
    fn histograms_with_sums(
        &self,
        service: u32,
    ) -> Result<(Vec<u64>, [u64; hist::KINDS as usize])> {
        check_service(service)?;
        let m: PerCpuArray<&MapData, ServiceHist> =
            PerCpuArray::try_from(self.map_named(maps::HIST)?).map_err(map_err(maps::HIST))?;
        let per_cpu = m.get(&service, 0).map_err(map_err(maps::HIST))?;
        let mut out = vec![0u64; HIST_PER_SERVICE];
        let mut sums = [0u64; hist::KINDS as usize];
        for cpu in per_cpu.iter() {
            for (o, v) in out.iter_mut().zip(cpu.b.iter()) {
                *o += v;
            }
            for (o, v) in sums.iter_mut().zip(cpu.sum_us.iter()) {
                *o += v;
            }
        }
        Ok((out, sums))
    }

    /// One of a service's cumulative histograms (`hist::KIND_*`).
    fn histogram(&self, service: u32, kind: u32) -> Result<Vec<u64>> {
        let all = self.histograms(service)?;
        let start = hist::index(kind, 0) as usize;
        Ok(all[start..start + hist::BUCKETS as usize].to_vec())
    }

    /// Node-wide statistics summed over CPUs, indexed by `STAT_*`.
    fn stats(&self) -> Result<[u64; NUM_STATS as usize]> {
        let m: PerCpuArray<&MapData, u64> =
            PerCpuArray::try_from(self.map_named(maps::STATS)?).map_err(map_err(maps::STATS))?;
        let mut out = [0; NUM_STATS as usize];
        for (i, slot) in out.iter_mut().enumerate() {
            *slot = m
                .get(&(i as u32), 0)
                .map_err(map_err(maps::STATS))?
                .iter()
                .sum();
        }
        Ok(out)
    }
}

impl MapReader for Shedder {
    fn map_named(&self, name: &'static str) -> Result<&aya::maps::Map> {
        self.map(name)
    }
}

/// The maps pinned under a pin directory, opened without loading any program: what the
/// CLI and the tests read while a daemon runs (or after it was killed).
pub struct PinnedMaps {
    maps: std::collections::HashMap<&'static str, aya::maps::Map>,
}

impl PinnedMaps {
    /// Open every pinned map under `dir/maps/`.
    pub fn open(dir: &Path) -> Result<Self> {
        let mut maps = std::collections::HashMap::new();
        for name in maps::ALL {
            let path = dir.join("maps").join(name);
            let data =
                MapData::from_pin(&path).map_err(|source| Error::Map { map: name, source })?;
            let map = aya::maps::Map::from_map_data(data)
                .map_err(|source| Error::Map { map: name, source })?;
            maps.insert(name, map);
        }
        Ok(Self { maps })
    }
}

impl MapReader for PinnedMaps {
    fn map_named(&self, name: &'static str) -> Result<&aya::maps::Map> {
        self.maps.get(name).ok_or(Error::MissingMap(name))
    }
}

/// Check that the running kernel's `sock` tracepoint records have the layout the tracking
/// programs read (see `shedder_common::tp`). A missing optional tracepoint (see
/// [`programs::OPTIONAL_TRACEPOINTS`]) is returned, not an error; a missing required one, or
/// any with another layout, is an error.
pub fn check_tracepoint_formats() -> std::result::Result<Vec<&'static str>, String> {
    use shedder_common::tp;
    /// (field, offset, size) as in `shedder_common::tp`.
    type Layout = [(&'static str, usize, usize)];
    let checks: [(&str, &Layout); 3] = [
        ("inet_sock_set_state", &tp::state::FIELDS),
        ("sock_recv_length", &tp::length::FIELDS),
        ("sock_send_length", &tp::length::FIELDS),
    ];
    let mut missing = Vec::new();
    for (event, fields) in checks {
        let path = format!("{}/events/sock/{event}/format", crate::sysfs::TRACEFS);
        let text = match std::fs::read_to_string(&path) {
            Ok(text) => text,
            Err(e)
                if e.kind() == std::io::ErrorKind::NotFound
                    && programs::OPTIONAL_TRACEPOINTS.contains(&event) =>
            {
                missing.push(event);
                continue;
            }
            Err(e) => {
                return Err(format!(
                    "cannot read {path}: {e} (this kernel lacks the sock:{event} tracepoint)"
                ));
            }
        };
        let found = parse_format(&text);
        for &(name, offset, size) in fields {
            match found.iter().find(|(n, _, _)| n == name) {
                Some(&(_, o, s)) if o == offset && s == size => {}
                Some(&(_, o, s)) => {
                    return Err(format!(
                        "sock:{event} field `{name}` is at offset {o} size {s} on this kernel, \
                         shedder reads offset {offset} size {size}"
                    ));
                }
                None => {
                    return Err(format!("sock:{event} has no field `{name}` on this kernel"));
                }
            }
        }
    }
    Ok(missing)
}

/// What is lost without the optional tracepoints in `missing` (empty: nothing).
pub fn missing_tracepoints_note(missing: &[&str]) -> Option<String> {
    if missing.is_empty() {
        return None;
    }
    Some(format!(
        "this kernel has no {} (Linux {} and later have them): in-flight connections are \
         counted, but accept-queue age and response latency are not measured, so the aimd and \
         gradient2 controllers have no latency signal and hold each service at its \
         fallback_limit; use controller = \"fixed\" to choose the limit, or a kernel ≥ {}",
        missing
            .iter()
            .map(|t| format!("sock:{t}"))
            .collect::<Vec<_>>()
            .join(" or "),
        programs::LATENCY_TRACEPOINTS_SINCE,
        programs::LATENCY_TRACEPOINTS_SINCE,
    ))
}

/// `(name, offset, size)` of each field line of a tracefs `format` file.
fn parse_format(text: &str) -> Vec<(String, usize, usize)> {
    let mut out = Vec::new();
    for line in text.lines() {
        let mut name = None;
        let mut offset = None;
        let mut size = None;
        for part in line.split(';') {
            let part = part.trim();
            if let Some(decl) = part.strip_prefix("field:") {
                // `unsigned short common_type` or `__u8 saddr[4]`: the last word, sans array.
                name = decl
                    .split_whitespace()
                    .last()
                    .map(|n| n.split('[').next().unwrap_or(n).to_string());
            } else if let Some(v) = part.strip_prefix("offset:") {
                offset = v.parse().ok();
            } else if let Some(v) = part.strip_prefix("size:") {
                size = v.parse().ok();
            }
        }
        if let (Some(n), Some(o), Some(s)) = (name, offset, size) {
            out.push((n, o, s));
        }
    }
    out
}

/// The usual CONFIG_HZ values, to snap a measurement to.
const KNOWN_HZ: [u32; 5] = [100, 250, 300, 1000, 1200];

fn snap_hz(measured: f64) -> u32 {
    for hz in KNOWN_HZ {
        if (measured - hz as f64).abs() <= hz as f64 * 0.05 {
            return hz;
        }
    }
    measured.round().max(1.0) as u32
}

/// The epoch shift (in jiffies) giving pending-attempt epochs closest to one second.
pub fn epoch_shift_for(hz: u32) -> u32 {
    let mut best = 0;
    let mut best_err = f64::MAX;
    for shift in 0..32u32 {
        let secs = (1u64 << shift) as f64 / hz.max(1) as f64;
        let err = (secs - 1.0).abs();
        if err < best_err {
            best = shift;
            best_err = err;
        }
    }
    best
}

/// Milliseconds to jiffies at `hz`, rounded up.
pub fn ms_to_jiffies(ms: u64, hz: u32) -> u64 {
    (ms * hz as u64).div_ceil(1000)
}

impl Shedder {
    /// Write a compiled policy: service policies and class rules first, then the port and
    /// address maps that switch protection on; entries of a previous policy that are no
    /// longer wanted are removed last. The heartbeat already in the maps is kept.
    pub fn apply(&mut self, compiled: &crate::policy::Compiled) -> Result<()> {
        for s in &compiled.services {
            self.set_policy(s.id, &s.policy)?;
        }
        self.replace_class_rules(&compiled.class_rules)?;

        let mut ports = vec![0u32; shedder_common::PORT_MAP_ENTRIES as usize];
        let mut addr = std::collections::HashMap::new();
        for s in &compiled.services {
            check_service(s.id)?;
            for &port in &s.ports {
                if s.addresses.is_empty() {
                    ports[port as usize] =
                        (ports[port as usize] & PORT_HAS_ADDR_SERVICES) | (s.id + 1);
                } else {
                    ports[port as usize] |= PORT_HAS_ADDR_SERVICES;
                    for a in &s.addresses {
                        addr.insert(addr_key(*a, port), s.id + 1);
                    }
                }
            }
        }
        {
            let mut m: HashMap<&mut MapData, ServiceAddrKey, u32> =
                HashMap::try_from(self.map_mut(maps::ADDR_SERVICES)?)
                    .map_err(map_err(maps::ADDR_SERVICES))?;
            for (k, v) in &addr {
                m.insert(k, v, 0).map_err(map_err(maps::ADDR_SERVICES))?;
            }
        }
        {
            let mut m: Array<&mut MapData, u32> =
                Array::try_from(self.map_mut(maps::PORTS)?).map_err(map_err(maps::PORTS))?;
            for (port, want) in ports.iter().enumerate() {
                let port = port as u32;
                if m.get(&port, 0).map_err(map_err(maps::PORTS))? != *want {
                    m.set(port, want, 0).map_err(map_err(maps::PORTS))?;
                }
            }
        }
        {
            let mut m: HashMap<&mut MapData, ServiceAddrKey, u32> =
                HashMap::try_from(self.map_mut(maps::ADDR_SERVICES)?)
                    .map_err(map_err(maps::ADDR_SERVICES))?;
            let stale: Vec<ServiceAddrKey> = m
                .keys()
                .filter_map(|k| k.ok())
                .filter(|k| !addr.contains_key(k))
                .collect();
            for k in stale {
                m.remove(&k).map_err(map_err(maps::ADDR_SERVICES))?;
            }
        }
        let mut globals = compiled.globals;
        let current = self.globals()?;
        globals.heartbeat_jiffies = current.heartbeat_jiffies;
        globals.generation = current.generation.wrapping_add(1);
        // The attempt tables' hash seed: kept while the maps live (a reload or a restart
        // that adopts pinned maps keeps what the tables remember), drawn at random when
        // the maps are new.
        globals.table_seed = match current.table_seed {
            0 => random_seed()?,
            seed => seed,
        };
        self.set_globals(&globals)
    }

    /// Make the class tries and the IPv4 direct table hold exactly `rules` (prefixes with
    /// host bits clear). New rules go into the tries first, then the direct table is
    /// rewritten (blocks into the half not in use, then the first level), and only then
    /// are stale trie entries removed, so a concurrent lookup never sees a hole.
    pub fn replace_class_rules(&mut self, rules: &[(crate::config::Prefix, u32)]) -> Result<()> {
        for (p, class) in rules {
            self.insert_class_rule(p.addr, p.len, *class)?;
        }
        self.write_direct_table(rules)?;
        let want: std::collections::HashSet<(IpAddr, u32)> =
            rules.iter().map(|(p, _)| (p.addr, p.len)).collect();
        self.remove_stale_rules::<4>(maps::CLASS_V4, &want, IpAddr::from)?;
        self.remove_stale_rules::<16>(maps::CLASS_V6, &want, IpAddr::from)
    }

    /// Remove the entries of a class trie that `want` does not hold.
    fn remove_stale_rules<const N: usize>(
        &mut self,
        name: &'static str,
        want: &std::collections::HashSet<(IpAddr, u32)>,
        to_ip: fn([u8; N]) -> IpAddr,
    ) -> Result<()>
    where
        [u8; N]: aya::Pod,
    {
        let mut m: LpmTrie<&mut MapData, [u8; N], ClassRule> =
            LpmTrie::try_from(self.map_mut(name)?).map_err(map_err(name))?;
        let stale: Vec<Key<[u8; N]>> = m
            .keys()
            .filter_map(|k| k.ok())
            .filter(|k| !want.contains(&(to_ip(k.data()), k.prefix_len())))
            .collect();
        for k in stale {
            m.remove(&k).map_err(map_err(name))?;
        }
        Ok(())
    }

    fn write_direct_table(&mut self, rules: &[(crate::config::Prefix, u32)]) -> Result<()> {
        let v4: Vec<(std::net::Ipv4Addr, u32, u32)> = rules
            .iter()
            .filter_map(|(p, class)| match p.addr {
                IpAddr::V4(a) => Some((a, p.len, *class)),
                IpAddr::V6(_) => None,
            })
            .collect();
        let current: Vec<u32> = match self.class_l1.take() {
            Some(l1) => l1,
            None => {
                let m: Array<&MapData, u32> =
                    Array::try_from(self.map(maps::CLASS_L1)?).map_err(map_err(maps::CLASS_L1))?;
                m.iter()
                    .collect::<Result<_, _>>()
                    .map_err(map_err(maps::CLASS_L1))?
            }
        };
        let half = CLASS_L2_BLOCKS / 2;
        let upper_in_use = current
            .iter()
            .any(|&e| e & classmap::CLASS_L1_BLOCK != 0 && (e & 0xffff) >= half);
        let base = if upper_in_use { 0 } else { half };
        let table = crate::classmap::build(&v4, base, half as usize);
        {
            let mut m: Array<&mut MapData, ClassBlock> =
                Array::try_from(self.map_mut(maps::CLASS_L2)?).map_err(map_err(maps::CLASS_L2))?;
            for (i, block) in table.blocks.iter().enumerate() {
                m.set(base + i as u32, block, 0)
                    .map_err(map_err(maps::CLASS_L2))?;
            }
        }
        let mut m: Array<&mut MapData, u32> =
            Array::try_from(self.map_mut(maps::CLASS_L1)?).map_err(map_err(maps::CLASS_L1))?;
        for (i, (&want, &have)) in table.l1.iter().zip(&current).enumerate() {
            if want != have {
                // On failure the cache is dropped, so the next write reads the map again.
                m.set(i as u32, want, 0).map_err(map_err(maps::CLASS_L1))?;
            }
        }
        self.class_l1 = Some(table.l1);
        Ok(())
    }
}
/// Remove everything pinned under `dir`: the links first (which detaches the programs),
/// then the maps. Returns the interfaces that were detached.
pub fn unpin_all(dir: &Path) -> std::io::Result<Vec<String>> {
    let mut detached = Vec::new();
    for sub in ["links", "maps"] {
        let d = dir.join(sub);
        let entries = match std::fs::read_dir(&d) {
            Ok(e) => e,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
            Err(e) => return Err(e),
        };
        for entry in entries {
            let entry = entry?;
            std::fs::remove_file(entry.path())?;
            if sub == "links" {
                detached.push(entry.file_name().to_string_lossy().into_owned());
            }
        }
        std::fs::remove_dir(&d)?;
    }
    match std::fs::remove_dir(dir) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(e),
    }
    Ok(detached)
}

fn check_service(id: u32) -> Result<()> {
    if id >= shedder_common::MAX_SERVICES || id + 1 > PORT_SERVICE_MASK {
        return Err(Error::Range(
            "service id",
            format!("{id} (at most {})", shedder_common::MAX_SERVICES - 1),
        ));
    }
    Ok(())
}

/// Key of the address-specific service map for `addr:port`.
pub fn addr_key(addr: IpAddr, port: u16) -> ServiceAddrKey {
    let mut key = ServiceAddrKey {
        port,
        ..Default::default()
    };
    match addr {
        IpAddr::V4(a) => {
            key.addr[..4].copy_from_slice(&a.octets());
            key.family = 4;
        }
        IpAddr::V6(a) => {
            key.addr = a.octets();
            key.family = 6;
        }
    }
    key
}

/// Wraps a program error from attaching to `iface` in `mode`.
fn attach_error(iface: &str, mode: &'static str) -> impl Fn(ProgramError) -> Error {
    let iface = iface.to_string();
    move |source| Error::Attach {
        iface: iface.clone(),
        mode,
        source,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tracefs_format_lines_parse() {
        let text = "name: x\nformat:\n\tfield:unsigned short common_type;\toffset:0;\tsize:2;\tsigned:0;\n\tfield:__u8 saddr_v6[16];\toffset:40;\tsize:16;\tsigned:0;\n\nprint fmt: \"%d\"\n";
        assert_eq!(
            parse_format(text),
            [
                ("common_type".to_string(), 0, 2),
                ("saddr_v6".to_string(), 40, 16)
            ]
        );
    }

    #[test]
    fn verifier_reason_is_the_last_line_before_the_statistics() {
        // Linux 6.1 on an index whose bounds it lost (the mask LLVM had dropped).
        let log = "3482: (0f) r0 += r9\nvalue -9223372036854775744 makes map_value pointer be out of bounds\nverification time 52253 usec\nstack depth 272+0\nprocessed 622 insns (limit 1000000) max_states_per_insn 1 total_states 45 peak_states 45 mark_read 17\n";
        assert_eq!(
            verifier_reason(log),
            "value -9223372036854775744 makes map_value pointer be out of bounds"
        );
        let too_big = "processed 1000001 insns (limit 1000000) max_states_per_insn 36\n";
        assert_eq!(verifier_reason(too_big), "no reason in the log");
        let e = Error::Verifier {
            program: "shedder_xdp",
            source: std::io::Error::from_raw_os_error(libc::E2BIG),
            reason: verifier_reason(too_big),
            log: too_big.into(),
        };
        assert!(e.too_complex());
        let text = e.to_string();
        assert!(
            text.starts_with("the kernel verifier rejected `shedder_xdp`: "),
            "{text}"
        );
        assert!(text.contains("shedder doctor"), "{text}");
    }

    #[test]
    fn hz_snaps_to_known_values() {
        assert_eq!(snap_hz(251.7), 250);
        assert_eq!(snap_hz(990.0), 1000);
        assert_eq!(snap_hz(101.0), 100);
        assert_eq!(snap_hz(500.0), 500);
    }

    #[test]
    fn epoch_about_one_second() {
        assert_eq!(epoch_shift_for(250), 8);
        assert_eq!(epoch_shift_for(1000), 10);
        assert_eq!(epoch_shift_for(100), 7);
    }

    #[test]
    fn ms_round_up() {
        assert_eq!(ms_to_jiffies(3000, 250), 750);
        assert_eq!(ms_to_jiffies(1, 250), 1);
        assert_eq!(ms_to_jiffies(0, 250), 0);
    }
}
