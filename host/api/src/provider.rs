//! `Provider` (one backend instance), `ProviderClass` (a kind of backend and its driver
//! component) and `PlacementPolicy` (a placement component).

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::common::{ComponentSource, NameRef};

/// One backend instance (a vCenter, a Proxmox cluster, a libvirt host).
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[kube(
    group = "banlieue.io",
    version = "v1alpha1",
    kind = "Provider",
    namespaced,
    status = "ProviderStatus",
    shortname = "vmprovider",
    category = "banlieue",
    derive = "PartialEq",
    derive = "Default",
    doc = "A backend instance: its class, connection, capabilities and the grant of its driver.",
    printcolumn(name = "Class", type_ = "string", json_path = ".spec.providerClassRef.name"),
    printcolumn(name = "Endpoint", type_ = "string", json_path = ".spec.connection.endpoint"),
    printcolumn(name = "Ready", type_ = "string", json_path = ".status.conditions[?(@.type==\"Ready\")].status"),
    printcolumn(name = "Age", type_ = "date", json_path = ".metadata.creationTimestamp")
)]
#[serde(rename_all = "camelCase")]
pub struct ProviderSpec {
    /// The ProviderClass whose driver talks to this backend.
    pub provider_class_ref: NameRef,
    /// How to reach the backend.
    pub connection: Connection,
    /// What the backend offers, in abstract terms.
    #[serde(default)]
    pub capabilities: ProviderCapabilities,
    /// How hard banlieue may drive the backend (defaults suit a vCenter or a Proxmox VE node).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub limits: Option<ProviderLimits>,
}

/// Limits on the work banlieue sends a backend: machines beyond them wait their turn
/// (`Ready=False`, reason `Queued`) instead of reaching the backend all at once.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ProviderLimits {
    /// Operations changing the backend (create, power changes, delete) in flight at once,
    /// per banlieue process (default 4).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 1000))]
    pub max_concurrent_operations: Option<u32>,
    /// Such operations started per second at most, with bursts of as many (default 10).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 10000))]
    pub operations_per_second: Option<u32>,
}

impl ProviderLimits {
    pub const DEFAULT_MAX_CONCURRENT_OPERATIONS: u32 = 4;
    pub const DEFAULT_OPERATIONS_PER_SECOND: u32 = 10;

    /// (concurrent operations, operations per second), defaults filled in.
    pub fn effective(limits: Option<&ProviderLimits>) -> (u32, u32) {
        let l = limits.copied().unwrap_or_default();
        (
            l.max_concurrent_operations.unwrap_or(Self::DEFAULT_MAX_CONCURRENT_OPERATIONS).max(1),
            l.operations_per_second.unwrap_or(Self::DEFAULT_OPERATIONS_PER_SECOND).max(1),
        )
    }
}

/// Connection to a backend.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Connection {
    /// `https://host[:port]` for HTTP backends, or a libvirt URI (`qemu+tcp://…`, `test:///default`).
    /// The driver may reach this endpoint and nothing else.
    #[schemars(length(min = 1, max = 2048))]
    pub endpoint: String,
    /// Where the driver's credentials are; the driver may read only these keys.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub credentials_ref: Option<CredentialsRef>,
    /// PEM CA bundle trusted for the endpoint (system roots when empty).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ca_bundle: Option<String>,
    /// Skip TLS verification. Only for test backends.
    #[serde(default)]
    pub insecure_skip_tls_verify: bool,
}

/// Credentials of a Provider: a Kubernetes Secret or a Vault KV v2 path.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct CredentialsRef {
    /// Secret (in the Provider's namespace) or Vault.
    #[serde(default)]
    pub kind: CredentialsKind,
    /// Secret name (kind Secret).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// The secret's path under the KV v2 mount, e.g. `infra/vcenter` (kind Vault).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub path: Option<String>,
    /// The keys the driver may read; all keys of the source when empty.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub keys: Vec<String>,
    /// The KV v2 mount (kind Vault); `secret` when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mount: Option<String>,
    /// A KV version to read (kind Vault); the latest when absent, so a rotation is seen.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub version: Option<u64>,
    /// Where Vault is and how banlieue logs in (kind Vault); the process's `--vault-addr`
    /// and `VAULT_TOKEN` when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub vault: Option<VaultConnection>,
}

/// A Vault (or OpenBao) server and the way banlieue authenticates to it.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct VaultConnection {
    /// `https://vault:8200`; the process's `--vault-addr` when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub address: Option<String>,
    /// PEM CA bundle trusted for Vault (system roots when absent).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ca_bundle: Option<String>,
    /// How to log in: exactly one method.
    pub auth: VaultAuthMethod,
}

/// How banlieue logs in to Vault. Exactly one is set.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct VaultAuthMethod {
    /// AppRole: the role ID and secret ID are in a Secret of the Provider's namespace.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub app_role: Option<AppRoleAuth>,
    /// Kubernetes auth: banlieue's service-account token, logged in as `role`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kubernetes: Option<KubernetesAuth>,
    /// A Vault token in a Secret of the Provider's namespace (key `token`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub token_secret: Option<String>,
}

/// Vault's AppRole method.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct AppRoleAuth {
    /// The Secret holding `role-id` and `secret-id`.
    pub secret_name: String,
    /// Where the method is mounted; `approle` when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mount: Option<String>,
}

/// Vault's Kubernetes method.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct KubernetesAuth {
    /// The Vault role bound to banlieue's service account.
    pub role: String,
    /// Where the method is mounted; `kubernetes` when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mount: Option<String>,
}

/// Kinds of credential source.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema)]
pub enum CredentialsKind {
    #[default]
    Secret,
    Vault,
}

/// Abstract classes a Provider maps to backend targets.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ProviderCapabilities {
    /// Abstract storage class → datastore / pool / storage.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub storage_classes: BTreeMap<String, String>,
    /// Abstract network class → port group / bridge / network.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub network_classes: BTreeMap<String, String>,
    /// Features offered (e.g. `nested-virt`, `tpm`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(extend("x-kubernetes-list-type" = "set"))]
    pub features: Vec<String>,
}

/// Observed state of a Provider, from its driver's probe.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ProviderStatus {
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["name"]))]
    pub failure_domains: Vec<FailureDomain>,
    /// What the Provider's driver does beyond the calls every driver answers, as it says
    /// (`snapshots`, `disk-export`, `disk-import`): a move that carries disks needs
    /// `disk-export` here and `disk-import` on the Provider it goes to.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub driver_features: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["type"]))]
    pub conditions: Vec<Condition>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// The machines on the Provider's backend, as its driver listed them when last asked
    /// (annotation `banlieue.io/discover`; `kubectl vm discover` sets it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub discovery: Option<Discovery>,
    /// Where the consoles of this Provider's machines are served (`kubectl vm console`,
    /// `kubectl vm vnc`, the browser page): by the banlieue replica that probes it, when its
    /// driver opens consoles (`console`, `vnc` in `driverFeatures`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub console: Option<ConsoleEndpoint>,
    /// The driver operations banlieue called for this Provider lately, and how many failed:
    /// the backend's recent health, without a Prometheus (written with each probe by the
    /// replica that calls its driver).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub operations: Option<RecentOperations>,
}

/// The driver operations of the last `windowSeconds`.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RecentOperations {
    pub window_seconds: i64,
    /// Operations called (probes, creates, describes, …).
    pub calls: i64,
    /// Those that failed (a machine already gone is not a failure).
    pub errors: i64,
    /// The last that failed, whenever it was.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_error: Option<OperationError>,
}

/// A driver operation that failed.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct OperationError {
    /// The driver export (`create`, `probe`, …).
    pub operation: String,
    /// The error's name (`unavailable`, `denied`, `invalid-spec`, …).
    pub reason: String,
    pub message: String,
    pub time: k8s_openapi::apimachinery::pkg::apis::meta::v1::Time,
}

/// banlieue's console server, as a client reaches it.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ConsoleEndpoint {
    /// `https://HOST:PORT` of the server.
    pub url: String,
    /// The PEM CA bundle its certificate chains to.
    pub ca_bundle: String,
}

/// Set on a Provider to a new value to have its driver list the machines on its backend
/// into `status.discovery` (`kubectl vm discover` sets it to the time it asks).
pub const DISCOVER_ANNOTATION: &str = "banlieue.io/discover";

/// What a Provider's backend holds, as its driver listed it.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Discovery {
    /// The `banlieue.io/discover` value this answers.
    pub requested: String,
    /// When the backend was listed (RFC 3339).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub time: Option<String>,
    /// Every machine found, banlieue's own included (with their owner), by backend id.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub machines: Vec<DiscoveredMachine>,
    /// More machines than a status holds: the first ones by backend id are listed.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub truncated: bool,
    /// Why the listing failed or stopped, if it did.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
}

/// A machine on a backend, as discovery found it.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct DiscoveredMachine {
    /// What the backend calls it (what `spec.adopt.backendId` takes).
    pub backend_id: String,
    /// Its name on the backend.
    pub name: String,
    pub power_state: crate::common::PowerState,
    pub cpus: u32,
    #[serde(rename = "memoryMiB")]
    pub memory_mib: u64,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub disks: Vec<crate::infra::DiskStatus>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub interfaces: Vec<crate::infra::InterfaceStatus>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub addresses: Vec<String>,
    /// The failure domain it runs in, as the Provider names it.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub failure_domain: String,
    /// The backend's tags for it.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tags: Vec<String>,
    /// A template: listed, never adopted.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub template: bool,
    /// The banlieue Machine that manages it, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub owner: Option<MachineOwner>,
}

/// The banlieue Machine a backend VM's mark names.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct MachineOwner {
    /// `namespace/name` of the Machine, and its UID.
    pub machine: String,
    #[serde(rename = "machineUID")]
    pub machine_uid: String,
    /// The installation (cluster id, and instance) it belongs to; empty where the backend
    /// holds none (machines banlieue made before marks carried it).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub installation: String,
}

/// A failure domain reported by a driver.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct FailureDomain {
    pub name: String,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub labels: BTreeMap<String, String>,
    #[serde(default)]
    pub capacity: Capacity,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub storage_classes: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub network_classes: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub features: Vec<String>,
}

/// Free capacity of a failure domain.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Capacity {
    #[serde(default)]
    pub cpus: u64,
    #[serde(rename = "memoryMiB", default)]
    pub memory_mib: u64,
    #[serde(rename = "storageGiB", default)]
    pub storage_gib: u64,
}

/// A kind of provider and the driver component that serves it.
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[kube(
    group = "banlieue.io",
    version = "v1alpha1",
    kind = "ProviderClass",
    plural = "providerclasses",
    status = "ComponentStatus",
    shortname = "pc",
    category = "banlieue",
    derive = "PartialEq",
    derive = "Default",
    doc = "A kind of provider: its driver component, how it is verified, what it may touch.",
    printcolumn(name = "Kind", type_ = "string", json_path = ".spec.infrastructureKind"),
    printcolumn(name = "Source", type_ = "string", json_path = ".spec.component.source"),
    printcolumn(name = "Ready", type_ = "string", json_path = ".status.conditions[?(@.type==\"Ready\")].status"),
    printcolumn(name = "Age", type_ = "date", json_path = ".metadata.creationTimestamp")
)]
#[serde(rename_all = "camelCase")]
pub struct ProviderClassSpec {
    /// The driver component.
    pub component: ComponentSource,
    /// Prefix of the infrastructure kinds (`Libvirt` → `LibvirtMachine`, `LibvirtCluster`, …).
    #[schemars(length(min = 1, max = 48), regex(pattern = r"^[A-Z][A-Za-z0-9]*$"))]
    pub infrastructure_kind: String,
    /// The host capabilities the driver requests.
    #[serde(default)]
    pub capabilities: RequestedCapabilities,
    /// The disk format the driver's `import-image` takes; the image builder converts each
    /// VMImage `url` source to it before the host streams it (libvirt: qcow2, vSphere:
    /// vmdk, a stream-optimised VMDK as `ImportVApp` uploads take). `source` converts
    /// nothing: for backends that download the URL themselves (Proxmox VE's `download-url`).
    #[serde(default)]
    pub image_format: ImageFormat,
}

/// A disk image format the image builder converts to.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum ImageFormat {
    #[default]
    Qcow2,
    Raw,
    /// Stream-optimised VMDK.
    Vmdk,
    /// As downloaded (after the checksum is verified and it is found to be a disk image).
    Source,
}

/// Host capabilities a driver asks for; each is further limited to a Provider's own endpoint and secret.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RequestedCapabilities {
    #[serde(default)]
    pub http: bool,
    #[serde(default)]
    pub libvirt: bool,
    #[serde(default)]
    pub secrets: bool,
}

/// Resolution state of a component (ProviderClass, PlacementPolicy).
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ComponentStatus {
    /// The sha256 digest that was verified and is loaded.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resolved_digest: Option<String>,
    /// WIT contract version the component was built for.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub contract_version: Option<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["type"]))]
    pub conditions: Vec<Condition>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
}

/// A placement component and its parameters.
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[kube(
    group = "banlieue.io",
    version = "v1alpha1",
    kind = "PlacementPolicy",
    plural = "placementpolicies",
    status = "ComponentStatus",
    shortname = "pp",
    category = "banlieue",
    derive = "PartialEq",
    derive = "Default",
    doc = "A placement policy component (how VMs pick a provider and failure domain) with parameters.",
    printcolumn(name = "Source", type_ = "string", json_path = ".spec.component.source"),
    printcolumn(name = "Ready", type_ = "string", json_path = ".status.conditions[?(@.type==\"Ready\")].status"),
    printcolumn(name = "Age", type_ = "date", json_path = ".metadata.creationTimestamp")
)]
#[serde(rename_all = "camelCase")]
pub struct PlacementPolicySpec {
    /// The placement component (`builtin:spread`, `builtin:binpack`, a file or an OCI artifact).
    pub component: ComponentSource,
    /// Free-form parameters passed to `choose`.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    #[schemars(extend("x-kubernetes-preserve-unknown-fields" = true))]
    pub parameters: BTreeMap<String, serde_json::Value>,
}
