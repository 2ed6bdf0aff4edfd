//! The house's rule, checked: each folder uses only the folders listed before it in the
//! crate's documentation (`lib.rs`), and `kernel/` takes plain values, never the
//! configuration or the controllers. Read from the sources, so a new import that breaks
//! the order fails here, not in a review.

use std::{
    collections::{BTreeMap, BTreeSet},
    fs,
    path::{Path, PathBuf},
};

fn src() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("src")
}

/// The folders in the order `lib.rs` lists them (`//! - [`name`]: ...`).
fn stated_order() -> Vec<String> {
    let lib = fs::read_to_string(src().join("lib.rs")).expect("read lib.rs");
    lib.lines()
        .filter_map(|l| l.strip_prefix("//! - [`"))
        .filter_map(|l| l.split_once('`').map(|(name, _)| name.to_string()))
        .collect()
}

/// The text with `//` comments removed (doc links name modules without importing them).
fn code(text: &str) -> String {
    text.lines()
        .map(|l| l.split_once("//").map_or(l, |(code, _)| code))
        .collect::<Vec<_>>()
        .join("\n")
}

/// The first path segments a `{ ... }` group names at its top level (`a::b, c` gives a, c).
fn group_heads(group: &str) -> Vec<String> {
    let mut heads = Vec::new();
    let (mut depth, mut at_start) = (0, true);
    let mut current = String::new();
    for ch in group.chars() {
        match ch {
            '{' => depth += 1,
            '}' => depth -= 1,
            ',' if depth == 0 => {
                heads.push(std::mem::take(&mut current));
                at_start = true;
                continue;
            }
            _ => {}
        }
        if depth == 0 && at_start {
            if ch.is_alphanumeric() || ch == '_' {
                current.push(ch);
            } else if !current.is_empty() {
                at_start = false;
            }
        }
    }
    heads.push(current);
    heads.into_iter().filter(|h| !h.is_empty()).collect()
}

/// The crate's top-level modules a file's code refers to through `crate::`.
fn uses(text: &str) -> BTreeSet<String> {
    let text = code(text);
    let mut found = BTreeSet::new();
    let mut rest = text.as_str();
    while let Some(i) = rest.find("crate::") {
        rest = &rest[i + "crate::".len()..];
        if let Some(inner) = rest.strip_prefix('{') {
            let mut depth = 1;
            let end = inner
                .char_indices()
                .find(|&(_, c)| {
                    depth += match c {
                        '{' => 1,
                        '}' => -1,
                        _ => 0,
                    };
                    depth == 0
                })
                .map_or(inner.len(), |(i, _)| i);
            found.extend(group_heads(&inner[..end]));
        } else {
            let name: String = rest
                .chars()
                .take_while(|c| c.is_alphanumeric() || *c == '_')
                .collect();
            found.insert(name);
        }
    }
    found
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in fs::read_dir(dir).expect("read a source folder") {
        let path = entry.expect("a source entry").path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// For each folder of the stated order, the folders its files use, with one file each.
fn imports(order: &[String]) -> BTreeMap<String, BTreeMap<String, PathBuf>> {
    let mut all = BTreeMap::new();
    for module in order {
        let mut files = Vec::new();
        let dir = src().join(module);
        if dir.is_dir() {
            rust_files(&dir, &mut files);
        } else {
            files.push(src().join(format!("{module}.rs")));
        }
        let mut used = BTreeMap::new();
        for file in files {
            let text = fs::read_to_string(&file).expect("read a source file");
            for name in uses(&text) {
                if order.contains(&name) && &name != module {
                    used.entry(name).or_insert_with(|| file.clone());
                }
            }
        }
        all.insert(module.clone(), used);
    }
    all
}

#[test]
fn the_reader_finds_paths_and_groups_but_not_comments() {
    let text = "use crate::{\n    config::{Config, Prefix},\n    kernel::{self, maps},\n};\n\
                // crate::daemon is only named here\nlet x = crate::signals::read();\n";
    let found: Vec<_> = uses(text).into_iter().collect();
    assert_eq!(found, ["config", "kernel", "signals"]);
}

#[test]
fn every_folder_uses_only_those_listed_before_it() {
    let order = stated_order();
    assert!(
        order.len() >= 10 && order.first().map(String::as_str) == Some("types"),
        "lib.rs lists its folders, plain values first: {order:?}"
    );
    let imports = imports(&order);
    let mut wrong = Vec::new();
    for (i, module) in order.iter().enumerate() {
        for (used, file) in &imports[module] {
            if !order[..i].contains(used) {
                wrong.push(format!("{} uses {used}", file.display()));
            }
        }
    }
    assert!(
        wrong.is_empty(),
        "imports against lib.rs's order:\n{wrong:#?}"
    );
}

#[test]
fn the_kernel_side_takes_plain_values() {
    let imports = imports(&stated_order());
    let kernel = &imports["kernel"];
    for forbidden in ["config", "control"] {
        assert!(
            !kernel.contains_key(forbidden),
            "{} uses {forbidden}: kernel/ takes plain values",
            kernel[forbidden].display()
        );
    }
}

/// The folders in the drawing of `docs/development.md`, bottom to top.
fn drawn_order() -> Vec<String> {
    let doc = Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/development.md");
    let doc = fs::read_to_string(doc).expect("read docs/development.md");
    let (_, rest) = doc.split_once("<!-- layers").expect("the drawing's marker");
    let (drawing, _) = rest.split_once("<!-- /layers -->").expect("its end");
    let mut names: Vec<String> = drawing
        .lines()
        .filter_map(|l| l.trim_start().strip_prefix("│ "))
        .filter_map(|l| l.split_whitespace().next())
        .filter(|name| name.chars().all(|c| c.is_ascii_lowercase() || c == '_'))
        .map(String::from)
        .collect();
    names.reverse();
    names
}

#[test]
fn the_drawing_in_the_docs_is_the_stated_order() {
    assert_eq!(drawn_order(), stated_order());
}
