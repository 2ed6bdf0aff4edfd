//! Where the packet path is attached on an interface.

use serde::Deserialize;

#[derive(Debug, Clone, Copy, Deserialize, PartialEq, Eq, Default)]
#[serde(rename_all = "lowercase")]
pub enum Attach {
    /// Native XDP, generic XDP where the driver has none; on a veth with `rst`, TC (see
    /// [`crate::kernel::netdev::choose`]).
    #[default]
    Auto,
    /// Native (driver) XDP only.
    Native,
    /// Generic (skb) XDP only.
    Generic,
    /// TC ingress (a tcx link on Linux 6.6+, a netlink cls_bpf filter before).
    Tc,
}

impl Attach {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Auto => "auto",
            Self::Native => "native",
            Self::Generic => "generic",
            Self::Tc => "tc",
        }
    }
}
