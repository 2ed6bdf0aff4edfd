//! Measuring: a subject per row (a loaded program with its frame), checked before and
//! after, and the rounds that interleave them.

use std::{
    io::IsTerminal as _,
    time::{Duration, Instant},
};

use anyhow::{Context as _, Result, ensure};
use aya::{
    Ebpf,
    programs::{SchedClassifier, TestRun, TestRunOptions, Xdp},
};
use shedder::kernel::{BASELINE_OBJECT, MapReader, Shedder};
use shedder_common::decision_index;
use shedder_lab::{
    packet::Packet,
    policy::{
        LONG_WINDOW, PORT_DROP, PORT_QUIC_DROP, SVC_DROP, SVC_QUIC_VN, install_standard,
        retransmit_window, retries,
    },
};

use super::{
    args::Args,
    egress::{
        EgressSpec, Tracking, check_tracking, egress_paths, handshake_ack, response, syn_ack,
    },
    paths::{ISN_OFFSET, PathSpec, initial, next_flood, paths, syn},
    programs::{
        Hook, Method, Program, TCX_NEXT, XDP_PASS, XDP_TX, action_name, run_egress, run_xdp,
    },
};

pub const BASELINE: &str = "empty XDP program (baseline)";
pub const BASELINE_QUIC: &str = "empty XDP program (baseline), the QUIC rows' 1,242-byte frame";
pub const BASELINE_TC: &str = "empty TC classifier (baseline)";

/// A loaded program with the frame it runs on and what it must do with it.
pub struct Subject {
    pub label: &'static str,
    pub hook: Hook,
    /// An empty program, what the other rows of its hook are compared with.
    pub baseline: bool,
    /// Bump the frame's initial sequence number before every call.
    pub new_attempts: bool,
    /// Every call a new source, port and initial sequence number ([`next_flood`]).
    pub flood: bool,
    /// Not a flood: the frame's source is given standing before each call.
    pub proven: bool,
    pub method: Method,
    /// `None` for the baselines and the egress rows.
    pub target: Option<f64>,
    /// An egress row: what the tracking of its connection must show after the runs.
    pub tracking: Option<Tracking>,
    pub program: Program,
    pub frame: Vec<u8>,
    pub action: u32,
    /// The frame the program must leave.
    pub output: Vec<u8>,
    /// A refused QUIC Initial: the program must leave the Version Negotiation packet
    /// answering it, whatever reserved version it offers.
    pub refusal: Option<Packet>,
    /// Program runs so far, the verification and warm-up calls included.
    pub runs: u64,
    /// Nanoseconds per packet: one per round (repeated) or per call (single-shot).
    pub samples: Vec<f64>,
}

impl Subject {
    pub fn baseline(
        hook: Hook,
        method: Method,
        frame: &Packet,
        label: &'static str,
    ) -> Result<Self> {
        let mut ebpf = Ebpf::load(BASELINE_OBJECT).context("loading the baseline object")?;
        let (name, action) = match hook {
            Hook::Xdp => (shedder_common::programs::BASELINE_XDP, XDP_PASS),
            Hook::TcEgress => (shedder_common::programs::BASELINE_TC, TCX_NEXT),
        };
        let program = ebpf
            .program_mut(name)
            .with_context(|| format!("the baseline object has no `{name}`"))?;
        match hook {
            Hook::Xdp => <&mut Xdp>::try_from(program)?.load(),
            Hook::TcEgress => <&mut SchedClassifier>::try_from(program)?.load(),
        }
        .with_context(|| format!("loading {name}"))?;
        let bytes = frame.bytes();
        Ok(Self {
            label,
            hook,
            baseline: true,
            tracking: None,
            new_attempts: false,
            flood: false,
            proven: false,
            method,
            target: None,
            program: Program::Baseline(ebpf),
            output: bytes.clone(),
            refusal: None,
            frame: bytes,
            action,
            runs: 0,
            samples: Vec::new(),
        })
    }

    /// A path through the egress program (repeated; the standard services installed, the
    /// connection made through its handshake first if the path says so).
    pub fn egress(spec: &EgressSpec) -> Result<Self> {
        let mut shedder = Box::new(Shedder::load().context("loading shedder")?);
        install_standard(&mut shedder);
        let before = if spec.tracked {
            run_egress(&mut shedder, &syn_ack(PORT_DROP))
                .with_context(|| format!("{}: the SYN-ACK", spec.label))?;
            run_xdp(&mut shedder, &handshake_ack(PORT_DROP))
                .with_context(|| format!("{}: the client's ACK", spec.label))?;
            Tracking::Idle
        } else {
            Tracking::None
        };
        check_tracking(&mut shedder, before, spec.label)?;
        let bytes = spec.packet.bytes();
        Ok(Self {
            label: spec.label,
            hook: Hook::TcEgress,
            baseline: false,
            tracking: Some(spec.after),
            new_attempts: false,
            flood: false,
            proven: false,
            method: Method::Repeated,
            target: None,
            program: Program::Shedder {
                shedder,
                decision: None,
            },
            output: bytes.clone(),
            refusal: None,
            frame: bytes,
            action: TCX_NEXT,
            runs: 0,
            samples: Vec::new(),
        })
    }

    pub fn path(spec: &PathSpec) -> Result<Self> {
        let mut shedder = Box::new(Shedder::load().context("loading shedder")?);
        install_standard(&mut shedder);
        if spec.memory {
            retransmit_window(&mut shedder, LONG_WINDOW.into());
        }
        if let Some((service, policy)) = &spec.policy {
            let mut policy = *policy;
            if spec.memory {
                // Retries counted, not demoted: every decision stays in the source's class,
                // where the counters are checked.
                retries(&mut policy, LONG_WINDOW, false);
            }
            if spec.fair {
                policy.fair_share = 1;
                policy.retry_budget = shedder_common::fair::BUDGET_ONE / 10;
            }
            shedder.set_policy(*service, &policy)?;
        }
        let quic = spec.packet.l4.is_some();
        let output = match spec.action {
            // A Version Negotiation's version varies (see `verify_output`).
            XDP_TX if quic => Vec::new(),
            XDP_TX => spec.packet.expected_rst(),
            _ => spec.packet.bytes(),
        };
        Ok(Self {
            label: spec.label,
            hook: Hook::Xdp,
            baseline: false,
            tracking: None,
            new_attempts: spec.memory,
            flood: spec.flood,
            proven: !spec.flood,
            method: spec.method,
            target: Some(spec.target),
            program: Program::Shedder {
                shedder,
                decision: spec.decision,
            },
            frame: spec.packet.bytes(),
            action: spec.action,
            output,
            refusal: (quic && spec.action == XDP_TX).then(|| spec.packet.clone()),
            runs: 0,
            samples: Vec::new(),
        })
    }

    /// One BPF_PROG_TEST_RUN call; the kernel's mean time per run. An error unless the
    /// program returned the action this path claims.
    pub fn call(&mut self, repeat: u32, data_out: Option<&mut [u8]>) -> Result<(Duration, u32)> {
        if self.flood {
            for frame in [&mut self.frame, &mut self.output] {
                next_flood(frame, self.runs);
            }
        } else if self.new_attempts {
            for frame in [&mut self.frame, &mut self.output] {
                let isn = &mut frame[ISN_OFFSET..ISN_OFFSET + 4];
                let next = u32::from_be_bytes(isn.try_into().expect("4 bytes")).wrapping_add(1);
                isn.copy_from_slice(&next.to_be_bytes());
            }
        }
        // A proven source's tokens last at most u8::MAX admissions: given before the call,
        // which runs at most that many times (see the module's note on proof).
        let repeat = if self.proven {
            repeat.min(u32::from(u8::MAX))
        } else {
            repeat
        };
        if let Program::Shedder { shedder, .. } = &mut self.program
            && self.proven
        {
            let src = shedder_lab::packet::source_address(&self.frame).context("a source")?;
            shedder.set_standing(src, u8::MAX)?;
        }
        let options = TestRunOptions {
            data_in: Some(&self.frame),
            data_out,
            repeat,
            ..Default::default()
        };
        let r = match self.hook {
            Hook::Xdp => self.program.xdp()?.test_run(options),
            Hook::TcEgress => self.program.tc()?.test_run(options),
        }
        .with_context(|| format!("{}: BPF_PROG_TEST_RUN", self.label))?;
        self.runs += u64::from(repeat);
        ensure!(
            r.return_value == self.action,
            "{}: returned {} instead of {}",
            self.label,
            action_name(self.hook, r.return_value),
            action_name(self.hook, self.action)
        );
        Ok((r.duration, r.data_size_out))
    }

    /// Run once and compare the frame the program leaves with the expected one.
    pub fn verify_output(&mut self) -> Result<()> {
        let mut out = vec![0u8; self.frame.len() + 256];
        let (_, len) = self.call(1, Some(&mut out))?;
        let out = &out[..len as usize];
        if let Some(initial) = &self.refusal {
            let version = u32::from_be_bytes(out[out.len() - 4..].try_into()?);
            self.output = initial.expected_version_negotiation(version);
        }
        ensure!(
            out == &self.output[..],
            "{}: the program left an unexpected frame",
            self.label
        );
        Ok(())
    }

    pub fn sample(&mut self, repeat: u32) -> Result<()> {
        let (d, _) = self.call(repeat, None)?;
        self.samples.push(d.as_nanos() as f64);
        Ok(())
    }

    /// The decision counters must show exactly the runs made, in the path's counter (none
    /// for the egress rows, which decide nothing), and an egress row's tracking what it
    /// claims.
    pub fn verify_counters(&mut self) -> Result<()> {
        let Program::Shedder { shedder, decision } = &mut self.program else {
            return Ok(());
        };
        if let Some(tracking) = self.tracking {
            check_tracking(shedder, tracking, self.label)?;
        }
        let decision = *decision;
        // A flood's decisions are the unproven attempts', every other path's the proven
        // ones'; none may show in the other.
        let mut all = 0;
        let mut other = 0;
        let mut mine = 0;
        for service in SVC_DROP..=SVC_QUIC_VN {
            let c = shedder.service_counters(service)?;
            let (counted, elsewhere) = if self.flood {
                (&c.unproven, &c.n)
            } else {
                (&c.n, &c.unproven)
            };
            all += counted.iter().sum::<u64>();
            other += elsewhere.iter().sum::<u64>();
            if let Some(d) = decision
                && d.service == service
            {
                mine = counted[decision_index(d.class, d.verdict, d.reason) as usize];
            }
        }
        ensure!(
            other == 0,
            "{}: {other} decisions counted as {}",
            self.label,
            if self.flood { "proven" } else { "unproven" }
        );
        match decision {
            None => ensure!(
                all == 0,
                "{}: {all} decisions counted, expected none",
                self.label
            ),
            Some(_) => {
                ensure!(
                    mine == self.runs && all == self.runs,
                    "{}: {} runs, but {mine} counted as expected and {all} decisions in all",
                    self.label,
                    self.runs
                );
            }
        }
        Ok(())
    }

    pub fn median(&self) -> f64 {
        median(&self.samples)
    }
}

pub fn median(samples: &[f64]) -> f64 {
    let mut s = samples.to_vec();
    s.sort_by(f64::total_cmp);
    match s.len() {
        0 => f64::NAN,
        n if n % 2 == 1 => s[n / 2],
        n => (s[n / 2 - 1] + s[n / 2]) / 2.0,
    }
}

pub fn measure(args: &Args) -> Result<Vec<Subject>> {
    let specs = paths();
    let mut subjects = Vec::new();
    for method in [Method::Repeated, Method::SingleShot] {
        subjects.push(Subject::baseline(
            Hook::Xdp,
            method,
            &syn(PORT_DROP),
            BASELINE,
        )?);
        // The QUIC rows' own baseline: a call's fixed cost grows with the frame it copies,
        // and an Initial is 1,200 bytes or more where a SYN is 74.
        subjects.push(Subject::baseline(
            Hook::Xdp,
            method,
            &initial(PORT_QUIC_DROP),
            BASELINE_QUIC,
        )?);
        for spec in specs.iter().filter(|p| p.method == method) {
            subjects.push(Subject::path(spec)?);
        }
    }
    // The egress program: repeated only (it leaves every frame as it was).
    subjects.push(Subject::baseline(
        Hook::TcEgress,
        Method::Repeated,
        &response(PORT_DROP),
        BASELINE_TC,
    )?);
    for spec in egress_paths() {
        subjects.push(Subject::egress(&spec)?);
    }
    for s in &mut subjects {
        s.verify_output()?;
    }
    let (repeated, single): (Vec<usize>, Vec<usize>) =
        (0..subjects.len()).partition(|&i| subjects[i].method == Method::Repeated);
    // Warm-up, not recorded.
    for &i in &repeated {
        subjects[i].call(args.repeat.min(10_000), None)?;
    }
    for _ in 0..1000 {
        for &i in &single {
            subjects[i].call(1, None)?;
        }
    }
    let per_round = args.single_calls.div_ceil(args.rounds.max(1));
    let start = Instant::now();
    let progress = std::io::stderr().is_terminal();
    for round in 0..args.rounds {
        if progress {
            eprint!("\rround {}/{}", round + 1, args.rounds);
        }
        // Rotate the order so that no path always follows the same one.
        for k in 0..repeated.len() {
            let i = repeated[(round + k) % repeated.len()];
            subjects[i].sample(args.repeat)?;
        }
        for _ in 0..per_round {
            for &i in &single {
                subjects[i].sample(1)?;
            }
        }
    }
    if progress {
        eprintln!();
    }
    eprintln!(
        "bench_xdp: measured in {:.1} s",
        start.elapsed().as_secs_f64()
    );
    for s in &mut subjects {
        s.verify_counters()?;
    }
    Ok(subjects)
}
