//! What a refused configuration reports.

use std::path::{Path, PathBuf};

/// A configuration error: which file, which field, what is wrong.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{}{}{message}", at(.file.as_deref(), *.line), key(.field))]
pub struct ConfigError {
    pub file: Option<PathBuf>,
    /// 1-based line of the offending value, when it can be found in the text.
    pub line: Option<usize>,
    /// Dotted path of the offending field, e.g. `service[0].max_limit`.
    pub field: String,
    pub message: String,
}

/// Where an error is, as its text begins.
fn at(file: Option<&Path>, line: Option<usize>) -> String {
    match (file, line) {
        (Some(file), Some(line)) => format!("{}:{line}: ", file.display()),
        (Some(file), None) => format!("{}: ", file.display()),
        (None, Some(line)) => format!("line {line}: "),
        (None, None) => String::new(),
    }
}

/// The key an error is about, after where it is.
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
        field: field.into(),
        message: message.into(),
    }
}
