//! The host: its suite, mirror and apt sources, its proxies, its rustup.

use std::{fs, path::PathBuf};

use anyhow::{Context as _, Result};

use crate::cmd::home;

/// The registries (crates.io, Debian) are reached through these where they are set.
const PROXY_VARS: &[&str] = &[
    "http_proxy",
    "https_proxy",
    "no_proxy",
    "all_proxy",
    "HTTP_PROXY",
    "HTTPS_PROXY",
    "NO_PROXY",
    "ALL_PROXY",
];

/// One suite of a `deb` source.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AptSource {
    uri: String,
    suite: String,
    components: Vec<String>,
}

/// `VERSION_CODENAME` of an os-release file.
fn os_codename(os_release: &str) -> Option<String> {
    os_release.lines().find_map(|l| {
        let v = l.strip_prefix("VERSION_CODENAME=")?;
        let v = v.trim().trim_matches(|c| c == '"' || c == '\'');
        (!v.is_empty()).then(|| v.to_owned())
    })
}

/// The `deb` lines of a one-line-style sources.list.
fn parse_one_line(text: &str) -> Vec<AptSource> {
    let mut out = Vec::new();
    for line in text.lines() {
        let line = line.split('#').next().unwrap_or("").trim();
        let mut words = line.split_whitespace();
        if words.next() != Some("deb") {
            continue;
        }
        let mut rest: Vec<&str> = words.collect();
        // `[arch=amd64 signed-by=…]` options may hold spaces.
        if rest.first().is_some_and(|w| w.starts_with('[')) {
            let end = rest.iter().position(|w| w.ends_with(']'));
            rest.drain(..=end.unwrap_or(rest.len() - 1));
        }
        if let [uri, suite, components @ ..] = rest.as_slice() {
            out.push(AptSource {
                uri: uri.to_string(),
                suite: suite.to_string(),
                components: components.iter().map(|c| c.to_string()).collect(),
            });
        }
    }
    out
}

/// The `deb` suites of a deb822-style .sources file.
fn parse_deb822(text: &str) -> Vec<AptSource> {
    let mut out = Vec::new();
    for stanza in text.split("\n\n") {
        let field = |name: &str| -> Vec<String> {
            stanza
                .lines()
                .filter(|l| !l.starts_with('#'))
                .find_map(|l| {
                    let (k, v) = l.split_once(':')?;
                    k.trim()
                        .eq_ignore_ascii_case(name)
                        .then(|| v.split_whitespace().map(str::to_owned).collect())
                })
                .unwrap_or_default()
        };
        if !field("Types").iter().any(|t| t == "deb")
            || field("Enabled").first().is_some_and(|e| e == "no")
        {
            continue;
        }
        let components = field("Components");
        for uri in field("URIs") {
            for suite in field("Suites") {
                out.push(AptSource {
                    uri: uri.clone(),
                    suite,
                    components: components.clone(),
                });
            }
        }
    }
    out
}

/// The sources of the release `codename` (`bookworm`, `bookworm-updates`, …).
fn release_sources(all: &[AptSource], codename: &str) -> Vec<AptSource> {
    all.iter()
        .filter(|s| {
            s.suite == codename
                || s.suite
                    .strip_prefix(codename)
                    .is_some_and(|r| r.starts_with('-'))
        })
        .cloned()
        .collect()
}

pub fn sources_list(sources: &[AptSource]) -> String {
    sources
        .iter()
        .map(|s| format!("deb {} {} {}\n", s.uri, s.suite, s.components.join(" ")))
        .collect()
}

/// An apt configuration file that sets a proxy (`Acquire::http::Proxy "…";` and kin).
fn sets_proxy(text: &str) -> bool {
    text.lines()
        .map(str::trim)
        .filter(|l| !l.starts_with("//") && !l.starts_with('#'))
        .any(|l| l.to_ascii_lowercase().contains("proxy"))
}

pub struct Host {
    pub suite: String,
    /// debootstrap's mirror: the URI of the host's source for `suite`.
    pub mirror: String,
    /// The host's sources of its release, for the root's sources.list.
    pub sources: Vec<AptSource>,
    /// Proxy variables, passed into the root.
    pub proxy_env: Vec<(String, String)>,
    /// apt configuration files that set a proxy, copied into the root.
    pub apt_proxy_files: Vec<PathBuf>,
    pub rustup_home: PathBuf,
    pub rustup: PathBuf,
}

pub fn read_host() -> Result<Host> {
    let os = fs::read_to_string("/etc/os-release").context("reading /etc/os-release")?;
    let suite = os_codename(&os)
        .context("/etc/os-release has no VERSION_CODENAME: fresh-check needs a Debian host")?;
    let mut all = Vec::new();
    if let Ok(text) = fs::read_to_string("/etc/apt/sources.list") {
        all.extend(parse_one_line(&text));
    }
    let mut parts: Vec<PathBuf> = fs::read_dir("/etc/apt/sources.list.d")
        .map(|d| d.filter_map(|e| e.ok().map(|e| e.path())).collect())
        .unwrap_or_default();
    parts.sort();
    for p in parts {
        // apt reads only these two kinds; others (e.g. `.disabled`) are not sources.
        let parse = match p.extension().and_then(|x| x.to_str()) {
            Some("list") => parse_one_line,
            Some("sources") => parse_deb822,
            _ => continue,
        };
        if let Ok(text) = fs::read_to_string(&p) {
            all.extend(parse(&text));
        }
    }
    let sources = release_sources(&all, &suite);
    let mirror = sources
        .iter()
        .find(|s| s.suite == suite)
        .map(|s| s.uri.clone())
        .with_context(|| {
            format!("no `deb` source for {suite} in /etc/apt/sources.list{{,.d/}}: no mirror")
        })?;
    let proxy_env = PROXY_VARS
        .iter()
        .filter_map(|&k| {
            let v = std::env::var(k).ok().filter(|v| !v.is_empty())?;
            Some((k.to_owned(), v))
        })
        .collect();
    let mut apt_files = vec![PathBuf::from("/etc/apt/apt.conf")];
    if let Ok(d) = fs::read_dir("/etc/apt/apt.conf.d") {
        apt_files.extend(d.filter_map(|e| e.ok().map(|e| e.path())));
    }
    let apt_proxy_files = apt_files
        .into_iter()
        .filter(|p| fs::read_to_string(p).is_ok_and(|t| sets_proxy(&t)))
        .collect();
    let rustup_home = match std::env::var_os("RUSTUP_HOME").filter(|h| !h.is_empty()) {
        Some(h) => PathBuf::from(h),
        None => home()?.join(".rustup"),
    };
    let rustup_home = fs::canonicalize(&rustup_home)
        .with_context(|| format!("the rustup home {} is missing", rustup_home.display()))?;
    let rustup = which::which("rustup")
        .context("`rustup` is not on PATH: fresh-check lends the host's rustup toolchains")?;
    Ok(Host {
        suite,
        mirror,
        sources,
        proxy_env,
        apt_proxy_files,
        rustup_home,
        rustup,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codename_from_os_release() {
        let text = "PRETTY_NAME=\"Debian GNU/Linux 12 (bookworm)\"\nVERSION_CODENAME=bookworm\n";
        assert_eq!(os_codename(text).as_deref(), Some("bookworm"));
        assert_eq!(
            os_codename("VERSION_CODENAME=\"trixie\"\n").as_deref(),
            Some("trixie")
        );
        assert_eq!(os_codename("ID=debian\nVERSION_CODENAME=\n"), None);
    }

    fn src(uri: &str, suite: &str, components: &[&str]) -> AptSource {
        AptSource {
            uri: uri.into(),
            suite: suite.into(),
            components: components.iter().map(|c| c.to_string()).collect(),
        }
    }

    #[test]
    fn one_line_sources() {
        let text = "# comment\n\
            deb http://deb.debian.org/debian bookworm main contrib # trailing\n\
            deb-src http://deb.debian.org/debian bookworm main\n\
            deb [arch=amd64 signed-by=/usr/share/keyrings/x.gpg] https://m.example/debian bookworm-updates main\n\
            deb [trusted=yes] http://local/ ./\n";
        assert_eq!(
            parse_one_line(text),
            [
                src(
                    "http://deb.debian.org/debian",
                    "bookworm",
                    &["main", "contrib"]
                ),
                src("https://m.example/debian", "bookworm-updates", &["main"]),
                src("http://local/", "./", &[]),
            ]
        );
    }

    #[test]
    fn deb822_sources() {
        let text = "Types: deb\n\
            # http://snapshot.debian.org/archive/debian/20250520T000000Z\n\
            URIs: http://deb.debian.org/debian\n\
            Suites: bookworm bookworm-updates\n\
            Components: main\n\
            Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg\n\
            \n\
            Types: deb-src\n\
            URIs: http://deb.debian.org/debian\n\
            Suites: bookworm\n\
            Components: main\n\
            \n\
            Types: deb\n\
            URIs: http://off.example/\n\
            Suites: bookworm\n\
            Components: main\n\
            Enabled: no\n";
        assert_eq!(
            parse_deb822(text),
            [
                src("http://deb.debian.org/debian", "bookworm", &["main"]),
                src(
                    "http://deb.debian.org/debian",
                    "bookworm-updates",
                    &["main"]
                ),
            ]
        );
    }

    #[test]
    fn sources_of_the_release_only() {
        let all = [
            src("http://d/debian", "bookworm", &["main"]),
            src("http://d/debian", "bookworm-updates", &["main"]),
            src("http://d/debian-security", "bookworm-security", &["main"]),
            src("https://other/apt", "cloud-sdk-bookworm", &["main"]),
            src("http://d/debian", "bookwormish", &["main"]),
            src(
                "https://deb.nodesource.com/node_20.x",
                "nodistro",
                &["main"],
            ),
        ];
        let mine = release_sources(&all, "bookworm");
        assert_eq!(mine, all[..3]);
        assert_eq!(
            sources_list(&mine[..1]),
            "deb http://d/debian bookworm main\n"
        );
    }

    #[test]
    fn apt_proxy_configuration() {
        assert!(sets_proxy("Acquire::http::Proxy \"http://p:3128\";\n"));
        assert!(sets_proxy("Acquire { https { proxy \"http://p\"; }; };"));
        assert!(!sets_proxy("Acquire::Check-Valid-Until \"false\";\n"));
        assert!(!sets_proxy("// Acquire::http::Proxy \"http://p\";\n"));
    }
}
