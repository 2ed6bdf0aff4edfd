//! Fleet mode: the etcd cluster the daemons share their limits through.

use super::Check;

/// Fleet mode: etcd answers at the configured endpoints, with the configured credentials.
pub(super) fn check_fleet(f: &crate::config::Fleet) -> Check {
    match crate::fleet::probe(f) {
        Ok(detail) => Check::ok("fleet", detail),
        Err(e) => Check::fail(
            "fleet",
            format!("etcd at {}: {e:#}", f.endpoints.join(",")),
            "start etcd or fix fleet.endpoints (and the TLS/auth files); without etcd the daemon \
             runs on each shared service's static share (global_limit × safety / max_nodes)",
        ),
    }
}
