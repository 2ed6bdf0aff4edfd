//! What a refused configuration reports.

use std::{fmt, path::PathBuf};

/// A configuration error: which file, which field, what is wrong.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigError {
    pub file: Option<PathBuf>,
    /// 1-based line of the offending value, when it can be found in the text.
    pub line: Option<usize>,
    /// Dotted path of the offending field, e.g. `service[0].max_limit`.
    pub field: String,
    pub message: String,
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match (&self.file, self.line) {
            (Some(file), Some(line)) => write!(f, "{}:{line}: ", file.display())?,
            (Some(file), None) => write!(f, "{}: ", file.display())?,
            (None, Some(line)) => write!(f, "line {line}: ")?,
            (None, None) => {}
        }
        if self.field.is_empty() {
            write!(f, "{}", self.message)
        } else {
            write!(f, "{}: {}", self.field, self.message)
        }
    }
}

impl std::error::Error for ConfigError {}

pub(super) fn err(field: impl Into<String>, message: impl Into<String>) -> ConfigError {
    ConfigError {
        file: None,
        line: None,
        field: field.into(),
        message: message.into(),
    }
}
