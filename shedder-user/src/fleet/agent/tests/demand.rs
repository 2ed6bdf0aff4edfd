//! This node's demand as it publishes it: taken from the daemon's moving means when it has
//! moved (a tenth and half a connection), at most every 500 ms; any change at all after
//! 5 s.

use std::time::Duration;

use super::*;

impl Node {
    /// The daemon's report of db with its rates: `attempts` MEDIUM attempts a second, 45
    /// admitted, 18 connections held (a hold of 400 ms), the kernel at 18.
    fn report_rates(&mut self, attempts: f64) {
        let r = Report {
            applied: 18,
            established: 18,
            rates: Some(([0.0, 0.0, attempts, 0.0], 45.0)),
        };
        self.local.report("db", r, self.now.at);
    }
}

/// The MEDIUM need a step published, if it put this node's record.
fn published_need(wrote: &Wrote) -> Option<f64> {
    let put = wrote
        .raise
        .as_ref()
        .map(|t| &t.then[0])
        .or(wrote.put.as_ref())?;
    Some(written(put).demand["db"].need[2])
}

#[test]
fn a_demand_that_moved_is_published_at_most_every_half_second() {
    let mut n = Node::new("demand");
    n.report_rates(45.0);
    n.join(&[], 10);
    assert_eq!(published_need(&n.step(true)), Some(18.0));
    // 75 attempts a second over the whole window: a need of 30, published at once.
    n.advance(Duration::from_millis(1500));
    n.report_rates(75.0);
    assert_eq!(published_need(&n.step(true)), Some(30.0));
    // 120 a second for the last 300 ms: a mean of 84, a need of 33.6; published once
    // 500 ms have passed since the last change.
    n.advance(Duration::from_millis(300));
    n.report_rates(120.0);
    assert_eq!(published_need(&n.step(true)), None);
    n.advance(Duration::from_millis(199));
    assert_eq!(published_need(&n.step(true)), None);
    n.advance(Duration::from_millis(1));
    assert_eq!(published_need(&n.step(true)), Some(33.6));
}

#[test]
fn a_small_change_of_demand_is_published_after_five_seconds() {
    let mut n = Node::new("demand");
    n.report_rates(45.0);
    n.join(&[], 10);
    n.step(true);
    // 46 attempts a second: a need of 18.4, too little a move to publish at once.
    n.advance(Duration::from_millis(1500));
    n.report_rates(46.0);
    assert_eq!(published_need(&n.step(true)), None);
    n.advance(Duration::from_millis(3499));
    assert_eq!(published_need(&n.step(true)), None);
    n.advance(Duration::from_millis(1));
    assert_eq!(published_need(&n.step(true)), Some(18.4));
}
