//! Spoofed SYN floods against a protected service (see docs/design.md, *Proof of a
//! handshake*, and `shedder_lab::flood_lab`): 100,000 forged SYNs a second from random
//! addresses, ports and sequence numbers in one class's space, beside clients of every
//! class at 75% of capacity; then a real overload during a flood.

use shedder_lab::flood_lab::{CLIENTS, FLOOD_RATE, SPACES, overload, run, success};

/// Clients with standing keep their success through a flood of forged SYNs in any class's
/// space; CRITICAL keeps all of it; the limit and the demand the daemon sees do not move.
#[test]
fn a_spoofed_flood_takes_nothing_from_clients_with_standing() {
    shedder_lab::require_root();
    let calm = run("flcalm", None, true, None);
    let mut failures = Vec::new();
    for space in SPACES {
        let rate = Some(FLOOD_RATE);
        let kernel = run(&format!("flk{}", &space.0[..2]), Some(space), false, rate);
        let shed = run(&format!("fls{}", &space.0[..2]), Some(space), true, rate);
        for (i, (class, _, _)) in CLIENTS.iter().enumerate() {
            let (got, without, alone) = (shed.success[i], calm.success[i], kernel.success[i]);
            // At least 95% of the success without the flood, and at least the kernel
            // alone's (two points of sampling noise: 100 CRITICAL requests are judged).
            if got < 0.95 * without || got + 0.02 < alone {
                failures.push(format!(
                    "{} forged: {class} {got:.3} (without the flood {without:.3}, kernel alone {alone:.3})",
                    space.0
                ));
            }
        }
        if shed.success[0] < 1.0 {
            failures.push(format!(
                "{} forged: CRITICAL {:.3}, not 100%",
                space.0, shed.success[0]
            ));
        }
        let (lim, calm_lim) = (shed.limit.unwrap_or(0), calm.limit.unwrap_or(0));
        if (lim as f64 - calm_lim as f64).abs() > 0.1 * calm_lim as f64 {
            failures.push(format!(
                "{} forged: limit {lim}, without the flood {calm_lim}",
                space.0
            ));
        }
        let (off, calm_off) = (
            shed.offered.expect("offered"),
            calm.offered.expect("offered"),
        );
        for c in 0..3 {
            let (a, b) = (off[c] as f64, calm_off[c] as f64);
            if (a - b).abs() > 0.1 * b.max(10.0) {
                failures.push(format!(
                    "{} forged: class {c} offered {a} proven attempts, {b} without the flood",
                    space.0
                ));
            }
        }
        if shed.flood_rate < 0.9 * FLOOD_RATE {
            failures.push(format!(
                "{} forged: the generator reached {:.0}/s only",
                space.0, shed.flood_rate
            ));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// During a flood of forged SYNs in the default class's space, a real overload of 3× the
/// capacity from clients with standing still gets priority order and its goodput.
#[test]
fn an_overload_during_a_flood_keeps_priority_and_goodput() {
    shedder_lab::require_root();
    let (w, capacity, forged) = overload("flover", SPACES[0].1, 3.0, Some(FLOOD_RATE));
    let s = |c| success(&w, c);
    eprintln!(
        "forged {forged:.0}/s; goodput {:.0}/s of {capacity:.0}/s; success critical {:.3} high {:.3} medium {:.3} sheddable {:.3}",
        w.goodput(),
        s("critical"),
        s("high"),
        s("medium"),
        s("sheddable")
    );
    assert!(
        w.goodput() >= 0.85 * capacity,
        "goodput {:.0}/s, below 85% of {capacity:.0}/s",
        w.goodput()
    );
    assert!(s("critical") >= 0.99, "CRITICAL {:.3}", s("critical"));
    assert!(
        s("critical") >= s("high") && s("high") >= s("medium") && s("medium") >= s("sheddable"),
        "priority order: critical {:.3} high {:.3} medium {:.3} sheddable {:.3}",
        s("critical"),
        s("high"),
        s("medium"),
        s("sheddable")
    );
    assert!(forged >= 0.9 * FLOOD_RATE, "forged {forged:.0}/s");
}
