//! libvirt for the banlieue host: one long-lived connection per URI, every call run on tokio's
//! blocking pool and bounded by a timeout, errors shaped like the WIT `error` variant.
//!
//! This is the backend of the `banlieue:host/libvirt` capability (`wit/host/libvirt.wit`). It does
//! not check grants: the runtime decides which URI a component may use before calling in here.
//!
//! ```no_run
//! # async fn demo() -> Result<(), banlieue_libvirt::LibvirtError> {
//! let connections = banlieue_libvirt::Connections::new();
//! let libvirt = connections.get("qemu:///system").await?;
//! for domain in libvirt.domain_list().await? {
//!     println!("{} {:?}", domain.name, domain.state);
//! }
//! # Ok(()) }
//! ```

mod connection;
mod console;
mod error;
mod operations;
mod types;

pub use connection::{Connections, DEFAULT_TIMEOUT, Libvirt};
pub use console::SerialConsole;
pub use error::{LibvirtError, Result};
pub use types::{
    AddressSource, DomainInfo, DomainState, InterfaceAddresses, IpAddress, NetworkInfo, NodeInfo, PoolInfo, SnapshotInfo, VolumeInfo,
};
