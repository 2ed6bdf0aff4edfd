//! Can the daemon recall keep-alive connections here: a kernel that closes a connection on
//! request (sock_diag `SOCK_DESTROY`).

use super::Check;
use crate::{
    config::{Config, Protocol},
    kernel::diag,
};

const NAME: &str = "recall";

/// With a TCP service that recalls: whether this host lets it.
pub fn check_recall(cfg: &Config) -> Option<Check> {
    let s = cfg
        .services
        .iter()
        .find(|s| s.protocol == Protocol::Tcp && s.recall_per_second > 0)?;
    Some(verdict(&s.name, diag::destroy_supported()))
}

fn verdict(service: &str, supported: std::io::Result<bool>) -> Check {
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
    fn recall_needs_sock_destroy() {
        assert_eq!(verdict("web", Ok(true)).status, Status::Ok);
        let built = verdict("web", Ok(false));
        assert_eq!(built.status, Status::Warn);
        assert!(built.detail.contains("CONFIG_INET_DIAG_DESTROY"));
        assert_eq!(
            verdict("web", Err(std::io::Error::other("x"))).status,
            Status::Warn
        );
    }
}
