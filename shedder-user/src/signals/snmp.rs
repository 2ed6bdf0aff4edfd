//! UDP receive errors of the calling thread's network namespace, from
//! `/proc/thread-self/net/snmp` (`Udp:` lines) and `/proc/thread-self/net/snmp6`: the
//! datagrams the kernel could not queue for any socket, a QUIC service's among them.

use std::io;

use super::netstat::{named_values, number};

/// Cumulative counters since the namespace was created, IPv4 and IPv6 together.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct UdpCounters {
    /// Datagrams dropped because a socket's receive buffer was full (RcvbufErrors).
    pub receive_buffer_errors: u64,
    /// Datagrams that could not be delivered for any reason, those included (InErrors).
    pub errors: u64,
}

/// Read the counters of the calling thread's network namespace.
pub fn read() -> io::Result<UdpCounters> {
    let v4 = parse(&std::fs::read_to_string("/proc/thread-self/net/snmp")?)?;
    // A kernel without IPv6 has no snmp6 file: IPv4's counters are all there is.
    let v6 = match std::fs::read_to_string("/proc/thread-self/net/snmp6") {
        Ok(text) => parse6(&text)?,
        Err(e) if e.kind() == io::ErrorKind::NotFound => UdpCounters::default(),
        Err(e) => return Err(e),
    };
    Ok(UdpCounters {
        receive_buffer_errors: v4.receive_buffer_errors + v6.receive_buffer_errors,
        errors: v4.errors + v6.errors,
    })
}

/// Parse an snmp file: a pair of `Udp:` lines, names then values.
pub fn parse(text: &str) -> io::Result<UdpCounters> {
    let mut c = UdpCounters::default();
    let mut found = 0;
    for (name, value) in named_values(text, "Udp:")? {
        let slot = match name {
            "RcvbufErrors" => &mut c.receive_buffer_errors,
            "InErrors" => &mut c.errors,
            _ => continue,
        };
        *slot = number(name, value)?;
        found += 1;
    }
    if found < 2 {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            "Udp lacks RcvbufErrors or InErrors",
        ));
    }
    Ok(c)
}

/// Parse an snmp6 file: one `name value` pair a line.
pub fn parse6(text: &str) -> io::Result<UdpCounters> {
    let mut c = UdpCounters::default();
    for line in text.lines() {
        let mut words = line.split_whitespace();
        let (Some(name), Some(value)) = (words.next(), words.next()) else {
            continue;
        };
        match name {
            "Udp6RcvbufErrors" => c.receive_buffer_errors = number(name, value)?,
            "Udp6InErrors" => c.errors = number(name, value)?,
            _ => {}
        }
    }
    Ok(c)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_udp_lines_of_both_families() {
        let v4 = "Tcp: RtoAlgorithm\nTcp: 1\n\
                  Udp: InDatagrams NoPorts InErrors OutDatagrams RcvbufErrors SndbufErrors\n\
                  Udp: 66 0 7 68 5 0\n";
        assert_eq!(
            parse(v4).unwrap(),
            UdpCounters {
                receive_buffer_errors: 5,
                errors: 7
            }
        );
        assert!(parse("Udp: InDatagrams\nUdp: 1\n").is_err());
        let v6 = "Udp6InDatagrams 3\nUdp6InErrors                    \t2\nUdp6RcvbufErrors 1\n";
        assert_eq!(
            parse6(v6).unwrap(),
            UdpCounters {
                receive_buffer_errors: 1,
                errors: 2
            }
        );
    }

    #[test]
    fn reads_this_namespace() {
        read().unwrap();
    }
}
