//! Classes by source prefix: the rules of the IPv4 and IPv6 tries, and for IPv4 a direct
//! lookup (DIR-16-8), an exact accelerator of the trie: the first level has one `u32` per
//! /16 source prefix, the second level blocks of 256 `u8` cells, one per /24. A first-level
//! entry or a cell is
//! - [`CLASS_CELL_NONE`]: no rule covers any of it (the service default applies);
//! - `1 + class`: every address in it has that class;
//! - [`CLASS_CELL_TRIE`]: it holds a rule longer than the table resolves: ask the trie;
//!
//! and a first-level entry with [`CLASS_L1_BLOCK`] set points at second-level block
//! `entry & 0xffff`. Userspace builds both levels from the same rules as the trie.

/// Source-prefix class rules, per address family.
pub const MAX_CLASS_RULES: u32 = 16384;
/// IPv4 class lookup table, first level: one entry per /16.
pub const CLASS_L1_ENTRIES: u32 = 65536;
/// IPv4 class lookup table, second level: blocks of 256 /24 cells, in two halves that
/// alternate between policy generations (so a reader never sees a block rewritten under it).
pub const CLASS_L2_BLOCKS: u32 = 2048;

pub const CLASS_CELL_NONE: u32 = 0;
pub const CLASS_CELL_TRIE: u32 = 0xff;
pub const CLASS_L1_BLOCK: u32 = 1 << 16;

/// What a cell says: `Some(Some(class))`, `Some(None)` (no rule: the default), or
/// `None` (ask the trie).
#[inline(always)]
pub fn decode(cell: u32) -> Option<Option<u32>> {
    // One range test rather than a match, so the packet path carries the class as a
    // range [0, 3], not four constants the verifier would explore separately.
    let class = cell.wrapping_sub(1);
    if class < 4 {
        Some(Some(class))
    } else if cell == CLASS_CELL_NONE {
        Some(None)
    } else {
        None
    }
}

/// A second-level block of the IPv4 class table: one cell per /24.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ClassBlock {
    pub cell: [u8; 256],
}

impl Default for ClassBlock {
    fn default() -> Self {
        Self { cell: [0; 256] }
    }
}

/// Value of the class tries: the class id.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ClassRule {
    pub class: u32,
}

const _: () = {
    assert!(size_of::<ClassRule>() == 4);
    assert!(size_of::<ClassBlock>() == 256);
};
