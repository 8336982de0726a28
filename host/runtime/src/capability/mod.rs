//! Host capabilities. Each lives in its own module with one choke point: the
//! function that checks the calling instance's grant before anything happens.
//! A component gets exactly the capabilities its world imports, limited by
//! the [`Grants`] of the call; everything else is refused with `denied`.

pub mod console;
pub mod http;
pub mod libvirt;
pub mod log;
pub mod observer;
pub mod secrets;
pub mod session;
pub mod transfer;
pub(crate) mod wasi;

/// Generated bindings of the `banlieue:host` interfaces, shared by every world.
pub(crate) mod bindings {
    wasmtime::component::bindgen!({
        path: "../../wit/host",
        world: "banlieue:host/capabilities",
        imports: { default: async },
    });
}

pub use bindings::banlieue::host::types::Error as WitError;

/// What one call may touch.
#[derive(Clone, Debug, Default)]
pub struct Grants {
    /// Who logs: the component and the object being reconciled.
    pub log: log::Attribution,
    /// The one HTTP origin the component may reach, if any.
    pub http: Option<http::HttpGrant>,
    /// The credential source and keys it may read, if any.
    pub secrets: Option<secrets::SecretsGrant>,
    /// The libvirt connection it may drive, if any.
    pub libvirt: Option<libvirt::LibvirtGrant>,
    /// The backend session store of its Provider, if any.
    pub session: Option<session::SessionGrant>,
    /// The image an `import-image` call may send, if any.
    pub transfer: Option<transfer::TransferGrant>,
    /// Where a `disk-export` call's disks go, if anywhere.
    pub export: Option<transfer::ExportGrant>,
    /// The disks a `disk-import` call may send, if any.
    pub carried: Option<transfer::CarriedGrant>,
    /// A conformance run's watch over this call (never set by the controllers).
    pub observer: Option<std::sync::Arc<observer::Observer>>,
}

impl From<WitError> for crate::error::GuestError {
    fn from(e: WitError) -> Self {
        use crate::error::GuestError as G;
        match e {
            WitError::NotFound(m) => G::NotFound(m),
            WitError::InvalidSpec(m) => G::InvalidSpec(m),
            WitError::Unavailable(m) => G::Unavailable(m),
            WitError::Denied(m) => G::Denied(m),
            WitError::Internal(m) => G::Internal(m),
        }
    }
}

impl bindings::banlieue::host::types::Host for crate::state::HostState {}
