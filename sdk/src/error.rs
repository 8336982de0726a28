//! Constructors and conversions for the contract's [`Error`] variant.

use crate::Error;

/// Result with the contract's error.
pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    /// The thing asked about does not exist.
    pub fn not_found(msg: impl Into<String>) -> Self {
        Error::NotFound(msg.into())
    }
    /// The request can never succeed as written.
    pub fn invalid_spec(msg: impl Into<String>) -> Self {
        Error::InvalidSpec(msg.into())
    }
    /// A transient failure; the host retries.
    pub fn unavailable(msg: impl Into<String>) -> Self {
        Error::Unavailable(msg.into())
    }
    /// The grant or the backend refused.
    pub fn denied(msg: impl Into<String>) -> Self {
        Error::Denied(msg.into())
    }
    /// A bug or an unexpected backend answer.
    pub fn internal(msg: impl Into<String>) -> Self {
        Error::Internal(msg.into())
    }

    /// The message, whatever the kind.
    pub fn message(&self) -> &str {
        match self {
            Error::NotFound(m)
            | Error::InvalidSpec(m)
            | Error::Unavailable(m)
            | Error::Denied(m)
            | Error::Internal(m) => m,
        }
    }

    /// Whether the host will retry the call.
    pub fn is_retryable(&self) -> bool {
        matches!(self, Error::Unavailable(_))
    }

    pub fn is_not_found(&self) -> bool {
        matches!(self, Error::NotFound(_))
    }

    /// Prefix the message with what was being done, keeping the kind.
    pub fn context(self, what: impl std::fmt::Display) -> Self {
        let wrap = |m: String| format!("{what}: {m}");
        match self {
            Error::NotFound(m) => Error::NotFound(wrap(m)),
            Error::InvalidSpec(m) => Error::InvalidSpec(wrap(m)),
            Error::Unavailable(m) => Error::Unavailable(wrap(m)),
            Error::Denied(m) => Error::Denied(wrap(m)),
            Error::Internal(m) => Error::Internal(wrap(m)),
        }
    }
}

/// A backend answer that does not parse is unexpected, not the user's fault.
/// Decode user input with [`Error::invalid_spec`] instead.
impl From<serde_json::Error> for Error {
    fn from(e: serde_json::Error) -> Self {
        Error::Internal(format!("json: {e}"))
    }
}

impl From<std::string::FromUtf8Error> for Error {
    fn from(e: std::string::FromUtf8Error) -> Self {
        Error::Internal(format!("utf-8: {e}"))
    }
}

impl From<std::num::ParseIntError> for Error {
    fn from(e: std::num::ParseIntError) -> Self {
        Error::Internal(format!("integer: {e}"))
    }
}

impl From<std::fmt::Error> for Error {
    fn from(e: std::fmt::Error) -> Self {
        Error::Internal(format!("format: {e}"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn context_keeps_the_kind() {
        let e = Error::unavailable("timeout").context("GET /vms");
        assert_eq!(e, Error::Unavailable("GET /vms: timeout".into()));
        assert!(e.is_retryable());
    }

    #[test]
    fn json_errors_are_internal() {
        let e: Error = serde_json::from_str::<u32>("nope").unwrap_err().into();
        assert!(matches!(e, Error::Internal(_)));
    }
}
