//! Where a key path is in the text: the spans toml's parser keeps for every key and value,
//! as a line and a column.

use std::ops::Range;

use toml::{
    Spanned,
    de::{DeTable, DeValue},
};

/// A place in the text: line and column, both from 1; the column counts characters.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Position {
    pub line: usize,
    pub column: usize,
}

impl Position {
    /// The position of byte `offset` of `text` (the end of the text when past it).
    pub(super) fn of(text: &str, offset: usize) -> Self {
        let mut offset = offset.min(text.len());
        while !text.is_char_boundary(offset) {
            offset -= 1;
        }
        let start = text[..offset].rfind('\n').map_or(0, |i| i + 1);
        Self {
            line: text[..start].matches('\n').count() + 1,
            column: text[start..offset].chars().count() + 1,
        }
    }
}

/// One step of a key path.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Step<'a> {
    Key(&'a str),
    Index(usize),
}

/// The steps of a key path as the errors write it: `service[1] (web).rate.high` is
/// `service`, 1, `rate`, `high` (the service's name in parentheses is a gloss, not a step).
fn steps(field: &str) -> Vec<Step<'_>> {
    let mut steps = Vec::new();
    let mut rest = field;
    while !rest.is_empty() {
        if let Some(r) = rest.strip_prefix(" (") {
            rest = r.split_once(')').map_or("", |(_, r)| r);
        } else if let Some(r) = rest.strip_prefix('[') {
            let (index, r) = r.split_once(']').unwrap_or((r, ""));
            let Ok(index) = index.parse() else { break };
            steps.push(Step::Index(index));
            rest = r;
        } else if let Some(r) = rest.strip_prefix('.') {
            rest = r;
        } else {
            let end = [rest.find('.'), rest.find('['), rest.find(" (")]
                .into_iter()
                .flatten()
                .min()
                .unwrap_or(rest.len());
            steps.push(Step::Key(&rest[..end]));
            rest = &rest[end..];
        }
    }
    steps
}

/// A configuration text and the document toml parsed it into, every key and value with
/// its span.
pub(super) struct Source<'i> {
    text: &'i str,
    doc: DeTable<'i>,
}

/// What [`Source::find`] found of a key path.
pub(super) struct Found<'d, 'i> {
    /// The value at the path, or the innermost table or array around it that the text has.
    pub value: &'d Spanned<DeValue<'i>>,
    /// Whether `value` is at the path itself.
    pub exact: bool,
}

impl<'i> Source<'i> {
    pub(super) fn new(text: &'i str, doc: DeTable<'i>) -> Self {
        Self { text, doc }
    }

    /// The value at `field`, else the innermost table or array on its way that the text
    /// has (a key left to its default: its table, found at the table's header). `None`
    /// when the text lacks even the first step (a section left out).
    pub(super) fn find(&self, field: &str) -> Option<Found<'_, 'i>> {
        let steps = steps(field);
        let mut found: Option<&Spanned<DeValue<'i>>> = None;
        let mut depth = 0;
        for step in &steps {
            let next = match (step, found) {
                (Step::Key(key), None) => self.doc.get(*key),
                (Step::Key(key), Some(v)) => v.get_ref().get(*key),
                (Step::Index(i), Some(v)) => v.get_ref().get(*i),
                (Step::Index(_), None) => None,
            };
            let Some(next) = next else { break };
            found = Some(next);
            depth += 1;
        }
        found.map(|value| Found {
            value,
            exact: depth == steps.len(),
        })
    }

    /// Where the value at `field` (or what [`Source::find`] finds of it) begins.
    pub(super) fn position_of(&self, field: &str) -> Option<Position> {
        self.find(field).map(|f| self.position(f.value.span()))
    }

    /// Where `span` begins.
    pub(super) fn position(&self, span: Range<usize>) -> Position {
        Position::of(self.text, span.start)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn positions_count_lines_and_characters_from_one() {
        let text = "a = 1\nname = \"é\" # x\n\nb";
        assert_eq!(Position::of(text, 0), Position { line: 1, column: 1 });
        assert_eq!(Position::of(text, 4), Position { line: 1, column: 5 });
        assert_eq!(Position::of(text, 6), Position { line: 2, column: 1 });
        // After a two-byte character, the column counts it once.
        let hash = text.find('#').unwrap();
        assert_eq!(
            Position::of(text, hash),
            Position {
                line: 2,
                column: 12
            }
        );
        assert_eq!(
            Position::of(text, text.len()),
            Position { line: 4, column: 2 }
        );
        // Inside a character or past the end: the character's start, the end.
        let e = text.find('é').unwrap();
        assert_eq!(Position::of(text, e + 1), Position::of(text, e));
        assert_eq!(Position::of(text, 999), Position { line: 4, column: 2 });
    }

    #[test]
    fn key_paths_split_into_steps() {
        use Step::*;
        assert_eq!(
            steps("service[1] (web.1).rate.high"),
            [Key("service"), Index(1), Key("rate"), Key("high")]
        );
        assert_eq!(
            steps("classes.high.sources[0]"),
            [Key("classes"), Key("high"), Key("sources"), Index(0)]
        );
        assert_eq!(steps("daemon"), [Key("daemon")]);
        assert_eq!(steps(""), []);
        assert_eq!(
            steps("a[x].b"),
            [Key("a")],
            "a malformed index ends the path"
        );
    }

    /// The position `find` reports for `field` in `text`, as (line, column, exact).
    fn at(text: &str, field: &str) -> Option<(usize, usize, bool)> {
        let source = Source::new(text, DeTable::parse(text).unwrap().into_inner());
        let found = source.find(field)?;
        let p = source.position(found.value.span());
        Some((p.line, p.column, found.exact))
    }

    #[test]
    fn finds_values_in_tables_arrays_of_tables_and_inline_tables() {
        let text = "\
[daemon]
tick_ms  =  5

[[service]]
name = \"a\"
ports = [80]
rate = { high = { per_second = 0, burst = 1 } }

[[service]]
name = \"b\"
ports = [80, 81]

[service.rate.low]
burst = 2
";
        assert_eq!(at(text, "daemon.tick_ms"), Some((2, 13, true)));
        assert_eq!(at(text, "service[1] (b).ports[1]"), Some((11, 14, true)));
        assert_eq!(at(text, "service[0] (a).rate.high"), Some((7, 17, true)));
        assert_eq!(
            at(text, "service[0] (a).rate.high.per_second"),
            Some((7, 32, true))
        );
        // A sub-table of the last [[service]], by its header.
        assert_eq!(
            at(text, "service[1] (b).rate.low.burst"),
            Some((14, 9, true))
        );
        // An array of tables: at its first header.
        assert_eq!(at(text, "service"), Some((4, 1, true)));
        // A key left to its default: its table's header.
        assert_eq!(at(text, "service[0] (a).max_limit"), Some((4, 1, false)));
        assert_eq!(at(text, "daemon.interfaces"), Some((1, 1, false)));
        // A section the text lacks: nowhere.
        assert_eq!(at(text, "fleet.endpoints"), None);
        assert_eq!(at(text, "classes"), None);
    }
}
