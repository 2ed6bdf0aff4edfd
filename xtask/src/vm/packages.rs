//! Kernel packages: which .deb a kernel series is, fetched into the cache and verified
//! (by apt, or by gpgv and SHA256 against a Debian archive's signed index).

use std::{
    collections::HashMap,
    fs,
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{Context as _, Result, bail};

use crate::{
    cmd::{checked, cmd, run, stdout, succeeds},
    setup::with_apt_update,
};

/// What gpgv checks a dist's InRelease against.
pub const KEYRING: &str = "/usr/share/keyrings/debian-archive-keyring.gpg";

/// The kernel `meta` depends on in the configured apt sources, downloaded into `cache`.
pub fn apt_kernel(series: &str, meta: &str, cache: &Path) -> Result<(String, PathBuf)> {
    let (package, version) = with_apt_update("vm-test", || {
        let deps = stdout(&mut cmd("apt-cache", ["depends", meta]))?;
        let package = deps
            .lines()
            .filter_map(|l| l.trim().strip_prefix("Depends:"))
            .map(str::trim)
            .find(|p| p.starts_with("linux-image-"))
            .with_context(|| format!("`apt-cache depends {meta}` names no linux-image package"))?
            .to_owned();
        let policy = stdout(&mut cmd("apt-cache", ["policy", &package]))?;
        let version = policy
            .lines()
            .filter_map(|l| l.trim().strip_prefix("Candidate:"))
            .map(str::trim)
            .find(|v| *v != "(none)")
            .with_context(|| format!("{package} has no candidate version in the apt sources"))?
            .to_owned();
        Ok((package, version))
    })?;
    if !package.starts_with(&format!("linux-image-{series}.")) {
        bail!(
            "kernel {series} package not found in the configured apt sources: {meta} depends on \
             {package}"
        );
    }
    let deb = cache.join(format!(
        "{package}_{}_amd64.deb",
        version.replace(':', "%3a")
    ));
    if deb.is_file() {
        eprintln!("vm-test: {} already downloaded", deb.display());
        return Ok((package, deb));
    }
    eprintln!("vm-test: kernel {series}: {package} {version} from the apt sources");
    let spec = format!("{package}={version}");
    with_apt_update("vm-test", || {
        let mut c = cmd("apt-get", ["download", &spec]);
        c.current_dir(cache);
        run(&mut c)
    })?;
    if !deb.is_file() {
        bail!("`apt-get download {spec}` did not leave {}", deb.display());
    }
    Ok((package, deb))
}

/// curl `url` to `dest` (through `dest.part`).
fn download(url: &str, dest: &Path) -> Result<()> {
    let part = PathBuf::from(format!("{}.part", dest.display()));
    run(Command::new("curl")
        .args(["-fsSL", "--retry", "2", "--connect-timeout", "20", "-o"])
        .arg(&part)
        .arg(url))
    .with_context(|| format!("downloading {url}"))?;
    fs::rename(&part, dest).with_context(|| format!("renaming {}", part.display()))
}

fn sha256(path: &Path) -> Result<String> {
    let out = stdout(Command::new("sha256sum").arg(path))?;
    out.split_whitespace()
        .next()
        .map(str::to_owned)
        .with_context(|| format!("no hash from sha256sum {}", path.display()))
}

/// One stanza of a Packages index, as field → value (first line of each field).
fn stanzas(text: &str) -> Vec<HashMap<&str, &str>> {
    text.split("\n\n")
        .map(|s| {
            s.lines()
                .filter(|l| !l.starts_with(' '))
                .filter_map(|l| l.split_once(": "))
                .collect()
        })
        .filter(|m: &HashMap<&str, &str>| !m.is_empty())
        .collect()
}

/// The dist's binary-amd64 index, verified: InRelease by gpgv, Packages.xz by its hash there.
/// If the archive cannot be reached, the copy verified by an earlier run (with a warning).
fn dist_index(archive: &str, dist: &str, cache: &Path) -> Result<String> {
    let saved = cache.join(format!("{dist}_main_binary-amd64_Packages"));
    let fresh = || -> Result<String> {
        let inrelease = cache.join(format!("{dist}_InRelease"));
        download(&format!("{archive}/dists/{dist}/InRelease"), &inrelease)?;
        let release = cache.join(format!("{dist}_Release"));
        let _ = fs::remove_file(&release);
        checked(
            Command::new("gpgv")
                .args(["--keyring", KEYRING, "--output"])
                .arg(&release)
                .arg(&inrelease),
        )
        .with_context(|| format!("gpgv does not accept {}", inrelease.display()))?;
        let release_text = fs::read_to_string(&release)?;
        let path = "main/binary-amd64/Packages.xz";
        let want = release_text
            .split("\nSHA256:")
            .nth(1)
            .and_then(|s| {
                s.lines()
                    .skip(1)
                    .take_while(|l| l.starts_with(' '))
                    .map(|l| l.split_whitespace().collect::<Vec<_>>())
                    .find(|f| f.len() == 3 && f[2] == path)
                    .map(|f| f[0].to_owned())
            })
            .with_context(|| format!("{dist}'s InRelease lists no SHA256 of {path}"))?;
        let xz = cache.join(format!("{dist}_main_binary-amd64_Packages.xz"));
        download(&format!("{archive}/dists/{dist}/{path}"), &xz)?;
        let got = sha256(&xz)?;
        if got != want {
            bail!("{} has SHA256 {got}, InRelease says {want}", xz.display());
        }
        let text = stdout(Command::new("xz").arg("-dc").arg(&xz))?;
        fs::write(&saved, &text)?;
        Ok(text)
    };
    match fresh() {
        Ok(text) => Ok(text),
        Err(e) if saved.is_file() => {
            eprintln!(
                "vm-test: warning: {e:#}; using the index verified earlier ({})",
                saved.display()
            );
            Ok(fs::read_to_string(&saved)?)
        }
        Err(e) => Err(e),
    }
}

/// `a` is a greater Debian version than `b`.
fn version_gt(a: &str, b: &str) -> bool {
    succeeds(Command::new("dpkg").args(["--compare-versions", a, "gt", b]))
}

/// The newest generic `linux-image-<series>.*-amd64` of `dist`, downloaded into `cache`.
pub fn dist_kernel(
    series: &str,
    archive: &str,
    dist: &str,
    cache: &Path,
) -> Result<(String, PathBuf)> {
    let index_url = format!("{archive}/dists/{dist}/main/binary-amd64/Packages.xz");
    let text = dist_index(archive, dist, cache)?;
    let prefix = format!("linux-image-{series}.");
    let mut best: Option<HashMap<&str, &str>> = None;
    for s in stanzas(&text) {
        let Some(&name) = s.get("Package") else {
            continue;
        };
        let generic = name.starts_with(&prefix)
            && name.ends_with("-amd64")
            && !name.ends_with("-cloud-amd64")
            && !name.ends_with("-rt-amd64");
        if !generic || !s.contains_key("Filename") || !s.contains_key("SHA256") {
            continue;
        }
        let newer = match &best {
            None => true,
            Some(b) => version_gt(s["Version"], b["Version"]),
        };
        if newer {
            best = Some(s);
        }
    }
    let best = best.with_context(|| format!("kernel {series} package not found in {index_url}"))?;
    let package = best["Package"].to_owned();
    let filename = best["Filename"];
    let base = Path::new(filename)
        .file_name()
        .with_context(|| format!("bad Filename {filename}"))?;
    let deb = cache.join(base);
    if deb.is_file() {
        eprintln!("vm-test: {} already downloaded", deb.display());
        return Ok((package, deb));
    }
    eprintln!(
        "vm-test: kernel {series}: {package} {} from {dist}",
        best["Version"]
    );
    let url = format!("{archive}/{filename}");
    let part = cache.join(format!("{}.download", base.to_string_lossy()));
    download(&url, &part)?;
    let got = sha256(&part)?;
    if got != best["SHA256"] {
        let _ = fs::remove_file(&part);
        bail!("{url} has SHA256 {got}, the index says {}", best["SHA256"]);
    }
    fs::rename(&part, &deb)?;
    Ok((package, deb))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn packages_index_stanzas() {
        let text = "Package: a\nVersion: 1\nDescription: x\n more\n\nPackage: b\nVersion: 2\n";
        let s = stanzas(text);
        assert_eq!(s.len(), 2);
        assert_eq!(s[1]["Version"], "2");
    }
}
