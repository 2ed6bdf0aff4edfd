//! Comparisons as masks, for the packet path's loops over classes.
//!
//! A branch in a loop the packet path runs for every class multiplies the paths the
//! verifier walks. Written as arithmetic (`x >> 63` on a signed value), a comparison
//! becomes a mask, but LLVM recognises the idiom and turns it back into a select, which
//! BPF (having no conditional move) compiles to a branch. On BPF the shift is therefore
//! written in inline assembly, which LLVM cannot see through; elsewhere (the daemon, the
//! unit tests) it is plain Rust with the same result.

/// All ones when `x < 0`, else 0.
#[inline(always)]
pub fn sign(x: i64) -> u64 {
    #[cfg(target_arch = "bpf")]
    {
        let mut v = x;
        // SAFETY: one ALU instruction on a register.
        unsafe {
            core::arch::asm!(
                "{v} s>>= 63",
                v = inout(reg) v,
                options(pure, nomem, nostack),
            );
        }
        v as u64
    }
    #[cfg(not(target_arch = "bpf"))]
    {
        (x >> 63) as u64
    }
}

/// All ones when `x == 0`, else 0.
#[inline(always)]
pub fn zero(x: u64) -> u64 {
    // (x | -x) has its top bit set exactly when x != 0.
    !sign((x | x.wrapping_neg()) as i64)
}

/// `min(a, b)` of two values below 2^63.
#[inline(always)]
pub fn min(a: u64, b: u64) -> u64 {
    let d = a.wrapping_sub(b) as i64;
    // d > 0: a - d = b; otherwise a.
    a - (d as u64 & !sign(d))
}

/// `x`, or 0 when `x` is negative as `i64` (a counter taken below zero by a race).
#[inline(always)]
pub fn non_negative(x: u64) -> u64 {
    x & !sign(x as i64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn masks_are_comparisons() {
        assert_eq!(sign(-1), u64::MAX);
        assert_eq!(sign(i64::MIN), u64::MAX);
        assert_eq!(sign(0), 0);
        assert_eq!(sign(5), 0);
        assert_eq!(non_negative(u64::MAX), 0);
        assert_eq!(non_negative(7), 7);
        assert_eq!(zero(0), u64::MAX);
        for x in [1, 2, 1 << 40, u64::MAX] {
            assert_eq!(zero(x), 0);
        }
        for (a, b) in [(0, 0), (3, 7), (7, 3), (u32::MAX as u64, 1), (5, 5)] {
            assert_eq!(min(a, b), a.min(b));
        }
    }
}
