//! The one error type of this crate. Messages name keys, paths and status codes, never values.

/// Why a secret could not be read; each case maps onto the WIT `error` variant.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SecretError {
    /// The key, Secret or path does not exist.
    #[error("secret not found: {0}")]
    NotFound(String),
    /// The backend refused our credentials (bad token, RBAC, policy).
    #[error("secret access denied: {0}")]
    Denied(String),
    /// The backend could not be reached or failed; worth retrying.
    #[error("secret backend unavailable: {0}")]
    Unavailable(String),
    /// The request or the stored value is unusable as is (bad key, not UTF-8, not a string).
    #[error("invalid secret: {0}")]
    Invalid(String),
}
