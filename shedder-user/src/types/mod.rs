//! Plain values that the configuration, the kernel side and the rest all speak: a
//! protocol, a prefix, an attach mode. Below every other folder, so that `kernel/` can take
//! them without knowing the configuration that names them.

mod attach;
mod prefix;
mod protocol;

pub use attach::Attach;
pub use prefix::Prefix;
pub use protocol::Protocol;
