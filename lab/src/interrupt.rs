//! Ctrl-C and SIGTERM for the long-running binaries (the demo, the overload benchmark):
//! the signal only sets a flag, which their loops check, so they stop their load and remove
//! what they made on the way out.

use std::sync::atomic::{AtomicBool, Ordering};

static INTERRUPTED: AtomicBool = AtomicBool::new(false);

extern "C" fn on_interrupt(_: libc::c_int) {
    INTERRUPTED.store(true, Ordering::SeqCst);
}

/// Route SIGINT and SIGTERM to [`interrupted`].
pub fn install() {
    for sig in [libc::SIGINT, libc::SIGTERM] {
        // SAFETY: the handler only stores to an atomic.
        unsafe { libc::signal(sig, on_interrupt as *const () as libc::sighandler_t) };
    }
}

/// Whether SIGINT or SIGTERM arrived since [`install`].
pub fn interrupted() -> bool {
    INTERRUPTED.load(Ordering::SeqCst)
}
