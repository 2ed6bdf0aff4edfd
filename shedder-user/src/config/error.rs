//! What a refused configuration reports.

use std::path::{Path, PathBuf};

/// A configuration error: which file, where in it, which key, what is wrong. Shown as
/// `shedder.toml:12:13: service[1] (web).max_limit: 5 is below min_limit (10)`; without a
/// file, as `line 12, column 13: …`. The other problems of the same file follow, one a
/// line, so that one run names them all.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{}{}{message}{}", at(.file.as_deref(), *.line, *.column), key(.field), rest(.also))]
pub struct ConfigError {
    pub file: Option<PathBuf>,
    /// 1-based line of the offending value (or of its table, for a key left out), when
    /// the text has it.
    pub line: Option<usize>,
    /// 1-based column (in characters) where the offending value begins, with `line`.
    pub column: Option<usize>,
    /// Dotted path of the offending field, e.g. `service[0].max_limit`.
    pub field: String,
    pub message: String,
    /// The file's other problems, after this one (empty in each of them). Boxed: a
    /// `Result` carrying this error stays small.
    pub also: Box<[ConfigError]>,
}

impl ConfigError {
    /// This error and the others, each alone, in order.
    pub fn each(&self) -> Vec<ConfigError> {
        let first = ConfigError {
            also: Box::default(),
            ..self.clone()
        };
        std::iter::once(first)
            .chain(self.also.iter().cloned())
            .collect()
    }

    /// The same errors, each naming `file`.
    pub(super) fn in_file(mut self, file: &Path) -> Self {
        self.file = Some(file.to_path_buf());
        for e in self.also.iter_mut() {
            e.file = Some(file.to_path_buf());
        }
        self
    }
}

/// The other problems, each on a line of its own.
fn rest(also: &[ConfigError]) -> String {
    also.iter().map(|e| format!("\n{e}")).collect()
}

/// The place prefix of an error's text.
fn at(file: Option<&Path>, line: Option<usize>, column: Option<usize>) -> String {
    match (file, line, column) {
        (Some(file), Some(line), Some(column)) => format!("{}:{line}:{column}: ", file.display()),
        (Some(file), Some(line), None) => format!("{}:{line}: ", file.display()),
        (Some(file), None, _) => format!("{}: ", file.display()),
        (None, Some(line), Some(column)) => format!("line {line}, column {column}: "),
        (None, Some(line), None) => format!("line {line}: "),
        (None, None, _) => String::new(),
    }
}

/// The key prefix of an error's text.
fn key(field: &str) -> String {
    if field.is_empty() {
        String::new()
    } else {
        format!("{field}: ")
    }
}

pub(super) fn err(field: impl Into<String>, message: impl Into<String>) -> ConfigError {
    ConfigError {
        file: None,
        line: None,
        column: None,
        field: field.into(),
        message: message.into(),
        also: Box::default(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_text_says_where_then_which_key_then_what() {
        let mut e = err("daemon.tick_ms", "5 is outside 10..=60000");
        assert_eq!(e.to_string(), "daemon.tick_ms: 5 is outside 10..=60000");
        (e.line, e.column) = (Some(2), Some(11));
        assert_eq!(
            e.to_string(),
            "line 2, column 11: daemon.tick_ms: 5 is outside 10..=60000"
        );
        e.file = Some("/etc/shedder/shedder.toml".into());
        assert_eq!(
            e.to_string(),
            "/etc/shedder/shedder.toml:2:11: daemon.tick_ms: 5 is outside 10..=60000"
        );
        let e = ConfigError {
            line: None,
            column: None,
            field: String::new(),
            message: "cannot read: denied".into(),
            ..e
        };
        assert_eq!(
            e.to_string(),
            "/etc/shedder/shedder.toml: cannot read: denied"
        );
    }
}
