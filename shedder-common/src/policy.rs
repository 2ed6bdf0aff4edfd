//! What the daemon decides for each service and the packet path applies: the limits of
//! each class, the action and the mode.

use crate::ids::NUM_CLASSES;

/// Per-service action when an attempt is shed.
pub const ACTION_DROP: u8 = 0;
pub const ACTION_RST: u8 = 1;
/// Marks a written [`ServicePolicy`].
pub const POLICY_CONFIGURED: u8 = 0xa5;

/// Per-service mode.
pub const MODE_ENFORCE: u8 = 0;
pub const MODE_DRY_RUN: u8 = 1;
/// Off: every attempt passes, counted as passed; refusals are neither made nor sampled
/// (`shedder mode SERVICE off`). Any mode the packet path does not know is taken as off.
pub const MODE_OFF: u8 = 2;

/// Limits of one class of one service.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ClassPolicy {
    /// The class's share of the service limit, written by the controller each tick.
    pub limit: u32,
    /// The class's share when the heartbeat is stale.
    pub fallback_limit: u32,
    /// Occupancy below the floor is admitted whatever the service's pressure.
    pub floor: u32,
    /// The floor in force when the heartbeat is stale.
    pub fallback_floor: u32,
    /// Hard cap on the class's occupancy in every mode (finite for CRITICAL too).
    pub ceiling: u32,
    /// A source's admissions per epoch within its fair share; 0: the equal share of the
    /// previous epoch ([`crate::fair::quota`]).
    pub source_quota: u32,
    /// Token bucket: nanoseconds per token (1e9 / rate); 0 disables the bucket.
    pub rate_interval_ns: u64,
    /// Token bucket: burst × interval, the most a full bucket can hold, in nanoseconds.
    pub burst_ns: u64,
    /// What makes a source of this class: the address ANDed with these masks (network
    /// byte order, as the address is read), IPv4 in the first word.
    pub source_mask_v4: u32,
    pub source_mask_v6: [u32; 4],
    /// The floor as a share of the service's admissions over the window (this epoch and
    /// the last), in 1/[`crate::fair::BUDGET_ONE`]: while `floor` is 0 (the floor is less than one
    /// connection), a class that has had less is admitted whatever the pressure. At small
    /// limits a floor of a few percent is a fraction of one connection, which `floor` cannot
    /// hold; this holds it in admissions instead.
    pub floor_share: u32,
    /// Connections of the service's limit held free for the classes above this one: the
    /// class sees the service full at `total_limit - reserve` (a trunk reservation, see
    /// [`crate::admit`]); not applied with a stale heartbeat.
    pub reserve: u32,
    /// Admitted attempts from sources without standing ([`crate::proof`]) the class holds at
    /// most (its *bounded unproven part*); more are refused ([`crate::Reason::Unproven`]).
    pub unproven_cap: u32,
}

/// Everything the packet path needs to decide for one service (one array lookup).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ServicePolicy {
    pub classes: [ClassPolicy; NUM_CLASSES],
    /// Concurrency limit of the whole service (the controller's output).
    pub total_limit: u32,
    /// Concurrency limit of the whole service when the heartbeat is stale.
    pub fallback_total: u32,
    /// [`ACTION_DROP`] or [`ACTION_RST`].
    pub action: u8,
    /// [`MODE_ENFORCE`] or [`MODE_DRY_RUN`].
    pub mode: u8,
    /// Class of sources no prefix rule matches.
    pub default_class: u8,
    /// [`POLICY_CONFIGURED`] once userspace has written this entry. The policy array starts
    /// zeroed; a port mapped to an unwritten entry passes (fail open) instead of meeting
    /// all-zero limits.
    pub configured: u8,
    /// A new attempt from a source shed for this service within this many jiffies is a
    /// retry; 0 disables retry recognition.
    pub retry_window_jiffies: u32,
    /// 1: retries are decided one class lower ([`crate::demote`]); 0: only counted.
    pub demote_retries: u32,
    /// 1: sources share each class fairly ([`crate::fair`]); 0: first come, first served.
    pub fair_share: u32,
    /// Admitted retries per class are held to this fraction (in 1/[`crate::fair::BUDGET_ONE`])
    /// of admitted first attempts over the window, plus `retry_budget_min`; a fraction of
    /// 0 turns the budget off.
    pub retry_budget: u32,
    pub retry_budget_min: u32,
    /// Established connections (busy or idle) the service may hold: an attempt beyond is
    /// refused ([`crate::Reason::Connections`]) in every class and mode. A safety bound on what
    /// idle pools may pin, far above the limit on work; 0: none (the daemon always writes
    /// one).
    pub max_connections: u32,
    pub _pad: u32,
}

const _: () = {
    assert!(size_of::<ClassPolicy>() == 72);
    assert!(size_of::<ServicePolicy>() == 328);
};
