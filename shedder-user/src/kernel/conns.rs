//! The tracked connections map from user space: reading what the packet path tracks, and
//! ending a connection the daemon's sweep found gone from the kernel's sockets.

use aya::{
    maps::{HashMap as BpfHashMap, MapData},
    programs::{TestRun, TestRunOptions},
};
use shedder_common::{SockState, flow::FlowKey, maps, programs};

use super::{Error, Result, Shedder, maps::map_err};

impl Shedder {
    /// Every tracked connection and its state (the map's entries as they were while it was
    /// read: one that ends or is born meanwhile may or may not be in it).
    pub fn tracked_connections(&self) -> Result<Vec<(FlowKey, SockState)>> {
        let map: BpfHashMap<&MapData, FlowKey, SockState> =
            BpfHashMap::try_from(self.map(maps::CONNS)?).map_err(map_err(maps::CONNS))?;
        // An entry removed between reading its key and its value is skipped.
        Ok(map.iter().filter_map(|e| e.ok()).collect())
    }

    /// End the tracked connection `key` if it is still the one established at
    /// `established_ns` (its work and its connection slot freed, as a close seen on the
    /// wire would), by running the sweep program in the kernel, where the counts are
    /// updated atomically beside the packet path's.
    pub fn end_connection(&mut self, key: &FlowKey, established_ns: u64) -> Result<()> {
        let mut frame = [0u8; 32];
        // SAFETY: FlowKey is #[repr(C)] plain integers without padding, 24 bytes.
        let key_bytes: [u8; 24] = unsafe { core::mem::transmute(*key) };
        frame[..24].copy_from_slice(&key_bytes);
        frame[24..].copy_from_slice(&established_ns.to_ne_bytes());
        let prog = self.xdp_program(programs::SWEEP)?;
        prog.test_run(TestRunOptions {
            data_in: Some(&frame),
            ..Default::default()
        })
        .map_err(|source| Error::Program {
            program: programs::SWEEP,
            source,
        })?;
        Ok(())
    }
}
