//! 64-bit atomics for map values shared between CPUs.
//!
//! The `bpfel-unknown-none` target is declared single-threaded with no compare-and-swap, so
//! `core::sync::atomic` operations would be lowered to plain loads and stores. These emit the
//! BPF atomic instructions directly: `BPF_ATOMIC | BPF_ADD` (`BPF_XADD`, every kernel), and
//! `BPF_CMPXCHG`, which needs Linux 5.12 and is therefore used only by the QUIC programs
//! (6.12); the TCP path makes do with additions so that it loads on 5.10.

use core::arch::asm;

/// `*ptr += value`, atomically.
#[inline(always)]
pub unsafe fn add(ptr: *mut u64, value: u64) {
    unsafe {
        asm!(
            "lock *(u64 *)({p} + 0) += {v}",
            p = in(reg) ptr,
            v = in(reg) value,
            options(nostack),
        );
    }
}

/// `*ptr += value`, atomically (32-bit).
#[inline(always)]
pub unsafe fn add32(ptr: *mut u32, value: u32) {
    unsafe {
        asm!(
            "lock *(u32 *)({p} + 0) += {v}",
            p = in(reg) ptr,
            v = in(reg) value,
            options(nostack),
        );
    }
}

/// `*ptr -= 1` unless it reads 0 or less; returns whether it took one. Without
/// compare-and-swap, two CPUs that both read 1 may both take one: the counter is then
/// `-1` as `i64`, which its readers clamp to 0 (see `shedder_common::Pending::count`), and
/// the next increment brings it back. The error is one count for the rest of the counter's
/// short life (a hold slot), never a count stuck high.
#[inline(always)]
pub unsafe fn decrement_if_positive(ptr: *mut u64) -> bool {
    let seen = unsafe { core::ptr::read_volatile(ptr) };
    if (seen as i64) <= 0 {
        return false;
    }
    unsafe { add(ptr, u64::MAX) };
    true
}

/// If `*ptr == old`, store `new`. Returns the value found (equal to `old` on success).
/// Linux 5.12: only for the QUIC programs, which need 6.12 anyway.
#[inline(always)]
pub unsafe fn compare_exchange(ptr: *mut u64, old: u64, new: u64) -> u64 {
    let found: u64;
    unsafe {
        asm!(
            "r0 = cmpxchg_64({p} + 0, r0, {n})",
            p = in(reg) ptr,
            n = in(reg) new,
            inout("r0") old => found,
            options(nostack),
        );
    }
    found
}
