//! Every reason banlieue's controllers give — on a condition or an Event — in one
//! vocabulary, and the mappings from the failures they meet (API errors, component
//! calls, component loading, grants) to it. docs/operations.md says what each means
//! and what to do.

use banlieue_api::common::{MachinePhase, PowerState};
use banlieue_runtime::{CallError, GuestError};

use crate::sandbox::components::LoadError;
use crate::sandbox::grants::GrantError;

macro_rules! reasons {
    ($($(#[$doc:meta])* $name:ident),* $(,)?) => {
        /// Why a condition is what it is, or why an Event was recorded.
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
        pub enum Reason {
            $($(#[$doc])* $name,)*
        }

        impl Reason {
            /// Every reason, for documentation and tests.
            pub const ALL: &[Reason] = &[$(Reason::$name,)*];

            /// The name the API shows (`reason: NoCandidates`).
            pub const fn as_str(self) -> &'static str {
                match self {
                    $(Reason::$name => stringify!($name),)*
                }
            }
        }
    };
}

reasons! {
    // Progress.
    Scheduled, Rescheduled, PlacementHolds, Provisioning, Provisioned, Moving, Deleting, Deleted,
    Paused, Resumed, Restarted, Probed, Loaded, BuiltIn, SignatureVerified, UnsignedAllowed,
    WaitingForInfrastructure, NotPaused,
    // CAPI: what a cluster or a machine made from a template waits for.
    WaitingForCluster, WaitingForClusterInfrastructure, WaitingForControlPlaneEndpoint, WaitingForOwner,
    WaitingForBootstrapData, NoFailureDomains,
    // What the backend reports about a machine.
    PoweredOn, PoweredOff, Suspended, Cloning, Configuring, PoweringOn, WaitingForAddress, Running,
    ShuttingDown, PowerStateMismatch,
    // Objects a VM or Machine names that are missing or wrong.
    ClassNotFound, ImageNotFound, ImageNotReady, UserDataNotFound, InvalidUserData, ProviderNotFound,
    ProviderClassNotFound, PlacementPolicyNotFound, NoImageSource, InvalidSpec,
    InvalidPlacement, InvalidConnection, InvalidBootstrapData, FailureDomainNotFound,
    // Placement.
    NoCandidates, InvalidDecision, PlacementPolicyNotReady, MigrationPending, MigrationDisabled,
    // Backends and drivers.
    BackendUnavailable, Queued, CredentialsRefused, CredentialsUnavailable, CredentialsNotFound, NotFound, DriverError, DriverNotReady,
    InvalidDriverResult,
    // Components: fetching, verifying, loading, running.
    Unsigned, VerificationFailed, InvalidArtifact, FetchFailed, SourceInvalid, PullSecretInvalid,
    CapabilitiesNotAllowed, NotLoaded, CRDInstallFailed, InvalidComponent, IncompatibleContract,
    ForbiddenImport, CPUBudgetExceeded, MemoryLimitExceeded, Trapped, Busy,
    // Images.
    Fetched, URLNotAllowed, ChecksumMismatch, ImageTooLarge, NotADiskImage, Imported, ImportFailed, NoProvider, InUse,
    Built, Building, BuildFailed, BuildNotConfigured,
    // Pools.
    AllReady, NotAllReady, Scaling, ScaledOut, ScaledIn, Updating, Stable, InvalidSelector, AutoHealingLimit,
    // The API server.
    Forbidden, APIError, MachineApplyFailed, Internal,
}

impl std::fmt::Display for Reason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl PartialEq<str> for Reason {
    fn eq(&self, other: &str) -> bool {
        self.as_str() == other
    }
}

impl PartialEq<String> for Reason {
    fn eq(&self, other: &String) -> bool {
        self.as_str() == other
    }
}

/// A failure a reconcile reports as a condition: the reason, a message a user can act
/// on, and whether it may clear without a change (then it is retried with backoff).
pub type Failure = (Reason, String, bool);

impl Reason {
    /// A machine's power state, as its `Ready` reason.
    pub fn of_power(power: PowerState) -> Reason {
        match power {
            PowerState::PoweredOn => Reason::PoweredOn,
            PowerState::PoweredOff => Reason::PoweredOff,
            PowerState::Suspended => Reason::Suspended,
        }
    }

    /// A machine's phase, as its `Ready` reason while it is on its way.
    pub fn of_phase(phase: MachinePhase) -> Reason {
        match phase {
            MachinePhase::Provisioning => Reason::Provisioning,
            MachinePhase::Cloning => Reason::Cloning,
            MachinePhase::Configuring => Reason::Configuring,
            MachinePhase::PoweringOn => Reason::PoweringOn,
            MachinePhase::WaitingForAddress => Reason::WaitingForAddress,
            MachinePhase::Running => Reason::Running,
            MachinePhase::ShuttingDown => Reason::ShuttingDown,
            MachinePhase::PoweredOff => Reason::PoweredOff,
        }
    }

    /// A component call's failure: what the driver or the sandbox said.
    pub fn of_call(e: &CallError) -> Reason {
        match e {
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
        }
    }

    /// Why a component could not be loaded.
    pub fn of_load(e: &LoadError) -> Reason {
        use banlieue_oci::Error as O;
        use banlieue_runtime::source::SourceError as S;
        match e {
            LoadError::Source(S::UnsignedNotAllowed(_) | S::Oci(O::Unsigned { .. })) => Reason::Unsigned,
            LoadError::Source(S::Oci(O::SignatureMismatch { .. } | O::DigestMismatch(_))) => Reason::VerificationFailed,
            LoadError::Source(S::Oci(O::InvalidArtifact(_) | O::TooLarge { .. })) => Reason::InvalidArtifact,
            LoadError::Source(S::Oci(_)) => Reason::FetchFailed,
            LoadError::Source(_) => Reason::SourceInvalid,
            LoadError::Component(e) => Reason::of_call(e),
            LoadError::PullSecret(_) => Reason::PullSecretInvalid,
            LoadError::CapabilitiesNotAllowed(..) => Reason::CapabilitiesNotAllowed,
        }
    }

    /// Why a Provider's grants could not be built.
    pub fn of_grant(e: &GrantError) -> Reason {
        match e {
            GrantError::Invalid(_) => Reason::InvalidConnection,
            GrantError::Unavailable(_) => Reason::BackendUnavailable,
        }
    }

    /// Why a Kubernetes API call failed: `Forbidden` when RBAC denied it (the server's
    /// message names the user, verb and resource to grant), else `APIError`.
    pub fn of_api(e: &kube::Error) -> (Reason, String) {
        match e {
            kube::Error::Api(s) if s.code == 403 => {
                (Reason::Forbidden, format!("{}; grant it to banlieue's role (deploy/base/rbac.yaml, from `banlieue rbacgen`)", s.message))
            }
            kube::Error::Api(s) => (Reason::APIError, format!("{} ({})", s.message, s.reason)),
            other => (Reason::APIError, other.to_string()),
        }
    }
}

/// A driver call's failure as a condition a user can act on.
pub fn call_failure(e: &CallError) -> Failure {
    (Reason::of_call(e), e.to_string(), e.is_retryable())
}

/// An API call's failure, retried.
pub fn api_failure(e: &kube::Error) -> Failure {
    let (reason, message) = Reason::of_api(e);
    (reason, message, true)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_unique_and_what_the_api_shows() {
        let names: std::collections::BTreeSet<&str> = Reason::ALL.iter().map(|r| r.as_str()).collect();
        assert_eq!(names.len(), Reason::ALL.len());
        assert_eq!(Reason::NoCandidates.as_str(), "NoCandidates");
        assert_eq!(Reason::CPUBudgetExceeded.to_string(), "CPUBudgetExceeded");
        assert!(Reason::Forbidden == *"Forbidden");
    }

    #[test]
    fn every_reason_is_documented_in_the_operations_guide() {
        let guide = include_str!("../../../../docs/operations.md");
        let missing: Vec<&str> = Reason::ALL.iter().map(|r| r.as_str()).filter(|r| !guide.contains(&format!("`{r}`"))).collect();
        assert!(missing.is_empty(), "docs/operations.md does not explain: {missing:?}");
    }

    #[test]
    fn a_call_that_trapped_or_ran_out_of_budget_says_so() {
        assert_eq!(Reason::of_call(&CallError::Trap("unreachable".into())), Reason::Trapped);
        assert_eq!(Reason::of_call(&CallError::Guest(GuestError::Denied("no".into()))), Reason::CredentialsRefused);
    }
}
