//! The CAPI v1beta2 infrastructure kinds (`infrastructure.banlieue.io`).
//!
//! Every provider class gets the same four kinds under its own prefix
//! (`LibvirtMachine`, `LibvirtMachineTemplate`, `LibvirtCluster`, `LibvirtClusterTemplate`).
//! The shapes are defined once here, under placeholder kind names, and
//! [`infrastructure_crds`] renames them for a prefix — at build time for the
//! built-in classes and at run time for third-party ones.

use std::collections::BTreeMap;

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, LabelSelector};
use kube::{CustomResource, CustomResourceExt};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::common::{Initialization, MachineAddress, MachinePhase, NameRef, PowerOffMode, PowerState, SecretKeyRef, StaticIp};
use crate::class::Firmware;

/// API group of the infrastructure kinds.
pub const INFRA_GROUP: &str = "infrastructure.banlieue.io";
/// CAPI reads this label to learn which of our versions implement its contract.
pub const CAPI_CONTRACT_LABEL: &str = "cluster.x-k8s.io/v1beta2";
/// The built-in provider classes' kind prefixes.
pub const BUILTIN_INFRA_KINDS: [&str; 3] = ["VSphere", "Proxmox", "Libvirt"];

/// Spec of `<Kind>Machine`: the resolved VM and where it runs.
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[kube(
    group = "infrastructure.banlieue.io",
    version = "v1alpha1",
    kind = "InfraMachine",
    namespaced,
    status = "InfraMachineStatus",
    derive = "PartialEq",
    derive = "Default",
    doc = "A machine on one provider (CAPI v1beta2 InfraMachine contract).",
    printcolumn(name = "Provider", type_ = "string", json_path = ".spec.providerRef.name"),
    printcolumn(name = "ProviderID", type_ = "string", json_path = ".spec.providerID"),
    printcolumn(name = "Provisioned", type_ = "boolean", json_path = ".status.initialization.provisioned"),
    printcolumn(name = "Ready", type_ = "string", json_path = ".status.conditions[?(@.type==\"Ready\")].status"),
    printcolumn(name = "Phase", type_ = "string", priority = 1, json_path = ".status.phase"),
    printcolumn(name = "Addresses", type_ = "string", priority = 1, json_path = ".status.addresses[*].address"),
    printcolumn(name = "Age", type_ = "date", json_path = ".metadata.creationTimestamp")
)]
#[serde(rename_all = "camelCase")]
pub struct InfraMachineSpec {
    /// Set by the provider once the backend VM exists (`<class>://<backend id>`).
    #[serde(rename = "providerID", default, skip_serializing_if = "Option::is_none")]
    pub provider_id: Option<String>,
    /// The failure domain the machine is placed in.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failure_domain: Option<String>,
    /// The Provider (same namespace) that runs the machine. Chosen by placement when unset
    /// (machines created by CAPI from a template).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub provider_ref: Option<NameRef>,
    /// The VMClass to resolve `vm` from, for machines CAPI makes from a template.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub class_ref: Option<NameRef>,
    /// The VMImage to resolve `vm` from, for machines CAPI makes from a template.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image_ref: Option<NameRef>,
    /// Addressing of the class's NICs for machines CAPI makes from a template, as a
    /// VirtualMachine's `spec.network`: above all `addressesFromPools` (Cluster API IPAM; what
    /// CAPV and CAPMox call `network.devices[].addressesFromPools`), since fixed addresses in a
    /// template would give every machine the same ones. Resolved into `vm.nics` when the
    /// machine is bound.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub network: Option<crate::vm::VmNetwork>,
    /// The resolved VM (written by banlieue; left empty in a template).
    #[serde(default)]
    pub vm: ResolvedVm,
}

impl InfraMachineSpec {
    /// The failure domain as the Provider's driver names it. CAPI names a cluster's domains
    /// `<provider>/<domain>`; `vm.failureDomain` then holds the Provider's own name.
    pub fn backend_failure_domain(&self) -> Option<&str> {
        self.vm.failure_domain.as_deref().or(self.failure_domain.as_deref())
    }
}

/// A VM with every reference resolved to backend terms.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ResolvedVm {
    #[serde(default)]
    pub cpus: u32,
    #[serde(rename = "memoryMiB", default)]
    pub memory_mib: u64,
    #[serde(default)]
    pub firmware: Firmware,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["name"]))]
    pub disks: Vec<ResolvedDisk>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["name"]))]
    pub nics: Vec<ResolvedNic>,
    /// The image location for this provider class (template, backing file or URL).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub image: BTreeMap<String, String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub user_data: Option<SecretKeyRef>,
    #[serde(default)]
    pub power_state: PowerState,
    /// How the machine is powered off, and how long a soft power-off may take.
    #[serde(default)]
    pub power_off_mode: PowerOffMode,
    #[serde(default = "crate::class::default_power_off_timeout")]
    pub power_off_timeout_seconds: u32,
    /// Bumped to restart the machine once.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub restart_requested_at: Option<String>,
    /// Make the machine as a copy of another machine at one of its snapshots (its VM's
    /// `spec.source.snapshotRef`, resolved), instead of from `image`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub restore: Option<MachineRestore>,
    /// Bring the machine back to a snapshot once (its VM's `spec.revertTo`, resolved).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub revert: Option<MachineRevert>,
    /// Make the machine from another machine's disks, carried from its backend (a move of
    /// its VM), instead of from `image`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub carry: Option<MachineCarry>,
    /// The Provider's own name of the failure domain, when `spec.failureDomain` holds the
    /// cluster-wide name CAPI uses (`<provider>/<domain>`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failure_domain: Option<String>,
    /// How the guest reads `userData`: cloud-init (default) or Ignition.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub user_data_format: Option<UserDataFormat>,
    /// When a change of CPUs, memory or disk sizes reaches a running machine (default
    /// `OnNextPowerCycle`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub update_policy: Option<UpdatePolicy>,
    /// Take over the backend VM of this id instead of making one (its VM's `spec.adopt`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub adopt: Option<crate::vm::VmAdopt>,
    /// What deleting the machine does to its backend VM (its VM's `spec.deletionPolicy`;
    /// unset: `Delete`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub deletion_policy: Option<crate::vm::DeletionPolicy>,
}

/// The machine and snapshot a machine is restored from.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct MachineRestore {
    /// The machine the snapshot was taken of: its name, the UID its backend knows it by, and
    /// its failure domain (the Provider's name for it).
    pub source_machine: String,
    #[serde(rename = "sourceMachineUID")]
    pub source_machine_uid: String,
    #[serde(default)]
    pub source_failure_domain: String,
    /// The backend's id of the snapshot.
    #[serde(rename = "snapshotID")]
    pub snapshot_id: String,
    /// A linked clone where the backend can.
    #[serde(default)]
    pub linked: bool,
    /// The backend id of the source machine when it was adopted, which its driver finds it by.
    #[serde(rename = "sourceBackendID", default, skip_serializing_if = "Option::is_none")]
    pub source_backend_id: Option<String>,
}

/// The powered-off machine whose disks a new machine is made from.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct MachineCarry {
    /// The Provider (same namespace) it runs on.
    pub provider: String,
    /// Its `<Kind>Machine` kind and name, and the UID its backend knows it by.
    pub kind: String,
    pub machine: String,
    #[serde(rename = "machineUID")]
    pub machine_uid: String,
    /// Its failure domain (the Provider's name for it).
    #[serde(default)]
    pub failure_domain: String,
    #[serde(rename = "providerID", default, skip_serializing_if = "Option::is_none")]
    pub provider_id: Option<String>,
    /// The backend id of an adopted machine (its `spec.vm.adopt`), which its driver finds it by.
    #[serde(rename = "backendID", default, skip_serializing_if = "Option::is_none")]
    pub backend_id: Option<String>,
}

/// How far a machine made from carried disks is (`spec.vm.carry`).
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct CarryStatus {
    pub phase: crate::vm::MovePhase,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub disks: Vec<crate::vm::MovedDisk>,
    /// Why it failed (phase `Failed`, for good: the VM stays on its old machine).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    /// The reason of that failure.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}

/// A snapshot to bring a machine back to.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct MachineRevert {
    /// The backend's id of the snapshot.
    #[serde(rename = "snapshotID")]
    pub snapshot_id: String,
    /// The VMSnapshot's UID: the machine is reverted once per snapshot object.
    #[serde(rename = "snapshotUID")]
    pub snapshot_uid: String,
}

/// When a change of a machine's CPUs, memory or disk sizes is applied to it while it runs.
/// Either way it is applied at once to a machine that is off.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema)]
pub enum UpdatePolicy {
    /// Power the machine off (per its power-off mode), apply, power it on again.
    Restart,
    /// Wait for the machine's next power cycle: a power-off, a restart
    /// (`restartRequestedAt`), or a shutdown from inside the guest.
    #[default]
    OnNextPowerCycle,
}

/// A machine's hardware as its backend reports it.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct MachineHardware {
    pub cpus: u32,
    #[serde(rename = "memoryMiB")]
    pub memory_mib: u64,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub disks: Vec<DiskStatus>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub interfaces: Vec<InterfaceStatus>,
}

/// One disk as the backend holds it.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct DiskStatus {
    /// The disk's name in the class (by position when the backend does not keep names).
    pub name: String,
    #[serde(rename = "sizeGiB")]
    pub size_gib: u64,
    /// What the backend calls it: a volume path, a VMDK file, a `storage:volume` id.
    pub id: String,
}

/// One NIC as the backend holds it.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct InterfaceStatus {
    /// The NIC's name in the class (by position).
    pub name: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub mac: String,
    /// The backend network it is on.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub network: String,
    /// The static addresses it was given (declared or from pools).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub addresses: Vec<String>,
}

/// The format of a bootstrap payload (CAPI's bootstrap Secret key `format`).
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema)]
pub enum UserDataFormat {
    #[default]
    #[serde(rename = "cloud-config")]
    CloudConfig,
    #[serde(rename = "ignition")]
    Ignition,
}

/// A disk placed on a backend storage target.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ResolvedDisk {
    pub name: String,
    #[serde(rename = "sizeGiB")]
    pub size_gib: u64,
    /// Backend datastore / pool.
    pub target: String,
}

/// A NIC attached to a backend network.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ResolvedNic {
    pub name: String,
    /// Backend network / bridge / port group.
    pub network: String,
    /// Static addressing (none declared: DHCP).
    #[serde(flatten)]
    pub ip: StaticIp,
}

/// Status of `<Kind>Machine` (CAPI v1beta2).
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct InfraMachineStatus {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub initialization: Option<Initialization>,
    /// `initialization.provisioned` for readers of the v1beta1 contract.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ready: Option<bool>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub addresses: Vec<MachineAddress>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failure_domain: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub power_state: Option<PowerState>,
    /// Where the machine is on its way to running, as its driver reports it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phase: Option<MachinePhase>,
    /// The last `spec.vm.restartRequestedAt` the machine was restarted for.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_restart_requested_at: Option<String>,
    /// The UID of the VMSnapshot the machine was last reverted to (`spec.vm.revert`).
    #[serde(rename = "revertedTo", default, skip_serializing_if = "Option::is_none")]
    pub reverted_to: Option<String>,
    /// The hardware the backend reports (CPUs, memory, each disk and NIC).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hardware: Option<MachineHardware>,
    /// A machine made from carried disks (`spec.vm.carry`): how far it is.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub carry: Option<CarryStatus>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["type"]))]
    pub conditions: Vec<Condition>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// Fields only v1beta1 readers look at.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub deprecated: Option<Deprecated>,
}

/// `status.deprecated` of the v1beta2 contract: what v1beta1 readers still read.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
pub struct Deprecated {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub v1beta1: Option<V1Beta1Failure>,
}

/// A terminal failure as v1beta1 reported it (v1beta2 has conditions only).
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct V1Beta1Failure {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failure_reason: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failure_message: Option<String>,
}

/// Spec of `<Kind>MachineTemplate`.
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[kube(
    group = "infrastructure.banlieue.io",
    version = "v1alpha1",
    kind = "InfraMachineTemplate",
    namespaced,
    derive = "PartialEq",
    derive = "Default",
    doc = "A template CAPI stamps Machines from (CAPI v1beta2 InfraMachineTemplate contract).",
    printcolumn(name = "Age", type_ = "date", json_path = ".metadata.creationTimestamp")
)]
pub struct InfraMachineTemplateSpec {
    pub template: InfraMachineTemplateResource,
}

/// The template body.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
pub struct InfraMachineTemplateResource {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metadata: Option<crate::vm::TemplateMeta>,
    pub spec: InfraMachineSpec,
}

/// Spec of `<Kind>Cluster`.
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[kube(
    group = "infrastructure.banlieue.io",
    version = "v1alpha1",
    kind = "InfraCluster",
    namespaced,
    status = "InfraClusterStatus",
    derive = "PartialEq",
    derive = "Default",
    doc = "A cluster's infrastructure: failure domains aggregated from selected Providers (CAPI v1beta2 InfraCluster contract).",
    printcolumn(name = "Cluster", type_ = "string", json_path = ".metadata.labels.cluster\\.x-k8s\\.io/cluster-name"),
    printcolumn(name = "Endpoint", type_ = "string", json_path = ".spec.controlPlaneEndpoint.host"),
    printcolumn(name = "Provisioned", type_ = "boolean", json_path = ".status.initialization.provisioned"),
    printcolumn(name = "Ready", type_ = "string", json_path = ".status.conditions[?(@.type==\"Ready\")].status"),
    printcolumn(name = "Domains", type_ = "string", priority = 1, json_path = ".status.failureDomains[*].name"),
    printcolumn(name = "Age", type_ = "date", json_path = ".metadata.creationTimestamp")
)]
#[serde(rename_all = "camelCase")]
pub struct InfraClusterSpec {
    /// Where the control plane is reached: set by the user, or by the control-plane
    /// provider (k0smotron); the cluster is provisioned only once it is known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub control_plane_endpoint: Option<ApiEndpoint>,
    /// Providers (same namespace) whose failure domains this cluster uses, by name.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["name"]))]
    pub provider_refs: Vec<NameRef>,
    /// Providers (same namespace) whose failure domains this cluster uses, by label
    /// (besides `providerRefs`; with neither, every Provider of the namespace).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub provider_selector: Option<LabelSelector>,
    /// Which failure domains may host control-plane machines, matched against the
    /// domain's attributes (its labels, `banlieue.io/provider`, `banlieue.io/failure-domain`).
    /// Without it, every domain may.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub control_plane_selector: Option<LabelSelector>,
}

/// Where the control plane is reached.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
pub struct ApiEndpoint {
    pub host: String,
    #[schemars(range(min = 1, max = 65535))]
    pub port: i32,
}

/// Status of `<Kind>Cluster`.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct InfraClusterStatus {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub initialization: Option<Initialization>,
    /// `initialization.provisioned` for readers of the v1beta1 contract.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ready: Option<bool>,
    /// The failure domains of the selected Providers, named `<provider>/<domain>`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["name"]), length(max = 100))]
    pub failure_domains: Vec<ClusterFailureDomain>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["type"]))]
    pub conditions: Vec<Condition>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// Fields only v1beta1 readers look at.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub deprecated: Option<Deprecated>,
}

/// A failure domain as CAPI v1beta2 lists it.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ClusterFailureDomain {
    #[schemars(length(min = 1, max = 256))]
    pub name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub control_plane: Option<bool>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub attributes: BTreeMap<String, String>,
}

/// Spec of `<Kind>ClusterTemplate`.
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[kube(
    group = "infrastructure.banlieue.io",
    version = "v1alpha1",
    kind = "InfraClusterTemplate",
    namespaced,
    derive = "PartialEq",
    derive = "Default",
    doc = "A template of a cluster's infrastructure (CAPI v1beta2 InfraClusterTemplate contract).",
    printcolumn(name = "Age", type_ = "date", json_path = ".metadata.creationTimestamp")
)]
pub struct InfraClusterTemplateSpec {
    pub template: InfraClusterTemplateResource,
}

/// The template body.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
pub struct InfraClusterTemplateResource {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metadata: Option<crate::vm::TemplateMeta>,
    pub spec: InfraClusterSpec,
}

/// Error for a kind prefix that cannot name Kubernetes kinds.
#[derive(Debug, PartialEq, Eq)]
pub struct InvalidKindPrefix(pub String);

impl std::fmt::Display for InvalidKindPrefix {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "infrastructure kind prefix {:?} must match ^[A-Z][A-Za-z0-9]{{0,47}}$", self.0)
    }
}

impl std::error::Error for InvalidKindPrefix {}

/// The four infrastructure CRDs of one provider class, e.g. `Libvirt` →
/// `LibvirtMachine`, `LibvirtMachineTemplate`, `LibvirtCluster`, `LibvirtClusterTemplate`.
pub fn infrastructure_crds(prefix: &str) -> Result<Vec<CustomResourceDefinition>, InvalidKindPrefix> {
    let valid = prefix.len() <= 48
        && prefix.chars().next().is_some_and(|c| c.is_ascii_uppercase())
        && prefix.chars().all(|c| c.is_ascii_alphanumeric());
    if !valid {
        return Err(InvalidKindPrefix(prefix.to_string()));
    }
    let shapes = [
        ("Machine", InfraMachine::crd()),
        ("MachineTemplate", InfraMachineTemplate::crd()),
        ("Cluster", InfraCluster::crd()),
        ("ClusterTemplate", InfraClusterTemplate::crd()),
    ];
    Ok(shapes.into_iter().map(|(suffix, crd)| crate::crdgen::without_nullable_objects(rename(crd, &format!("{prefix}{suffix}")))).collect())
}

fn rename(mut crd: CustomResourceDefinition, kind: &str) -> CustomResourceDefinition {
    let singular = kind.to_ascii_lowercase();
    let plural = format!("{singular}s");
    crd.metadata.name = Some(format!("{plural}.{INFRA_GROUP}"));
    let labels = crd.metadata.labels.get_or_insert_with(BTreeMap::new);
    labels.insert(CAPI_CONTRACT_LABEL.into(), "v1alpha1".into());
    let names = &mut crd.spec.names;
    names.kind = kind.to_string();
    names.list_kind = Some(format!("{kind}List"));
    names.singular = Some(singular);
    names.plural = plural;
    names.categories = Some(vec!["banlieue".into(), "cluster-api".into()]);
    crd
}
