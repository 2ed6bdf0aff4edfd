//! `[classes]`: the criticality ladder, and the source prefixes that place a client on it.

use std::{fmt, net::IpAddr};

use serde::Deserialize;
use shedder_common::NUM_CLASSES;

use super::defaults;

/// One rung of the criticality ladder.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct Class {
    /// Source prefixes (CIDR) in this class.
    #[serde(default)]
    pub sources: Vec<String>,
    /// Fraction of the service limit this class keeps under overload (not for critical).
    pub floor: Option<f64>,
    /// Fraction of the service's max_limit this class may never exceed.
    pub ceiling: Option<f64>,
    /// What counts as one source when the class is shared fairly: an IPv4 address masked
    /// to this prefix length (default 24: one tenant's /24; 32: an address).
    #[serde(default = "defaults::source_prefix_v4")]
    pub source_prefix_v4: u8,
    /// The same for IPv6 (default 64: one host's or one site's /64; 128: an address).
    #[serde(default = "defaults::source_prefix_v6")]
    pub source_prefix_v6: u8,
}

impl Default for Class {
    fn default() -> Self {
        Self {
            sources: Vec::new(),
            floor: None,
            ceiling: None,
            source_prefix_v4: defaults::source_prefix_v4(),
            source_prefix_v6: defaults::source_prefix_v6(),
        }
    }
}

impl Class {
    /// The critical class of a file that describes none: no sources, and the default
    /// ceiling (critical is never shed by pressure, so it needs one).
    pub fn critical() -> Self {
        Self {
            ceiling: Some(defaults::critical_ceiling()),
            ..Self::default()
        }
    }
}

#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct Classes {
    #[serde(default = "Class::critical")]
    pub critical: Class,
    #[serde(default)]
    pub high: Class,
    #[serde(default)]
    pub medium: Class,
    #[serde(default)]
    pub sheddable: Class,
}

impl Default for Classes {
    fn default() -> Self {
        Self {
            critical: Class::critical(),
            high: Class::default(),
            medium: Class::default(),
            sheddable: Class::default(),
        }
    }
}

impl Classes {
    pub fn by_id(&self) -> [&Class; NUM_CLASSES] {
        [&self.critical, &self.high, &self.medium, &self.sheddable]
    }
}

#[derive(Debug, Clone, Copy, Deserialize, PartialEq, Eq, Default)]
#[serde(rename_all = "lowercase")]
pub enum ClassName {
    Critical,
    High,
    #[default]
    Medium,
    Sheddable,
}

impl ClassName {
    pub fn id(self) -> u32 {
        match self {
            Self::Critical => 0,
            Self::High => 1,
            Self::Medium => 2,
            Self::Sheddable => 3,
        }
    }
}

/// A parsed IP prefix.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Prefix {
    pub addr: IpAddr,
    pub len: u32,
}

impl Prefix {
    pub fn parse(s: &str) -> Result<Self, String> {
        let (addr, len) = match s.split_once('/') {
            Some((a, l)) => (a, Some(l)),
            None => (s, None),
        };
        let addr: IpAddr = addr
            .trim()
            .parse()
            .map_err(|_| format!("`{s}` is not an IP prefix (expected e.g. 198.18.10.0/24)"))?;
        let max = if addr.is_ipv4() { 32 } else { 128 };
        let len = match len {
            Some(l) => l
                .trim()
                .parse::<u32>()
                .ok()
                .filter(|&l| l <= max)
                .ok_or_else(|| format!("`{s}`: prefix length must be 0..={max}"))?,
            None => max,
        };
        // Host bits must be zero: `198.18.10.1/24` is almost always a typo.
        let masked = mask(addr, len);
        if masked != addr {
            return Err(format!(
                "`{s}` has host bits set (did you mean {masked}/{len}?)"
            ));
        }
        Ok(Self { addr, len })
    }

    /// Whether `addr` is inside the prefix (an address of the other family never is).
    pub fn contains(&self, addr: IpAddr) -> bool {
        addr.is_ipv4() == self.addr.is_ipv4() && mask(addr, self.len) == self.addr
    }
}

fn mask(addr: IpAddr, len: u32) -> IpAddr {
    match addr {
        IpAddr::V4(a) => {
            let m = if len == 0 { 0 } else { u32::MAX << (32 - len) };
            IpAddr::V4((u32::from(a) & m).into())
        }
        IpAddr::V6(a) => {
            let m = if len == 0 {
                0
            } else {
                u128::MAX << (128 - len)
            };
            IpAddr::V6((u128::from(a) & m).into())
        }
    }
}

impl fmt::Display for Prefix {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.addr, self.len)
    }
}
