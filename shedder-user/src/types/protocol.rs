//! What a service's new connections are: the packet path keys its services by it.

use serde::Deserialize;

/// What a service's new connections are.
#[derive(Debug, Clone, Copy, Deserialize, PartialEq, Eq, Hash, Default)]
#[serde(rename_all = "lowercase")]
pub enum Protocol {
    /// TCP: the attempts are SYNs to the ports.
    #[default]
    Tcp,
    /// QUIC (HTTP/3) over UDP: the attempts are Initial packets of QUIC v1 or v2 to the
    /// ports.
    Quic,
}

impl Protocol {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Tcp => "tcp",
            Self::Quic => "quic",
        }
    }

    /// The transport the ports are of.
    pub fn transport(self) -> &'static str {
        match self {
            Self::Tcp => "TCP",
            Self::Quic => "UDP",
        }
    }
}
