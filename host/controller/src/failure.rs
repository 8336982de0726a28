//! How a reconcile fails, in two kinds only:
//!
//! - a [`Failure`]: the reconcile cannot go on for a reason a user can act on (a class
//!   missing, a backend down, a driver refusing). It becomes a condition — reason and
//!   message — and, when `retry` says it may clear by itself, a retry with backoff;
//!   otherwise the watch on what is missing brings the object back.
//! - an [`Error`]: the reconcile could not even say so (the API server refused a write, a
//!   cache stopped). The controller runtime retries it with backoff.
//!
//! Each error met on the way owns its reason and whether it may clear by itself
//! ([`Cause`]), so `?` turns it into a Failure and nothing parses a message back.

use banlieue_runtime::{CallError, Feature, GuestError};

use crate::status::reasons::Reason;

/// Why a reconcile cannot go on, as the condition that says so.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Failure {
    pub reason: Reason,
    /// What happened and, where it can, what to do about it.
    pub message: String,
    /// It may clear without a change to any object (retried with backoff).
    pub retry: bool,
}

impl Failure {
    /// A failure only a change clears (the object, or what it names, must change).
    pub fn until_changed(reason: Reason, message: impl Into<String>) -> Failure {
        Failure { reason, message: message.into(), retry: false }
    }

    /// A failure that may clear by itself: retried with backoff.
    pub fn transient(reason: Reason, message: impl Into<String>) -> Failure {
        Failure { reason, message: message.into(), retry: true }
    }

    /// The same failure with `context` before its message (what was being done).
    pub fn context(self, context: impl std::fmt::Display) -> Failure {
        Failure { message: format!("{context}: {}", self.message), ..self }
    }
}

impl std::fmt::Display for Failure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.reason, self.message)
    }
}

/// An error that knows the reason it is reported with and whether it may clear by itself.
pub trait Cause: std::fmt::Display {
    fn reason(&self) -> Reason;
    fn retry(&self) -> bool;
}

impl<E: Cause + ?Sized> Cause for &E {
    fn reason(&self) -> Reason {
        (**self).reason()
    }

    fn retry(&self) -> bool {
        (**self).retry()
    }
}

impl<E: Cause> From<E> for Failure {
    fn from(e: E) -> Failure {
        Failure { reason: e.reason(), message: e.to_string(), retry: e.retry() }
    }
}

/// A component call: what the driver or the sandbox said.
impl Cause for CallError {
    fn reason(&self) -> Reason {
        match self {
            CallError::Guest(GuestError::Denied(_)) => Reason::CredentialsRefused,
            CallError::Guest(GuestError::Unavailable(_)) => Reason::BackendUnavailable,
            CallError::Guest(GuestError::InvalidSpec(_)) => Reason::InvalidSpec,
            CallError::Guest(GuestError::NotFound(_)) => Reason::NotFound,
            CallError::Guest(GuestError::Internal(_)) => Reason::DriverError,
            CallError::Invalid(_) => Reason::InvalidComponent,
            CallError::Incompatible(_) => Reason::IncompatibleContract,
            CallError::ForbiddenImport { .. } => Reason::ForbiddenImport,
            CallError::CpuBudget(_) => Reason::CPUBudgetExceeded,
            CallError::Memory(_) => Reason::MemoryLimitExceeded,
            CallError::Trap(_) => Reason::Trapped,
            CallError::Busy(_) => Reason::Busy,
            CallError::InvalidDecision(_) => Reason::InvalidDecision,
            CallError::InvalidResult(_) => Reason::InvalidDriverResult,
            CallError::Unsupported { feature: Feature::Snapshots, .. } | CallError::NotOffered(Feature::Snapshots) => Reason::SnapshotsUnsupported,
            CallError::Unsupported { feature: Feature::Adopt, .. } | CallError::NotOffered(Feature::Adopt) => Reason::AdoptionUnsupported,
            CallError::Unsupported { feature: Feature::Console | Feature::Vnc, .. } | CallError::NotOffered(Feature::Console | Feature::Vnc) => Reason::ConsoleUnsupported,
            CallError::Unsupported { .. } | CallError::NotOffered(_) => Reason::CannotCarryDisks,
        }
    }

    fn retry(&self) -> bool {
        self.is_retryable()
    }
}

/// A Kubernetes API call, retried: `Forbidden` when RBAC denied it (the server's message
/// names the user, verb and resource to grant), else `APIError`.
impl Cause for kube::Error {
    fn reason(&self) -> Reason {
        match self {
            kube::Error::Api(s) if s.code == 403 => Reason::Forbidden,
            _ => Reason::APIError,
        }
    }

    fn retry(&self) -> bool {
        true
    }
}

/// An API call's failure as its condition: the message says what to grant when RBAC denied it.
pub fn api_failure(e: &kube::Error) -> Failure {
    let message = match e {
        kube::Error::Api(s) if s.code == 403 => format!("{}; grant it to banlieue's role (deploy/base/rbac.yaml, from `banlieue rbacgen`)", s.message),
        kube::Error::Api(s) => format!("{} ({})", s.message, s.reason),
        other => other.to_string(),
    };
    Failure { reason: e.reason(), message, retry: true }
}

/// Errors a reconcile returns to the controller runtime (which retries with backoff).
/// What a user can act on is a [`Failure`] on a condition instead.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("Kubernetes API: {0}")]
    Kube(#[from] kube::Error),
    /// A watch the reconcile reads through ended before its cache was ready.
    #[error("the {0} cache's watch stopped")]
    CacheStopped(&'static str),
}

#[cfg(test)]
mod tests {
    use super::*;

    fn api(code: u16) -> kube::Error {
        kube::Error::Api(kube::core::Status::failure("virtualmachines is forbidden: User \"x\"", "Forbidden").with_code(code).boxed())
    }

    #[test]
    fn an_rbac_denial_says_what_to_grant_and_other_api_errors_are_api_errors() {
        let denied = api_failure(&api(403));
        assert_eq!((denied.reason, denied.retry), (Reason::Forbidden, true));
        assert!(denied.message.contains("deploy/base/rbac.yaml"), "{}", denied.message);
        assert_eq!(api_failure(&api(500)).reason, Reason::APIError);
    }

    #[test]
    fn a_call_error_keeps_its_reason_and_retry_rule_through_question_mark() {
        fn call() -> Result<(), Failure> {
            Err(CallError::Guest(GuestError::Unavailable("vcenter down".into())))?
        }
        let f = call().unwrap_err();
        assert_eq!((f.reason, f.retry), (Reason::BackendUnavailable, true));
        assert!(f.message.contains("vcenter down"));
        assert_eq!(Failure::from(CallError::Trap("unreachable".into())).reason, Reason::Trapped);
        assert_eq!(Failure::from(CallError::Guest(GuestError::Denied("no".into()))).reason, Reason::CredentialsRefused);
        let f: Failure = CallError::Guest(GuestError::InvalidSpec("no such disk".into())).into();
        assert_eq!((f.reason, f.retry), (Reason::InvalidSpec, false));
    }
}
