//! Every reason banlieue's controllers give — on a condition or an Event — in one
//! vocabulary. docs/operations.md says what each means and what to do. Which failure
//! gives which reason is said by the failure itself ([`crate::failure::Cause`]).

use banlieue_api::common::{MachinePhase, PowerState};

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
    // A machine's hardware against its spec (`ConfigurationApplied`).
    Applied, PendingRestart, DiskShrinkRefused, NotAppliedInPlace, Reconfigured,
    // Objects a VM or Machine names that are missing or wrong.
    ClassNotFound, ImageNotFound, ImageNotReady, UserDataNotFound, InvalidUserData, ProviderNotFound,
    ProviderClassNotFound, PlacementPolicyNotFound, NoImageSource, InvalidSpec,
    InvalidPlacement, InvalidConnection, InvalidBootstrapData, FailureDomainNotFound,
    // Addresses.
    InvalidNetwork, AddressConflict, AddressesReported, WaitingForIPAddress, IPAMNotInstalled,
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
    // Snapshots and reverts.
    SnapshotTaken, SnapshotInProgress, SnapshotDeleted, SnapshotsUnsupported, VMNotFound, VMNotPlaced, NotFoundOnBackend,
    Reverting, Reverted, InvalidRevert, SnapshotNotReady, InvalidSchedule, SnapshotRunStarted, SnapshotsBlockMove, SnapshotsDropped, InvalidRestore, Restored,
    // Moves that carry the disks.
    CannotCarryDisks, Carrying, Moved, MoveFailed,
    // Machines banlieue did not make: adopted, matched against their class, let go of.
    Adopted, AlreadyManaged, AdoptionUnsupported, ConfigurationMatches, ConfigurationDiffers, Released,
    // Consoles: a session's audit, and why one was not opened.
    ConsoleOpened, ConsoleClosed, ConsoleUnsupported, TooManySessions,
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

impl Reason {
    /// The reason the API shows as `name`, if it is one of banlieue's.
    pub fn parse(name: &str) -> Option<Reason> {
        Reason::ALL.iter().copied().find(|r| r.as_str() == name)
    }

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
}
