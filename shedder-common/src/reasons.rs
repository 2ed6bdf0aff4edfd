//! Why an attempt's verdict was reached: the reasons the packet path counts and samples, and
//! which of them mean a class wants more than it got.

/// Why the verdict was reached. Admissions: under the limits, below the class's floor, or
/// CRITICAL. Refusals, in the order the decision meets them: the class's ceiling; its
/// share ("priority": what the classes above it are given and the floors in use below it
/// leave); the service's total, counting this class and every class above it in full and
/// the classes below it only up to their floors ("service_limit", or "floors_below" when
/// the total is reached only because of those floors); the class's token bucket; the
/// source's fair share within its class; the class's retry budget.
///
/// The packet path carries a reason as its number (`Reason::Rate as u32`): the decision
/// picks one with masks the verifier follows as arithmetic, and the number indexes the
/// counters ([`crate::decision_index`]) and is written in samples. Userspace reads a
/// number back with [`Reason::from_u32`], which has no reason for a number it does not
/// know (an object of another version wrote it): callers show that one as unknown.
#[repr(u8)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Reason {
    /// Under the class and service limits.
    UnderLimit = 0,
    /// The class was below its floor: admitted whatever the service's pressure.
    Floor = 1,
    /// CRITICAL is never shed by pressure (only by its ceiling).
    Critical = 2,
    /// The class reached its hard ceiling.
    Ceiling = 3,
    /// The class reached its share: the rest of the limit is given to classes of higher
    /// priority, or held by the floors in use below it.
    Priority = 4,
    /// The service is full with this class and the classes above it (and the floors in use
    /// of the classes below).
    ServiceLimit = 5,
    /// The class's new-connection token bucket was empty.
    Rate = 6,
    /// A retry over the class's retry budget.
    RetryBudget = 7,
    /// The source is over its fair share of its class while the class is contended.
    FairShare = 8,
    /// The service is full only because of the floors in use of the classes below this one.
    FloorsBelow = 9,
    /// An attempt from a source without standing ([`crate::proof`]) while the class already
    /// holds its cap of such attempts (`ClassPolicy::unproven_cap`).
    Unproven = 10,
    /// The service holds its ceiling of established connections
    /// (`ServicePolicy::max_connections`): a safety bound on what the node keeps open, busy
    /// or idle, not the controller's limit.
    Connections = 11,
}

impl Reason {
    /// Every reason, in the order of their numbers.
    pub const ALL: [Reason; 12] = [
        Reason::UnderLimit,
        Reason::Floor,
        Reason::Critical,
        Reason::Ceiling,
        Reason::Priority,
        Reason::ServiceLimit,
        Reason::Rate,
        Reason::RetryBudget,
        Reason::FairShare,
        Reason::FloorsBelow,
        Reason::Unproven,
        Reason::Connections,
    ];

    /// The reason numbered `n`, or `None` for a number no reason has.
    pub const fn from_u32(n: u32) -> Option<Self> {
        if (n as usize) < Self::ALL.len() {
            Some(Self::ALL[n as usize])
        } else {
            None
        }
    }

    /// Its name in counters, metrics, logs and status output.
    pub const fn name(self) -> &'static str {
        match self {
            Reason::UnderLimit => "under_limit",
            Reason::Floor => "floor",
            Reason::Critical => "critical",
            Reason::Ceiling => "ceiling",
            Reason::Priority => "priority",
            Reason::ServiceLimit => "service_limit",
            Reason::Rate => "rate",
            Reason::RetryBudget => "retry_budget",
            Reason::FairShare => "fair_share",
            Reason::FloorsBelow => "floors_below",
            Reason::Unproven => "unproven",
            Reason::Connections => "connections",
        }
    }
}

impl TryFrom<u32> for Reason {
    /// The number no reason has.
    type Error = u32;

    fn try_from(n: u32) -> Result<Self, u32> {
        Self::from_u32(n).ok_or(n)
    }
}

/// Decision counters per (class, verdict), one per reason number: more than there are
/// reasons, so that a reason added later leaves the counters' layout, and so the pinned
/// maps, as they are. A power of two: the packet path masks a reason with it.
pub const REASON_SLOTS: u32 = 16;

/// The refusals that mean a class wants more of the service than it got, one bit per
/// reason: its share, the service's total, the floors below it, a source's fair share. Not
/// the ceiling, a token bucket or the retry budget, which are limits of their own. The
/// packet path re-decides these for fair shares and counts them per class; the daemon reads
/// them as demand.
pub const PRESSURE_REASONS: u32 = (1 << Reason::Priority as u32)
    | (1 << Reason::ServiceLimit as u32)
    | (1 << Reason::FloorsBelow as u32)
    | (1 << Reason::FairShare as u32);

/// 1 if `reason` is one of [`PRESSURE_REASONS`], else 0 (a shift, not a comparison).
#[inline(always)]
pub const fn is_pressure(reason: u32) -> u32 {
    (PRESSURE_REASONS >> (reason & (REASON_SLOTS - 1))) & 1
}

const _: () = {
    assert!(REASON_SLOTS.is_power_of_two());
    assert!(Reason::ALL.len() <= REASON_SLOTS as usize);
    // `from_u32` indexes `ALL` by number.
    let mut i = 0;
    while i < Reason::ALL.len() {
        assert!(Reason::ALL[i] as usize == i);
        i += 1;
    }
};

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reasons_read_back_from_their_numbers_and_others_do_not() {
        for r in Reason::ALL {
            assert_eq!(Reason::from_u32(r as u32), Some(r));
            assert_eq!(Reason::try_from(r as u32), Ok(r));
        }
        for n in [12, 15, 16, 255, u32::MAX] {
            assert_eq!(Reason::from_u32(n), None, "{n}");
            assert_eq!(Reason::try_from(n), Err(n));
        }
    }

    #[test]
    fn reason_names_are_the_exported_labels() {
        // Metric labels, counters output and logs carry these: renaming one breaks dashboards.
        let names = Reason::ALL.map(Reason::name);
        assert_eq!(
            names,
            [
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
            ]
        );
    }

    #[test]
    fn pressure_is_share_total_floors_below_and_fair_share() {
        let pressed: std::vec::Vec<Reason> = Reason::ALL
            .into_iter()
            .filter(|&r| is_pressure(r as u32) == 1)
            .collect();
        assert_eq!(
            pressed,
            [
                Reason::Priority,
                Reason::ServiceLimit,
                Reason::FairShare,
                Reason::FloorsBelow
            ]
        );
        // Numbers past the reasons are masked into the slots, never shifted out of range.
        assert_eq!(is_pressure(Reason::Priority as u32 + REASON_SLOTS), 1);
        assert_eq!(is_pressure(u32::MAX), 0);
    }
}
