//! `shedder detach`: stop the daemon and detach, or remove what a dead one left pinned.

use std::path::Path;

use anyhow::{Context as _, Result};
use shedder::{api::control::ClientError, kernel};

use super::Target;

pub fn run(target: &Target, pin_dir: &Path) -> Result<()> {
    match target.client()?.call("POST", "/shedding/detach", b"") {
        Ok(_) => println!("the daemon is stopping and detaching"),
        Err(ClientError::NotRunning(_)) => {
            let pins = kernel::pins::locate(pin_dir).context("finding the bpf filesystem")?;
            let detached = kernel::unpin_all(&pins.path)
                .with_context(|| format!("removing pins under {}", pin_dir.display()))?;
            if detached.is_empty() {
                println!(
                    "nothing was attached (no links under {})",
                    pin_dir.display()
                );
            } else {
                println!("detached: {}", detached.join(", "));
            }
        }
        Err(e) => return Err(e.into()),
    }
    Ok(())
}
