//! `VMSnapshot`: a point a VM can go back to, taken on its backend.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, LabelSelector, Time};
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::common::{NameRef, SecretKeyRef};

/// A snapshot of one VirtualMachine on the backend it runs on.
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[kube(
    group = "banlieue.io",
    version = "v1alpha1",
    kind = "VMSnapshot",
    namespaced,
    status = "VMSnapshotStatus",
    shortname = "vmsnap",
    category = "banlieue",
    derive = "PartialEq",
    derive = "Default",
    doc = "A snapshot of a VirtualMachine's disks (and memory, where asked and the backend can) on its backend.",
    printcolumn(name = "VM", type_ = "string", json_path = ".spec.vmRef.name"),
    printcolumn(name = "Phase", type_ = "string", json_path = ".status.phase"),
    printcolumn(name = "ReadyToUse", type_ = "boolean", json_path = ".status.readyToUse"),
    printcolumn(name = "Memory", type_ = "boolean", json_path = ".status.memory"),
    printcolumn(name = "Taken", type_ = "date", json_path = ".status.creationTime"),
    printcolumn(name = "Backend ID", type_ = "string", priority = 1, json_path = ".status.snapshotID"),
    printcolumn(name = "Age", type_ = "date", json_path = ".metadata.creationTimestamp")
)]
#[serde(rename_all = "camelCase")]
pub struct VMSnapshotSpec {
    /// The VirtualMachine (same namespace) to snapshot.
    pub vm_ref: NameRef,
    /// Include the VM's memory (it must be running), so a revert returns it to running
    /// where it was. libvirt always includes it for a running VM.
    #[serde(default)]
    pub memory: bool,
    /// Quiesce the guest's file systems first, through guest tools (vSphere) or the QEMU
    /// guest agent (Proxmox VE); refused where none answers.
    #[serde(default)]
    pub quiesce: bool,
    /// Free text kept with the snapshot on the backend.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
    /// Keep this object when its VM is deleted (it is owned by the VM, and deleted with it,
    /// otherwise). The backend snapshot goes with the VM's backend machine either way; what
    /// stays is the record of what the VM was (class, image, user-data).
    #[serde(default)]
    pub retain_on_vm_deletion: bool,
}

/// Where a snapshot is.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema)]
pub enum SnapshotPhase {
    /// Waiting for its VM (not found, not placed yet) or for a slot on its Provider.
    #[default]
    Pending,
    /// Asked of the backend.
    InProgress,
    /// Taken: the VM can be reverted to it.
    Ready,
    /// Refused, or gone from the backend; the condition says why.
    Failed,
}

/// What the VM was when the snapshot was taken.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct SnapshotSource {
    pub class_ref: NameRef,
    /// Left out for an adopted VM without one.
    #[serde(default, skip_serializing_if = "NameRef::is_unset")]
    #[schemars(transform = crate::common::no_default)]
    pub image_ref: NameRef,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub user_data: Option<SecretKeyRef>,
    /// The Provider the VM ran on (the snapshot lives there).
    pub provider: String,
    /// The infrastructure Machine it was taken of, and that machine's UID: a snapshot
    /// belongs to one backend machine, and a VM moved elsewhere has a new one.
    pub machine: String,
    #[serde(rename = "machineUID")]
    pub machine_uid: String,
    /// The failure domain the machine was in, as its Provider names it.
    #[serde(default)]
    pub failure_domain: String,
    /// The backend id of an adopted machine (its `spec.vm.adopt`), which its driver finds it by.
    #[serde(rename = "backendID", default, skip_serializing_if = "Option::is_none")]
    pub backend_id: Option<String>,
}

/// Observed state of a VMSnapshot.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct VMSnapshotStatus {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phase: Option<SnapshotPhase>,
    /// The VM can be reverted to it, or restored from it.
    #[serde(default)]
    pub ready_to_use: bool,
    /// When the backend took it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub creation_time: Option<Time>,
    /// What it occupies on the backend, where the backend says.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub size_bytes: Option<u64>,
    /// Whether it holds the VM's memory.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory: Option<bool>,
    /// The backend's name for it (a vSphere snapshot id, a Proxmox VE or libvirt snapshot name).
    #[serde(rename = "snapshotID", default, skip_serializing_if = "Option::is_none")]
    pub snapshot_id: Option<String>,
    /// The VM as it was, and the backend machine the snapshot belongs to.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub source: Option<SnapshotSource>,
    /// Ready.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["type"]))]
    pub conditions: Vec<Condition>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
}

/// The name a snapshot is given on the backend: its UID, so a retry after a crash finds
/// it rather than taking a second (39 characters: within Proxmox VE's 40, and starting
/// with a letter as it wants).
pub fn backend_name(uid: &str) -> String {
    format!("bl-{uid}")
}

/// Snapshots of the VMs a selector picks, on a cron schedule, with retention.
///
/// A schedule of its own, not a field of each VM: one object gives a pool (by its label) or
/// any set of VMs the same snapshots, its status says how each run went, and a VM's spec
/// stays what the VM is.
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[kube(
    group = "banlieue.io",
    version = "v1alpha1",
    kind = "VMSnapshotSchedule",
    namespaced,
    status = "VMSnapshotScheduleStatus",
    shortname = "vmsnapsched",
    category = "banlieue",
    derive = "PartialEq",
    derive = "Default",
    doc = "Snapshots of the VirtualMachines a selector picks, on a cron schedule in a time zone, with retention.",
    printcolumn(name = "Schedule", type_ = "string", json_path = ".spec.schedule"),
    printcolumn(name = "TimeZone", type_ = "string", json_path = ".spec.timeZone"),
    printcolumn(name = "Last", type_ = "date", json_path = ".status.lastScheduleTime"),
    printcolumn(name = "Next", type_ = "string", json_path = ".status.nextScheduleTime"),
    printcolumn(name = "Ready", type_ = "string", json_path = ".status.conditions[?(@.type==\"Ready\")].status"),
    printcolumn(name = "Age", type_ = "date", json_path = ".metadata.creationTimestamp")
)]
#[serde(rename_all = "camelCase")]
pub struct VMSnapshotScheduleSpec {
    /// When: cron's five fields (`0 2 * * *`: 02:00 every day), six with seconds first, or
    /// `@hourly`, `@daily`, `@weekly`, `@monthly`, `@yearly`.
    pub schedule: String,
    /// The IANA time zone the schedule is read in (`Europe/Paris`); UTC when unset.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub time_zone: Option<String>,
    /// The VirtualMachines (of this namespace) to snapshot: a pool's label, or any.
    pub selector: LabelSelector,
    /// How many of each VM's snapshots to keep, and for how long.
    pub retention: Retention,
    /// At most this many of the schedule's snapshots being taken at once on one Provider
    /// (the others of a run wait their turn). Default 4.
    #[serde(default = "default_in_flight")]
    pub max_in_flight_per_provider: u32,
    /// Include each running VM's memory (see VMSnapshot `spec.memory`; a VM that is off
    /// gets a snapshot of its disks).
    #[serde(default)]
    pub memory: bool,
    /// Quiesce each guest first (see VMSnapshot `spec.quiesce`).
    #[serde(default)]
    pub quiesce: bool,
    /// Take no snapshots (retention still applies). A run missed meanwhile is not caught up.
    #[serde(default)]
    pub suspend: bool,
}

fn default_in_flight() -> u32 {
    4
}

/// Which of a VM's scheduled snapshots are kept: the newest `keepLast` Ready ones, none
/// older than `maxAge`; either or both.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Retention {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub keep_last: Option<u32>,
    /// A duration: `36h`, `7d`, `2w`, `1d 12h`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_age: Option<String>,
}

/// Observed state of a VMSnapshotSchedule.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct VMSnapshotScheduleStatus {
    /// The latest scheduled time a run was started for (a control plane that was down over
    /// several starts the latest one only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_schedule_time: Option<Time>,
    /// When the next run starts, in the schedule's time zone.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub next_schedule_time: Option<String>,
    /// How the latest run is going.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_run: Option<RunStatus>,
    /// Ready: the schedule is valid and running.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["type"]))]
    pub conditions: Vec<Condition>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
}

/// One run of a schedule: the VMs it covers and where their snapshots are.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RunStatus {
    pub schedule_time: Time,
    /// VMs the selector picked.
    pub vms: u32,
    pub ready: u32,
    /// Taken or waiting for a slot on their Provider.
    pub in_progress: u32,
    pub failed: u32,
    /// VMs whose snapshot is not made yet (their Provider has `maxInFlightPerProvider` under way).
    pub waiting: u32,
}

/// The label on a scheduled snapshot naming its schedule.
pub const SCHEDULE_LABEL: &str = "banlieue.io/snapshot-schedule";
/// The annotation on a scheduled snapshot saying which run made it (RFC 3339).
pub const SCHEDULED_AT_ANNOTATION: &str = "banlieue.io/scheduled-at";
