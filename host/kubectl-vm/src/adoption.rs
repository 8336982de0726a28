//! `kubectl vm discover|adopt|release`: the VMs already on a backend listed (the Provider is
//! asked through its `banlieue.io/discover` annotation, and its driver answers in
//! `status.discovery`), one taken over (a VirtualMachine with `spec.adopt`), and a VM let go
//! of (`deletionPolicy: Orphan`, then deleted) — declarative fields only, as every command.

use std::time::Duration;

use banlieue_api::provider::{DiscoveredMachine, Discovery, DISCOVER_ANNOTATION};
use banlieue_api::{Provider, VirtualMachine};
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use kube::ResourceExt;
use serde_json::json;

use crate::output::{self, Format};
use crate::{await_vm, get_vm, not_found, ready, Failure, Progress, Result, Target, Wait};

impl Target {
    fn providers(&self) -> Api<Provider> {
        Api::namespaced(self.client.clone(), &self.namespace)
    }
}

/// Ask Provider `provider` for the machines on its backend and print them: the unmanaged
/// ones, or with `all` every one with the Machine that manages it.
pub async fn discover(t: &Target, provider: &str, all: bool, timeout: u64) -> Result<()> {
    let found = ask(t, provider, timeout).await?;
    if let Some(why) = &found.message {
        eprintln!("warning: {why}");
    }
    let machines: Vec<&DiscoveredMachine> = found.machines.iter().filter(|m| all || m.owner.is_none()).collect();
    if let Some(text) = output::structured(t.format, "List", &machines)? {
        print!("{text}");
        return Ok(());
    }
    let wide = t.format == Format::Wide;
    let mut header = vec!["BACKEND ID", "NAME", "POWER", "CPUS", "MEMORY", "DISKS"];
    if all {
        header.push("MANAGED BY");
    }
    if wide {
        header.extend(["FAILURE DOMAIN", "ADDRESSES", "TAGS"]);
    }
    let rows = machines.iter().map(|m| {
        let disks: u64 = m.disks.iter().map(|d| d.size_gib).sum();
        let mut row = vec![
            m.backend_id.clone(),
            m.name.clone(),
            if m.template { "template".into() } else { format!("{:?}", m.power_state) },
            m.cpus.to_string(),
            format!("{}Mi", m.memory_mib),
            format!("{} ({disks}Gi)", m.disks.len()),
        ];
        if all {
            row.push(m.owner.as_ref().map_or("-".into(), |o| o.machine.clone()));
        }
        if wide {
            row.extend([m.failure_domain.clone(), m.addresses.join(","), m.tags.join(",")]);
        }
        row
    });
    print!("{}", output::table(&header, rows));
    if machines.is_empty() {
        eprintln!("no {}machines on Provider {provider}'s backend", if all { "" } else { "unmanaged " });
    }
    Ok(())
}

/// Set the Provider's discover annotation to a new value and wait for its status to answer it.
async fn ask(t: &Target, provider: &str, timeout: u64) -> Result<Discovery> {
    if t.providers().get_opt(provider).await?.is_none() {
        let names: Vec<String> = t.providers().list(&Default::default()).await?.items.iter().map(|p| p.name_any()).collect();
        return Err(Failure::NotFound(not_found("provider", provider, &t.namespace, &names)));
    }
    let token = k8s_openapi::jiff::Timestamp::now().to_string();
    let patch = json!({"metadata": {"annotations": {DISCOVER_ANNOTATION: token}}});
    t.providers().patch(provider, &PatchParams::default(), &Patch::Merge(patch)).await?;
    let progress = Progress::start(&format!("Provider {provider} to list its backend's machines"));
    let answered = {
        let token = token.clone();
        move |p: Option<&Provider>| p.and_then(|p| p.status.as_ref()?.discovery.as_ref()).is_some_and(|d| d.requested == token)
    };
    let waited = tokio::time::timeout(Duration::from_secs(timeout), kube::runtime::wait::await_condition(t.providers(), provider, answered)).await;
    progress.finish();
    match waited {
        Ok(Ok(Some(p))) => Ok(p.status.and_then(|s| s.discovery).unwrap_or_default()),
        Ok(Ok(None)) => Err(Failure::NotFound(format!("provider {provider:?} was deleted while waiting"))),
        Ok(Err(e)) => Err(Failure::Other(e.into())),
        Err(_) => Err(Failure::TimedOut(format!(
            "Provider {provider:?} did not list its backend's machines within {timeout}s: is banlieue's provider role running, and the Provider Ready?"
        ))),
    }
}

/// What `kubectl vm adopt` makes.
pub struct Adopt {
    pub provider: String,
    pub backend_id: String,
    pub name: String,
    /// The VM's class; none: one named after the VM, made from the VM's hardware.
    pub class: Option<String>,
}

/// Write a VirtualMachine adopting backend VM `backend_id` of `provider`; with `--wait`,
/// until it is Ready.
pub async fn adopt(t: &Target, a: Adopt, wait: Wait) -> Result<()> {
    let found = ask(t, &a.provider, wait.timeout).await?;
    let m = found.machines.iter().find(|m| m.backend_id == a.backend_id).ok_or_else(|| {
        Failure::NotFound(format!("Provider {} has no machine with backend id {:?} (`kubectl vm discover --provider {}` lists them)", a.provider, a.backend_id, a.provider))
    })?;
    if let Some(o) = &m.owner {
        return Err(Failure::Refused(format!("backend VM {} ({}) is already managed by Machine {}", m.name, m.backend_id, o.machine)));
    }
    if m.template {
        return Err(Failure::Refused(format!("backend VM {} ({}) is a template: templates are not adopted", m.name, m.backend_id)));
    }
    // The installation that manages the Provider manages what is made here too (one that
    // acts only on labelled objects would not see them otherwise).
    let provider = t.providers().get(&a.provider).await?;
    let labels = match provider.labels().get(banlieue_api::INSTANCE_LABEL) {
        Some(instance) => json!({ banlieue_api::INSTANCE_LABEL: instance }),
        None => json!({}),
    };
    let class = match a.class {
        Some(c) => c,
        None => {
            let name = format!("adopted-{}", a.name);
            let storage = provider.spec.capabilities.storage_classes.keys().next().cloned().unwrap_or_else(|| "standard".into());
            make_class(t, &name, m, &storage, &labels).await?;
            name
        }
    };
    // The VM keeps the power state it has: adopting changes nothing on the backend.
    let power = if m.power_state == banlieue_api::common::PowerState::PoweredOff { "PoweredOff" } else { "PoweredOn" };
    let vm: VirtualMachine = serde_json::from_value(json!({
        "apiVersion": "banlieue.io/v1alpha1", "kind": "VirtualMachine",
        "metadata": {"name": a.name, "namespace": t.namespace, "labels": labels},
        "spec": {"classRef": {"name": class}, "placement": {"providerRef": {"name": a.provider}},
                 "desiredPowerState": power, "adopt": {"backendId": a.backend_id}},
    }))
    .map_err(anyhow::Error::from)?;
    t.vms().create(&PostParams::default(), &vm).await?;
    println!("virtualmachine/{} adopting {} ({}) on Provider {} with VMClass {class}", a.name, m.name, m.backend_id, a.provider);
    if wait.wait {
        await_vm(t, &a.name, wait, "Ready", ready).await?;
    }
    Ok(())
}

/// A VMClass with the found VM's CPUs, memory and disk sizes (on `storage`, the Provider's
/// first storage class), so the adopted VM matches its class. An existing class of that name
/// is kept.
async fn make_class(t: &Target, name: &str, m: &DiscoveredMachine, storage: &str, labels: &serde_json::Value) -> Result<()> {
    let disks: Vec<serde_json::Value> = m.disks.iter().enumerate().map(|(i, d)| json!({"name": format!("disk{i}"), "sizeGiB": d.size_gib.max(1), "storageClass": storage})).collect();
    let class = json!({
        "apiVersion": "banlieue.io/v1alpha1", "kind": "VMClass",
        "metadata": {"name": name, "labels": labels},
        "spec": {"cpus": m.cpus, "memoryMiB": m.memory_mib, "disks": disks},
    });
    let api: Api<banlieue_api::VMClass> = Api::all(t.client.clone());
    let class: banlieue_api::VMClass = serde_json::from_value(class).map_err(anyhow::Error::from)?;
    match api.create(&PostParams::default(), &class).await {
        Ok(_) => println!("vmclass/{name} created from the VM's hardware"),
        Err(kube::Error::Api(e)) if e.code == 409 => println!("vmclass/{name} exists; kept"),
        Err(e) => return Err(e.into()),
    }
    Ok(())
}

/// Let VM `name` go: its backend VM stays as it is, without banlieue's mark; the
/// VirtualMachine is deleted. With `--wait`, until it is gone.
pub async fn release(t: &Target, name: &str, wait: Wait) -> Result<()> {
    let vm = get_vm(t, name).await?;
    if vm.spec.deletion_policy != banlieue_api::vm::DeletionPolicy::Orphan {
        t.vms().patch(name, &PatchParams::default(), &Patch::Merge(json!({"spec": {"deletionPolicy": "Orphan"}}))).await?;
    }
    t.vms().delete(name, &DeleteParams::default()).await?;
    println!("virtualmachine/{name} released: its backend VM is left as it is");
    if wait.wait {
        let progress = Progress::start(&format!("virtualmachine/{name} to be gone"));
        let gone = tokio::time::timeout(Duration::from_secs(wait.timeout), kube::runtime::wait::await_condition(t.vms(), name, kube::runtime::wait::conditions::is_deleted(&vm.uid().unwrap_or_default()))).await;
        progress.finish();
        match gone {
            Ok(Ok(_)) => println!("virtualmachine/{name} is gone ({:.1}s)", progress.elapsed().as_secs_f64()),
            Ok(Err(e)) => return Err(Failure::Other(e.into())),
            Err(_) => return Err(Failure::TimedOut(format!("virtualmachine {name:?} still exists after {}s", wait.timeout))),
        }
    }
    Ok(())
}
