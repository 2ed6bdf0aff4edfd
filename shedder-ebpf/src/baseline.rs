//! The empty programs the benchmark measures shedder's against: an XDP program and a TC
//! classifier that let every frame through and do nothing else.
#![no_std]
#![no_main]

use aya_ebpf::{
    bindings::{TC_ACT_OK, TC_ACT_UNSPEC, xdp_action},
    macros::{classifier, xdp},
    programs::{TcContext, XdpContext},
};

#[xdp]
pub fn baseline_xdp(_ctx: XdpContext) -> u32 {
    xdp_action::XDP_PASS
}

/// The egress rows' baseline (shedder's egress program is a TC classifier): passes as
/// shedder's programs do, on to the next program (TCX_NEXT).
#[classifier]
pub fn baseline_tc(_ctx: TcContext) -> i32 {
    TC_ACT_UNSPEC
}

/// Another tool's program as many are: it passes every frame with TC_ACT_OK, which in tcx
/// ends the chain. Tests attach it beside shedder's.
#[classifier]
pub fn baseline_tc_end(_ctx: TcContext) -> i32 {
    TC_ACT_OK
}

#[cfg(not(test))]
#[panic_handler]
fn panic(_info: &core::panic::PanicInfo<'_>) -> ! {
    loop {}
}
