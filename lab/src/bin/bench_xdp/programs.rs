//! The programs measured and how they are run: shedder's XDP and egress programs or the
//! empty ones, the actions they return, and a frame run through one.

use anyhow::{Context as _, Result, ensure};
use aya::{
    Ebpf,
    programs::{SchedClassifier, TestRun, TestRunOptions, Xdp},
};
use serde::Serialize;
use shedder::kernel::{BASELINE_OBJECT, Shedder};
use shedder_lab::packet::Packet;

pub const XDP_DROP: u32 = 1;
pub const XDP_PASS: u32 = 2;
pub const XDP_TX: u32 = 3;
pub const TC_ACT_OK: u32 = 0;
/// How shedder's TC programs pass a frame: on to the next program (TC_ACT_UNSPEC, -1 as
/// the kernel's u32).
pub const TCX_NEXT: u32 = u32::MAX;
pub const TC_ACT_SHOT: u32 = 2;

/// The program a row measures: shedder's XDP program (or the empty one), or its TC egress
/// program (or the empty classifier).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Hook {
    Xdp,
    TcEgress,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Method {
    /// One call with a large repeat per round; the kernel's mean per run.
    Repeated,
    /// Calls with repeat = 1; each call's time.
    SingleShot,
}

/// A decision counter: (service, class, verdict, reason).
#[derive(Clone, Copy, Debug)]
pub struct Decision {
    pub service: u32,
    pub class: u32,
    pub verdict: u32,
    pub reason: u32,
}

/// Run `packet` through shedder's XDP program, which must pass it.
pub fn run_xdp(shedder: &mut Shedder, packet: &Packet) -> Result<()> {
    let r = shedder.xdp()?.test_run(TestRunOptions {
        data_in: Some(&packet.bytes()),
        ..Default::default()
    })?;
    expect_action(Hook::Xdp, XDP_PASS, r.return_value)
}

/// Run `packet` through shedder's egress program, which must let it through.
pub fn run_egress(shedder: &mut Shedder, packet: &Packet) -> Result<()> {
    let r = shedder.egress()?.test_run(TestRunOptions {
        data_in: Some(&packet.bytes()),
        ..Default::default()
    })?;
    expect_action(Hook::TcEgress, TCX_NEXT, r.return_value)
}

pub fn expect_action(hook: Hook, want: u32, got: u32) -> Result<()> {
    ensure!(
        got == want,
        "{hook:?} returned {} instead of {}",
        action_name(hook, got),
        action_name(hook, want)
    );
    Ok(())
}

pub enum Program {
    Baseline(Ebpf),
    Shedder {
        shedder: Box<Shedder>,
        decision: Option<Decision>,
    },
}

impl Program {
    pub fn xdp(&mut self) -> Result<&mut Xdp> {
        Ok(match self {
            Self::Baseline(ebpf) => ebpf
                .program_mut(shedder_common::programs::BASELINE_XDP)
                .context("baseline program")?
                .try_into()?,
            Self::Shedder { shedder, .. } => shedder.xdp()?,
        })
    }

    /// The empty classifier, or shedder's egress program.
    pub fn tc(&mut self) -> Result<&mut SchedClassifier> {
        Ok(match self {
            Self::Baseline(ebpf) => ebpf
                .program_mut(shedder_common::programs::BASELINE_TC)
                .context("baseline classifier")?
                .try_into()?,
            Self::Shedder { shedder, .. } => shedder.egress()?,
        })
    }
}

/// The empty XDP program and the empty classifier, both loaded.
pub fn baseline_programs() -> Result<Program> {
    let mut ebpf = Ebpf::load(BASELINE_OBJECT).context("loading the baseline object")?;
    for name in [
        shedder_common::programs::BASELINE_XDP,
        shedder_common::programs::BASELINE_TC,
    ] {
        let program = ebpf
            .program_mut(name)
            .with_context(|| format!("the baseline object has no `{name}`"))?;
        if name == shedder_common::programs::BASELINE_XDP {
            <&mut Xdp>::try_from(program)?.load()
        } else {
            <&mut SchedClassifier>::try_from(program)?.load()
        }
        .with_context(|| format!("loading {name}"))?;
    }
    Ok(Program::Baseline(ebpf))
}

pub fn action_name(hook: Hook, action: u32) -> String {
    match (hook, action) {
        (Hook::Xdp, 0) => "XDP_ABORTED".into(),
        (Hook::Xdp, XDP_DROP) => "XDP_DROP".into(),
        (Hook::Xdp, XDP_PASS) => "XDP_PASS".into(),
        (Hook::Xdp, XDP_TX) => "XDP_TX".into(),
        (Hook::Xdp, 4) => "XDP_REDIRECT".into(),
        (Hook::TcEgress, TC_ACT_OK) => "TC_ACT_OK".into(),
        (Hook::TcEgress, TC_ACT_SHOT) => "TC_ACT_SHOT".into(),
        (Hook::TcEgress, TCX_NEXT) => "TCX_NEXT".into(),
        (_, other) => format!("action {other}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn actions_are_named_for_their_hook() {
        assert_eq!(action_name(Hook::Xdp, 0), "XDP_ABORTED");
        assert_eq!(action_name(Hook::TcEgress, 0), "TC_ACT_OK");
        assert_eq!(action_name(Hook::TcEgress, TC_ACT_SHOT), "TC_ACT_SHOT");
        assert_eq!(action_name(Hook::TcEgress, u32::MAX), "TCX_NEXT");
    }
}
