//! What can go wrong loading or calling a component, as a caller can act on it.

use std::time::Duration;

/// A failed load or call. Every variant says what the component did or lacks;
/// none of them means the host is broken.
#[derive(Debug, thiserror::Error)]
pub enum CallError {
    #[error("not a valid WebAssembly component: {0}")]
    Invalid(String),
    #[error("incompatible contract: {0}")]
    Incompatible(String),
    #[error("component imports `{import}`, which banlieue does not provide to {world} components")]
    ForbiddenImport { import: String, world: &'static str },
    #[error("component exceeded its CPU budget of {0:?} of guest time")]
    CpuBudget(Duration),
    #[error("component exceeded its memory limit of {0} MiB")]
    Memory(u64),
    #[error("component trapped: {0}")]
    Trap(String),
    #[error("no sandbox slot free, retry later: {0}")]
    Busy(String),
    /// The component returned an error value of the contract.
    #[error("{0}")]
    Guest(GuestError),
    /// A driver answered with a result outside what the host accepts (`validate`): too
    /// large, too many entries, malformed addresses or names, or a value the contract
    /// does not define.
    #[error("{0}")]
    InvalidResult(String),
    /// The driver was built for a contract without `feature`; the host refused the call.
    #[error("{feature} needs banlieue:provider {}; this driver was built for {contract}: rebuild it against {} or later", .feature.since(), .feature.since())]
    Unsupported { feature: Feature, contract: semver::Version },
    /// The driver's contract has `feature`, but the driver does not offer it (its `features`
    /// answer does not list it); the host refused the call.
    #[error("this driver does not offer {0}")]
    NotOffered(Feature),
    /// The component answered, but with something the contract does not allow.
    #[error("invalid decision: {0}")]
    InvalidDecision(#[from] InvalidDecision),
}

/// What a newer provider contract added, which an older driver lacks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Feature {
    /// `snapshot-create`, `-list`, `-revert`, `-delete` (0.6.0).
    Snapshots,
    /// `disk-export`: a machine's disks carried away to another backend (0.6.0).
    DiskExport,
    /// `disk-import`: a machine made from disks carried from another backend (0.6.0).
    DiskImport,
    /// `list-machines`, `adopt`, `release`: machines banlieue did not make, found, taken and
    /// let go of (0.6.0).
    Adopt,
    /// `console` of kind `serial`: a machine's serial console (0.6.0).
    Console,
    /// `console` of kind `vnc`: a machine's graphical display (0.6.0).
    Vnc,
}

impl Feature {
    /// The contract version that added it.
    pub fn since(self) -> &'static str {
        "0.6.0"
    }

    /// Its name in a driver's `features` answer.
    pub fn name(self) -> &'static str {
        match self {
            Feature::Snapshots => "snapshots",
            Feature::DiskExport => "disk-export",
            Feature::DiskImport => "disk-import",
            Feature::Adopt => "adopt",
            Feature::Console => "console",
            Feature::Vnc => "vnc",
        }
    }

    /// The feature a console of `kind` needs.
    pub fn of_console(kind: crate::provider::ConsoleKind) -> Feature {
        match kind {
            crate::provider::ConsoleKind::Serial => Feature::Console,
            crate::provider::ConsoleKind::Vnc => Feature::Vnc,
        }
    }
}

impl std::fmt::Display for Feature {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// A placement decision that names no candidate.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum InvalidDecision {
    #[error("the policy chose candidate {index} of {candidates}")]
    OutOfRange { index: u32, candidates: usize },
    /// From a 0.1 component, which names its choice by provider and failure domain.
    #[error("the policy chose {provider}/{failure_domain}, which is not a candidate")]
    NotACandidate { provider: String, failure_domain: String },
}

/// The contract's `error` variant.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum GuestError {
    #[error("not found: {0}")]
    NotFound(String),
    #[error("invalid spec: {0}")]
    InvalidSpec(String),
    #[error("unavailable: {0}")]
    Unavailable(String),
    #[error("denied: {0}")]
    Denied(String),
    #[error("internal: {0}")]
    Internal(String),
}

impl CallError {
    /// Worth retrying later (the backend or the host was busy), as opposed to a
    /// component or spec that will fail the same way again.
    pub fn is_retryable(&self) -> bool {
        matches!(self, CallError::Busy(_) | CallError::Guest(GuestError::Unavailable(_)))
    }

    /// A short machine-readable reason for conditions and metrics.
    pub fn reason(&self) -> &'static str {
        match self {
            CallError::Invalid(_) => "InvalidComponent",
            CallError::Incompatible(_) => "IncompatibleContract",
            CallError::ForbiddenImport { .. } => "ForbiddenImport",
            CallError::CpuBudget(_) => "CPUBudgetExceeded",
            CallError::Memory(_) => "MemoryLimitExceeded",
            CallError::Trap(_) => "Trapped",
            CallError::Busy(_) => "Busy",
            CallError::Guest(GuestError::NotFound(_)) => "NotFound",
            CallError::Guest(GuestError::InvalidSpec(_)) => "InvalidSpec",
            CallError::Guest(GuestError::Unavailable(_)) => "Unavailable",
            CallError::Guest(GuestError::Denied(_)) => "Denied",
            CallError::Guest(GuestError::Internal(_)) => "Internal",
            CallError::InvalidDecision(_) => "InvalidDecision",
            CallError::InvalidResult(_) => "InvalidDriverResult",
            CallError::Unsupported { feature: Feature::Snapshots, .. } | CallError::NotOffered(Feature::Snapshots) => "SnapshotsUnsupported",
            CallError::Unsupported { feature: Feature::Adopt, .. } | CallError::NotOffered(Feature::Adopt) => "AdoptionUnsupported",
            CallError::Unsupported { .. } | CallError::NotOffered(_) => "CannotCarryDisks",
        }
    }
}
