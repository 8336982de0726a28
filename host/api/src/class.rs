//! `VMClass` (hardware shape) and `VMImage` (what a VM boots).

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::common::NameRef;

/// A hardware shape VMs are made in.
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[kube(
    group = "banlieue.io",
    version = "v1alpha1",
    kind = "VMClass",
    plural = "vmclasses",
    status = "VMClassStatus",
    shortname = "vmclass",
    category = "banlieue",
    derive = "PartialEq",
    derive = "Default",
    doc = "A VM hardware shape: CPUs, memory, disks, NICs, firmware and required features.",
    printcolumn(name = "CPUs", type_ = "integer", json_path = ".spec.cpus"),
    printcolumn(name = "Memory", type_ = "integer", json_path = ".spec.memoryMiB"),
    printcolumn(name = "Firmware", type_ = "string", json_path = ".spec.firmware"),
    printcolumn(name = "Age", type_ = "date", json_path = ".metadata.creationTimestamp")
)]
#[serde(rename_all = "camelCase")]
pub struct VMClassSpec {
    /// Virtual CPUs.
    #[schemars(range(min = 1, max = 1024))]
    pub cpus: u32,
    /// Memory in MiB.
    #[serde(rename = "memoryMiB")]
    #[schemars(range(min = 64))]
    pub memory_mib: u64,
    /// Disks; the first is the boot disk, cloned from the image.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["name"]))]
    pub disks: Vec<DiskSpec>,
    /// Network interfaces.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["name"]))]
    pub nics: Vec<NicSpec>,
    /// BIOS or UEFI.
    #[serde(default)]
    pub firmware: Firmware,
    /// Features a Provider must offer (e.g. `nested-virt`, `tpm`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(extend("x-kubernetes-list-type" = "set"))]
    pub features: Vec<String>,
    /// How long a soft power-off (`powerOffMode` Soft or TrySoft) waits for the guest, in seconds (default 60).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 3600))]
    pub power_off_timeout_seconds: Option<u32>,
    /// The placement policy VMs of this class are scheduled with (default: spread).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub placement_policy_ref: Option<NameRef>,
}

pub(crate) fn default_power_off_timeout() -> u32 {
    DEFAULT_POWER_OFF_TIMEOUT_SECONDS
}

/// The soft power-off timeout of a class that names none.
pub const DEFAULT_POWER_OFF_TIMEOUT_SECONDS: u32 = 60;

/// One disk of a class.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct DiskSpec {
    /// Disk name, unique in the class.
    #[schemars(length(min = 1, max = 63), regex(pattern = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"))]
    pub name: String,
    /// Size in GiB.
    #[serde(rename = "sizeGiB")]
    #[schemars(range(min = 1))]
    pub size_gib: u64,
    /// Abstract storage class, mapped by each Provider to a backend target.
    #[schemars(length(min = 1, max = 63))]
    pub storage_class: String,
}

/// One NIC of a class.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct NicSpec {
    /// NIC name, unique in the class.
    #[schemars(length(min = 1, max = 63), regex(pattern = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"))]
    pub name: String,
    /// Abstract network class, mapped by each Provider to a backend network.
    #[schemars(length(min = 1, max = 63))]
    pub network_class: String,
}

/// Firmware kinds.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema)]
pub enum Firmware {
    #[default]
    BIOS,
    UEFI,
}

/// Observed state of a VMClass.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct VMClassStatus {
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["type"]))]
    pub conditions: Vec<Condition>,
}

/// An OS image VMs boot from.
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[kube(
    group = "banlieue.io",
    version = "v1alpha1",
    kind = "VMImage",
    plural = "vmimages",
    status = "VMImageStatus",
    shortname = "vmimage",
    category = "banlieue",
    derive = "PartialEq",
    derive = "Default",
    doc = "An OS image with per-provider-class sources and an optional kairos build.",
    printcolumn(name = "OS", type_ = "string", json_path = ".spec.os.family"),
    printcolumn(name = "Version", type_ = "string", json_path = ".spec.os.version"),
    printcolumn(name = "Arch", type_ = "string", json_path = ".spec.os.arch"),
    printcolumn(name = "Age", type_ = "date", json_path = ".metadata.creationTimestamp")
)]
#[serde(rename_all = "camelCase")]
pub struct VMImageSpec {
    /// What the image contains.
    #[serde(default)]
    pub os: OsInfo,
    /// Where each provider class finds the image.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["providerClass"]))]
    pub sources: Vec<ImageSource>,
    /// Build the image with kairos-operator, then import it into each Provider.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub build: Option<ImageBuild>,
}

/// OS metadata.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
pub struct OsInfo {
    /// e.g. `ubuntu`, `debian`, `kairos`.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub family: String,
    /// e.g. `24.04`.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub version: String,
    /// CPU architecture.
    #[serde(default = "default_arch")]
    #[schemars(regex(pattern = r"^(amd64|arm64)$"))]
    pub arch: String,
}

impl Default for OsInfo {
    fn default() -> Self {
        Self { family: String::new(), version: String::new(), arch: default_arch() }
    }
}

fn default_arch() -> String {
    "amd64".into()
}

/// Where one provider class finds an image. Exactly one of the locations is used, by the class's driver.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ImageSource {
    /// The ProviderClass this source is for.
    #[schemars(length(min = 1, max = 253))]
    pub provider_class: String,
    /// A backend template name (vSphere, Proxmox).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub template: Option<String>,
    /// A backing file or volume (libvirt).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub backing_file: Option<String>,
    /// A URL the driver imports from.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub url: Option<String>,
    /// `sha256:<hex>` of the URL's content.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(regex(pattern = r"^sha256:[a-f0-9]{64}$"))]
    pub checksum: Option<String>,
}

/// An image built by kairos-operator's `OSArtifact`. The image builder creates the
/// OSArtifact (this spec, plus an exporter that pushes the built disk to the registry the
/// operator configured), waits for it, and imports the result into every Provider of the
/// classes whose source names no location.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ImageBuild {
    /// The `build.kairos.io/v1alpha2` OSArtifact spec (`image`, `artifacts`, …), passed
    /// through; `exporters` are banlieue's.
    #[schemars(extend("x-kubernetes-preserve-unknown-fields" = true))]
    pub os_artifact: BTreeMap<String, serde_json::Value>,
}

/// Where a build stands.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct BuildStatus {
    /// `namespace/name` of the OSArtifact.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub os_artifact: String,
    /// The OSArtifact's phase: Pending, Building, Exporting, Ready, Error.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub phase: String,
    /// The pushed artifact, pinned (`registry/repository@sha256:…`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub artifact: Option<String>,
    /// Where the built disk is fetched from (the registry's blob URL).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub url: Option<String>,
    /// `sha256:<hex>` of the built disk.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub checksum: Option<String>,
    /// For which `spec.build` generation.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
}

impl ImageSource {
    /// Names none of the locations: the source is the VMImage's build.
    pub fn is_built(&self) -> bool {
        self.template.is_none() && self.backing_file.is_none() && self.url.is_none()
    }
}

impl VMImage {
    /// The source for `provider_class`, with a built source made the `url` and `checksum`
    /// the build produced (unchanged while the build has not produced anything).
    pub fn source_for(&self, provider_class: &str) -> Option<ImageSource> {
        let mut src = self.spec.sources.iter().find(|s| s.provider_class == provider_class)?.clone();
        if src.is_built() && self.spec.build.is_some() {
            if let Some(b) = self.status.as_ref().and_then(|s| s.build.as_ref()).filter(|b| b.url.is_some()) {
                src.url = b.url.clone();
                src.checksum = b.checksum.clone();
            }
        }
        Some(src)
    }
}

/// Observed state of a VMImage.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct VMImageStatus {
    /// The kairos-operator build, when `spec.build` is set.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub build: Option<BuildStatus>,
    /// The image on each Provider its `url` sources apply to.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["provider"]))]
    pub providers: Vec<ImageImport>,
    /// Imports of an earlier source or build, kept while VirtualMachines made from them
    /// exist (`status.scheduled.image`), then removed.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub retired: Vec<ImageImport>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["type"]))]
    pub conditions: Vec<Condition>,
}

/// Where an import into one Provider stands.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema)]
pub enum ImportPhase {
    #[default]
    Pending,
    Importing,
    Ready,
    Failed,
}

/// The image on one Provider.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ImageImport {
    /// `namespace/name` of the Provider.
    pub provider: String,
    pub phase: ImportPhase,
    /// `sha256:<hex>` of the image imported (or being imported).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub digest: Option<String>,
    /// What the backend calls the imported image (a volume path, a template).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reference: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
}
