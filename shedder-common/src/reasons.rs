//! Why an attempt's verdict was reached: the reasons the packet path counts and samples, and
//! which of them mean a class wants more than it got.

/// Why the verdict was reached. Admissions: under the limits, below the class's floor, or
/// CRITICAL. Refusals, in the order the decision meets them: the class's ceiling; its
/// share ("priority": what the classes above it are given and the floors in use below it
/// leave); the service's total, counting this class and every class above it in full and
/// the classes below it only up to their floors ("service_limit", or "floors_below" when
/// the total is reached only because of those floors); the class's token bucket; the
/// source's fair share within its class; the class's retry budget.
pub const NUM_REASONS: u32 = 16;
/// Under the class and service limits.
pub const REASON_UNDER_LIMIT: u32 = 0;
/// The class was below its floor: admitted whatever the service's pressure.
pub const REASON_FLOOR: u32 = 1;
/// CRITICAL is never shed by pressure (only by its ceiling).
pub const REASON_CRITICAL: u32 = 2;
/// The class reached its hard ceiling.
pub const REASON_CEILING: u32 = 3;
/// The class reached its share: the rest of the limit is given to classes of higher
/// priority, or held by the floors in use below it.
pub const REASON_PRIORITY: u32 = 4;
/// The service is full with this class and the classes above it (and the floors in use
/// of the classes below).
pub const REASON_SERVICE_LIMIT: u32 = 5;
/// The class's new-connection token bucket was empty.
pub const REASON_RATE: u32 = 6;
/// A retry over the class's retry budget.
pub const REASON_RETRY_BUDGET: u32 = 7;
/// The source is over its fair share of its class while the class is contended.
pub const REASON_FAIR_SHARE: u32 = 8;
/// The service is full only because of the floors in use of the classes below this one.
pub const REASON_FLOORS_BELOW: u32 = 9;
/// An attempt from a source without standing ([`crate::proof`]) while the class already holds its
/// cap of such attempts (`ClassPolicy::unproven_cap`).
pub const REASON_UNPROVEN: u32 = 10;
/// The service holds its ceiling of established connections (`ServicePolicy::max_connections`):
/// a safety bound on what the node keeps open, busy or idle, not the controller's limit.
pub const REASON_CONNECTIONS: u32 = 11;
pub const REASON_NAMES: [&str; NUM_REASONS as usize] = [
    "under_limit",
    "floor",
    "critical",
    "ceiling",
    "priority",
    "service_limit",
    "rate",
    "retry_budget",
    "fair_share",
    "floors_below",
    "unproven",
    "connections",
    "reserved12",
    "reserved13",
    "reserved14",
    "reserved15",
];
/// Reasons that are used (the rest of [`REASON_NAMES`] are reserved and never counted).
pub const REASONS_IN_USE: u32 = 12;

/// The refusals that mean a class wants more of the service than it got, one bit per
/// reason: its share, the service's total, the floors below it, a source's fair share. Not
/// the ceiling, a token bucket or the retry budget, which are limits of their own. The
/// packet path re-decides these for fair shares and counts them per class; the daemon reads
/// them as demand.
pub const PRESSURE_REASONS: u32 = (1 << REASON_PRIORITY)
    | (1 << REASON_SERVICE_LIMIT)
    | (1 << REASON_FLOORS_BELOW)
    | (1 << REASON_FAIR_SHARE);

/// 1 if `reason` is one of [`PRESSURE_REASONS`], else 0 (a shift, not a comparison).
#[inline(always)]
pub const fn is_pressure(reason: u32) -> u32 {
    (PRESSURE_REASONS >> (reason & (NUM_REASONS - 1))) & 1
}
