//! Whether the maps an earlier run pinned can be adopted: the pure decision behind a
//! restart, an upgrade or a rollback (the module above reads what is pinned and carries the
//! decision out).
//!
//! aya reuses a pinned map by its name alone. A version whose maps differ would then run
//! its programs over another version's values: a resized value is refused by the verifier
//! at best, and a field whose meaning changed at the same size is read wrong silently. So
//! a set is adopted only when it is entirely this version's: its layout marker names
//! [`LAYOUT`], it holds exactly the object's maps, and each has the object's type, key and
//! value sizes, capacity and flags. Anything else is replaced whole, never mixed.

pub use shedder_common::LAYOUT;

/// What the kernel knows of one map's shape.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MapShape {
    pub map_type: u32,
    pub key_size: u32,
    pub value_size: u32,
    pub max_entries: u32,
    pub flags: u32,
}

impl MapShape {
    /// How `pinned` differs from `self`, field by field.
    fn differences(&self, pinned: &MapShape) -> Vec<String> {
        [
            ("type", self.map_type, pinned.map_type),
            ("key size", self.key_size, pinned.key_size),
            ("value size", self.value_size, pinned.value_size),
            ("capacity", self.max_entries, pinned.max_entries),
            ("flags", self.flags, pinned.flags),
        ]
        .into_iter()
        .filter(|(_, ours, theirs)| ours != theirs)
        .map(|(what, ours, theirs)| format!("{what} {theirs}, this version's {ours}"))
        .collect()
    }
}

/// What lies where the maps are pinned.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Pinned {
    /// The layout marker's value: `None` when there is no marker (versions before it, whose
    /// layout is 1).
    pub marker: Option<u32>,
    /// Every other pin, by name, with its shape (`None`: not a map this process can read).
    pub maps: Vec<(String, Option<MapShape>)>,
}

/// What to do with the pinned maps.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Plan {
    /// Nothing is pinned: create the maps.
    Fresh,
    /// The set is this version's: adopt it, state and all.
    Adopt,
    /// The set is another layout's (`layout`: its marker, 1 when unmarked): load a new set
    /// beside it, switch the attachments to it, then remove the old one. `why` names each
    /// difference found.
    Replace { layout: u32, why: Vec<String> },
}

/// Decide what to do with `pinned`, given the object's maps (`ours`) and this version's
/// layout.
pub fn plan(ours: &[(&str, MapShape)], pinned: &Pinned) -> Plan {
    if pinned.marker.is_none() && pinned.maps.is_empty() {
        return Plan::Fresh;
    }
    let layout = pinned.marker.unwrap_or(1);
    let mut why = Vec::new();
    if layout != LAYOUT {
        let by = if layout > LAYOUT {
            "a newer"
        } else {
            "an older"
        };
        why.push(format!(
            "pinned by layout {layout} ({by} version), this version's is {LAYOUT}"
        ));
    }
    for (name, shape) in ours {
        match pinned.maps.iter().find(|(n, _)| n == name) {
            None => why.push(format!("{name} is not pinned")),
            Some((_, None)) => why.push(format!("{name} is pinned but is not a readable map")),
            Some((_, Some(theirs))) => {
                let d = shape.differences(theirs);
                if !d.is_empty() {
                    why.push(format!("{name}: {}", d.join(", ")));
                }
            }
        }
    }
    for (name, _) in &pinned.maps {
        if !ours.iter().any(|(n, _)| n == name) {
            why.push(format!(
                "{name} is pinned but is not one of this version's maps"
            ));
        }
    }
    if why.is_empty() {
        Plan::Adopt
    } else {
        Plan::Replace { layout, why }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const ARRAY: MapShape = MapShape {
        map_type: 2,
        key_size: 4,
        value_size: 16,
        max_entries: 256,
        flags: 0,
    };
    const HASH: MapShape = MapShape {
        map_type: 1,
        key_size: 8,
        value_size: 8,
        max_entries: 1024,
        flags: 1,
    };
    const OURS: [(&str, MapShape); 2] = [("A", ARRAY), ("H", HASH)];

    fn pinned(marker: Option<u32>, maps: &[(&str, Option<MapShape>)]) -> Pinned {
        Pinned {
            marker,
            maps: maps.iter().map(|(n, s)| (n.to_string(), *s)).collect(),
        }
    }

    fn why(plan: Plan) -> Vec<String> {
        match plan {
            Plan::Replace { why, .. } => why,
            other => panic!("expected a replacement, got {other:?}"),
        }
    }

    #[test]
    fn nothing_pinned_is_a_fresh_start() {
        assert_eq!(plan(&OURS, &Pinned::default()), Plan::Fresh);
    }

    #[test]
    fn this_versions_set_is_adopted_marked_or_not_at_layout_1() {
        let maps = [("H", Some(HASH)), ("A", Some(ARRAY))];
        assert_eq!(plan(&OURS, &pinned(Some(LAYOUT), &maps)), Plan::Adopt);
        // Pins from before the marker existed are layout 1.
        let unmarked = plan(&OURS, &pinned(None, &maps));
        assert_eq!(unmarked == Plan::Adopt, LAYOUT == 1);
    }

    #[test]
    fn another_layout_is_replaced_even_with_the_same_shapes() {
        // Same sizes, another meaning: only the marker tells.
        let maps = [("A", Some(ARRAY)), ("H", Some(HASH))];
        let p = plan(&OURS, &pinned(Some(LAYOUT + 1), &maps));
        assert_eq!(
            p,
            Plan::Replace {
                layout: LAYOUT + 1,
                why: vec![format!(
                    "pinned by layout {} (a newer version), this version's is {LAYOUT}",
                    LAYOUT + 1
                )],
            }
        );
        assert_eq!(
            why(plan(&OURS, &pinned(Some(0), &maps))),
            vec![format!(
                "pinned by layout 0 (an older version), this version's is {LAYOUT}"
            )]
        );
    }

    #[test]
    fn a_resized_map_is_never_reused() {
        let bigger = MapShape {
            value_size: 24,
            max_entries: 512,
            ..ARRAY
        };
        let w = why(plan(
            &OURS,
            &pinned(Some(LAYOUT), &[("A", Some(bigger)), ("H", Some(HASH))]),
        ));
        assert_eq!(
            w,
            vec!["A: value size 24, this version's 16, capacity 512, this version's 256"]
        );
        let retyped = MapShape {
            map_type: 9,
            ..HASH
        };
        let w = why(plan(
            &OURS,
            &pinned(Some(LAYOUT), &[("A", Some(ARRAY)), ("H", Some(retyped))]),
        ));
        assert_eq!(w, vec!["H: type 9, this version's 1"]);
    }

    #[test]
    fn a_missing_an_unknown_or_an_unreadable_pin_is_replaced() {
        let w = why(plan(&OURS, &pinned(Some(LAYOUT), &[("A", Some(ARRAY))])));
        assert_eq!(w, vec!["H is not pinned"]);
        let w = why(plan(
            &OURS,
            &pinned(
                Some(LAYOUT),
                &[("A", Some(ARRAY)), ("H", None), ("X", Some(HASH))],
            ),
        ));
        assert_eq!(
            w,
            vec![
                "H is pinned but is not a readable map",
                "X is pinned but is not one of this version's maps",
            ]
        );
        // A marker alone (the maps removed by hand) is no set to adopt either.
        assert!(matches!(
            plan(&OURS, &pinned(Some(LAYOUT), &[])),
            Plan::Replace { .. }
        ));
    }
}
