//! Listen-queue overflow and SYN-cookie counters from `/proc/<thread>/net/netstat`
//! (`TcpExt:` lines), for the calling thread's network namespace.

use std::io;

/// Cumulative counters since boot (or namespace creation).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ListenCounters {
    /// Connections dropped because an accept queue was full.
    pub overflows: u64,
    /// All drops at a listening socket (overflows included).
    pub drops: u64,
    /// SYN cookies the kernel sent (a listener's SYN queue was full: a flood, or a burst),
    /// cookies it accepted back, and cookies that failed its check.
    pub syncookies_sent: u64,
    pub syncookies_received: u64,
    pub syncookies_failed: u64,
}

/// Read the counters of the calling thread's network namespace.
pub fn read() -> io::Result<ListenCounters> {
    parse(&std::fs::read_to_string("/proc/thread-self/net/netstat")?)
}

/// Parse a netstat file: pairs of `TcpExt:` lines, names then values.
pub fn parse(text: &str) -> io::Result<ListenCounters> {
    let mut counters = ListenCounters::default();
    let mut found = 0;
    for (name, value) in named_values(text, "TcpExt:")? {
        let slot = match name {
            "ListenOverflows" => &mut counters.overflows,
            "ListenDrops" => &mut counters.drops,
            "SyncookiesSent" => {
                counters.syncookies_sent = number(name, value)?;
                continue;
            }
            "SyncookiesRecv" => {
                counters.syncookies_received = number(name, value)?;
                continue;
            }
            "SyncookiesFailed" => {
                counters.syncookies_failed = number(name, value)?;
                continue;
            }
            _ => continue,
        };
        *slot = number(name, value)?;
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

/// The (name, value) pairs of the first two lines starting with `prefix` in a
/// `/proc/net/netstat`-style file: a line of names, then a line of values.
pub(super) fn named_values<'a>(
    text: &'a str,
    prefix: &str,
) -> io::Result<impl Iterator<Item = (&'a str, &'a str)>> {
    let mut lines = text.lines().filter(|l| l.starts_with(prefix));
    let (Some(names), Some(values)) = (lines.next(), lines.next()) else {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("no {prefix} lines"),
        ));
    };
    Ok(names
        .split_whitespace()
        .zip(values.split_whitespace())
        .skip(1))
}

/// A counter's value, or an error naming it.
pub(super) fn number(name: &str, value: &str) -> io::Result<u64> {
    value
        .parse()
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidData, format!("{name}={value}")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_tcpext() {
        let text = "TcpExt: SyncookiesSent SyncookiesRecv SyncookiesFailed ListenOverflows ListenDrops TCPBacklogDrop\n\
                    TcpExt: 7 5 1 12 15 3\n\
                    IpExt: InNoRoutes\nIpExt: 0\n";
        assert_eq!(
            parse(text).unwrap(),
            ListenCounters {
                overflows: 12,
                drops: 15,
                syncookies_sent: 7,
                syncookies_received: 5,
                syncookies_failed: 1,
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
