//! A VM's consoles — its serial console and its graphical (VNC) display — opened for a user
//! of the cluster, never with the backend's credentials.
//!
//! - [`access`]: who may open one — the caller's token and permission, decided by the
//!   cluster's API server (the one place a console is authorized).
//!
//! The stream itself (the host opening the backend's console under the Provider's grant and
//! pumping it to the caller) is not built yet: docs/console.md says what is.

pub mod access;
