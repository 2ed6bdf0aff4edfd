//! Load over keep-alive connections is shed by recall (see `shedder_lab::keepalive_lab`):
//! 60 HIGH and 540 SHEDDABLE wrk connections, each with a second of thought between
//! requests, offer 3× the capacity over connections the gate admitted while the service was
//! idle. Recall closes SHEDDABLE's keep-alive connections as the class goes over its bound,
//! and their clients' next connections meet the gate. HTTP/2 is measured in
//! `cargo xtask bench recall`.

use shedder_lab::keepalive_lab::{
    DEADLINE, HIGH_CONNECTIONS, Node, SHEDDABLE_CONNECTIONS, Sheddable, THINK, describe, recalls,
};

/// 3× the capacity over keep-alive connections: with recall, goodput within the deadline
/// is at least 85% of capacity and HIGH's success at least 95%; the same run with recall
/// off is shown beside it, and loses both.
#[test]
fn load_over_keep_alive_is_shed_by_recall() {
    let node = Node::new("rka");
    let offered = (HIGH_CONNECTIONS + SHEDDABLE_CONNECTIONS) as f64 / THINK.as_secs_f64();
    eprintln!(
        "capacity through haproxy {:.0}/s; offered about {offered:.0}/s over {} keep-alive \
         connections",
        node.capacity,
        HIGH_CONNECTIONS + SHEDDABLE_CONNECTIONS
    );
    let (off_high, off_shed, off_log) = node.run(false, Sheddable::Wrk);
    let off_shed = off_shed.wrk();
    let off_goodput = off_high.goodput() + off_shed.goodput();
    eprintln!("recall off: goodput within {DEADLINE:?} {off_goodput:.0}/s");
    eprintln!("  {}", describe("high", &off_high));
    eprintln!("  {}", describe("sheddable", &off_shed));
    // Without recall the lab must overload, or the run with it proves nothing.
    assert!(
        off_goodput < 0.85 * node.capacity && off_high.success() < 0.95,
        "without recall the lab did not overload: goodput {off_goodput:.0}/s, HIGH {:.3}",
        off_high.success()
    );
    assert!(
        !off_log.contains("recalled keep-alive"),
        "recall_per_second = 0 recalled:\n{off_log}"
    );

    let (high, shed, log) = node.run(true, Sheddable::Wrk);
    let shed = shed.wrk();
    let goodput = high.goodput() + shed.goodput();
    eprintln!("recall on: goodput within {DEADLINE:?} {goodput:.0}/s");
    eprintln!("  {}", describe("high", &high));
    eprintln!("  {}", describe("sheddable", &shed));
    let recalled = recalls(&log);
    eprintln!("{}", recalled.join("\n"));
    assert!(!recalled.is_empty(), "nothing recalled:\n{log}");
    assert!(
        goodput >= 0.85 * node.capacity,
        "goodput within the deadline {goodput:.0}/s < 85% of {:.0}/s (recall off: {off_goodput:.0}/s)",
        node.capacity
    );
    assert!(
        high.success() >= 0.95,
        "HIGH's success {:.3} < 0.95 (recall off: {:.3})",
        high.success(),
        off_high.success()
    );
    assert_eq!(
        high.read_errors, 0,
        "a HIGH connection was reset while only SHEDDABLE was over its bound"
    );
}
