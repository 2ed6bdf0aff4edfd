//! Reading what an earlier run pinned, and carrying out [`plan`]'s
//! decision: adopt the set, or load a new one beside it and retire the old one once the
//! attachments run the new programs.
//!
//! The maps live in `maps/` under the pin directory. A replacement loads its maps into
//! `maps-next/`; the attachments are switched to the new programs (each atomically, by link
//! update or in-place filter replacement); then [`retire`] unpins `maps/` and renames
//! `maps-next/` to it. A start interrupted anywhere in between leaves `maps-next/`, which
//! the next start [`settle`]s first: finished if an attachment already runs over it,
//! removed if none does.

use std::{collections::BTreeSet, io, path::Path};

use aya::maps::{Array, Map, MapData, MapInfo};
use shedder_common::maps;

use super::{Error, OBJECT, Result};
mod plan;

pub use plan::{LAYOUT, MapShape, Pinned, Plan, plan};

/// Where the maps in use are pinned, under the pin directory.
pub const MAPS: &str = "maps";
/// Where a replacement's maps are pinned until they are in use.
pub const NEXT: &str = "maps-next";

/// The shapes of the object's maps, as it defines them.
pub fn ours() -> Result<Vec<(&'static str, MapShape)>> {
    let object = aya_obj::Object::parse(OBJECT)
        .map_err(|e| Error::Layout(format!("parsing the eBPF object: {e}")))?;
    maps::ALL
        .into_iter()
        .map(|name| {
            let m = object.maps.get(name).ok_or(Error::MissingMap(name))?;
            Ok((
                name,
                MapShape {
                    map_type: m.map_type(),
                    key_size: m.key_size(),
                    value_size: m.value_size(),
                    max_entries: m.max_entries(),
                    flags: m.map_flags(),
                },
            ))
        })
        .collect()
}

fn shape(info: &MapInfo) -> Option<MapShape> {
    Some(MapShape {
        map_type: info.map_type().ok()? as u32,
        key_size: info.key_size(),
        value_size: info.value_size(),
        max_entries: info.max_entries(),
        flags: info.map_flags(),
    })
}

/// What is pinned in `dir` (a maps directory); nothing when it does not exist.
pub fn read(dir: &Path) -> io::Result<Pinned> {
    let mut pinned = Pinned::default();
    let entries = match std::fs::read_dir(dir) {
        Ok(e) => e,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(pinned),
        Err(e) => return Err(e),
    };
    for entry in entries {
        let entry = entry?;
        let name = entry.file_name().to_string_lossy().into_owned();
        if name == maps::LAYOUT {
            // A marker that cannot be read marks no layout this version knows.
            pinned.marker = Some(read_marker(&entry.path()).unwrap_or(u32::MAX));
            continue;
        }
        let shape = MapInfo::from_pin(entry.path())
            .ok()
            .as_ref()
            .and_then(shape);
        pinned.maps.push((name, shape));
    }
    pinned.maps.sort_by(|a, b| a.0.cmp(&b.0));
    Ok(pinned)
}

/// The layout number a marker holds.
fn read_marker(path: &Path) -> Option<u32> {
    let data = MapData::from_pin(path).ok()?;
    let array: Array<MapData, u32> = Map::Array(data).try_into().ok()?;
    array.get(&0, 0).ok()
}

/// Pin this version's layout marker in `dir` (a maps directory), unless it is there.
pub fn mark(dir: &Path) -> Result<()> {
    let path = dir.join(maps::LAYOUT);
    if read_marker(&path) == Some(LAYOUT) {
        return Ok(());
    }
    let pin_err = |reason: String| Error::Pin {
        path: path.clone(),
        reason,
    };
    // BPF_MAP_TYPE_ARRAY of one u32.
    let def = aya_obj::Map::new_from_params(2, 4, 4, 1, 0);
    let data = MapData::create(def, maps::LAYOUT, None).map_err(|e| pin_err(e.to_string()))?;
    let mut map = Map::Array(data);
    // Set before it is pinned, so that no reader sees an unset marker.
    Array::<&mut MapData, u32>::try_from(&mut map)
        .and_then(|mut a| a.set(0, LAYOUT, 0))
        .map_err(|e| pin_err(e.to_string()))?;
    match std::fs::remove_file(&path) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        Err(e) => return Err(pin_err(e.to_string())),
    }
    map.pin(&path).map_err(|e| pin_err(e.to_string()))
}

/// The kernel's ids of the maps pinned in `dir`.
fn map_ids(dir: &Path) -> BTreeSet<u32> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return BTreeSet::new();
    };
    entries
        .flatten()
        .filter_map(|e| MapInfo::from_pin(e.path()).ok().map(|i| i.id()))
        .collect()
}

/// The kernel's ids of the maps the programs attached through `pin_dir/links` use.
fn live_map_ids(pin_dir: &Path) -> BTreeSet<u32> {
    let programs = super::attach::pinned_link_programs(&pin_dir.join("links"));
    if programs.is_empty() {
        return BTreeSet::new();
    }
    aya::programs::loaded_programs()
        .flatten()
        .filter(|p| programs.contains(&p.id()))
        .filter_map(|p| p.map_ids().ok().flatten())
        .flatten()
        .collect()
}

/// Whether a program attached through `pin_dir/links` runs over the maps pinned in `dir`.
pub fn in_use(pin_dir: &Path, dir: &Path) -> bool {
    let live = live_map_ids(pin_dir);
    map_ids(dir).iter().any(|id| live.contains(id))
}

/// Unpin every entry of the maps directory `dir` and remove it (nothing when it is absent).
pub fn unpin_dir(dir: &Path) -> io::Result<()> {
    let entries = match std::fs::read_dir(dir) {
        Ok(e) => e,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(e),
    };
    for entry in entries {
        std::fs::remove_file(entry?.path())?;
    }
    std::fs::remove_dir(dir)
}

/// A replacement's last step: the old maps unpinned, the new ones moved to `maps/`.
pub fn retire(pin_dir: &Path) -> io::Result<()> {
    unpin_dir(&pin_dir.join(MAPS))?;
    std::fs::rename(pin_dir.join(NEXT), pin_dir.join(MAPS))
}

/// What an interrupted replacement left, settled: `Some(true)` if it was finished (an
/// attachment already ran over the new maps), `Some(false)` if its maps were removed
/// (none did), `None` if there was none.
pub fn settle(pin_dir: &Path) -> io::Result<Option<bool>> {
    let next = pin_dir.join(NEXT);
    if !next.exists() {
        return Ok(None);
    }
    if in_use(pin_dir, &next) {
        retire(pin_dir)?;
        Ok(Some(true))
    } else {
        unpin_dir(&next)?;
        Ok(Some(false))
    }
}

/// Settle what an interrupted replacement left (logged), then decide what to do with the
/// maps pinned under `pin_dir`.
pub fn prepare(pin_dir: &Path) -> Result<Plan> {
    let io = |what| move |e| Error::Io(what, e);
    match settle(pin_dir).map_err(io("settling an interrupted replacement of the maps"))? {
        Some(true) => tracing::warn!(
            dir = %pin_dir.display(),
            "an earlier start was interrupted after switching to new maps: finished it (the \
             old maps are removed)"
        ),
        Some(false) => tracing::warn!(
            dir = %pin_dir.display(),
            "an earlier start was interrupted before switching to new maps: removed them"
        ),
        None => {}
    }
    let pinned = read(&pin_dir.join(MAPS)).map_err(io("reading the pinned maps"))?;
    Ok(plan(&ours()?, &pinned))
}

/// Refuse to read the maps pinned under `pin_dir` unless they are this version's (for the
/// tools that read them without a daemon: `counters`, `doctor`).
pub fn check_readable(pin_dir: &Path) -> Result<()> {
    let pinned = read(&pin_dir.join(MAPS)).map_err(|e| Error::Io("reading the pinned maps", e))?;
    match plan(&ours()?, &pinned) {
        Plan::Adopt => Ok(()),
        Plan::Fresh => Err(Error::Layout(format!(
            "nothing is pinned under {} (is a daemon running, with this pin_dir?)",
            pin_dir.join(MAPS).display()
        ))),
        Plan::Replace { why, .. } => Err(Error::Layout(format!(
            "the maps under {} are not this version's ({}): the daemon of this version \
             replaces them when it starts",
            pin_dir.join(MAPS).display(),
            why.join("; ")
        ))),
    }
}

/// The maps' shapes as a record: a line per map.
pub fn record(shapes: &[(&str, MapShape)]) -> String {
    shapes
        .iter()
        .map(|(name, s)| {
            format!(
                "{name} type={} key={} value={} entries={} flags={:#x}\n",
                s.map_type, s.key_size, s.value_size, s.max_entries, s.flags
            )
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The maps' shapes are recorded per layout in `shedder-user/layouts/<LAYOUT>.txt`. A
    /// change to any map fails here until [`LAYOUT`] is bumped (and the new layout's record
    /// written with `RECORD_LAYOUT=1`): otherwise a daemon of the new version would take an
    /// old version's pins for its own. A record, once written, is never rewritten.
    #[test]
    fn the_maps_are_the_layout_they_were_recorded_under() {
        let path = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR"))
            .join("layouts")
            .join(format!("{LAYOUT}.txt"));
        let actual = record(&ours().expect("the object's maps"));
        match std::fs::read_to_string(&path) {
            Ok(recorded) => assert!(
                recorded == actual,
                "the eBPF object's maps differ from layout {LAYOUT}'s record ({}): bump \
                 shedder_common::LAYOUT, then record the new layout with RECORD_LAYOUT=1.\n\
                 recorded:\n{recorded}\nnow:\n{actual}",
                path.display()
            ),
            Err(_) if std::env::var_os("RECORD_LAYOUT").is_some() => {
                std::fs::write(&path, actual).expect("writing the record");
            }
            Err(e) => panic!(
                "no record of layout {LAYOUT} at {} ({e}): write it with RECORD_LAYOUT=1",
                path.display()
            ),
        }
    }

    #[test]
    fn the_marker_is_not_one_of_the_objects_maps() {
        assert!(!maps::ALL.contains(&maps::LAYOUT));
    }
}
