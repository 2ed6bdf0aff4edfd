//! Reading the sampled refusals the packet path hands over (`shedder_common::refusal`).

use aya::maps::{MapData, RingBuf};
use shedder_common::{maps, refusal::Sample};

use super::{Error, Result, Shedder};

/// The ring buffer of this load's sampled refusals.
pub struct RefusalReader {
    ring: RingBuf<MapData>,
}

impl Shedder {
    /// The reader of the sampled refusals (once: the ring moves to the reader).
    pub fn refusal_reader(&mut self) -> Result<RefusalReader> {
        let map = self
            .ebpf
            .take_map(maps::REFUSALS)
            .ok_or(Error::MissingMap(maps::REFUSALS))?;
        let ring = RingBuf::try_from(map).map_err(|source| Error::Map {
            map: maps::REFUSALS,
            source,
        })?;
        Ok(RefusalReader { ring })
    }
}

impl RefusalReader {
    /// The samples waiting, `max` at most (the rest wait for the next call).
    pub fn drain(&mut self, max: usize) -> Vec<Sample> {
        let mut out = Vec::new();
        while out.len() < max {
            let Some(item) = self.ring.next() else {
                break;
            };
            if let Some(s) = Sample::from_bytes(&item) {
                out.push(s);
            }
        }
        out
    }
}
