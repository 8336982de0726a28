//! Small shared shapes used by several kinds.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// A reference to an object by name (same namespace, or cluster-scoped).
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
pub struct NameRef {
    /// Name of the referenced object.
    #[schemars(length(min = 1, max = 253))]
    pub name: String,
}

/// A key in a Secret in the referring object's namespace.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
pub struct SecretKeyRef {
    /// Name of the Secret.
    #[schemars(length(min = 1, max = 253))]
    pub name: String,
    /// Key inside the Secret's data.
    #[schemars(length(min = 1, max = 253))]
    pub key: String,
}

/// Where a Wasm component comes from and how it is trusted (ProviderClass, PlacementPolicy).
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ComponentSource {
    /// `oci://REGISTRY/REPO:TAG`, `oci://REGISTRY/REPO@sha256:…`, `file:///path.wasm`
    /// (development), or `builtin:NAME` for a component compiled into banlieue.
    #[schemars(regex(pattern = r"^(oci://[^\s]+|file:///[^\s]*|builtin:[a-z0-9-]+)$"))]
    pub source: String,
    /// How the component is verified before a byte of it runs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub verification: Option<Verification>,
    /// Docker-config Secret (namespace/name) holding registry credentials.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pull_secret_ref: Option<NamespacedRef>,
    /// CPU and memory budget of one call into the component.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub limits: Option<ComponentLimits>,
}

/// Signature verification of a component.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Verification {
    /// PEM public keys (cosign format); a signature by any one of them is accepted.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub public_keys: Vec<String>,
    /// Run the component without a signature. Only for development.
    #[serde(default)]
    pub allow_unsigned: bool,
}

/// A namespaced object reference.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
pub struct NamespacedRef {
    /// Namespace of the object.
    #[schemars(length(min = 1, max = 63))]
    pub namespace: String,
    /// Name of the object.
    #[schemars(length(min = 1, max = 253))]
    pub name: String,
}

/// Per-call budget of a component.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ComponentLimits {
    /// CPU time one call may spend running guest code, in milliseconds (default 1000).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 600000))]
    pub cpu_millis: Option<u32>,
    /// Linear memory of one instance, in MiB (default 64).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 4096))]
    pub memory_mib: Option<u32>,
}

/// A network address as CAPI reports it.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
pub struct MachineAddress {
    /// Hostname, ExternalIP, InternalIP, ExternalDNS or InternalDNS.
    #[serde(rename = "type")]
    pub type_: AddressType,
    /// The address.
    pub address: String,
}

/// Kinds of machine address (CAPI `MachineAddressType`).
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema)]
pub enum AddressType {
    Hostname,
    ExternalIP,
    InternalIP,
    ExternalDNS,
    InternalDNS,
}

/// Power states a VM can be asked for or observed in.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema)]
pub enum PowerState {
    #[default]
    PoweredOn,
    PoweredOff,
    Suspended,
}

/// How a VM is powered off (when asked to power off, restart, or be deleted).
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema)]
pub enum PowerOffMode {
    /// Cut the power at once.
    Hard,
    /// Ask the guest to shut down; never force it (retried until the guest is off).
    Soft,
    /// Ask the guest, then cut the power when the class's timeout passes.
    #[default]
    TrySoft,
}

/// Where a machine is on its way to running, as its driver reports it.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema)]
pub enum MachinePhase {
    Provisioning,
    Cloning,
    Configuring,
    PoweringOn,
    WaitingForAddress,
    Running,
    ShuttingDown,
    PoweredOff,
}

/// CAPI v1beta2 `initialization` status block.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
pub struct Initialization {
    /// True once the infrastructure is provisioned.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub provisioned: Option<bool>,
}
