//! One error type for every libvirt call, shaped like the WIT `error` variant.

use virt::error::{Error as VirtError, ErrorDomain, ErrorNumber};

/// Why a libvirt call failed; each case maps onto the WIT `banlieue:host/types.error`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LibvirtError {
    /// The domain, volume, pool or network does not exist.
    #[error("not found: {0}")]
    NotFound(String),
    /// The request can never succeed as written (bad XML, unsupported by this driver,
    /// wrong state for the operation); retrying will not help.
    #[error("invalid: {0}")]
    Invalid(String),
    /// The hypervisor could not be reached, or did not answer in time; worth retrying.
    #[error("unavailable: {0}")]
    Unavailable(String),
    /// libvirt refused the credentials or the operation (ACLs, read-only connection).
    #[error("denied: {0}")]
    Denied(String),
    /// Anything else libvirt reported.
    #[error("internal: {0}")]
    Internal(String),
}

/// Shorthand used throughout the crate.
pub type Result<T, E = LibvirtError> = std::result::Result<T, E>;

impl LibvirtError {
    /// Classify an error libvirt reported on `uri`.
    pub(crate) fn from_virt(uri: &str, err: &VirtError) -> Self {
        let message = format!("{} ({uri})", err.message());
        match err.code() {
            ErrorNumber::NoDomain
            | ErrorNumber::NoStorageVolume
            | ErrorNumber::NoStoragePool
            | ErrorNumber::NoNetwork
            | ErrorNumber::NoNodeDevice
            | ErrorNumber::NoSecret
            | ErrorNumber::NoDomainSnapshot
            | ErrorNumber::NoDomainMetadata
            | ErrorNumber::NoDomainCheckpoint
            | ErrorNumber::NoNwfilter => LibvirtError::NotFound(message),
            ErrorNumber::XmlError
            | ErrorNumber::XmlDetail
            | ErrorNumber::InvalidArg
            | ErrorNumber::NoSupport
            | ErrorNumber::ConfigUnsupported
            | ErrorNumber::ArgumentUnsupported
            | ErrorNumber::OperationUnsupported
            | ErrorNumber::OperationInvalid
            | ErrorNumber::OsType
            | ErrorNumber::NoName
            | ErrorNumber::NoOs
            | ErrorNumber::NoDevice
            | ErrorNumber::DomExist
            | ErrorNumber::StorageVolExist
            | ErrorNumber::NetworkExist
            | ErrorNumber::InvalidMac
            | ErrorNumber::CpuIncompatible
            | ErrorNumber::XmlInvalidSchema
            | ErrorNumber::DeviceMissing => LibvirtError::Invalid(message),
            ErrorNumber::AuthFailed
            | ErrorNumber::AuthCancelled
            | ErrorNumber::AccessDenied
            | ErrorNumber::OperationDenied => LibvirtError::Denied(message),
            _ if connection_lost(err) => LibvirtError::Unavailable(message),
            ErrorNumber::OperationTimeout
            | ErrorNumber::AgentUnresponsive
            | ErrorNumber::ResourceBusy
            | ErrorNumber::OperationAborted
            | ErrorNumber::UnknownHost
            | ErrorNumber::AuthUnavailable => LibvirtError::Unavailable(message),
            _ => LibvirtError::Internal(message),
        }
    }
}

/// Errors after which the connection cannot be trusted and is reopened on the next call.
pub(crate) fn connection_lost(err: &VirtError) -> bool {
    match err.code() {
        ErrorNumber::NoConnect
        | ErrorNumber::InvalidConn
        | ErrorNumber::Rpc
        | ErrorNumber::GnutlsError
        | ErrorNumber::Ssh
        | ErrorNumber::Libssh => true,
        // A system error is the connection's only when it comes from the transport (EOF, reset);
        // a failed file operation on the host must not throw a healthy connection away.
        ErrorNumber::SystemError => matches!(err.domain(), ErrorDomain::Rpc | ErrorDomain::Remote),
        _ => false,
    }
}
