//! Where the configuration, the control socket and a verb's input are: a flag, else the
//! environment, else the configuration's own setting, else the default, so that a node
//! set up the usual way needs no flag at all.

use std::{
    ffi::OsString,
    io::Read as _,
    path::{Path, PathBuf},
};

use anyhow::Result;
use shedder::{
    BadInput,
    config::{Config, ConfigError},
};

/// The configuration when neither `--config` nor `SHEDDER_CONFIG` names one.
pub const DEFAULT_CONFIG: &str = "/etc/shedder/shedder.toml";
pub const CONFIG_ENV: &str = "SHEDDER_CONFIG";
pub const SOCKET_ENV: &str = "SHEDDER_SOCKET";
/// The path that means standard input wherever a file is read.
pub const STDIN: &str = "-";

/// A configuration path and whether someone asked for it: a named file must exist, the
/// default may be absent (a node without one).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigPath {
    pub path: PathBuf,
    pub named: bool,
}

/// The environment as the resolution sees it (a function, so tests need not set it).
pub type Env<'a> = &'a dyn Fn(&str) -> Option<OsString>;

/// The process's environment; an empty variable counts as unset.
pub fn process_env(name: &str) -> Option<OsString> {
    std::env::var_os(name).filter(|v| !v.is_empty())
}

/// `--config`, else `SHEDDER_CONFIG`, else [`DEFAULT_CONFIG`].
pub fn config_path(flag: Option<&Path>, env: Env<'_>) -> ConfigPath {
    match flag
        .map(Path::to_path_buf)
        .or_else(|| env(CONFIG_ENV).map(PathBuf::from))
    {
        Some(path) => ConfigPath { path, named: true },
        None => ConfigPath {
            path: DEFAULT_CONFIG.into(),
            named: false,
        },
    }
}

/// The configuration a verb that needs one reads.
pub fn required_config(flag: Option<&Path>, env: Env<'_>) -> PathBuf {
    config_path(flag, env).path
}

/// The configuration a verb that can do without one reads: a named one, or the default
/// when it exists.
pub fn optional_config(flag: Option<&Path>, env: Env<'_>) -> Option<PathBuf> {
    let c = config_path(flag, env);
    (c.named || c.path.exists()).then_some(c.path)
}

/// The control socket: `--socket`, else `SHEDDER_SOCKET`, else `daemon.control_socket` of
/// the configuration ([`optional_config`]), else the default.
pub fn socket(socket: Option<&Path>, config: Option<&Path>, env: Env<'_>) -> Result<PathBuf> {
    if let Some(s) = socket
        .map(Path::to_path_buf)
        .or_else(|| env(SOCKET_ENV).map(PathBuf::from))
    {
        return Ok(s);
    }
    match optional_config(config, env) {
        Some(path) => Ok(load_config(&path)?.daemon.control_socket),
        None => Ok(shedder::config::defaults::control_socket()),
    }
}

/// A validated configuration, its refusal as bad input.
pub fn load_config(path: &Path) -> Result<Config> {
    read_config(path).map(|(cfg, _)| cfg)
}

/// A validated configuration and its text, from a file or, for `-`, standard input.
pub fn read_config(path: &Path) -> Result<(Config, String)> {
    parse_input(path).map_err(|e| BadInput(e.to_string()).into())
}

/// [`read_config`], its refusal as the configuration's own error (every problem, placed).
pub fn parse_input(path: &Path) -> Result<(Config, String), ConfigError> {
    if path != Path::new(STDIN) {
        return Config::read(path);
    }
    let mut text = String::new();
    std::io::stdin()
        .read_to_string(&mut text)
        .map_err(|e| ConfigError {
            file: Some(STDIN_NAME.into()),
            line: None,
            column: None,
            field: String::new(),
            message: format!("cannot read: {e}"),
            also: Box::default(),
        })?;
    let cfg = Config::parse_named(&text, Path::new(STDIN_NAME))?;
    Ok((cfg, text))
}

/// How errors in standard input name it.
pub const STDIN_NAME: &str = "<stdin>";

/// How a verb names its input in what it prints.
pub fn shown(path: &Path) -> String {
    if path == Path::new(STDIN) {
        STDIN_NAME.to_string()
    } else {
        path.display().to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(vars: &'static [(&'static str, &'static str)]) -> impl Fn(&str) -> Option<OsString> {
        move |name| {
            vars.iter()
                .find(|(k, _)| *k == name)
                .map(|(_, v)| OsString::from(v))
        }
    }

    #[test]
    fn the_configuration_is_the_flag_else_the_environment_else_the_default() {
        let none = env(&[]);
        let set = env(&[(CONFIG_ENV, "/srv/env.toml")]);
        let flag = Some(Path::new("/srv/flag.toml"));
        assert_eq!(
            config_path(flag, &set),
            ConfigPath {
                path: "/srv/flag.toml".into(),
                named: true
            }
        );
        assert_eq!(
            config_path(None, &set),
            ConfigPath {
                path: "/srv/env.toml".into(),
                named: true
            }
        );
        assert_eq!(
            config_path(None, &none),
            ConfigPath {
                path: DEFAULT_CONFIG.into(),
                named: false
            }
        );
        // A named file is read even if absent (its absence is then the error); the default
        // only when it exists.
        assert_eq!(
            optional_config(None, &env(&[(CONFIG_ENV, "/nonexistent/x.toml")])),
            Some("/nonexistent/x.toml".into())
        );
        if !Path::new(DEFAULT_CONFIG).exists() {
            assert_eq!(optional_config(None, &none), None);
        }
    }

    #[test]
    fn the_socket_is_the_flag_else_the_environment_else_the_configuration_else_the_default() {
        let dir = std::env::temp_dir().join(format!("shedder-paths-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let cfg = dir.join("shedder.toml");
        std::fs::write(
            &cfg,
            "[daemon]\nmeasure_only = true\ncontrol_socket = \"/srv/cfg.sock\"\n",
        )
        .unwrap();
        let both = env(&[(SOCKET_ENV, "/srv/env.sock")]);
        let flag = Some(Path::new("/srv/flag.sock"));
        let at = |s: Option<&Path>, c: Option<&Path>, e: Env<'_>| socket(s, c, e).unwrap();
        assert_eq!(at(flag, Some(&cfg), &both), Path::new("/srv/flag.sock"));
        assert_eq!(at(None, Some(&cfg), &both), Path::new("/srv/env.sock"));
        assert_eq!(at(None, Some(&cfg), &env(&[])), Path::new("/srv/cfg.sock"));
        if !Path::new(DEFAULT_CONFIG).exists() {
            assert_eq!(
                at(None, None, &env(&[])),
                shedder::config::defaults::control_socket()
            );
        }
        // A configuration named but broken is bad input, not a silent default.
        std::fs::write(&cfg, "[daemon]\ntick_ms = 1\n").unwrap();
        let e = socket(None, Some(&cfg), &env(&[])).unwrap_err();
        assert!(e.downcast_ref::<BadInput>().is_some(), "{e}");
        assert!(e.to_string().contains("daemon.tick_ms"), "{e}");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn standard_input_is_named_as_such() {
        assert_eq!(shown(Path::new("-")), "<stdin>");
        assert_eq!(shown(Path::new("a.toml")), "a.toml");
    }
}
