//! Can the daemon recall keep-alive connections here: a kernel that closes a connection on
//! request (sock_diag `SOCK_DESTROY`), and work counted by requests (Linux 6.6), without
//! which recall is off.

use super::Check;
use crate::{
    config::{Config, Protocol},
    kernel::{
        diag,
        version::{DATA_EVENT_KERNEL, KernelVersion},
    },
};

const NAME: &str = "recall";

/// With a TCP service that recalls: whether this host lets it.
pub fn check_recall(cfg: &Config, kernel: Option<KernelVersion>) -> Option<Check> {
    let s = cfg
        .services
        .iter()
        .find(|s| s.protocol == Protocol::Tcp && s.recall_per_second > 0)?;
    Some(verdict(&s.name, kernel, diag::destroy_supported()))
}

fn verdict(
    service: &str,
    kernel: Option<KernelVersion>,
    supported: std::io::Result<bool>,
) -> Check {
    if let Some(k) = kernel.filter(|&k| k < DATA_EVENT_KERNEL) {
        return Check::warn(
            NAME,
            format!(
                "service `{service}` recalls keep-alive connections, but on Linux {k} work is \
                 counted per connection, not per request, and recall stays off: load over \
                 keep-alive connections is not shed"
            ),
            format!("run Linux {DATA_EVENT_KERNEL} or later"),
        );
    }
    match supported {
        Ok(true) => Check::ok(
            NAME,
            "the kernel closes connections on request (sock_diag SOCK_DESTROY): keep-alive \
             connections of classes over their bound can be recalled",
        ),
        Ok(false) => Check::warn(
            NAME,
            format!(
                "service `{service}` recalls keep-alive connections, but this kernel was built \
                 without CONFIG_INET_DIAG_DESTROY: load over keep-alive connections is not shed \
                 (the daemon counts what it would recall)"
            ),
            "use a kernel built with CONFIG_INET_DIAG_DESTROY=y (Debian's are), or set \
             recall_per_second = 0 to say so in the configuration",
        ),
        Err(e) => Check::warn(
            NAME,
            format!("could not ask the kernel whether it closes connections on request: {e}"),
            "run doctor as root",
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::doctor::Status;

    #[test]
    fn recall_needs_the_data_event_and_sock_destroy() {
        let k = |minor| Some(KernelVersion::new(6, minor, 0));
        assert_eq!(verdict("web", k(18), Ok(true)).status, Status::Ok);
        let old = verdict("web", k(1), Ok(true));
        assert_eq!(old.status, Status::Warn);
        assert!(old.detail.contains("per connection"), "{}", old.detail);
        let built = verdict("web", k(12), Ok(false));
        assert_eq!(built.status, Status::Warn);
        assert!(built.detail.contains("CONFIG_INET_DIAG_DESTROY"));
        assert_eq!(
            verdict("web", None, Err(std::io::Error::other("x"))).status,
            Status::Warn
        );
    }
}
