//! Listen-queue overflow counters from `/proc/<thread>/net/netstat` (`TcpExt:` lines), for
//! the calling thread's network namespace.

use std::io;

/// Cumulative counters since boot (or namespace creation).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ListenCounters {
    /// Connections dropped because an accept queue was full.
    pub overflows: u64,
    /// All drops at a listening socket (overflows included).
    pub drops: u64,
}

/// Read the counters of the calling thread's network namespace.
pub fn read() -> io::Result<ListenCounters> {
    parse(&std::fs::read_to_string("/proc/thread-self/net/netstat")?)
}

/// Parse a netstat file: pairs of `TcpExt:` lines, names then values.
pub fn parse(text: &str) -> io::Result<ListenCounters> {
    let mut lines = text.lines().filter(|l| l.starts_with("TcpExt:"));
    let (Some(names), Some(values)) = (lines.next(), lines.next()) else {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            "no TcpExt lines",
        ));
    };
    let mut counters = ListenCounters::default();
    let mut found = 0;
    for (name, value) in names
        .split_whitespace()
        .zip(values.split_whitespace())
        .skip(1)
    {
        let slot = match name {
            "ListenOverflows" => &mut counters.overflows,
            "ListenDrops" => &mut counters.drops,
            _ => continue,
        };
        *slot = value
            .parse()
            .map_err(|_| io::Error::new(io::ErrorKind::InvalidData, format!("{name}={value}")))?;
        found += 1;
    }
    if found < 2 {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            "TcpExt lacks ListenOverflows or ListenDrops",
        ));
    }
    Ok(counters)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_tcpext() {
        let text = "TcpExt: SyncookiesSent ListenOverflows ListenDrops TCPBacklogDrop\n\
                    TcpExt: 0 12 15 3\n\
                    IpExt: InNoRoutes\nIpExt: 0\n";
        assert_eq!(
            parse(text).unwrap(),
            ListenCounters {
                overflows: 12,
                drops: 15
            }
        );
        assert!(parse("IpExt: A\nIpExt: 1\n").is_err());
        assert!(parse("TcpExt: ListenOverflows\nTcpExt: 1\n").is_err());
    }

    #[test]
    fn reads_this_namespace() {
        // Every Linux network namespace has these counters.
        read().unwrap();
    }
}
