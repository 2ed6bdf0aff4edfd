//! Fragments of files the unit tests of the configuration share.

use super::Config;

/// The `[daemon]` table of a file that sheds on one interface.
pub const IFACE: &str = "[daemon]\ninterfaces = [\"eth0\"]\n";

pub const FLEET: &str =
    "[fleet]\nendpoints = [\"http://198.18.0.21:2379\"]\nnode = \"lb-1\"\nmax_nodes = 10\n";

pub const SHARED: &str = "[[service]]\nname = \"db\"\nports = [5432]\nglobal_limit = 500\n";

/// The message of the first error `toml` is refused with (the rule a test is about; the
/// fragments often lack what a whole file needs, e.g. an interface).
pub fn error_of(toml: &str) -> String {
    Config::parse(toml)
        .unwrap_err()
        .each()
        .remove(0)
        .to_string()
}
