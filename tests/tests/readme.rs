//! The README's status table against the code (no root needed): the protocols the packet
//! path decides are named as working and none of them as planned, and the operator surface
//! names every verb of the command line (taken from `shedder-user/golden/help.txt`, which
//! the CLI's own unit test keeps equal to `--help`). The count of fixture runs is checked
//! where the fixture table is built (`fixtures.rs`).

use shedder::config::Protocol;
use shedder_tests::markdown::cells;
use shedder_tests::read_repo_file;

/// How the README names a protocol. A new variant fails to compile here until it is named.
fn readme_name(p: Protocol) -> &'static str {
    match p {
        Protocol::Tcp => "TCP",
        Protocol::Quic => "QUIC",
    }
}

const PROTOCOLS: [Protocol; 2] = [Protocol::Tcp, Protocol::Quic];

/// The rows of the table under `## Status`, by area: (works today, limits today, planned).
fn status_table(readme: &str) -> Vec<(String, [String; 3])> {
    let section = readme
        .split("\n## ")
        .find(|s| s.starts_with("Status\n"))
        .expect("README.md has a `## Status` section");
    let mut rows = section
        .lines()
        .skip_while(|l| !l.starts_with('|'))
        .take_while(|l| l.starts_with('|'));
    let header = cells(rows.next().expect("a header row"));
    assert_eq!(
        header,
        ["area", "works today", "limits today", "planned"],
        "the status table's columns changed: update this test"
    );
    rows.skip(1) // the |---| line
        .map(|l| {
            let c = cells(l);
            assert_eq!(c.len(), 4, "a status row without four cells: {l}");
            (c[0].clone(), [c[1].clone(), c[2].clone(), c[3].clone()])
        })
        .collect()
}

/// The verbs listed under `Commands:` of `shedder --help`.
fn verbs(help: &str) -> Vec<String> {
    let top = help
        .split("==> ")
        .find(|s| s.starts_with("shedder --help\n"))
        .expect("help.txt has `shedder --help`");
    top.lines()
        .skip_while(|l| *l != "Commands:")
        .skip(1)
        .take_while(|l| !l.trim().is_empty())
        .filter_map(|l| l.split_whitespace().next())
        .filter(|v| *v != "help")
        .map(str::to_string)
        .collect()
}

fn check(readme: &str, help: &str) -> Vec<String> {
    let rows = status_table(readme);
    let mut errors = Vec::new();
    let row = |area: &str| rows.iter().find(|(a, _)| a == area).map(|(_, c)| c);
    match row("packet path") {
        None => errors.push("no `packet path` row".to_string()),
        Some([works, _, _]) => {
            for p in PROTOCOLS {
                if !works.contains(readme_name(p)) {
                    errors.push(format!(
                        "`packet path` does not name {} under `works today`, though the \
                         packet path decides it (protocol = \"{}\")",
                        readme_name(p),
                        p.as_str()
                    ));
                }
            }
        }
    }
    for (area, [works, limits, planned]) in &rows {
        for p in PROTOCOLS {
            let name = readme_name(p);
            if planned.contains(name) {
                errors.push(format!("`{area}` plans {name}, which works today"));
            }
            let only = format!("{name} only");
            if area == "packet path" && (works.contains(&only) || limits.contains(&only)) {
                errors.push(format!("`{area}` says `{only}`"));
            }
        }
    }
    match row("operator surface") {
        None => errors.push("no `operator surface` row".to_string()),
        Some([works, _, _]) => {
            for verb in verbs(help) {
                if !works.contains(&format!("`{verb}`")) {
                    errors.push(format!(
                        "`operator surface` does not name the verb `{verb}`"
                    ));
                }
            }
        }
    }
    errors
}

#[test]
fn the_status_table_says_what_the_code_does() {
    let errors = check(
        &read_repo_file("README.md"),
        &read_repo_file("shedder-user/golden/help.txt"),
    );
    assert!(errors.is_empty(), "README.md:\n{}", errors.join("\n"));
}

/// The check fails on the stale shapes it exists for.
#[test]
fn the_check_catches_a_stale_table() {
    let help = "==> shedder --help\nx\n\nCommands:\n  run   Run\n  status  S\n  help  H\n\n";
    let table = |packet: &str, planned: &str, surface: &str| {
        format!(
            "# x\n\n## Status\n\n| area | works today | limits today | planned |\n|---|---|---|---|\n\
             | packet path | {packet} | — | {planned} |\n| operator surface | {surface} | — | — |\n\n## Next\n"
        )
    };
    assert!(
        check(
            &table("TCP SYNs, QUIC Initials", "—", "`run`, `status`"),
            help
        )
        .is_empty()
    );
    let e = check(&table("TCP only", "QUIC", "`run`"), help);
    assert!(e.iter().any(|e| e.contains("does not name QUIC")), "{e:?}");
    assert!(e.iter().any(|e| e.contains("plans QUIC")), "{e:?}");
    assert!(e.iter().any(|e| e.contains("says `TCP only`")), "{e:?}");
    assert!(e.iter().any(|e| e.contains("verb `status`")), "{e:?}");
}
