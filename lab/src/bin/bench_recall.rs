//! `cargo xtask bench recall`: what recalling keep-alive connections does, with recall off
//! and on, in the keep-alive lab (`shedder_lab::keepalive_lab`): HIGH's 60 wrk
//! connections beside SHEDDABLE's load, either 540 more wrk connections over HTTP/1.1 or
//! h2load over HTTP/2 (10 connections, 50 requests in flight on each, a closed loop).
//! HTTP/2 carries many requests on one connection: shedder sees the connection busy, not
//! how many requests it holds, and a recall fails every one of them. Prints a Markdown
//! table. Root only; about 5 minutes.

use std::process::ExitCode;

use shedder_lab::keepalive_lab::{
    DEADLINE, Node, Outcome, RUN, Sheddable, describe, recalled_by_class,
};

fn main() -> ExitCode {
    if std::env::args().any(|a| a == "--help" || a == "-h") {
        eprintln!("bench_recall: no options; root only, about 5 minutes");
        return ExitCode::SUCCESS;
    }
    let node = Node::new("brc");
    println!(
        "capacity through haproxy: {:.0}/s; deadline {DEADLINE:?}\n",
        node.capacity
    );
    println!(
        "| SHEDDABLE's client | recall | goodput within deadline | HIGH success | SHEDDABLE answered | connections recalled (high / sheddable) |"
    );
    println!("|---|---|---|---|---|---|");
    for (label, sheddable) in [
        ("wrk, HTTP/1.1, 540 connections", Sheddable::Wrk),
        (
            "h2load, HTTP/2, 10 connections × 50 streams",
            Sheddable::H2 {
                clients: 10,
                streams: 50,
            },
        ),
    ] {
        for recall in [false, true] {
            let (high, shed, log) = node.run(recall, sheddable);
            let [rh, _, rs] = recalled_by_class(&log);
            let (goodput, answered, detail) = match shed {
                Outcome::Wrk(r) => (
                    high.goodput() + r.goodput(),
                    format!("{:.0}/s in time, {} reset", r.goodput(), r.read_errors),
                    describe("sheddable", &r),
                ),
                Outcome::H2(r) => {
                    // h2load's log covers the whole run (no warm-up): its rate in time.
                    let in_time = r.logged_in_time as f64 / RUN.as_secs_f64();
                    (
                        high.goodput() + in_time,
                        format!(
                            "{in_time:.0}/s in time, {:.0}/s in all",
                            r.logged_2xx as f64 / RUN.as_secs_f64()
                        ),
                        r.summary.replace('\n', "; "),
                    )
                }
            };
            println!(
                "| {label} | {} | {goodput:.0}/s ({:.0}%) | {:.3} | {answered} | {rh} / {rs} |",
                if recall { "on" } else { "off" },
                100.0 * goodput / node.capacity,
                high.success(),
            );
            eprintln!("  {}\n  {detail}", describe("high", &high));
        }
    }
    ExitCode::SUCCESS
}
