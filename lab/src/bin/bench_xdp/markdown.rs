//! The report in Markdown: the XDP table with its method and the verifier's figures, and
//! the egress table.

use shedder_lab::policy::{HIGH_V4, PORT_DROP};

use super::{
    egress::{response, syn_ack},
    paths::syn,
    programs::{Hook, Method},
    report::{Report, Row, xdp_baseline},
};

pub fn thousands(n: u64) -> String {
    let digits = n.to_string();
    let mut out = String::new();
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

/// A row's figures as table cells: ns/packet, the baseline's, the difference, the ratio.
fn figures(r: &Row) -> String {
    format!(
        "{:.1} | {:.1} | {:.1} | {:.2}×",
        r.ns,
        r.baseline_ns,
        r.ns - r.baseline_ns,
        r.ratio
    )
}

pub fn markdown(report: &Report) -> String {
    let m = &report.machine;
    let repeated_proven = format!(
        "repeat {} × {} rounds",
        report.repeat.min(u32::from(u8::MAX)),
        report.rounds
    );
    let repeated = format!(
        "repeat {} × {} rounds",
        thousands(report.repeat.into()),
        report.rounds
    );
    let single = format!("single-shot × {}", thousands(report.single_calls as u64));
    let mut md = String::new();
    md.push_str("### XDP per-packet cost (BPF_PROG_TEST_RUN)\n\n");
    md.push_str(&format!(
        "Machine: Linux {} {}, {}, {} CPU(s). IPv4 frames from {HIGH_V4} (a HIGH-class \
         prefix); SYNs of {} bytes with MSS, SACK, timestamps and window scale.\n\n",
        m.kernel,
        m.arch,
        m.cpu,
        m.nproc,
        syn(PORT_DROP).bytes().len()
    ));
    md.push_str(
        "| path | returns | method | ns/packet | baseline ns | ns over baseline | × baseline | target | result |\n",
    );
    md.push_str("|---|---|---|---:|---:|---:|---:|---:|---|\n");
    for r in report.rows.iter().filter(|r| r.hook == Hook::Xdp) {
        let method = match r.method {
            Method::Repeated if r.proven => &repeated_proven,
            Method::Repeated => &repeated,
            Method::SingleShot => &single,
        };
        let (target, result) = match (r.target, r.pass) {
            (Some(t), Some(pass)) => (
                format!("≤ {t:.1}×"),
                if pass { "PASS" } else { "FAIL" }.to_string(),
            ),
            _ => ("—".into(), "—".into()),
        };
        md.push_str(&format!(
            "| {} | {} | {method} | {} | {target} | {result} |\n",
            r.path.replace('|', "\\|"),
            r.action,
            figures(r)
        ));
    }
    md.push_str(&format!(
        "\n*{repeated}*: one BPF_PROG_TEST_RUN call per round runs the program {} times on \
         the same frame; the kernel reports the mean per run in whole ns; the median of the \
         rounds is shown, rounds interleaved across all programs and paths. \
         *{single}*: calls with repeat = 1 (the RST path rewrites its frame, so a repeat \
         would make every later run see the RST, not the SYN); the median per-call time is \
         shown, the baseline measured the same way in the same run, and the ratio is to that \
         baseline. A single-shot time includes the kernel's fixed per-call timing overhead, \
         which both sides share, and a path costs more single-shot than repeated (each call \
         starts on a fresh copy of the frame, after a system call); SYN-drop is measured both \
         ways to show by how much.\n",
        thousands(report.repeat.into())
    ));
    if let Some(e) = &report.rst_estimate {
        md.push_str(&format!(
            "\nSYN-RST on the repeated basis (an estimate, not a target: repeated SYN-drop + \
             single-shot SYN-RST − single-shot SYN-drop): {:.0} ns/packet, {:.2}× the \
             repeated baseline.\n",
            e.ns, e.ratio
        ));
    }
    if let (Some(repeated_base), Some(single_base)) = (
        xdp_baseline(&report.rows, Method::Repeated),
        xdp_baseline(&report.rows, Method::SingleShot),
    ) {
        for r in report
            .rows
            .iter()
            .filter(|r| r.path.starts_with("SYN flood"))
        {
            // What the program adds to an empty one, single-shot, on top of what an empty
            // program costs per packet when repeated: the per-call overhead left out.
            let ns = r.ns - single_base + repeated_base;
            md.push_str(&format!(
                "\n{}: {:.0} ns per SYN on the repeated basis (the single-shot figure less the \
                 single-shot baseline, plus the repeated baseline), about {:.1} million SYNs \
                 a second per core.\n",
                r.path,
                ns,
                1e3 / ns
            ));
        }
    }
    let list = |v: &[(String, Option<u32>)]| -> String {
        v.iter()
            .map(|(name, n)| match n {
                Some(n) => format!("{name} {}", thousands((*n).into())),
                None => format!("{name} (not reported by this kernel)"),
            })
            .collect::<Vec<_>>()
            .join(", ")
    };
    md.push_str(&format!(
        "
Verifier: instructions processed per program: {}. With `daemon.kernel_debug_log` (the log \
         sites, pruned by the verifier when it is off, are verified too): {}.\n",
        list(&report.verified_insns),
        list(&report.verified_insns_logging)
    ));
    md.push_str(&egress_markdown(report, &repeated));
    md
}

/// The egress rows' table: no targets, only what the program costs.
pub fn egress_markdown(report: &Report, repeated: &str) -> String {
    let mut md = String::new();
    md.push_str("\n### TC egress per-packet cost (BPF_PROG_TEST_RUN)\n\n");
    md.push_str(&format!(
        "The egress program ({}), which every segment the host sends passes, beside an \
         empty TC classifier, both run on the same {}-byte frame of a server's response \
         (a SYN-ACK is {} bytes) with skb test runs in the rounds above: {repeated}, the \
         median of the rounds' means. No target: what it costs is reported. The tracked \
         connection is made beforehand through its handshake (the SYN-ACK through the \
         egress program, the client's ACK through the XDP program); every call must return \
         TCX_NEXT (on to the next program) and leave the frame unchanged, and afterwards the tracking must be as the \
         row says (the connection tracked and idle, none, or the recorded handshake \
         completed by the client's ACK). A test run builds the whole frame in the socket \
         buffer's linear part, as the stack does a segment's headers; a response's payload, \
         which the stack keeps in pages, is not read either way.\n\n",
        shedder_common::programs::EGRESS,
        response(PORT_DROP).bytes().len(),
        syn_ack(PORT_DROP).bytes().len(),
    ));
    md.push_str("| path | returns | ns/packet | baseline ns | ns over baseline | × baseline |\n");
    md.push_str("|---|---|---:|---:|---:|---:|\n");
    for r in report.rows.iter().filter(|r| r.hook == Hook::TcEgress) {
        md.push_str(&format!(
            "| {} | {} | {} |\n",
            r.path.replace('|', "\\|"),
            r.action,
            figures(r)
        ));
    }
    md
}
