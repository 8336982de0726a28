//! `kubectl vm snapshot|snapshots|revert`: VMSnapshots made, listed, and a VM's
//! `spec.revertTo` set — declarative fields only, as every other command.

use banlieue_api::snapshot::SnapshotPhase;
use banlieue_api::vm::RevertPhase;
use banlieue_api::{VMSnapshot, VMSnapshotSpec};
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams};
use kube::ResourceExt;
use serde_json::json;

use crate::output::{self, Format};
use crate::{await_vm, get_vm, not_found, ready, writable, Failure, Progress, Result, Target, Wait};

impl Target {
    fn snapshots(&self) -> Api<VMSnapshot> {
        Api::namespaced(self.client.clone(), &self.namespace)
    }
}

/// What `kubectl vm snapshot` asks for.
pub struct Request {
    pub memory: bool,
    pub quiesce: bool,
    pub description: Option<String>,
    /// The VMSnapshot's name (default `<vm>-<UTC time>`).
    pub name: Option<String>,
}

/// Make a VMSnapshot of `vm`; with `--wait`, until it is Ready (a refusal ends the wait
/// with its reason, exit 4).
pub async fn snapshot(t: &Target, vm: &str, request: Request, wait: Wait) -> Result<()> {
    let v = writable(t, vm).await?;
    let name = request.name.unwrap_or_else(|| format!("{vm}-{}", k8s_openapi::jiff::Timestamp::now().strftime("%Y%m%d-%H%M%S")));
    let mut snap = VMSnapshot::new(
        &name,
        VMSnapshotSpec {
            vm_ref: banlieue_api::common::NameRef { name: vm.to_string() },
            memory: request.memory,
            quiesce: request.quiesce,
            description: request.description,
            retain_on_vm_deletion: false,
        },
    );
    snap.metadata.namespace = Some(t.namespace.clone());
    snap.metadata.labels = installation_of(&v);
    t.snapshots().create(&PostParams::default(), &snap).await.map_err(|e| match e {
        kube::Error::Api(s) if s.code == 409 => Failure::Refused(format!("vmsnapshot {name:?} already exists: name it with --name")),
        e => e.into(),
    })?;
    println!("vmsnapshot/{name} created");
    if !wait.wait {
        return Ok(());
    }
    let progress = Progress::start(&format!("vmsnapshot {name} to be taken"));
    let waited = tokio::time::timeout(
        std::time::Duration::from_secs(wait.timeout),
        kube::runtime::wait::await_condition(t.snapshots(), &name, |s: Option<&VMSnapshot>| {
            matches!(s.and_then(|s| s.status.as_ref()?.phase), Some(SnapshotPhase::Ready | SnapshotPhase::Failed))
        }),
    )
    .await;
    progress.finish();
    let why = |s: &VMSnapshot| s.status.as_ref().and_then(|st| st.conditions.iter().find(|c| c.type_ == "Ready")).map(|c| format!("{}: {}", c.reason, c.message)).unwrap_or_default();
    match waited {
        Ok(Ok(Some(s))) if s.status.as_ref().and_then(|st| st.phase) == Some(SnapshotPhase::Ready) => {
            let id = s.status.as_ref().and_then(|st| st.snapshot_id.clone()).unwrap_or_default();
            println!("vmsnapshot/{name} is Ready (backend snapshot {id}, {:.1}s)", progress.elapsed().as_secs_f64());
            Ok(())
        }
        Ok(Ok(Some(s))) => Err(Failure::Refused(format!("vmsnapshot {name:?} failed: {}", why(&s)))),
        Ok(Ok(None)) => Err(Failure::NotFound(format!("vmsnapshot {name:?} was deleted while waiting"))),
        Ok(Err(e)) => Err(Failure::Other(e.into())),
        Err(_) => {
            let now = t.snapshots().get_opt(&name).await?.map(|s| why(&s)).unwrap_or_default();
            Err(Failure::TimedOut(format!("vmsnapshot {name:?} not Ready after {}s; {now}", wait.timeout)))
        }
    }
}

/// The VM's snapshots, oldest first.
pub async fn list(t: &Target, vm: &str) -> Result<()> {
    get_vm(t, vm).await?;
    let mut snaps: Vec<VMSnapshot> = t.snapshots().list(&ListParams::default()).await?.items.into_iter().filter(|s| s.spec.vm_ref.name == vm).collect();
    snaps.sort_by_key(|s| s.metadata.creation_timestamp.as_ref().map(|t| t.0));
    if let Some(text) = output::structured(t.format, "VMSnapshotList", &snaps)? {
        print!("{text}");
        return Ok(());
    }
    let mut header = vec!["NAME", "PHASE", "MEMORY", "TAKEN", "AGE"];
    if t.format == Format::Wide {
        header.extend(["BACKEND-ID", "SCHEDULE", "MESSAGE"]);
    }
    let rows = snaps.iter().map(|s| {
        let st = s.status.clone().unwrap_or_default();
        let mut row = vec![
            s.name_any(),
            st.phase.map(|p| format!("{p:?}")).unwrap_or_else(|| "Pending".into()),
            st.memory.map(|m| if m { "yes" } else { "no" }.to_string()).unwrap_or_else(|| "-".into()),
            st.creation_time.as_ref().map(|c| output::age(Some(c))).unwrap_or_else(|| "-".into()),
            output::age(s.metadata.creation_timestamp.as_ref()),
        ];
        if t.format == Format::Wide {
            row.push(st.snapshot_id.unwrap_or_else(|| "-".into()));
            row.push(s.labels().get(banlieue_api::snapshot::SCHEDULE_LABEL).cloned().unwrap_or_else(|| "-".into()));
            row.push(st.conditions.iter().find(|c| c.type_ == "Ready").map(|c| c.message.clone()).unwrap_or_default());
        }
        row
    });
    print!("{}", output::table(&header, rows));
    Ok(())
}

/// A new VM `to` made from `snapshot` (`spec.source.snapshotRef`), on the snapshot's
/// Provider: the snapshotted VM's spec when it still exists, else its class, image and
/// user-data as the snapshot recorded them; with `--wait`, until it is Ready.
pub async fn restore(t: &Target, snapshot: &str, to: &str, linked: bool, wait: Wait) -> Result<()> {
    let Some(snap) = t.snapshots().get_opt(snapshot).await? else {
        let names: Vec<String> = t.snapshots().list(&ListParams::default()).await?.items.iter().map(|s| s.name_any()).collect();
        return Err(Failure::NotFound(not_found("vmsnapshot", snapshot, &t.namespace, &names)));
    };
    let st = snap.status.clone().unwrap_or_default();
    let (Some(SnapshotPhase::Ready), Some(source)) = (st.phase, st.source) else {
        return Err(Failure::Refused(format!("vmsnapshot {snapshot:?} is {:?}, not Ready", st.phase.unwrap_or_default())));
    };
    let mut spec = match t.vms().get_opt(&snap.spec.vm_ref.name).await? {
        Some(original) => serde_json::to_value(&original.spec).map_err(anyhow::Error::from)?,
        None => json!({"classRef": source.class_ref, "imageRef": source.image_ref, "userData": source.user_data}),
    };
    if let Some(s) = spec.as_object_mut() {
        // A new VM: not the original's revert, restore or pause.
        for field in ["revertTo", "source", "paused", "restartRequestedAt"] {
            s.remove(field);
        }
    }
    spec["placement"] = json!({"providerRef": {"name": source.provider}});
    spec["source"] = json!({"snapshotRef": {"name": snapshot}, "linkedClone": linked});
    let mut vm: banlieue_api::VirtualMachine = serde_json::from_value(json!({
        "apiVersion": "banlieue.io/v1alpha1", "kind": "VirtualMachine",
        "metadata": {"name": to, "namespace": t.namespace}, "spec": spec,
    }))
    .map_err(anyhow::Error::from)?;
    vm.metadata.labels = installation_of(&snap);
    t.vms().create(&PostParams::default(), &vm).await.map_err(|e| match e {
        kube::Error::Api(s) if s.code == 409 => Failure::Refused(format!("virtualmachine {to:?} already exists")),
        e => e.into(),
    })?;
    println!("virtualmachine/{to} restoring from {snapshot} on {}", source.provider);
    if wait.wait {
        await_vm(t, to, wait, "Ready", ready).await?;
    }
    Ok(())
}

/// The label naming the banlieue installation `obj` belongs to, for what is made from it: a
/// snapshot of a VM, a VM from a snapshot, is acted on by the same installation (none: the
/// default one).
fn installation_of<K: kube::Resource>(obj: &K) -> Option<std::collections::BTreeMap<String, String>> {
    let instance = obj.meta().labels.as_ref()?.get(banlieue_api::INSTANCE_LABEL)?;
    Some(std::collections::BTreeMap::from([(banlieue_api::INSTANCE_LABEL.to_string(), instance.clone())]))
}

/// Set the VM's `spec.revertTo` (cleared first when it already names the snapshot, so the
/// revert happens again); with `--wait`, until the VM is back at it and Ready.
pub async fn revert(t: &Target, vm: &str, snapshot: &str, wait: Wait) -> Result<()> {
    let v = writable(t, vm).await?;
    let Some(snap) = t.snapshots().get_opt(snapshot).await? else {
        let names: Vec<String> = t.snapshots().list(&ListParams::default()).await?.items.iter().filter(|s| s.spec.vm_ref.name == vm).map(|s| s.name_any()).collect();
        return Err(Failure::NotFound(not_found("vmsnapshot", snapshot, &t.namespace, &names)));
    };
    if snap.spec.vm_ref.name != vm {
        return Err(Failure::Refused(format!("vmsnapshot {snapshot:?} is a snapshot of virtualmachine {:?}, not of {vm:?}", snap.spec.vm_ref.name)));
    }
    let phase = snap.status.as_ref().and_then(|s| s.phase).unwrap_or_default();
    if phase != SnapshotPhase::Ready {
        return Err(Failure::Refused(format!("vmsnapshot {snapshot:?} is {phase:?}, not Ready")));
    }
    let vms = t.vms();
    if v.spec.revert_to.as_deref() == Some(snapshot) {
        vms.patch(vm, &PatchParams::default(), &Patch::Merge(json!({"spec": {"revertTo": null}}))).await?;
    }
    vms.patch(vm, &PatchParams::default(), &Patch::Merge(json!({"spec": {"revertTo": snapshot}}))).await?;
    println!("virtualmachine/{vm} reverting to {snapshot}");
    if wait.wait {
        let uid = snap.uid().unwrap_or_default();
        let what = format!("reverted to {snapshot}");
        await_vm(t, vm, wait, &what, move |v| {
            v.status.as_ref().and_then(|s| s.revert.as_ref()).is_some_and(|r| r.snapshot_uid == uid && r.phase == RevertPhase::Reverted) && ready(v)
        })
        .await?;
    }
    Ok(())
}
