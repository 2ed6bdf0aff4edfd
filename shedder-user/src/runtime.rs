//! The daemon's one runtime for side I/O, a tokio runtime on a thread of its own ("io"):
//! the control socket and the metrics endpoint ([`crate::api::http`]), the fleet's etcd
//! agent ([`crate::fleet`]) and the kernel debug log ([`crate::kernel::klog`]) all run on it
//! as tasks. The tick loop stays synchronous and never waits on it; they meet only through
//! channels and locks held briefly.

use std::sync::OnceLock;

/// The runtime for side I/O, started on first use.
pub fn handle() -> &'static tokio::runtime::Handle {
    static HANDLE: OnceLock<tokio::runtime::Handle> = OnceLock::new();
    HANDLE.get_or_init(|| {
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::Builder::new()
            .name("io".into())
            .spawn(move || {
                let rt = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .expect("building the I/O runtime");
                let _ = tx.send(rt.handle().clone());
                rt.block_on(std::future::pending::<()>());
            })
            .expect("spawning the I/O thread");
        rx.recv().expect("the I/O runtime starts")
    })
}
