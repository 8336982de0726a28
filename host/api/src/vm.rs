//! `VirtualMachine`: the user's VM, and `VirtualMachinePool`.

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, LabelSelector};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::common::{Initialization, MachineAddress, MachinePhase, NameRef, PowerOffMode, PowerState, SecretKeyRef, StaticIp};

/// A virtual machine, run on whichever Provider its placement picks.
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[kube(
    group = "banlieue.io",
    version = "v1alpha1",
    kind = "VirtualMachine",
    namespaced,
    status = "VirtualMachineStatus",
    shortname = "vm",
    category = "banlieue",
    derive = "PartialEq",
    derive = "Default",
    doc = "A virtual machine: class, image, placement, power state and user-data, run on any Provider.",
    printcolumn(name = "Class", type_ = "string", json_path = ".spec.classRef.name"),
    printcolumn(name = "Image", type_ = "string", json_path = ".spec.imageRef.name"),
    printcolumn(name = "Provider", type_ = "string", json_path = ".status.scheduled.provider"),
    printcolumn(name = "Power", type_ = "string", json_path = ".status.observedPowerState"),
    printcolumn(name = "Ready", type_ = "string", json_path = ".status.conditions[?(@.type==\"Ready\")].status"),
    printcolumn(name = "Phase", type_ = "string", priority = 1, json_path = ".status.phase"),
    printcolumn(name = "Addresses", type_ = "string", priority = 1, json_path = ".status.addresses[*].address"),
    printcolumn(name = "Age", type_ = "date", json_path = ".metadata.creationTimestamp")
)]
#[serde(rename_all = "camelCase")]
pub struct VirtualMachineSpec {
    /// The VMClass (hardware shape) of this VM.
    pub class_ref: NameRef,
    /// The VMImage this VM boots from. Required, unless the VM adopts one that exists
    /// (`adopt`), which keeps what it boots from.
    #[serde(default, skip_serializing_if = "NameRef::is_unset")]
    #[schemars(transform = crate::common::no_default)]
    pub image_ref: NameRef,
    /// Where the VM may run; empty means any Provider in the namespace.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub placement: Option<Placement>,
    /// The power state banlieue drives the VM towards.
    #[serde(default)]
    pub desired_power_state: PowerState,
    /// How the VM is powered off (power off, restart, delete); the timeout comes from its class.
    #[serde(default)]
    pub power_off_mode: PowerOffMode,
    /// Bump to any new value (conventionally an RFC 3339 time) to restart the VM once.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub restart_requested_at: Option<String>,
    /// When a change of its class's CPUs, memory or disk sizes reaches the VM while it runs:
    /// `OnNextPowerCycle` (default: the next power-off or restart) or `Restart` (at once,
    /// powering it off and on). A VM that is off gets it at once either way.
    #[serde(default)]
    pub update_policy: crate::infra::UpdatePolicy,
    /// Cloud-init / ignition user-data, read from a Secret key.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub user_data: Option<SecretKeyRef>,
    /// How the guest reads `userData`: cloud-init (default) or Ignition. A backend that
    /// cannot deliver Ignition refuses the VM, never passes it on as cloud-init.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub user_data_format: Option<crate::infra::UserDataFormat>,
    /// Static addresses (or IP pools) of the class's NICs; a NIC not named here takes DHCP.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub network: Option<VmNetwork>,
    /// Make the VM from a snapshot rather than from its image: a new machine with the
    /// snapshotted VM's disks as they were (a restore into a new VM), on the snapshot's
    /// Provider (`spec.placement.providerRef` must name it). Read when the VM's machine is
    /// made; the VM lives on its own afterwards.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub source: Option<VmSource>,
    /// Revert the VM to this VMSnapshot (a Ready snapshot of this VM, same namespace), once:
    /// the VM is powered off (per `powerOffMode`), its backend machine brought back to the
    /// snapshot, and powered on again if `desiredPowerState` says so. Recorded in
    /// `status.revert`; set it again (after clearing it) to revert to the same snapshot again.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub revert_to: Option<String>,
    /// What happens when the placement no longer matches where the VM runs.
    #[serde(default)]
    pub migration_policy: MigrationPolicy,
    /// How the VM moves when it does: `CarryDisks` (default) takes its disks along (powered
    /// off, exported, converted, imported on the new backend, then started there; the old
    /// machine goes only once the new one is Ready), `Recreate` makes it afresh from its image
    /// on the new backend (what the guest wrote is lost). A move between backends that cannot
    /// carry disks is refused (`PlacementValid=False/CannotCarryDisks`), never made a recreate.
    #[serde(default)]
    pub move_strategy: MoveStrategy,
    /// Take over a VM that already exists on the Provider `placement.providerRef` names,
    /// instead of making one (`kubectl vm discover` lists them): it is marked as this VM's on
    /// its backend and managed from then on like any other — power, restarts, snapshots,
    /// moves, deletion — never recreated. Its hardware is reported in `status.hardware`;
    /// where it differs from the class, `ConfigurationMatches=False` names the differences
    /// (the VM is not changed). A VM another VirtualMachine or banlieue installation manages
    /// is refused (`AlreadyManaged`). Read when the VM's machine is made.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub adopt: Option<VmAdopt>,
    /// What deleting this VirtualMachine does to its backend VM: `Delete` (default) removes
    /// it and its disks; `Orphan` removes banlieue's mark from it and leaves it as it is,
    /// running or not, to be discovered (and adopted) again.
    #[serde(default)]
    pub deletion_policy: DeletionPolicy,
    /// Stop reconciling this VM (the backend VM is left as it is).
    #[serde(default)]
    pub paused: bool,
}

/// Which existing VMs a pool adopts as members.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct AdoptSelector {
    /// Backend names, `*` standing for any run of characters (`billing-*`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub names: Vec<String>,
    /// Backend tags (Proxmox VE's); a VM carrying any of them matches.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tags: Vec<String>,
}

/// A VM's CPUs and memory as its backend holds them.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct VmHardware {
    pub cpus: u32,
    #[serde(rename = "memoryMiB")]
    pub memory_mib: u64,
}

/// A VM that exists on a backend, to adopt.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct VmAdopt {
    /// What the backend calls it, as `kubectl vm discover` shows it: a libvirt domain UUID,
    /// a vSphere instance UUID, a Proxmox VE VM id.
    pub backend_id: String,
    /// Bring the VM to its class — CPUs, memory, each disk grown by position — while it is
    /// powered off (as a class change is: at once when off, else per `updatePolicy`). A disk
    /// larger than the class's is never shrunk: `ConfigurationMatches=False/DiskShrinkRefused`
    /// and nothing is changed. Disks the VM lacks are not added. Off (the default): the VM
    /// keeps the hardware it has, and a difference is only reported.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub apply_class: bool,
}

/// What deleting a VirtualMachine does to its backend VM.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema)]
pub enum DeletionPolicy {
    /// Remove the backend VM and its disks.
    #[default]
    Delete,
    /// Leave the backend VM as it is, without banlieue's mark.
    Orphan,
}

/// Where a VM's disks come from, when not from its image.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct VmSource {
    /// A Ready VMSnapshot of this namespace (of another VM, or of one since deleted while
    /// the snapshot lives).
    pub snapshot_ref: NameRef,
    /// Share the snapshotted disks where the backend can (a vSphere linked clone) instead of
    /// copying them; Proxmox VE and libvirt always copy.
    #[serde(default)]
    pub linked_clone: bool,
}

/// How a VM's NICs are addressed.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct VmNetwork {
    /// One entry per NIC (by its name in the VM's class) that does not take DHCP.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 16))]
    pub interfaces: Vec<InterfaceAddressing>,
}

/// The addressing of one NIC of the VM's class.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct InterfaceAddressing {
    /// The NIC's name in the VM's class.
    #[schemars(length(min = 1, max = 63))]
    pub name: String,
    #[serde(flatten)]
    pub ip: StaticIp,
    /// IP pools to take an address from (one each), through Cluster API's IPAM contract
    /// (`ipam.cluster.x-k8s.io/v1beta1`): banlieue claims an address per pool
    /// (`IPAddressClaim` `<vm>-<nic>-<index>`, owned by the VM), waits for the IPAM
    /// provider's `IPAddress`, and releases the claim when the VM is deleted or no longer
    /// names the pool. The pool's gateway is the NIC's unless `gateway` is set.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 4))]
    pub addresses_from_pools: Vec<PoolRef>,
}

/// An IP pool of an IPAM provider (a `TypedLocalObjectReference` in the VM's namespace, as
/// Cluster API's IPAM contract shapes it), e.g. `{apiGroup: ipam.cluster.x-k8s.io, kind: InClusterIPPool, name: lan}`.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, PartialOrd, Ord, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PoolRef {
    /// The pool kind's API group.
    #[schemars(length(min = 1, max = 253))]
    pub api_group: String,
    #[schemars(length(min = 1, max = 63))]
    pub kind: String,
    #[schemars(length(min = 1, max = 253))]
    pub name: String,
}

impl std::fmt::Display for PoolRef {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}.{} {:?}", self.kind, self.api_group, self.name)
    }
}

/// Placement constraints of a VM.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Placement {
    /// Pin the VM to one Provider by name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub provider_ref: Option<NameRef>,
    /// Providers whose labels match are candidates.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub provider_selector: Option<LabelSelector>,
    /// Failure domains whose labels match are candidates.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failure_domain_selector: Option<LabelSelector>,
    /// Keep away from VMs matching a selector within a topology.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub anti_affinity: Vec<AntiAffinityRule>,
    /// The PlacementPolicy that chooses among candidates, instead of the class's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub policy_ref: Option<NameRef>,
}

/// Keep this VM apart from others that share a topology value.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct AntiAffinityRule {
    /// Failure-domain label (or `banlieue.io/provider`, `banlieue.io/failure-domain`) that defines "together".
    #[schemars(length(min = 1, max = 317))]
    pub topology_key: String,
    /// The VMs to keep away from (in the same namespace).
    pub label_selector: LabelSelector,
    /// Required rules filter candidates; preferred ones only weigh them.
    #[serde(default)]
    pub mode: AffinityMode,
    /// Weight of a preferred rule.
    #[serde(default = "default_weight")]
    #[schemars(range(min = 1, max = 100))]
    pub weight: i32,
}

fn default_weight() -> i32 {
    1
}

/// Required or preferred.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema)]
pub enum AffinityMode {
    Required,
    #[default]
    Preferred,
}

/// When a VM runs somewhere its placement no longer allows.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema)]
pub enum MigrationPolicy {
    /// Move it (tear down, recreate on the new placement) as soon as placement changes.
    #[default]
    Automatic,
    /// Report `PlacementValid=False`; move only when the user deletes `status.scheduled` by bumping the restart field.
    Manual,
    /// Never move; report `PlacementValid=False`.
    Never,
    /// As `Automatic`, and a VM with snapshots moves too: its snapshots are deleted first (an
    /// Event says so). With any other policy a VM with snapshots does not move
    /// (`PlacementValid=False/SnapshotsBlockMove`): its snapshots live on the machine it leaves.
    AutomaticDroppingSnapshots,
}

/// How a VM moves to another placement.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema)]
pub enum MoveStrategy {
    /// Carry the disks to the new backend: nothing the guest wrote is lost.
    #[default]
    CarryDisks,
    /// Tear the machine down and make it afresh from the image on the new backend.
    Recreate,
}

/// A move that carries the VM's disks, while it lasts (and when it failed, why).
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct MoveStatus {
    /// Where the VM runs until the move is done.
    pub from: MoveEnd,
    /// Where it goes.
    pub to: MoveEnd,
    pub phase: MovePhase,
    /// Each disk carried: bytes moved so far of the phase's total.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub disks: Vec<MovedDisk>,
    /// Why the move failed (phase `Failed`); the VM stays where it was until its spec changes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    /// The VM's generation the move was made (or failed) for.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub start_time: Option<k8s_openapi::apimachinery::pkg::apis::meta::v1::Time>,
}

/// One end of a move: the placement and the Machine there.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct MoveEnd {
    pub scheduled: Scheduled,
    pub machine: InfrastructureRef,
}

/// Where a move that carries the disks is.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema)]
pub enum MovePhase {
    /// The VM is powered off on its old backend (per `powerOffMode`).
    #[default]
    PoweringOff,
    /// The old backend's driver hands each disk to banlieue, which streams it into its cache.
    Exporting,
    /// `qemu-img convert` to the format the new backend takes.
    Converting,
    /// The new backend's driver makes the machine from the carried disks.
    Importing,
    /// The new machine is brought to the VM's power state.
    Starting,
    /// The new machine is Ready: the old one is being deleted.
    RemovingSource,
    /// The move failed; the VM runs where it was.
    Failed,
}

/// A disk on its way.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct MovedDisk {
    pub name: String,
    pub bytes_done: u64,
    /// The phase's total, once known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bytes_total: Option<u64>,
}

/// Observed state of a VirtualMachine.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct VirtualMachineStatus {
    /// Where the scheduler put the VM.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scheduled: Option<Scheduled>,
    /// The infrastructure Machine realising this VM.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub infrastructure_ref: Option<InfrastructureRef>,
    /// Mirrors the Machine's `initialization`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub initialization: Option<Initialization>,
    /// Addresses reported by the backend.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub addresses: Vec<MachineAddress>,
    /// The power state the backend reports.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_power_state: Option<PowerState>,
    /// Where the machine is on its way to running, as the backend reports it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phase: Option<MachinePhase>,
    /// The last `restartRequestedAt` acted upon.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_restart_requested_at: Option<String>,
    /// The VM's CPUs and memory as its backend holds them (its disks and NICs: `disks`,
    /// `interfaces`): what an adopted VM has, whatever its class says.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hardware: Option<VmHardware>,
    /// The VM's disks as its backend holds them (name, size, backend id).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub disks: Vec<crate::infra::DiskStatus>,
    /// The VM's NICs as its backend holds them (name, MAC, network, static addresses).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub interfaces: Vec<crate::infra::InterfaceStatus>,
    /// The `IPAddressClaim`s banlieue made for `spec.network`'s pools (recorded before each
    /// is made, so none is forgotten when the VM is deleted or leaves a pool).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub ip_address_claims: Vec<String>,
    /// The last revert to a snapshot (`spec.revertTo`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub revert: Option<RevertStatus>,
    /// A move that carries the disks, while it lasts, or the last one that failed.
    #[serde(rename = "move", default, skip_serializing_if = "Option::is_none")]
    pub moving: Option<MoveStatus>,
    /// Ready, Scheduled, PlacementValid, InfrastructureReady, AddressesReady, ConfigurationApplied, Reverted, Moved.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["type"]))]
    pub conditions: Vec<Condition>,
    /// When the VM was first Ready (its apply → Ready time is this minus its creation).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub first_ready_time: Option<k8s_openapi::apimachinery::pkg::apis::meta::v1::Time>,
    /// The generation this status describes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
}

/// A revert to a snapshot, as `spec.revertTo` asked for it.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RevertStatus {
    /// The VMSnapshot.
    pub snapshot: String,
    /// Its UID: a revert is applied once per snapshot object.
    #[serde(rename = "snapshotUID")]
    pub snapshot_uid: String,
    /// The backend's id of the snapshot.
    #[serde(rename = "snapshotID")]
    pub snapshot_id: String,
    pub phase: RevertPhase,
    /// When the backend machine was brought back to the snapshot.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub completion_time: Option<k8s_openapi::apimachinery::pkg::apis::meta::v1::Time>,
}

/// Where a revert is.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema)]
pub enum RevertPhase {
    /// Handed to the VM's machine: powering off, reverting.
    #[default]
    Reverting,
    /// The backend machine is back at the snapshot.
    Reverted,
}

/// The scheduler's decision.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Scheduled {
    /// Provider name.
    pub provider: String,
    /// ProviderClass of that provider.
    pub provider_class: String,
    /// Failure domain inside the provider.
    pub failure_domain: String,
    /// Abstract storage class → backend target.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub storage: BTreeMap<String, String>,
    /// Abstract network class → backend target.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub networks: BTreeMap<String, String>,
    /// What the VM's machine was made from on that Provider (a template name or backing
    /// file): kept while the machine exists, so an image whose source changes keeps its
    /// earlier import for this VM.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image: Option<String>,
}

/// Reference to the infrastructure Machine.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct InfrastructureRef {
    pub api_version: String,
    pub kind: String,
    pub name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub uid: Option<String>,
}

/// A set of identical VMs.
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[kube(
    group = "banlieue.io",
    version = "v1alpha1",
    kind = "VirtualMachinePool",
    namespaced,
    status = "VirtualMachinePoolStatus",
    shortname = "vmpool",
    category = "banlieue",
    derive = "PartialEq",
    derive = "Default",
    doc = "A pool of identical VirtualMachines with scale-in order and rolling updates.",
    scale(
        spec_replicas_path = ".spec.replicas",
        status_replicas_path = ".status.replicas",
        label_selector_path = ".status.selector"
    ),
    printcolumn(name = "Desired", type_ = "integer", json_path = ".spec.replicas"),
    printcolumn(name = "Current", type_ = "integer", json_path = ".status.replicas"),
    printcolumn(name = "Ready", type_ = "integer", json_path = ".status.readyReplicas"),
    printcolumn(name = "Updated", type_ = "integer", json_path = ".status.updatedReplicas"),
    printcolumn(name = "Age", type_ = "date", json_path = ".metadata.creationTimestamp")
)]
#[serde(rename_all = "camelCase")]
pub struct VirtualMachinePoolSpec {
    /// Desired number of VMs (at most 1000 per pool).
    #[serde(default = "default_replicas")]
    #[schemars(range(min = 0, max = 1000))]
    pub replicas: i32,
    /// Selects the pool's VMs; must match the template's labels.
    pub selector: LabelSelector,
    /// The VM each member is made from.
    pub template: VirtualMachineTemplate,
    /// Which members go first when scaling in.
    #[serde(default)]
    pub scale_in_order: ScaleInOrder,
    /// How template changes roll out.
    #[serde(default)]
    pub update_strategy: UpdateStrategy,
    /// Overrides the class's placement policy for members.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub placement_policy_ref: Option<NameRef>,
    /// Existing VMs the pool takes as members — adopted, as a VM's `spec.adopt` does — before
    /// it makes new ones, up to `replicas`: VMs on the template's Provider
    /// (`template.spec.placement.providerRef`) that banlieue does not manage, that are not
    /// templates, and whose backend name matches one of `names` (`*` stands for any run of
    /// characters) or that carry one of `tags`. Adopted members are members like any other:
    /// scaled in in the same order, replaced by a rolling update.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub adopt_selector: Option<AdoptSelector>,
    /// Make no change to members (no scaling, no update, no healing); status is still reported.
    #[serde(default)]
    pub paused: bool,
    /// Replace members that do not become Ready in time.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub auto_healing: Option<AutoHealing>,
}

/// Replacing members that do not become Ready.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct AutoHealing {
    /// How long a member may stay not Ready (since it was made, or since it was last Ready).
    #[serde(default = "default_not_ready_timeout")]
    #[schemars(range(min = 1))]
    pub not_ready_timeout_seconds: u32,
    /// Replacements made for one template revision before the pool stops replacing and
    /// reports `ReplicaFailure` (a broken template does not churn).
    #[serde(default = "default_max_replacements")]
    pub max_replacements: u32,
}

fn default_not_ready_timeout() -> u32 {
    600
}

fn default_max_replacements() -> u32 {
    3
}

fn default_replicas() -> i32 {
    1
}

/// Metadata and spec of pool members.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
pub struct VirtualMachineTemplate {
    /// Labels and annotations of members.
    #[serde(default)]
    pub metadata: TemplateMeta,
    /// Spec of members.
    pub spec: VirtualMachineSpec,
}

/// The metadata a template may set.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
pub struct TemplateMeta {
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub labels: BTreeMap<String, String>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub annotations: BTreeMap<String, String>,
}

/// Scale-in order.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema)]
pub enum ScaleInOrder {
    /// Newest members first, then by name (deterministic).
    #[default]
    Newest,
    /// Oldest members first.
    Oldest,
}

/// Update strategy of a pool.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct UpdateStrategy {
    /// RollingUpdate replaces members; OnDelete waits for the user to delete them.
    #[serde(rename = "type", default)]
    pub type_: UpdateStrategyType,
    /// Parameters of a rolling update.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rolling_update: Option<RollingUpdate>,
}

impl Default for UpdateStrategy {
    fn default() -> Self {
        Self { type_: UpdateStrategyType::RollingUpdate, rolling_update: None }
    }
}

/// Kinds of update strategy.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema)]
pub enum UpdateStrategyType {
    #[default]
    RollingUpdate,
    OnDelete,
}

/// Rolling update bounds (count or percentage).
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RollingUpdate {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_unavailable: Option<IntOrString>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_surge: Option<IntOrString>,
}

/// Observed state of a pool.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct VirtualMachinePoolStatus {
    #[serde(default)]
    pub replicas: i32,
    #[serde(default)]
    pub ready_replicas: i32,
    #[serde(default)]
    pub updated_replicas: i32,
    /// The selector in string form, for the scale subresource.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub selector: Option<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["type"]))]
    pub conditions: Vec<Condition>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// The template revision members are made from now (label `banlieue.io/pool-revision`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub current_revision: Option<String>,
    /// Members replaced by auto-healing for the current revision.
    #[serde(default)]
    pub replaced: i32,
}
