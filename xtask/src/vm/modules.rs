//! The modules a kernel package must load for the checks: found in its tree, decompressed,
//! each after what it depends on (read from its `.modinfo`), for `/init` to `insmod` in
//! turn.

use std::{
    collections::{BTreeSet, HashMap},
    fs,
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{Context as _, Result};

use crate::cmd::checked;

/// A module's name as the kernel knows it: `-` and `_` are the same.
fn module_key(name: &str) -> String {
    name.replace('-', "_")
}

/// Module name → file, for every module under `dir`.
fn module_index(dir: &Path, index: &mut HashMap<String, PathBuf>) -> Result<()> {
    for entry in fs::read_dir(dir).with_context(|| format!("listing {}", dir.display()))? {
        let path = entry?.path();
        if path.is_dir() {
            module_index(&path, index)?;
            continue;
        }
        let Some(name) = path.file_name().and_then(|n| n.to_str()) else {
            continue;
        };
        let stem = [".ko", ".ko.xz", ".ko.zst", ".ko.gz"]
            .iter()
            .find_map(|ext| name.strip_suffix(ext));
        if let Some(stem) = stem {
            index.insert(module_key(stem), path.clone());
        }
    }
    Ok(())
}

/// A module file's contents, decompressed.
fn read_module(path: &Path) -> Result<Vec<u8>> {
    let name = path.to_string_lossy();
    let tool = if name.ends_with(".xz") {
        Some("xz")
    } else if name.ends_with(".zst") {
        Some("zstd")
    } else if name.ends_with(".gz") {
        Some("gzip")
    } else {
        None
    };
    let Some(tool) = tool else {
        return fs::read(path).with_context(|| format!("reading {}", path.display()));
    };
    Ok(checked(Command::new(tool).arg("-dc").arg(path))?.stdout)
}

/// The values of `key` in an ELF64 little-endian module's `.modinfo` section.
fn modinfo(module: &[u8], key: &str) -> Option<Vec<String>> {
    let bytes = |at: usize, n: usize| module.get(at..at.checked_add(n)?);
    let u16_at = |at| Some(u16::from_le_bytes(bytes(at, 2)?.try_into().ok()?) as usize);
    let u32_at = |at| Some(u32::from_le_bytes(bytes(at, 4)?.try_into().ok()?) as usize);
    let u64_at = |at| Some(u64::from_le_bytes(bytes(at, 8)?.try_into().ok()?) as usize);
    if bytes(0, 6)? != b"\x7fELF\x02\x01" {
        return None;
    }
    let (shoff, shentsize, shnum, shstrndx) =
        (u64_at(0x28)?, u16_at(0x3a)?, u16_at(0x3c)?, u16_at(0x3e)?);
    // (name offset, file offset, size) of section i.
    let section = |i: usize| {
        let h = shoff.checked_add(i.checked_mul(shentsize)?)?;
        Some((u32_at(h)?, u64_at(h + 0x18)?, u64_at(h + 0x20)?))
    };
    let (_, strtab, _) = section(shstrndx)?;
    for i in 0..shnum {
        let (name, offset, size) = section(i)?;
        let name_bytes = module.get(strtab.checked_add(name)?..)?;
        let end = name_bytes.iter().position(|&b| b == 0)?;
        if &name_bytes[..end] != b".modinfo" {
            continue;
        }
        let prefix = format!("{key}=");
        return Some(
            bytes(offset, size)?
                .split(|&b| b == 0)
                .filter_map(|e| std::str::from_utf8(e).ok()?.strip_prefix(&prefix))
                .map(str::to_owned)
                .collect(),
        );
    }
    None
}

/// `wanted` and everything they depend on, each after its dependencies.
pub fn resolve_modules(wanted: &[&str], dir: &Path) -> Result<Vec<(String, Vec<u8>)>> {
    let mut index = HashMap::new();
    module_index(dir, &mut index)?;
    fn visit(
        name: &str,
        index: &HashMap<String, PathBuf>,
        seen: &mut BTreeSet<String>,
        out: &mut Vec<(String, Vec<u8>)>,
    ) -> Result<()> {
        let key = module_key(name);
        if !seen.insert(key.clone()) {
            return Ok(());
        }
        let path = index
            .get(&key)
            .with_context(|| format!("module {name} not found in the kernel package"))?;
        let data = read_module(path)?;
        let depends = modinfo(&data, "depends")
            .with_context(|| format!("{} has no readable .modinfo", path.display()))?;
        for dep in depends
            .iter()
            .flat_map(|d| d.split(','))
            .filter(|d| !d.is_empty())
        {
            visit(dep, index, seen, out)?;
        }
        out.push((key, data));
        Ok(())
    }
    let mut seen = BTreeSet::new();
    let mut out = Vec::new();
    for name in wanted {
        visit(name, &index, &mut seen, &mut out)?;
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A minimal ELF64 little-endian object: a null section, `.shstrtab`, `.modinfo`.
    fn elf(modinfo: &[u8]) -> Vec<u8> {
        let names = b"\0.shstrtab\0.modinfo\0";
        let mut out = vec![0u8; 64];
        out[..6].copy_from_slice(b"\x7fELF\x02\x01");
        let names_at = out.len();
        out.extend(names);
        let modinfo_at = out.len();
        out.extend(modinfo);
        let shoff = out.len();
        for (name, at, size) in [
            (0u32, 0, 0),
            (1, names_at, names.len()),
            (11, modinfo_at, modinfo.len()),
        ] {
            let mut h = [0u8; 64];
            h[..4].copy_from_slice(&name.to_le_bytes());
            h[0x18..0x20].copy_from_slice(&(at as u64).to_le_bytes());
            h[0x20..0x28].copy_from_slice(&(size as u64).to_le_bytes());
            out.extend(h);
        }
        out[0x28..0x30].copy_from_slice(&(shoff as u64).to_le_bytes());
        out[0x3a..0x3c].copy_from_slice(&64u16.to_le_bytes());
        out[0x3c..0x3e].copy_from_slice(&3u16.to_le_bytes());
        out[0x3e..0x40].copy_from_slice(&1u16.to_le_bytes());
        out
    }

    #[test]
    fn modinfo_values_of_a_key() {
        let module = elf(b"license=GPL\0depends=veth,ipv6\0alias=x\0depends=\0");
        assert_eq!(
            modinfo(&module, "depends").unwrap(),
            ["veth,ipv6".to_owned(), String::new()]
        );
        assert_eq!(modinfo(&module, "license").unwrap(), ["GPL"]);
        assert!(modinfo(&module, "vermagic").unwrap().is_empty());
        // Not an ELF64 LE object, or cut short: no answer, no panic.
        assert_eq!(modinfo(b"\x7fELF\x01\x01", "depends"), None);
        assert_eq!(modinfo(&module[..module.len() - 40], "depends"), None);
    }

    #[test]
    fn modules_come_after_what_they_depend_on() {
        let dir = std::env::temp_dir().join(format!("shedder-modules-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        fs::create_dir_all(dir.join("kernel/net")).unwrap();
        for (file, depends) in [
            ("kernel/net/a.ko", "b,c_d"),
            ("kernel/b.ko", ""),
            ("kernel/net/c-d.ko", "b"),
            ("kernel/e.ko", "missing"),
        ] {
            let info = format!("depends={depends}\0");
            fs::write(dir.join(file), elf(info.as_bytes())).unwrap();
        }
        let order = resolve_modules(&["a", "c-d"], &dir).unwrap();
        let missing = resolve_modules(&["e"], &dir).map(|_| ()).unwrap_err();
        let _ = fs::remove_dir_all(&dir);
        let names: Vec<&str> = order.iter().map(|(n, _)| n.as_str()).collect();
        // Each once, under the kernel's name (`_` for `-`).
        assert_eq!(names, ["b", "c_d", "a"]);
        assert!(format!("{missing:#}").contains("module missing not found"));
    }
}
