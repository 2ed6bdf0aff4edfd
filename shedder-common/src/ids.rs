//! Who an attempt is for and what became of it: the services a node protects and how a
//! packet finds its service, the classes of the criticality ladder, and the verdicts.

/// Services one node can protect. Sizes the policy, in-flight and counter maps.
pub const MAX_SERVICES: u32 = 256;
/// Entries of a port → service array (one per TCP port, and one per UDP port for QUIC).
pub const PORT_MAP_ENTRIES: u32 = 65536;
/// Address-specific service entries (service bound to one destination address).
pub const MAX_ADDR_SERVICES: u32 = 1024;

/// Port-map value: low bits hold `service id + 1` of the service listening on any address
/// (0 = the port is not protected).
pub const PORT_SERVICE_MASK: u32 = 0xffff;
/// Port-map value flag: services bound to specific destination addresses exist on this
/// port; look the (address, port) pair up in the address map first.
pub const PORT_HAS_ADDR_SERVICES: u32 = 1 << 31;

/// Key of the address-specific service map.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct ServiceAddrKey {
    /// IPv4 addresses in the first four bytes, the rest zero.
    pub addr: [u8; 16],
    /// Destination port, host byte order.
    pub port: u16,
    /// 4 or 6.
    pub family: u8,
    /// [`ADDR_KEY_TCP`] or [`ADDR_KEY_QUIC`]: a TCP and a QUIC service may share an
    /// address and port number (HTTP/2 and HTTP/3 on 443).
    pub proto: u8,
}

/// [`ServiceAddrKey::proto`] of a TCP service (0, as the field was padding before QUIC).
pub const ADDR_KEY_TCP: u8 = 0;
/// [`ServiceAddrKey::proto`] of a QUIC service (UDP's protocol number).
pub const ADDR_KEY_QUIC: u8 = 17;

/// The four-level criticality ladder (CRITICAL, HIGH, MEDIUM, SHEDDABLE, as Google's SRE
/// book names them). Lower id = more important.
pub const NUM_CLASSES: usize = 4;
pub const CLASS_CRITICAL: u32 = 0;
pub const CLASS_HIGH: u32 = 1;
pub const CLASS_MEDIUM: u32 = 2;
pub const CLASS_SHEDDABLE: u32 = 3;
pub const CLASS_NAMES: [&str; NUM_CLASSES] = ["critical", "high", "medium", "sheddable"];

/// What happened to a new connection attempt.
pub const NUM_VERDICTS: u32 = 4;
/// Admitted and passed to the stack.
pub const VERDICT_PASS: u32 = 0;
/// Shed with XDP_DROP / TC_ACT_SHOT.
pub const VERDICT_DROP: u32 = 1;
/// Shed by answering RST|ACK (XDP_TX / TC redirect).
pub const VERDICT_RST: u32 = 2;
/// Would have been shed, passed because the service is in dry-run mode.
pub const VERDICT_DRY_RUN: u32 = 3;
pub const VERDICT_NAMES: [&str; NUM_VERDICTS as usize] = ["pass", "drop", "rst", "dry_run"];

const _: () = {
    assert!(size_of::<ServiceAddrKey>() == 20);
    assert!(NUM_CLASSES.is_power_of_two());
};
