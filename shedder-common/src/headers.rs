//! Bounds of the packet path's walk through a packet's headers.

/// Longest IPv6 extension-header chain the packet path walks; a longer one is dropped
/// ([`crate::STAT_EXT_CHAIN_DROPPED`]). RFC 8200 §4.1 has each extension header occur once, the
/// destination options at most twice: hop-by-hop, destination options twice, routing,
/// fragment, authentication, mobility, HIP, shim6 and the two experimental values make
/// eleven, so a longer chain is not one a conforming sender builds.
pub const MAX_IPV6_EXT_HEADERS: usize = 12;
