//! 64-bit atomics for map values shared between CPUs.
//!
//! The `bpfel-unknown-none` target is declared single-threaded with no compare-and-swap, so
//! `core::sync::atomic` operations would be lowered to plain loads and stores. These emit the
//! BPF atomic instructions directly (`BPF_ATOMIC | BPF_ADD`, and `BPF_CMPXCHG`, kernel 5.12+).

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

/// `*ptr -= 1` unless it is already 0, atomically; a few tries under contention. Returns
/// whether it decremented.
#[inline(always)]
pub unsafe fn decrement_if_positive(ptr: *mut u64) -> bool {
    let mut seen = unsafe { core::ptr::read_volatile(ptr) };
    let mut tries = 0;
    while tries < 4 {
        if seen == 0 {
            return false;
        }
        let found = unsafe { compare_exchange(ptr, seen, seen - 1) };
        if found == seen {
            return true;
        }
        seen = found;
        tries += 1;
    }
    false
}

/// If `*ptr == old`, store `new`. Returns the value found (equal to `old` on success).
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
