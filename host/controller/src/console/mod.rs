//! A VM's consoles — its serial console and its graphical (VNC) display — opened for a user
//! of the cluster, never with the backend's credentials.
//!
//! - [`access`]: who may open one — the caller's token and permission, decided by the
//!   cluster's API server (the one place a console is authorized).
//! - [`open`]: where it is — the VM's Machine, its driver's answer, the host opening it
//!   under the Provider's grant.
//! - [`session`]: how many may be open and for how long.
//! - [`server`]: the HTTPS endpoint users open them at, as websockets.

pub mod access;
pub mod open;
pub mod server;
pub mod session;
mod tls;

pub use server::{ConsoleOptions, ConsoleServer, TlsFiles};
pub use session::SessionLimits;
