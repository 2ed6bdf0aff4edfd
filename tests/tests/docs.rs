//! The documentation against the code (no root needed):
//!
//! - `docs/configuration.md` is the configuration reference: per section a table
//!   `| key | type | default | meaning |`. Every key it lists is accepted by the real parser
//!   (each section written out with the documented examples parses); the parser accepts no
//!   key it does not list; a literal default is what the parser fills in for an omitted key;
//!   a *required* key is required; its ```toml examples parse.
//! - `deploy/shedder.toml` uses exactly the documented keys, counting the commented-out
//!   `# key = value` examples and the keys inside inline tables.
//! - Every relative link in `README.md`, `CHANGELOG.md`, `docs/*.md` and `deploy/*.md`
//!   points to a file that exists and, with a `#fragment`, to a heading in it.

use shedder_tests::markdown::cells;
use shedder_tests::{read_repo_file, repo_root};
use std::{
    collections::{BTreeMap, BTreeSet},
    path::{Path, PathBuf},
};

use shedder::config::{Config, ConfigError};

const REFERENCE: &str = "docs/configuration.md";
const EXAMPLE: &str = "deploy/shedder.toml";
const CLASSES: [&str; 4] = ["critical", "high", "medium", "sheddable"];
/// The class a `<class>` section is written out as.
const SOME_CLASS: &str = "high";

fn fail(errors: &[String]) {
    assert!(errors.is_empty(), "\n{}\n", errors.join("\n"));
}

// ---------------------------------------------------------------------------------------
// The reference, read from its tables.

#[derive(Debug, Clone)]
enum Dflt {
    /// A TOML value in backticks: what the parser fills in.
    Literal(String),
    Required,
    /// Described in words (`none: the host name`): not checkable as a value.
    Described,
}

#[derive(Debug, Clone)]
struct Key {
    name: String,
    default: Dflt,
    /// The `e.g. `…`` of the last column, if any.
    example: Option<String>,
    line: usize,
}

impl Key {
    /// The value the key is written with when the reference's examples are put together.
    fn example(&self) -> Option<&str> {
        match (&self.example, &self.default) {
            (Some(e), _) => Some(e),
            (None, Dflt::Literal(d)) => Some(d),
            _ => None,
        }
    }
}

/// Section (`daemon`, `classes.<class>`, `service`, `service.rate.<class>`, …) → its keys,
/// in the order of the document.
#[derive(Debug)]
struct Reference {
    sections: Vec<(String, Vec<Key>)>,
}

/// The text of a cell that is exactly one code span.
fn code_span(cell: &str) -> Option<&str> {
    let inner = cell.strip_prefix('`')?.strip_suffix('`')?;
    (!inner.contains('`')).then_some(inner)
}

fn parse_reference(text: &str) -> Reference {
    let mut sections: Vec<(String, Vec<Key>)> = Vec::new();
    let mut current: Option<usize> = None;
    let mut in_fence = false;
    for (i, line) in text.lines().enumerate() {
        if line.trim_start().starts_with("```") {
            in_fence = !in_fence;
            continue;
        }
        if in_fence {
            continue;
        }
        if line.starts_with('#') {
            // A heading that is a section name in code (`[daemon]`, `[[service]]`) starts a
            // section; any other heading ends it.
            let title = line.trim_start_matches('#').trim();
            current = code_span(title).and_then(|t| t.strip_prefix('[')).map(|t| {
                let t = t.trim_start_matches('[').trim_end_matches(']');
                sections.push((t.to_string(), Vec::new()));
                sections.len() - 1
            });
            continue;
        }
        let (Some(s), true) = (current, line.starts_with('|')) else {
            continue;
        };
        let c = cells(line);
        let Some(name) = code_span(&c[0]) else {
            continue; // the header row and its rule
        };
        assert_eq!(
            c.len(),
            4,
            "{REFERENCE}:{}: a row has 4 cells: {line}",
            i + 1
        );
        let default = match code_span(&c[2]) {
            Some(v) => Dflt::Literal(v.to_string()),
            None if c[2] == "*required*" => Dflt::Required,
            None => Dflt::Described,
        };
        let example = c[3]
            .rsplit_once("e.g. `")
            .map(|(_, e)| e.split('`').next().unwrap_or("").to_string());
        sections[s].1.push(Key {
            name: name.to_string(),
            default,
            example,
            line: i + 1,
        });
    }
    Reference { sections }
}

fn reference() -> Reference {
    let r = parse_reference(&read_repo_file(REFERENCE));
    let names: Vec<&str> = r.sections.iter().map(|(s, _)| s.as_str()).collect();
    for s in ["daemon", "classes", "service", "fleet"] {
        assert!(
            names.contains(&s),
            "{REFERENCE} has no `[{s}]` section: {names:?}"
        );
    }
    r
}

// ---------------------------------------------------------------------------------------
// Configuration documents put together from sections.

/// A minimal configuration that validates: one interface, one service, a fleet (so that
/// `global_limit` and the `[fleet]` keys can be tried on it).
fn base() -> BTreeMap<String, Vec<(String, String)>> {
    let kv = |k: &str, v: &str| (k.to_string(), v.to_string());
    BTreeMap::from([
        ("daemon".to_string(), vec![kv("interfaces", r#"["eth0"]"#)]),
        (
            "service".to_string(),
            vec![kv("name", r#""web""#), kv("ports", "[8080]")],
        ),
        (
            "fleet".to_string(),
            vec![
                kv("endpoints", r#"["http://198.18.0.21:2379"]"#),
                kv("max_nodes", "10"),
            ],
        ),
    ])
}

type Doc = BTreeMap<String, Vec<(String, String)>>;

fn set(doc: &mut Doc, section: &str, key: &str, value: &str) {
    let keys = doc.entry(section.to_string()).or_default();
    keys.retain(|(k, _)| k != key);
    keys.push((key.to_string(), value.to_string()));
}

fn unset(doc: &mut Doc, section: &str, key: &str) {
    if let Some(keys) = doc.get_mut(section) {
        keys.retain(|(k, _)| k != key);
    }
}

/// The TOML text of a document, sections in the reference's order (which is one TOML
/// accepts: `[service.rate.high]` after `[[service]]`), empty sections left out.
fn render(r: &Reference, doc: &Doc) -> String {
    let mut out = String::new();
    for (section, _) in &r.sections {
        let Some(keys) = doc.get(section).filter(|k| !k.is_empty()) else {
            continue;
        };
        let name = section.replace("<class>", SOME_CLASS);
        if section == "service" {
            out.push_str("[[service]]\n");
        } else {
            out.push_str(&format!("[{name}]\n"));
        }
        for (k, v) in keys {
            out.push_str(&format!("{k} = {v}\n"));
        }
        out.push('\n');
    }
    out
}

/// The base, with the required keys of `section` (at their examples) when it is a section
/// the base does not have.
fn base_for(r: &Reference, section: &str) -> Doc {
    let mut doc = base();
    if !doc.contains_key(section) {
        for k in keys_of(r, section) {
            if let (Dflt::Required, Some(e)) = (&k.default, k.example()) {
                set(&mut doc, section, &k.name, e);
            }
        }
    }
    doc
}

fn keys_of<'a>(r: &'a Reference, section: &str) -> &'a [Key] {
    r.sections
        .iter()
        .find(|(s, _)| s == section)
        .map_or(&[], |(_, k)| k.as_slice())
}

fn parse(text: &str) -> Result<Config, ConfigError> {
    Config::parse(text)
}

/// An error without its line: the same refusal from two texts whose lines differ.
fn refusal(e: &ConfigError) -> (String, String) {
    (e.field.clone(), e.message.clone())
}

// ---------------------------------------------------------------------------------------
// (b) Every documented key is accepted; every accepted key is documented.

#[test]
fn every_documented_key_is_accepted_with_its_example() {
    let r = reference();
    let mut errors = Vec::new();
    for (section, keys) in &r.sections {
        let mut doc = base_for(&r, section);
        for k in keys {
            match k.example() {
                Some(e) => set(&mut doc, section, &k.name, e),
                None => errors.push(format!(
                    "{REFERENCE}:{}: [{section}] {}: no literal default and no `e.g. …` example",
                    k.line, k.name
                )),
            }
        }
        let text = render(&r, &doc);
        if let Err(e) = parse(&text) {
            errors.push(format!(
                "[{section}] written with the documented examples is refused: {e}\n{text}"
            ));
        }
    }
    fail(&errors);
}

/// The keys the parser accepts in a table, from its refusal of an unknown one
/// ("unknown key, expected one of `a`, `b`, …" or "… expected `a` or `b`").
fn accepted_keys(text: &str) -> BTreeSet<String> {
    let e = parse(text).expect_err("an unknown key must be refused");
    let expected = e
        .message
        .strip_prefix("unknown key, ")
        .unwrap_or_else(|| panic!("not an unknown-key refusal: {e}\n{text}"));
    expected
        .split('`')
        .skip(1)
        .step_by(2)
        .map(str::to_string)
        .collect()
}

#[test]
fn the_parser_accepts_no_key_the_reference_leaves_out() {
    let r = reference();
    let mut errors = Vec::new();
    const UNKNOWN: &str = "zz_not_a_key";
    for (section, keys) in &r.sections {
        let mut doc = base_for(&r, section);
        set(&mut doc, section, UNKNOWN, "1");
        let accepted = accepted_keys(&render(&r, &doc));
        let documented: BTreeSet<String> = keys.iter().map(|k| k.name.clone()).collect();
        for k in accepted.difference(&documented) {
            errors.push(format!(
                "[{section}] {k}: accepted by the parser, not in {REFERENCE}"
            ));
        }
        for k in documented.difference(&accepted) {
            errors.push(format!(
                "[{section}] {k}: in {REFERENCE}, not a key the parser knows"
            ));
        }
    }
    // The top level: the sections themselves.
    let top = accepted_keys(&format!("{UNKNOWN} = 1\n{}", render(&r, &base())));
    let roots: BTreeSet<String> = r
        .sections
        .iter()
        .map(|(s, _)| s.split('.').next().unwrap().to_string())
        .collect();
    if top != roots {
        errors.push(format!(
            "top-level tables: the parser has {top:?}, {REFERENCE} {roots:?}"
        ));
    }
    fail(&errors);
}

/// The fenced ```toml blocks of a Markdown text, with the line each starts on.
fn toml_blocks(text: &str) -> Vec<(String, usize)> {
    let mut out = Vec::new();
    let mut block: Option<(String, usize)> = None;
    for (i, line) in text.lines().enumerate() {
        let fence = line.trim_start().starts_with("```");
        match &mut block {
            Some(_) if fence => out.push(block.take().unwrap()),
            Some((b, _)) => {
                b.push_str(line);
                b.push('\n');
            }
            None if fence && line.trim() == "```toml" => block = Some((String::new(), i + 1)),
            None => {}
        }
    }
    out
}

#[test]
fn the_reference_s_example_files_parse() {
    let blocks = toml_blocks(&read_repo_file(REFERENCE));
    assert!(!blocks.is_empty(), "{REFERENCE} shows no ```toml example");
    let errors: Vec<String> = blocks
        .iter()
        .filter_map(|(b, line)| {
            parse(b)
                .err()
                .map(|e| format!("{REFERENCE}:{line}: the example is refused: {e}"))
        })
        .collect();
    fail(&errors);
}

// ---------------------------------------------------------------------------------------
// (c) The documented defaults are the parser's.

#[test]
fn documented_defaults_are_what_the_parser_fills_in() {
    let r = reference();
    let mut errors = Vec::new();
    let mut checked = 0;
    for (section, keys) in &r.sections {
        for k in keys {
            let mut without = base_for(&r, section);
            unset(&mut without, section, &k.name);
            let omitted = parse(&render(&r, &without));
            match &k.default {
                Dflt::Literal(d) => {
                    let mut with = without.clone();
                    set(&mut with, section, &k.name, d);
                    let written = parse(&render(&r, &with));
                    checked += 1;
                    let same = match (&omitted, &written) {
                        // The parser keeps whether the file set demote_retries (writing
                        // `true` is refused where retry recognition is off); what it means
                        // is `demotes_retries()`.
                        (Ok(a), Ok(b)) if section == "service" && k.name == "demote_retries" => {
                            a.services[0].demotes_retries() == b.services[0].demotes_retries()
                        }
                        (Ok(a), Ok(b)) => a == b,
                        (Err(a), Err(b)) => refusal(a) == refusal(b),
                        _ => false,
                    };
                    if !same {
                        errors.push(format!(
                            "{REFERENCE}:{}: [{section}] {} = {d} is documented as the default, \
                             but leaving it out gives\n  {omitted:?}\nand writing it gives\n  \
                             {written:?}",
                            k.line, k.name
                        ));
                    }
                }
                Dflt::Required => {
                    checked += 1;
                    if omitted.is_ok() {
                        errors.push(format!(
                            "{REFERENCE}:{}: [{section}] {} is documented as required, but a \
                             file without it is accepted",
                            k.line, k.name
                        ));
                    }
                }
                Dflt::Described => {}
            }
        }
    }
    assert!(checked >= 30, "only {checked} defaults checked");
    fail(&errors);
}

// ---------------------------------------------------------------------------------------
// (a) The example configuration uses exactly the documented keys.

/// A tiny reader of the TOML values the example uses (strings, numbers, booleans, arrays,
/// inline tables), collecting the keys of inline tables.
struct Value<'a> {
    s: &'a [u8],
    i: usize,
}

impl Value<'_> {
    fn ws(&mut self) {
        while self.i < self.s.len() && (self.s[self.i] as char).is_whitespace() {
            self.i += 1;
        }
    }

    fn key(&mut self) -> Option<String> {
        self.ws();
        let start = self.i;
        while self.i < self.s.len()
            && (self.s[self.i].is_ascii_alphanumeric() || matches!(self.s[self.i], b'_' | b'-'))
        {
            self.i += 1;
        }
        (self.i > start).then(|| String::from_utf8_lossy(&self.s[start..self.i]).into_owned())
    }

    fn eat(&mut self, c: u8) -> bool {
        self.ws();
        if self.s.get(self.i) == Some(&c) {
            self.i += 1;
            true
        } else {
            false
        }
    }

    /// One value; the dotted paths of the keys of inline tables in it, below `path`.
    fn value(&mut self, path: &str, keys: &mut Vec<String>) -> Option<()> {
        self.ws();
        match *self.s.get(self.i)? {
            b'"' => {
                self.i += 1;
                while *self.s.get(self.i)? != b'"' {
                    self.i += if self.s[self.i] == b'\\' { 2 } else { 1 };
                }
                self.i += 1;
            }
            b'[' => {
                self.i += 1;
                while !self.eat(b']') {
                    self.value(path, keys)?;
                    self.eat(b',');
                }
            }
            b'{' => {
                self.i += 1;
                while !self.eat(b'}') {
                    let k = self.key()?;
                    if !self.eat(b'=') {
                        return None;
                    }
                    let p = format!("{path}.{k}");
                    keys.push(p.clone());
                    self.value(&p, keys)?;
                    self.eat(b',');
                }
            }
            _ => {
                let start = self.i;
                while self.i < self.s.len()
                    && (self.s[self.i].is_ascii_alphanumeric()
                        || matches!(self.s[self.i], b'.' | b'-' | b'+' | b'_'))
                {
                    self.i += 1;
                }
                let word = std::str::from_utf8(&self.s[start..self.i]).ok()?;
                let number = word.replace('_', "").parse::<f64>().is_ok();
                if !(number || word == "true" || word == "false") {
                    return None;
                }
            }
        }
        Some(())
    }
}

/// `key = value` (the value whole, up to an optional `# comment`): the key's dotted path
/// and those of inline-table keys in the value.
fn assignment(line: &str, section: &str) -> Option<Vec<String>> {
    let (key, rest) = line.split_once('=')?;
    let key = key.trim();
    if key.is_empty() || !key.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_') {
        return None;
    }
    let path = format!("{section}.{key}");
    let mut keys = vec![path.clone()];
    let mut v = Value {
        s: rest.as_bytes(),
        i: 0,
    };
    v.value(&path, &mut keys)?;
    v.ws();
    // Whatever follows a complete value is a comment, or this is prose, not a key.
    (v.i == v.s.len() || v.s[v.i] == b'#').then_some(keys)
}

/// Every key path in the example, commented-out examples (`# key = value`, `# [fleet]`)
/// included, with the line it is on.
fn example_keys(text: &str) -> Vec<(String, usize)> {
    let mut section = String::new();
    let mut out = Vec::new();
    for (i, line) in text.lines().enumerate() {
        let body = line.trim().trim_start_matches('#').trim();
        if let Some(h) = body.strip_prefix('[')
            && let Some(h) = h.trim_start_matches('[').strip_suffix(']')
        {
            let h = h.trim_end_matches(']');
            if h.bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'.')
            {
                section = h.to_string();
                continue;
            }
        }
        if let Some(keys) = assignment(body, &section) {
            out.extend(keys.into_iter().map(|k| (k, i + 1)));
        }
    }
    out
}

/// A key path as the reference names it: (section, key), class names below `classes` and
/// `rate` written `<class>`.
fn normalise(path: &str) -> (String, String) {
    let parts: Vec<&str> = path.split('.').collect();
    let mut out: Vec<String> = Vec::new();
    for (i, p) in parts.iter().enumerate() {
        let below = i > 0 && matches!(parts[i - 1], "classes" | "rate");
        let last = i == parts.len() - 1;
        // `[classes]` lists the classes as keys; `rate`'s keys are any class.
        if below && CLASSES.contains(p) && !(last && parts[i - 1] == "classes") {
            out.push("<class>".into());
        } else {
            out.push(p.to_string());
        }
    }
    let key = out.pop().unwrap_or_default();
    (out.join("."), key)
}

#[test]
fn the_example_configuration_uses_exactly_the_documented_keys() {
    let r = reference();
    let documented: BTreeSet<(String, String)> = r
        .sections
        .iter()
        .flat_map(|(s, keys)| keys.iter().map(move |k| (s.clone(), k.name.clone())))
        .collect();
    let sections: BTreeSet<&str> = r.sections.iter().map(|(s, _)| s.as_str()).collect();
    let mut errors = Vec::new();
    let mut used = BTreeSet::new();
    let found = example_keys(&read_repo_file(EXAMPLE));
    assert!(
        found.len() >= 40,
        "only {} keys read from {EXAMPLE}",
        found.len()
    );
    for (path, line) in found {
        let (section, key) = normalise(&path);
        if key == "<class>" {
            // `rate = { sheddable = {…} }`: a class, whose keys are `[{section}.<class>]`.
            if !sections.contains(format!("{section}.<class>").as_str()) {
                errors.push(format!(
                    "{EXAMPLE}:{line}: {path}: no [{section}.<class>] in {REFERENCE}"
                ));
            }
            continue;
        }
        if !documented.contains(&(section.clone(), key.clone())) {
            errors.push(format!(
                "{EXAMPLE}:{line}: {path}: `{key}` is not documented under [{section}] in {REFERENCE}"
            ));
        }
        used.insert((section, key));
    }
    for (section, key) in documented.difference(&used) {
        errors.push(format!(
            "[{section}] {key}: documented in {REFERENCE}, missing from {EXAMPLE}"
        ));
    }
    fail(&errors);
}

#[test]
fn the_example_reader_reads_commented_keys_and_skips_prose() {
    let text = "[daemon]\n# measure_only = false\ntick_ms = 200 # a comment\n\
                # retry_window_ms = 0 it has no effect\n# (default 0.9).\n\
                [classes]\nhigh = { sources = [\"198.18.20.0/24\"], floor = 0.5 }\n\
                # [fleet]\n# safety = 0.9\n";
    let keys: Vec<String> = example_keys(text).into_iter().map(|(k, _)| k).collect();
    assert_eq!(
        keys,
        [
            "daemon.measure_only",
            "daemon.tick_ms",
            "classes.high",
            "classes.high.sources",
            "classes.high.floor",
            "fleet.safety"
        ]
    );
    assert_eq!(normalise("classes.high"), ("classes".into(), "high".into()));
    assert_eq!(
        normalise("classes.high.floor"),
        ("classes.<class>".into(), "floor".into())
    );
    assert_eq!(
        normalise("service.rate.sheddable.burst"),
        ("service.rate.<class>".into(), "burst".into())
    );
}

// ---------------------------------------------------------------------------------------
// Links.

/// The anchors GitHub gives a Markdown file's headings: lower case, punctuation removed,
/// spaces as `-`, a repeated heading suffixed `-1`, `-2`, ….
fn anchors(text: &str) -> BTreeSet<String> {
    let mut seen: BTreeMap<String, usize> = BTreeMap::new();
    let mut out = BTreeSet::new();
    let mut in_fence = false;
    for line in text.lines() {
        if line.trim_start().starts_with("```") {
            in_fence = !in_fence;
        }
        if in_fence || !line.starts_with('#') {
            continue;
        }
        let title = line.trim_start_matches('#').trim();
        let slug: String = title
            .to_lowercase()
            .chars()
            .filter(|c| c.is_alphanumeric() || matches!(c, ' ' | '-' | '_'))
            .map(|c| if c == ' ' { '-' } else { c })
            .collect();
        let n = seen.entry(slug.clone()).or_default();
        out.insert(if *n == 0 {
            slug.clone()
        } else {
            format!("{slug}-{n}")
        });
        *n += 1;
    }
    out
}

/// The targets of `[text](target)` links outside code, with their line.
fn links(text: &str) -> Vec<(String, usize)> {
    let mut out = Vec::new();
    let mut in_fence = false;
    for (i, line) in text.lines().enumerate() {
        if line.trim_start().starts_with("```") {
            in_fence = !in_fence;
            continue;
        }
        if in_fence {
            continue;
        }
        // Code spans hold no links.
        let prose: String = line.split('`').step_by(2).collect::<Vec<_>>().join(" ");
        let mut rest = prose.as_str();
        while let Some(at) = rest.find("](") {
            let after = &rest[at + 2..];
            let Some(end) = after.find(')') else { break };
            out.push((after[..end].trim().to_string(), i + 1));
            rest = &after[end..];
        }
    }
    out
}

fn markdown_files() -> Vec<String> {
    let mut files = vec!["README.md".to_string(), "CHANGELOG.md".to_string()];
    for dir in ["docs", "deploy"] {
        let mut in_dir: Vec<String> = std::fs::read_dir(repo_root().join(dir))
            .unwrap_or_else(|e| panic!("{dir}: {e}"))
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .filter(|n| n.ends_with(".md"))
            .map(|n| format!("{dir}/{n}"))
            .collect();
        in_dir.sort();
        files.extend(in_dir);
    }
    files
}

#[test]
fn relative_links_point_to_existing_files_and_headings() {
    let mut errors = Vec::new();
    let mut count = 0;
    for file in markdown_files() {
        let text = read_repo_file(&file);
        let dir = Path::new(&file).parent().unwrap_or(Path::new(""));
        for (target, line) in links(&text) {
            if target.contains("://") || target.starts_with("mailto:") {
                continue;
            }
            count += 1;
            let (path, fragment) = target.split_once('#').unwrap_or((&target, ""));
            let rel = if path.is_empty() {
                PathBuf::from(&file)
            } else {
                dir.join(path)
            };
            let abs = repo_root().join(&rel);
            if !abs.exists() {
                errors.push(format!(
                    "{file}:{line}: ({target}): {} does not exist",
                    rel.display()
                ));
                continue;
            }
            if fragment.is_empty() {
                continue;
            }
            let Ok(target_text) = std::fs::read_to_string(&abs) else {
                errors.push(format!("{file}:{line}: ({target}): not a text file"));
                continue;
            };
            if !anchors(&target_text).contains(fragment) {
                errors.push(format!(
                    "{file}:{line}: ({target}): no heading #{fragment} in {}",
                    rel.display()
                ));
            }
        }
    }
    assert!(count >= 10, "only {count} relative links found");
    fail(&errors);
}

#[test]
fn anchors_are_github_slugs() {
    let a = anchors(
        "# Fleet mode: sharing one downstream\n## `[daemon]`\n## Map sizes\n## Map sizes\n",
    );
    assert_eq!(
        a,
        BTreeSet::from([
            "fleet-mode-sharing-one-downstream".to_string(),
            "daemon".to_string(),
            "map-sizes".to_string(),
            "map-sizes-1".to_string(),
        ])
    );
}
