//! The version of the pinned maps' layout.

/// The layout of the pinned maps: which maps there are, their types, sizes and what their
/// values mean. A daemon adopts the maps an earlier run pinned only when that run's layout
/// is this one and every map's shape agrees; any other set is replaced (docs/operations.md,
/// *Upgrades and rollbacks*). Bump it whenever a map is added, removed or resized, or a
/// value's meaning changes: a unit test of the daemon holds the maps' shapes against the
/// layout they were recorded under, and fails until this is bumped.
///
/// Layout 1 is also what an unmarked set of pins is (versions before the marker).
pub const LAYOUT: u32 = 1;
