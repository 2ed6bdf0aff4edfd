//! Does each configured service have a socket here to measure: a listening TCP socket on
//! one of its ports, or for a QUIC service a UDP socket bound to one?

use std::net::IpAddr;

use super::Check;
use crate::{
    config::{Config, Protocol, Service, socket_serves},
    kernel::{
        diag,
        version::{KernelVersion, QUIC_KERNEL},
    },
};

const NAME: &str = "service sockets";

/// With a QUIC service: whether this kernel is one whose verifier accepts the QUIC
/// programs (the daemon refuses a QUIC service where it did not load them).
pub fn check_quic_kernel(cfg: &Config, kernel: Option<KernelVersion>) -> Option<Check> {
    let s = cfg.services.iter().find(|s| s.protocol == Protocol::Quic)?;
    Some(match kernel {
        Some(k) if k >= QUIC_KERNEL => Check::ok(
            "quic",
            format!("Linux {k}: the QUIC programs load from {QUIC_KERNEL} on"),
        ),
        Some(k) => Check::fail(
            "quic",
            format!(
                "service `{}` is a QUIC service, but on Linux {k} the verifier refuses the QUIC                  programs (too complex for it); the daemon will refuse the configuration",
                s.name
            ),
            format!("run Linux {QUIC_KERNEL} or later, or remove the QUIC services"),
        ),
        None => Check::warn(
            "quic",
            "the kernel's version is unknown: whether the QUIC programs load is not known",
            format!("the QUIC programs were seen to load from Linux {QUIC_KERNEL} on"),
        ),
    })
}

/// One check per service, in the caller's network namespace.
pub fn check_sockets(cfg: &Config) -> Vec<Check> {
    let tcp =
        diag::listeners().map(|l| l.into_iter().map(|l| (l.addr, l.port)).collect::<Vec<_>>());
    let udp = if cfg.services.iter().any(|s| s.protocol == Protocol::Quic) {
        diag::udp_sockets().map(|u| u.into_iter().map(|u| (u.addr, u.port)).collect())
    } else {
        Ok(Vec::new())
    };
    cfg.services
        .iter()
        .map(|s| {
            let (found, kind) = match s.protocol {
                Protocol::Tcp => (&tcp, "listening TCP socket"),
                Protocol::Quic => (&udp, "UDP socket"),
            };
            match found {
                Ok(sockets) => verdict(s, kind, sockets),
                Err(e) => Check::warn(
                    NAME,
                    format!(
                        "service `{}`: sock_diag could not list sockets: {e}",
                        s.name
                    ),
                    "run doctor as root",
                ),
            }
        })
        .collect()
}

/// The verdict for `s` given the sockets (address, port) of its kind found here.
fn verdict(s: &Service, kind: &str, sockets: &[(IpAddr, u16)]) -> Check {
    let serves = |&(addr, port): &(IpAddr, u16)| socket_serves(&s.ports, &s.addresses, addr, port);
    let ports = s
        .ports
        .iter()
        .map(u16::to_string)
        .collect::<Vec<_>>()
        .join(", ");
    let n = sockets.iter().filter(|x| serves(x)).count();
    if n > 0 {
        Check::ok(
            NAME,
            format!(
                "service `{}` ({}): {n} {kind}(s) on port(s) {ports}",
                s.name,
                s.protocol.as_str()
            ),
        )
    } else {
        Check::warn(
            NAME,
            format!(
                "service `{}` ({}): no {kind} on port(s) {ports} in this network namespace: \
                 its attempts are decided, but its signals ({}) cannot be read here",
                s.name,
                s.protocol.as_str(),
                match s.protocol {
                    Protocol::Tcp => "accept queue",
                    Protocol::Quic => "receive queue and drops",
                }
            ),
            "start the service, or run doctor (and the daemon) in the service's network \
             namespace",
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg(text: &str) -> Config {
        Config::parse(&format!("[daemon]\ninterfaces = [\"eth0\"]\n{text}")).expect("valid")
    }

    #[test]
    fn quic_services_need_a_kernel_whose_verifier_takes_the_quic_programs() {
        let quic = cfg("[[service]]\nname = \"h3\"\nprotocol = \"quic\"\nports = [443]\n");
        let tcp = cfg("[[service]]\nname = \"web\"\nports = [443]\n");
        assert!(check_quic_kernel(&tcp, Some(KernelVersion::new(6, 1, 0))).is_none());
        let old = check_quic_kernel(&quic, Some(KernelVersion::new(6, 1, 0))).expect("a check");
        assert_eq!(old.status, super::super::Status::Fail);
        let new = check_quic_kernel(&quic, Some(KernelVersion::new(6, 12, 3))).expect("a check");
        assert_eq!(new.status, super::super::Status::Ok);
    }

    #[test]
    fn a_socket_on_a_port_of_the_service_is_found_by_address() {
        let c = cfg(
            "[[service]]\nname = \"h3\"\nprotocol = \"quic\"\nports = [443]\naddresses = [\"198.18.0.2\"]\n",
        );
        let s = &c.services[0];
        let any: IpAddr = "::".parse().unwrap();
        let mine: IpAddr = "198.18.0.2".parse().unwrap();
        let other: IpAddr = "198.18.0.3".parse().unwrap();
        assert_eq!(
            verdict(s, "UDP socket", &[(any, 443)]).status,
            super::super::Status::Ok
        );
        assert_eq!(
            verdict(s, "UDP socket", &[(mine, 443)]).status,
            super::super::Status::Ok
        );
        let w = verdict(s, "UDP socket", &[(other, 443), (mine, 80)]);
        assert_eq!(w.status, super::super::Status::Warn);
        assert!(
            w.detail.contains("no UDP socket on port(s) 443"),
            "{}",
            w.detail
        );
        assert!(w.detail.contains("receive queue and drops"), "{}", w.detail);
    }
}
