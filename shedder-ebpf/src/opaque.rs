//! Bounds the verifier must see.
//!
//! LLVM removes a mask it can prove redundant (an index it knows to be below the array's
//! length), but the verifier of older kernels tracks less: Linux 6.1 loses the bounds of a
//! counter index built with shifts and ORs, and then rejects the access as possibly out of
//! bounds. A mask written in inline assembly is opaque to LLVM, so it stays in the program
//! where the verifier sees it.

use core::arch::asm;

/// `value & mask`, kept in the program whatever LLVM knows of `value`.
#[inline(always)]
pub fn mask(value: u64, mask: u64) -> u64 {
    let mut v = value;
    // SAFETY: one ALU instruction on registers.
    unsafe {
        asm!(
            "{v} &= {m}",
            v = inout(reg) v,
            m = in(reg) mask,
            options(pure, nomem, nostack),
        );
    }
    v
}
