//! `[classes]`: the criticality ladder, and the source prefixes that place a client on it.

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
