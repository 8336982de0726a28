//! One VirtualMachine end to end through the whole control plane (scheduler, VM
//! controller, infrastructure Machine, Provider probe, Wasm driver) on the real
//! backends: vSphere (a real vcsim) and Proxmox VE (a real fakepve), both
//! started on 127.0.0.1 by each test, and libvirtd with qemu (TCG) where the
//! guest really boots, shared by the whole run (`banlieue-test-backends`).
//!
//! Every test checks what the backend itself holds, through the fixture's own
//! session with the backend's API, not only what banlieue reports in status.
//! Each test has its own API (`TestEnv`), control plane and backend instance.

use std::time::{Duration, Instant};

use banlieue_api::common::{MachinePhase, PowerState};
use banlieue_api::{Provider, VirtualMachine};
use banlieue_test_backends::fakepve::FakePve;
use banlieue_test_backends::libvirtd::{peak_concurrent, EventLog, Libvirtd};
use banlieue_test_backends::vcsim::{self, Vcsim};
use banlieue_tests::backends::{census, libvirtd_fixtures, libvirtd_provider, machines, names, proxmox_fixtures, pve_vm, secret, three_backends, vm, vm_class, vm_image, vsphere_fixtures, Names, PveEndpoint, KVM, PVE, VCENTER};
use banlieue_tests::control::{wait_for, ControlPlane};
use banlieue_tests::{await_deleted, TestEnv};
use anyhow::Context as _;
use base64::Engine as _;
use k8s_openapi::api::core::v1::{Event, Secret};
use kube::api::{Api, DynamicObject, ListParams, Patch, PatchParams};
use kube::ResourceExt;
use serde_json::{json, Value};

const USER_DATA: &str = "#cloud-config\nhostname: web\nruncmd:\n  - echo hello from banlieue\n";

fn b64(s: &str) -> String {
    base64::engine::general_purpose::STANDARD.encode(s)
}

// ---------------------------------------------------------------------------------------------
// Objects


// ---------------------------------------------------------------------------------------------
// Conditions

type Cond = (String, String, String);

fn vm_condition(vm: &VirtualMachine, type_: &str) -> Option<Cond> {
    let c = vm.status.as_ref()?.conditions.iter().find(|c| c.type_ == type_)?;
    Some((c.status.clone(), c.reason.clone(), c.message.clone()))
}

fn provider_ready(p: &Provider) -> Option<Cond> {
    let c = p.status.as_ref()?.conditions.iter().find(|c| c.type_ == "Ready")?;
    Some((c.status.clone(), c.reason.clone(), c.message.clone()))
}

fn machine_condition(m: &DynamicObject, type_: &str) -> Option<Cond> {
    let c = m.data["status"]["conditions"].as_array()?.iter().find(|c| c["type"] == type_)?;
    let s = |k: &str| c[k].as_str().unwrap_or_default().to_string();
    Some((s("status"), s("reason"), s("message")))
}

fn is_ready(vm: Option<&VirtualMachine>) -> bool {
    vm.and_then(|v| vm_condition(v, "Ready")).is_some_and(|(s, _, _)| s == "True")
}

fn power(vm: Option<&VirtualMachine>) -> Option<PowerState> {
    vm.and_then(|v| v.status.as_ref()?.observed_power_state)
}

async fn wait_provider(providers: &Api<Provider>, name: &str, secs: u64, status: &'static str, reason: Option<&'static str>) -> anyhow::Result<Provider> {
    let what = format!("Ready={status} {}", reason.unwrap_or(""));
    wait_for(providers, name, secs, &what, move |p: Option<&Provider>| {
        p.and_then(provider_ready).is_some_and(|(s, r, _)| s == status && reason.is_none_or(|want| r == want))
    })
    .await
}

async fn patch_spec(api: &Api<VirtualMachine>, name: &str, spec: Value) -> anyhow::Result<()> {
    api.patch(name, &PatchParams::default(), &Patch::Merge(json!({ "spec": spec }))).await?;
    Ok(())
}

/// Make the Provider controller reconcile (probe) now. A healthy Provider is probed again only
/// every `PROBE_INTERVAL` (60 s), and nothing tells banlieue a backend went down but a call to it.
/// A metadata change is a watch event, so it reconciles at once without changing the Provider's
/// spec (or generation, or its cached grants).
async fn nudge(providers: &Api<Provider>, name: &str, value: &str) -> anyhow::Result<()> {
    providers
        .patch(name, &PatchParams::default(), &Patch::Merge(json!({"metadata": {"annotations": {"banlieue-tests/nudge": value}}})))
        .await?;
    Ok(())
}

async fn restarted_events(env: &TestEnv) -> anyhow::Result<usize> {
    let events: Api<Event> = Api::namespaced(env.client.clone(), &env.ns);
    Ok(events.list(&ListParams::default()).await?.items.into_iter().filter(|e| e.reason.as_deref() == Some("Restarted")).count())
}

// ---------------------------------------------------------------------------------------------
// 1. vSphere lifecycle

#[tokio::test]
async fn a_vm_lives_and_dies_on_vsphere() -> anyhow::Result<()> {
    let env = TestEnv::start("vsphere-lifecycle").await?;
    env.install_crds().await?;
    let vc = Vcsim::start().await?;
    let names_before = vc.vm_names().await?;
    let cp = ControlPlane::start(&env)?;
    let n = vsphere_fixtures(&env, &vc, vcsim::PASSWORD).await?;
    let providers: Api<Provider> = Api::namespaced(env.client.clone(), &env.ns);
    let vms: Api<VirtualMachine> = Api::namespaced(env.client.clone(), &env.ns);
    let machines = machines(&env, "VSphere");

    // The Provider reports vcsim's cluster as its failure domain, with the classes it really has.
    let p = wait_provider(&providers, VCENTER, 60, "True", Some("Probed")).await?;
    let st = p.status.clone().unwrap_or_default();
    let fds: Vec<&str> = st.failure_domains.iter().map(|f| f.name.as_str()).collect();
    assert_eq!(fds, ["DC0_C0"], "vcsim's one cluster: {st:?}");
    let fd = &st.failure_domains[0];
    assert_eq!(fd.storage_classes, ["standard"], "ghost maps to a datastore vcsim lacks: not offered");
    assert_eq!(fd.network_classes, ["default"]);
    assert_eq!(fd.labels.get("topology.kubernetes.io/zone").map(String::as_str), Some("DC0_C0"));
    assert!(provider_ready(&p).unwrap().2.contains("vCenter"), "the backend's version: {:?}", provider_ready(&p));

    env.apply(secret(&env, "web-user-data", &[("user-data", USER_DATA)])).await?;
    env.apply(vm(&env, "web", &n, VCENTER, json!({"userData": {"name": "web-user-data", "key": "user-data"}}))).await?;
    // vcsim's stand-in for VMware Tools reports the guest address within 50 ms of power-on, so the
    // VM must show it within seconds: a Machine WaitingForAddress is described again after
    // machine::SETTLING_MIN, not only at RESYNC (300 s).
    let ready = wait_for(&vms, "web", 30, "Ready with an address", |v: Option<&VirtualMachine>| {
        is_ready(v) && v.and_then(|v| v.status.as_ref()).is_some_and(|s| !s.addresses.is_empty())
    })
    .await
    .context("a Machine WaitingForAddress must be described again soon, not only at RESYNC")?;
    let status = ready.status.clone().unwrap_or_default();
    let scheduled = status.scheduled.clone().expect("scheduled");
    assert_eq!((scheduled.provider.as_str(), scheduled.failure_domain.as_str()), (VCENTER, "DC0_C0"));
    assert_eq!(status.phase, Some(MachinePhase::Running));
    assert_eq!(status.observed_power_state, Some(PowerState::PoweredOn));

    // On vcsim: exactly one VM with the Machine's UID as instanceUuid, powered on, with the user-data.
    let machine = machines.get("web").await?;
    let uid = machine.uid().expect("uid");
    let moref = vc.find_vm(&uid).await?.expect("a VM with the Machine's UID as instanceUuid on vcsim");
    assert_eq!(vc.vm_property(&moref, "config.instanceUuid").await?.as_deref(), Some(uid.as_str()));
    let vm_name = format!("{}_web", env.ns);
    assert_eq!(vc.name(&moref).await?, vm_name);
    let names_now = vc.vm_names().await?;
    assert_eq!(names_now.iter().filter(|n| **n == vm_name).count(), 1, "{names_now:?}");
    assert_eq!(names_now.len(), names_before.len() + 1, "exactly one VM created: {names_now:?}");
    assert_eq!(vc.power_state(&moref).await?, "poweredOn");
    assert_eq!(vc.extra_config(&moref, "guestinfo.userdata").await?, Some(b64(USER_DATA)));
    assert_eq!(vc.vm_property(&moref, "config.hardware.numCPU").await?.as_deref(), Some("2"));
    assert_eq!(vc.vm_property(&moref, "config.hardware.memoryMB").await?.as_deref(), Some("2048"));
    // The boot disk as the class declares it (10 GiB), not the template's size.
    let disks = vc.virtual_disks(&moref).await?;
    assert_eq!(disks.iter().map(|(kib, _)| *kib).collect::<Vec<_>>(), [10 << 20], "{disks:?}");
    let ips = vc.guest_ips(&moref).await?;
    assert!(!ips.is_empty(), "vcsim reports a guest IP");
    let addresses: Vec<&str> = status.addresses.iter().map(|a| a.address.as_str()).collect();
    assert_eq!(addresses, ips.iter().map(String::as_str).collect::<Vec<_>>(), "the VM's addresses are vcsim's guest IPs");
    let provider_id = machine.data["spec"]["providerID"].as_str().unwrap_or_default().to_string();
    let bios = vc.vm_property(&moref, "config.uuid").await?.unwrap_or_default();
    assert!(provider_id.starts_with("vsphere://"), "{provider_id}");
    assert_eq!(provider_id, format!("vsphere://{bios}"));

    // Soft power-off: vcsim's VM is off, the VM reports it and is Ready in that state.
    patch_spec(&vms, "web", json!({"powerOffMode": "Soft", "desiredPowerState": "PoweredOff"})).await?;
    wait_for(&vms, "web", 60, "PoweredOff and Ready", |v: Option<&VirtualMachine>| is_ready(v) && power(v) == Some(PowerState::PoweredOff)).await?;
    assert_eq!(vc.power_state(&moref).await?, "poweredOff");
    assert_eq!(machines.get("web").await?.data["spec"]["vm"]["powerOffMode"], "Soft");

    patch_spec(&vms, "web", json!({"desiredPowerState": "PoweredOn"})).await?;
    wait_for(&vms, "web", 60, "PoweredOn and Ready", |v: Option<&VirtualMachine>| is_ready(v) && power(v) == Some(PowerState::PoweredOn)).await?;
    assert_eq!(vc.power_state(&moref).await?, "poweredOn");

    // Restart: one new restartRequestedAt, one restart, powered on at the end.
    let stamp = "2026-12-03T10:00:00Z";
    patch_spec(&vms, "web", json!({"restartRequestedAt": stamp})).await?;
    wait_for(&vms, "web", 60, "restart recorded", |v: Option<&VirtualMachine>| {
        is_ready(v) && v.and_then(|v| v.status.as_ref()?.last_restart_requested_at.clone()).as_deref() == Some(stamp)
    })
    .await?;
    assert_eq!(restarted_events(&env).await?, 1, "exactly one restart for one new restartRequestedAt");
    assert_eq!(vc.power_state(&moref).await?, "poweredOn");
    assert_eq!(vc.find_vm(&uid).await?.as_deref(), Some(moref.as_str()), "restarted in place, not recreated");

    // Delete: the VM goes after the Machine, which goes after vcsim's VM.
    vms.delete("web", &Default::default()).await?;
    await_deleted(&vms, "web").await?;
    await_deleted(&machines, "web").await?;
    assert_eq!(vc.find_vm(&uid).await?, None, "no VM with the Machine's UID left on vcsim");
    let names_after = vc.vm_names().await?;
    assert!(!names_after.contains(&vm_name), "{names_after:?}");
    assert_eq!(names_after, names_before);

    // Everything — probes, create, describes, power, restart, delete — over one vCenter session.
    assert_eq!(vc.login_count().await?, 1, "one login for the whole lifecycle");
    drop(cp);
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// 2. Proxmox lifecycle

#[tokio::test]
async fn a_vm_lives_and_dies_on_proxmox() -> anyhow::Result<()> {
    let env = TestEnv::start("proxmox-lifecycle").await?;
    env.install_crds().await?;
    let pve = FakePve::start().await?;
    let before = pve.vms().await?;
    let cp = ControlPlane::start(&env)?;
    // Through the counting proxy: every ticket login the control plane makes is counted.
    let n = proxmox_fixtures(&env, &pve, &pve.password.clone(), PveEndpoint::Proxy).await?;
    let providers: Api<Provider> = Api::namespaced(env.client.clone(), &env.ns);
    let vms: Api<VirtualMachine> = Api::namespaced(env.client.clone(), &env.ns);
    let machines = machines(&env, "Proxmox");

    let p = wait_provider(&providers, PVE, 60, "True", Some("Probed")).await?;
    let fds: Vec<String> = p.status.clone().unwrap_or_default().failure_domains.into_iter().map(|f| f.name).collect();
    assert_eq!(fds, ["pve1", "pve2"], "fakepve's nodes");

    env.apply(secret(&env, "web-user-data", &[("user-data", USER_DATA)])).await?;
    env.apply(pve_vm(&env, "web", &n, json!({"userData": {"name": "web-user-data", "key": "user-data"}}))).await?;
    // fakepve's guest agent answers only for its pre-seeded VMs, never for a fresh clone: the VM
    // is Ready (provisioned, powered on as asked) but its phase stays WaitingForAddress.
    let ready = wait_for(&vms, "web", 90, "Ready", is_ready).await?;
    let status = ready.status.clone().unwrap_or_default();
    assert_eq!(status.phase, Some(MachinePhase::WaitingForAddress), "{status:?}");
    assert!(status.addresses.is_empty());
    assert_eq!(status.observed_power_state, Some(PowerState::PoweredOn));
    assert_eq!(status.scheduled.as_ref().map(|s| s.failure_domain.as_str()), Some("pve1"));

    let machine = machines.get("web").await?;
    let uid = machine.uid().expect("uid");
    let [found] = <[_; 1]>::try_from(pve.vms_tagged(&uid).await?).map_err(|v| anyhow::anyhow!("exactly one VM tagged with the UID: {v:?}"))?;
    assert_eq!((found.name.as_str(), found.node.as_str(), found.status.as_str()), (format!("web.{}", env.ns).as_str(), "pve1", "running"));
    assert!(!before.iter().any(|v| v.vmid == found.vmid), "a new VMID");
    assert_eq!(pve.vms().await?.len(), before.len() + 1);
    assert_eq!(machine.data["spec"]["providerID"].as_str(), Some(format!("proxmox://pve1/{}", found.vmid).as_str()));
    let c = pve.vm_config("pve1", found.vmid).await?;
    let s = |k: &str| c[k].as_str().map(String::from).unwrap_or_else(|| c[k].to_string());
    assert_eq!((s("cores"), s("memory")), ("2".to_string(), "2048".to_string()), "the class's shape: {c}");
    assert_eq!(s("ide2"), "local-lvm:cloudinit", "a cloud-init drive: {c}");
    assert!(s("scsi0").starts_with(&format!("local-lvm:vm-{}-disk-", found.vmid)), "{c}");
    assert!(s("description").contains(&format!("banlieue-uid: {uid}")), "{c}");

    // TrySoft power-off: fakepve's guest honours the shutdown request, so no hard stop is needed.
    patch_spec(&vms, "web", json!({"powerOffMode": "TrySoft", "desiredPowerState": "PoweredOff"})).await?;
    wait_for(&vms, "web", 60, "PoweredOff and Ready", |v: Option<&VirtualMachine>| is_ready(v) && power(v) == Some(PowerState::PoweredOff)).await?;
    assert_eq!(pve.vm_status("pve1", found.vmid).await?["status"], "stopped");
    let tasks: Vec<String> = pve.tasks("pve1").await?.iter().map(|t| t["type"].as_str().unwrap_or_default().to_string()).collect();
    assert_eq!(tasks.iter().filter(|t| *t == "qmshutdown").count(), 1, "asked the guest once: {tasks:?}");
    assert_eq!(tasks.iter().filter(|t| *t == "qmstop").count(), 0, "never pulled the plug: {tasks:?}");

    patch_spec(&vms, "web", json!({"desiredPowerState": "PoweredOn"})).await?;
    wait_for(&vms, "web", 60, "PoweredOn and Ready", |v: Option<&VirtualMachine>| is_ready(v) && power(v) == Some(PowerState::PoweredOn)).await?;
    assert_eq!(pve.vm_status("pve1", found.vmid).await?["status"], "running");

    vms.delete("web", &Default::default()).await?;
    await_deleted(&vms, "web").await?;
    await_deleted(&machines, "web").await?;
    assert!(pve.vms_tagged(&uid).await?.is_empty(), "nothing tagged with the UID left");
    assert!(pve.vms().await?.iter().all(|v| v.vmid != found.vmid));
    assert_eq!(pve.vms().await?, before);

    assert_eq!(pve.logins(), 1, "one ticket login for the whole lifecycle");
    let seen = pve.requests();
    assert!(seen.iter().filter(|s| !s.path.ends_with("/access/ticket")).all(|s| s.auth == "ticket"), "{seen:?}");
    drop(cp);
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// 3. A crash between the backend call and the status write

#[tokio::test]
async fn a_crash_after_the_clone_before_the_status_write_makes_no_second_vm() -> anyhow::Result<()> {
    let env = TestEnv::start("vsphere-crash").await?;
    env.install_crds().await?;
    let vc = Vcsim::start().await?;
    let count_before = vc.vm_names().await?.len();
    let cp = ControlPlane::start(&env)?;
    let n = vsphere_fixtures(&env, &vc, vcsim::PASSWORD).await?;
    let providers: Api<Provider> = Api::namespaced(env.client.clone(), &env.ns);
    let vms: Api<VirtualMachine> = Api::namespaced(env.client.clone(), &env.ns);
    let machines = machines(&env, "VSphere");
    wait_provider(&providers, VCENTER, 60, "True", None).await?;

    env.apply(vm(&env, "crashy", &n, VCENTER, json!({}))).await?;
    let uid = wait_for(&machines, "crashy", 60, "Machine exists", |m: Option<&DynamicObject>| m.is_some()).await?.uid().expect("uid");
    // vcsim is the backend's own API: no watch exists, so poll it (bounded) and kill the control
    // plane the moment the VM with the Machine's UID exists, whatever the Machine's status says.
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        if vc.find_vm(&uid).await?.is_some() {
            break;
        }
        anyhow::ensure!(Instant::now() < deadline, "no VM with UID {uid} appeared on vcsim within 60 s");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    cp.kill();
    let at_kill = machines.get("crashy").await?;
    eprintln!(
        "killed with the Machine's status: provisioned={} providerID={}",
        at_kill.data["status"]["initialization"]["provisioned"],
        at_kill.data["spec"]["providerID"]
    );

    let _cp = ControlPlane::start(&env)?;
    wait_for(&vms, "crashy", 90, "Ready after restart", is_ready).await?;
    let moref = vc.find_vm(&uid).await?.expect("the VM is still there");
    let names = vc.vm_names().await?;
    let vm_name = format!("{}_crashy", env.ns);
    assert_eq!(names.iter().filter(|n| **n == vm_name).count(), 1, "exactly one VM for the Machine: {names:?}");
    assert_eq!(names.len(), count_before + 1, "vcsim's VM count grew by exactly one: {names:?}");
    assert_eq!(vc.power_state(&moref).await?, "poweredOn");
    assert_eq!(machines.get("crashy").await?.uid().as_deref(), Some(uid.as_str()), "the same Machine");
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// 4. Wrong credentials, then fixed

#[tokio::test]
async fn refused_credentials_are_reported_and_fixing_the_secret_recovers_on_vsphere() -> anyhow::Result<()> {
    let env = TestEnv::start("vsphere-creds").await?;
    env.install_crds().await?;
    let vc = Vcsim::start().await?;
    let _cp = ControlPlane::start(&env)?;
    vsphere_fixtures(&env, &vc, "not-the-password").await?;
    let providers: Api<Provider> = Api::namespaced(env.client.clone(), &env.ns);

    let p = wait_provider(&providers, VCENTER, 60, "False", Some("CredentialsRefused")).await?;
    let (_, _, message) = provider_ready(&p).unwrap();
    assert!(message.contains("InvalidLogin"), "names vCenter's complaint: {message}");
    assert!(p.status.unwrap().failure_domains.is_empty());
    assert_eq!(vc.login_count().await?, 0, "vcsim refused every login");

    let secrets: Api<Secret> = Api::namespaced(env.client.clone(), &env.ns);
    secrets
        .patch("vcenter-credentials", &PatchParams::default(), &Patch::Merge(json!({"data": {"password": b64(vcsim::PASSWORD)}})))
        .await?;
    // Refused credentials are re-read every few seconds (banlieue watches no Secrets): no nudge, no minute's wait.
    let p = wait_provider(&providers, VCENTER, 30, "True", Some("Probed")).await?;
    assert_eq!(p.status.unwrap().failure_domains.len(), 1);
    assert_eq!(vc.login_count().await?, 1, "logged in with the fixed password");
    Ok(())
}

#[tokio::test]
async fn refused_credentials_are_reported_and_fixing_the_secret_recovers_on_proxmox() -> anyhow::Result<()> {
    let env = TestEnv::start("proxmox-creds").await?;
    env.install_crds().await?;
    let pve = FakePve::start().await?;
    let _cp = ControlPlane::start(&env)?;
    // Over https, trusting fakepve's certificate through the Provider's caBundle.
    proxmox_fixtures(&env, &pve, "not-the-password", PveEndpoint::Https).await?;
    let providers: Api<Provider> = Api::namespaced(env.client.clone(), &env.ns);

    let p = wait_provider(&providers, PVE, 60, "False", Some("CredentialsRefused")).await?;
    let (_, _, message) = provider_ready(&p).unwrap();
    assert!(message.contains("refused the login") && message.contains("401"), "names Proxmox VE's complaint: {message}");

    let secrets: Api<Secret> = Api::namespaced(env.client.clone(), &env.ns);
    secrets.patch("pve-credentials", &PatchParams::default(), &Patch::Merge(json!({"data": {"password": b64(&pve.password)}}))).await?;
    let p = wait_provider(&providers, PVE, 30, "True", Some("Probed")).await?;
    assert_eq!(p.status.unwrap().failure_domains.len(), 2);
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// 5. Backend down

#[tokio::test]
async fn a_stopped_vcenter_makes_its_provider_and_machines_unavailable() -> anyhow::Result<()> {
    let env = TestEnv::start("vsphere-down").await?;
    env.install_crds().await?;
    let mut vc = Vcsim::start().await?;
    let endpoint = vc.url.trim_start_matches("http://").trim_end_matches("/sdk").to_string();
    let cp = ControlPlane::start(&env)?;
    let n = vsphere_fixtures(&env, &vc, vcsim::PASSWORD).await?;
    let providers: Api<Provider> = Api::namespaced(env.client.clone(), &env.ns);
    let vms: Api<VirtualMachine> = Api::namespaced(env.client.clone(), &env.ns);
    let machines = machines(&env, "VSphere");
    wait_provider(&providers, VCENTER, 60, "True", None).await?;
    env.apply(vm(&env, "early", &n, VCENTER, json!({}))).await?;
    wait_for(&vms, "early", 90, "Ready", is_ready).await?;

    vc.stop();
    // A healthy Provider is probed every 60 s; nudge it so it probes now (see `nudge`).
    nudge(&providers, VCENTER, "backend-stopped").await?;
    let p = wait_provider(&providers, VCENTER, 30, "False", Some("BackendUnavailable")).await?;
    let (_, _, message) = provider_ready(&p).unwrap();
    assert!(message.contains(&endpoint), "names the backend {endpoint}: {message}");

    // The Provider's change wakes its Machines: the one that exists cannot be described.
    let m = wait_for(&machines, "early", 30, "Machine Ready=False BackendUnavailable", |m: Option<&DynamicObject>| {
        m.and_then(|m| machine_condition(m, "Ready")).is_some_and(|(s, r, _)| s == "False" && r == "BackendUnavailable")
    })
    .await?;
    let (_, _, message) = machine_condition(&m, "Ready").unwrap();
    assert!(message.contains(&endpoint), "the Machine's condition names the backend {endpoint}: {message}");
    let v = wait_for(&vms, "early", 30, "VM not Ready", |v: Option<&VirtualMachine>| {
        v.and_then(|v| vm_condition(v, "Ready")).is_some_and(|(s, r, _)| s == "False" && r == "BackendUnavailable")
    })
    .await?;
    assert!(vm_condition(&v, "Ready").unwrap().2.contains(&endpoint));

    // A VM applied now is not placed on the unavailable Provider, and says why.
    env.apply(vm(&env, "late", &n, VCENTER, json!({}))).await?;
    let v = wait_for(&vms, "late", 30, "NoCandidates", |v: Option<&VirtualMachine>| {
        v.and_then(|v| vm_condition(v, "Scheduled")).is_some_and(|(s, r, _)| s == "False" && r == "NoCandidates")
    })
    .await?;
    let (_, _, message) = vm_condition(&v, "Scheduled").unwrap();
    assert!(message.contains(VCENTER) && message.contains("BackendUnavailable"), "{message}");
    assert!(!is_ready(Some(&v)));
    assert!(machines.get_opt("late").await?.is_none(), "no Machine for an unplaceable VM");

    // Nothing panicked: the control plane went on reconciling after the backend died (above), and
    // its metrics count the failed calls by outcome.
    let metrics = cp.ctx.metrics.render();
    let line = format!(r#"banlieue_component_calls_total{{component="{}",function="probe",outcome="BackendUnavailable"}}"#, n.provider_class);
    assert!(metrics.contains(&line), "metrics lack {line}:\n{metrics}");
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// 6. Bad input

#[tokio::test]
async fn a_missing_template_or_datastore_creates_nothing_on_vsphere() -> anyhow::Result<()> {
    let env = TestEnv::start("vsphere-bad").await?;
    env.install_crds().await?;
    let vc = Vcsim::start().await?;
    let names_before = vc.vm_names().await?;
    let _cp = ControlPlane::start(&env)?;
    let n = vsphere_fixtures(&env, &vc, vcsim::PASSWORD).await?;
    let providers: Api<Provider> = Api::namespaced(env.client.clone(), &env.ns);
    let vms: Api<VirtualMachine> = Api::namespaced(env.client.clone(), &env.ns);
    let machines = machines(&env, "VSphere");
    wait_provider(&providers, VCENTER, 60, "True", None).await?;

    // An image whose template vcsim does not have.
    let missing = Names { image: format!("{}-missing-template", env.ns), ..names(&env, "vsphere") };
    env.apply(vm_image(&missing.image, &n.provider_class, "no-such-template")).await?;
    env.apply(vm(&env, "orphan", &missing, VCENTER, json!({}))).await?;
    let m = wait_for(&machines, "orphan", 60, "Machine Ready=False InvalidSpec", |m: Option<&DynamicObject>| {
        m.and_then(|m| machine_condition(m, "Ready")).is_some_and(|(s, r, _)| s == "False" && r == "InvalidSpec")
    })
    .await?;
    let (_, _, message) = machine_condition(&m, "Ready").unwrap();
    assert!(message.contains("no-such-template"), "names the template: {message}");
    let v = wait_for(&vms, "orphan", 30, "VM Ready=False InvalidSpec", |v: Option<&VirtualMachine>| {
        v.and_then(|v| vm_condition(v, "Ready")).is_some_and(|(s, r, _)| s == "False" && r == "InvalidSpec")
    })
    .await?;
    assert!(vm_condition(&v, "Ready").unwrap().2.contains("no-such-template"));
    assert_eq!(vc.find_vm(&m.uid().unwrap_or_default()).await?, None);
    assert_eq!(vc.vm_names().await?, names_before, "nothing created on vcsim");

    // A class whose disk needs `ghost`, which the Provider maps to a datastore vcsim lacks: the
    // probe does not offer it, so the VM is placed nowhere.
    let ghost = Names { vm_class: format!("{}-ghost", env.ns), ..names(&env, "vsphere") };
    env.apply(vm_class(&ghost.vm_class, 1, 512, 4, "ghost", 10)).await?;
    env.apply(vm(&env, "ghostly", &ghost, VCENTER, json!({}))).await?;
    let v = wait_for(&vms, "ghostly", 30, "NoCandidates", |v: Option<&VirtualMachine>| {
        v.and_then(|v| vm_condition(v, "Scheduled")).is_some_and(|(s, r, _)| s == "False" && r == "NoCandidates")
    })
    .await?;
    let (_, _, message) = vm_condition(&v, "Scheduled").unwrap();
    assert!(message.contains("\"ghost\""), "names the storage class: {message}");
    assert!(!is_ready(Some(&v)));
    assert!(machines.get_opt("ghostly").await?.is_none(), "no Machine for an unplaceable VM");
    assert_eq!(vc.vm_names().await?, names_before, "nothing created on vcsim");
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// One VM across all three backends


/// Wait until the VM is Ready on `provider` (a new Machine, not the old one going away).
async fn ready_on(vms: &Api<VirtualMachine>, name: &str, provider: &'static str) -> anyhow::Result<VirtualMachine> {
    wait_for(vms, name, 90, &format!("Ready on {provider}"), move |v: Option<&VirtualMachine>| {
        is_ready(v) && v.and_then(|v| v.status.as_ref()?.scheduled.as_ref()).is_some_and(|s| s.provider == provider)
    })
    .await
}

fn machine_uid(vm: &VirtualMachine) -> String {
    vm.status.as_ref().and_then(|s| s.infrastructure_ref.as_ref()?.uid.clone()).unwrap_or_default()
}

/// An address from an IP pool (the test playing the IPAM provider) is the VM's, not its
/// backend's: it reaches the guest the way each backend's guests read it — vSphere's
/// `guestinfo.metadata`, Proxmox VE's `ipconfig0`, the libvirtd guest's seed, which the booting
/// guest applies — the claim kept across both moves, and released when the VM is deleted.
#[tokio::test]
async fn an_address_from_a_pool_follows_the_vm_to_each_backends_guest() -> anyhow::Result<()> {
    use banlieue_tests::ipam;
    let env = TestEnv::start("pool-roam").await?;
    env.install_crds().await?;
    ipam::install_crds(&env.client).await?;
    let vc = Vcsim::start().await?;
    let pve = FakePve::start().await?;
    let lv = Libvirtd::shared()?;
    let _cp = ControlPlane::start(&env)?;
    let n = three_backends(&env, &vc, &pve, lv).await?;
    let vms: Api<VirtualMachine> = Api::namespaced(env.client.clone(), &env.ns);
    let claims = ipam::claims(&env.client, &env.ns);
    let network = json!({"interfaces": [{"name": "eth0", "addressesFromPools": [ipam::pool("lab")]}]});
    env.apply(vm(&env, "nomad", &n, VCENTER, json!({"network": network, "moveStrategy": "Recreate"}))).await?;
    wait_for(&claims, "nomad-eth0-0", 30, "the VM's claim", |c: Option<&DynamicObject>| c.is_some()).await?;
    // The libvirtd test network is 192.168.123.0/24, DHCP from .10: .6 is nobody's lease.
    ipam::answer(&env.client, &env.ns, "nomad-eth0-0", "nomad-eth0-0", "lab-192-168-123-6", "192.168.123.6", 24, "192.168.123.1").await?;
    let claim_uid = claims.get("nomad-eth0-0").await?.uid();

    // vSphere: in guestinfo.metadata's network configuration.
    let on_vc = ready_on(&vms, "nomad", VCENTER).await?;
    let moref = vc.find_vm(&machine_uid(&on_vc)).await?.expect("the VM on vcsim");
    let meta = vc.extra_config(&moref, "guestinfo.metadata").await?.context("guestinfo.metadata")?;
    let meta: Value = serde_json::from_slice(&base64::engine::general_purpose::STANDARD.decode(meta)?)?;
    let eth0 = meta["network"]["ethernets"].as_object().and_then(|e| e.values().next()).cloned().unwrap_or_default();
    assert_eq!(eth0["addresses"], json!(["192.168.123.6/24"]), "{meta}");

    // Proxmox VE: ipconfig0.
    patch_spec(&vms, "nomad", json!({"placement": {"providerRef": {"name": PVE}}})).await?;
    let on_pve = ready_on(&vms, "nomad", PVE).await?;
    let [pve_vm] = pve.vms_tagged(&machine_uid(&on_pve)).await?.try_into().map_err(|v| anyhow::anyhow!("one VM: {v:?}"))?;
    let config = pve.vm_config(&pve_vm.node, pve_vm.vmid).await?;
    assert_eq!(config["ipconfig0"], "ip=192.168.123.6/24,gw=192.168.123.1", "{config}");

    // libvirtd: the booting guest applies it from its seed.
    patch_spec(&vms, "nomad", json!({"placement": {"providerRef": {"name": KVM}}})).await?;
    let on_kvm = ready_on(&vms, "nomad", KVM).await?;
    let domain = format!("{}_nomad", env.ns);
    assert_eq!(lv.uuid(&domain)?, machine_uid(&on_kvm));
    lv.await_serial(&domain, "banlieue-guest: ready", BOOT_SECS).await?;
    assert!(lv.serial_log(&domain).contains("banlieue-guest: eth0 static address=192.168.123.6/24"), "{}", lv.serial_log(&domain));
    assert_eq!(claims.get("nomad-eth0-0").await?.uid(), claim_uid, "one claim for the VM's life, across both moves");
    assert_eq!(on_kvm.status.as_ref().map(|s| s.ip_address_claims.clone()), Some(vec!["nomad-eth0-0".to_string()]));

    vms.delete("nomad", &Default::default()).await?;
    await_deleted(&vms, "nomad").await?;
    assert!(claims.get_opt("nomad-eth0-0").await?.is_none(), "released with the VM");
    assert!(lv.domains(&domain)?.is_empty());
    Ok(())
}

#[tokio::test]
async fn one_vm_moves_across_vsphere_proxmox_and_libvirt_by_changing_one_field() -> anyhow::Result<()> {
    let env = TestEnv::start("swap").await?;
    env.install_crds().await?;
    let vc = Vcsim::start().await?;
    let pve = FakePve::start().await?;
    let lv = Libvirtd::shared()?;
    let _cp = ControlPlane::start(&env)?;
    let ns = &env.ns;
    let n = three_backends(&env, &vc, &pve, lv).await?;
    env.apply(secret(&env, "roamer-user-data", &[("user-data", "#cloud-config\n#banlieue-marker: roaming\n")])).await?;
    let vms: Api<VirtualMachine> = Api::namespaced(env.client.clone(), ns);
    env.apply(vm(&env, "roamer", &n, VCENTER, json!({"userData": {"name": "roamer-user-data", "key": "user-data"}, "moveStrategy": "Recreate"}))).await?;

    // vSphere.
    let on_vc = ready_on(&vms, "roamer", VCENTER).await?;
    assert_eq!(census(&env, &vc, &pve, lv, "roamer").await?, (1, 0, 0));
    assert!(vc.find_vm(&machine_uid(&on_vc)).await?.is_some(), "vcsim holds the VSphereMachine's VM");

    // One field: placement.providerRef. → Proxmox VE.
    patch_spec(&vms, "roamer", json!({"placement": {"providerRef": {"name": PVE}}})).await?;
    let on_pve = ready_on(&vms, "roamer", PVE).await?;
    assert_ne!(machine_uid(&on_pve), machine_uid(&on_vc), "a new Machine on the new backend");
    assert_eq!(census(&env, &vc, &pve, lv, "roamer").await?, (0, 1, 0));
    assert_eq!(pve.vms_tagged(&machine_uid(&on_pve)).await?.len(), 1);

    // → libvirt (libvirtd + qemu): the guest really boots, with the same user-data, and gets a lease.
    patch_spec(&vms, "roamer", json!({"placement": {"providerRef": {"name": KVM}}})).await?;
    let on_kvm = ready_on(&vms, "roamer", KVM).await?;
    // Nothing reported by an earlier backend survives a move (status writes clear what is gone).
    let earlier: Vec<String> = [&on_vc, &on_pve].into_iter().flat_map(vm_addresses).collect();
    assert!(!vm_addresses(&on_kvm).iter().any(|a| earlier.contains(a)), "{:?} still shows an earlier backend's address ({earlier:?})", vm_addresses(&on_kvm));
    assert_eq!(census(&env, &vc, &pve, lv, "roamer").await?, (0, 0, 1));
    let domain = format!("{ns}_roamer");
    assert_eq!(lv.uuid(&domain)?, machine_uid(&on_kvm), "the domain is the LibvirtMachine's");
    assert_eq!(lv.state(&domain)?, "running");
    let addressed = wait_for(&vms, "roamer", BOOT_SECS, "an address on libvirt", |v: Option<&VirtualMachine>| {
        v.and_then(|v| v.status.as_ref()).is_some_and(|s| !s.addresses.is_empty())
    })
    .await?;
    let mac = lv.mac(&domain)?;
    assert_eq!(vm_addresses(&addressed), lv.leases(&mac)?, "status shows the network's DHCP lease for {mac}: {}", lv.virsh(&["net-dhcp-leases", &lv.network])?);
    assert!(lv.serial_log(&domain).contains("banlieue-guest: marker=roaming"), "{}", lv.serial_log(&domain));

    // Each move is told: the VM's Events say where it went and why.
    let events: Api<Event> = Api::namespaced(env.client.clone(), ns);
    let moves = events.list(&ListParams::default()).await?.items.into_iter().filter(|e| e.reason.as_deref() == Some("Moving")).count();
    assert!(moves >= 2, "a Moving event per move, saw {moves}");

    // migrationPolicy Never: a new placement is reported, not acted on.
    patch_spec(&vms, "roamer", json!({"migrationPolicy": "Never", "placement": {"providerRef": {"name": VCENTER}}})).await?;
    let held = wait_for(&vms, "roamer", 30, "PlacementValid=False", |v: Option<&VirtualMachine>| {
        v.and_then(|v| vm_condition(v, "PlacementValid")).is_some_and(|(s, _, _)| s == "False")
    })
    .await?;
    assert_eq!(held.status.as_ref().and_then(|s| s.scheduled.as_ref()).map(|s| s.provider.as_str()), Some(KVM));
    assert_eq!(census(&env, &vc, &pve, lv, "roamer").await?, (0, 0, 1), "Never: it stays where it is");

    // Manual: still held until the user bumps the restart field, then it moves.
    patch_spec(&vms, "roamer", json!({"migrationPolicy": "Manual"})).await?;
    wait_for(&vms, "roamer", 30, "Manual observed", |v: Option<&VirtualMachine>| {
        v.is_some_and(|v| v.status.as_ref().and_then(|s| s.observed_generation) == v.metadata.generation)
            && v.and_then(|v| vm_condition(v, "PlacementValid")).is_some_and(|(s, _, _)| s == "False")
    })
    .await?;
    assert_eq!(census(&env, &vc, &pve, lv, "roamer").await?, (0, 0, 1), "Manual: no move without a restart");
    patch_spec(&vms, "roamer", json!({"restartRequestedAt": "2026-12-03T12:00:00Z"})).await?;
    ready_on(&vms, "roamer", VCENTER).await?;
    assert_eq!(census(&env, &vc, &pve, lv, "roamer").await?, (1, 0, 0));

    // Leaving libvirt shut the guest down gracefully (ACPI) and removed its volumes and seed.
    assert!(lv.serial_log(&domain).contains("ACPI power button: powering off"), "{}", lv.serial_log(&domain));
    assert_eq!(lv.volumes(&format!("{domain}_"))?, Vec::<String>::new());

    // Delete: nothing anywhere.
    vms.delete("roamer", &Default::default()).await?;
    await_deleted(&vms, "roamer").await?;
    assert_eq!(census(&env, &vc, &pve, lv, "roamer").await?, (0, 0, 0));
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// libvirtd + qemu: a guest that boots, and a banlieue process killed mid-flight

/// Bound on a TCG boot to a DHCP lease (~15 s alone; two cores shared by parallel tests).
const BOOT_SECS: u64 = 180;

fn vm_addresses(vm: &VirtualMachine) -> Vec<String> {
    vm.status.as_ref().map(|s| s.addresses.iter().map(|a| a.address.clone()).collect()).unwrap_or_default()
}

#[tokio::test]
async fn a_vm_boots_on_libvirtd_with_its_user_data_and_shows_its_address() -> anyhow::Result<()> {
    let env = TestEnv::start("boot").await?;
    env.install_crds().await?;
    let lv = Libvirtd::shared()?;
    let _cp = ControlPlane::start(&env)?;
    let n = libvirtd_fixtures(&env, lv).await?;
    env.apply(secret(&env, "web-user-data", &[("user-data", "#cloud-config\n#banlieue-marker: hello-from-user-data\n")])).await?;
    env.apply(vm(&env, "web", &n, KVM, json!({"userData": {"name": "web-user-data", "key": "user-data"}}))).await?;
    let vms: Api<VirtualMachine> = Api::namespaced(env.client.clone(), &env.ns);
    let ready = wait_for(&vms, "web", BOOT_SECS, "Ready with an address", |v: Option<&VirtualMachine>| {
        is_ready(v) && v.is_some_and(|v| !vm_addresses(v).is_empty())
    })
    .await?;

    // libvirtd's view: the domain runs, is the Machine's, and its lease is the address in status.
    let domain = format!("{}_web", env.ns);
    assert_eq!(lv.state(&domain)?, "running");
    assert_eq!(lv.uuid(&domain)?, machine_uid(&ready));
    assert_eq!(vm_addresses(&ready), lv.leases(&lv.mac(&domain)?)?);
    // The guest's console: it read the user-data's marker and the Machine's UID from the seed.
    let log = lv.serial_log(&domain);
    assert!(log.contains("banlieue-guest: marker=hello-from-user-data"), "{log}");
    assert!(log.contains(&format!("banlieue-guest: instance-id={}", machine_uid(&ready))), "{log}");
    assert_eq!(ready.status.as_ref().and_then(|s| s.phase), Some(MachinePhase::Running));

    vms.delete("web", &Default::default()).await?;
    await_deleted(&vms, "web").await?;
    assert!(lv.domains(&domain)?.is_empty());
    assert_eq!(lv.volumes(&format!("{domain}_"))?, Vec::<String>::new());
    Ok(())
}

/// A static address reaches a booting guest on libvirtd + qemu: the seed libvirtd holds
/// carries the network-config matching the domain's MAC, and the test guest applies that
/// address (outside the network's DHCP range) and says so on its console. libvirtd reports
/// no address for a guest without DHCP lease or agent, so `status.addresses` shows the
/// declared one and `AddressesReady` stays False, saying so.
#[tokio::test]
async fn a_static_address_reaches_the_booting_guest_on_libvirtd() -> anyhow::Result<()> {
    let env = TestEnv::start("static").await?;
    env.install_crds().await?;
    let lv = Libvirtd::shared()?;
    let _cp = ControlPlane::start(&env)?;
    let n = libvirtd_fixtures(&env, lv).await?;
    // The test network is 192.168.123.0/24 with DHCP from .10: .5 is nobody's lease.
    let network = json!({"interfaces": [{"name": "eth0", "addresses": ["192.168.123.5/24"], "gateway": "192.168.123.1"}]});
    env.apply(vm(&env, "db", &n, KVM, json!({"network": network}))).await?;
    let vms: Api<VirtualMachine> = Api::namespaced(env.client.clone(), &env.ns);
    let domain = format!("{}_db", env.ns);
    let booted = wait_for(&vms, "db", BOOT_SECS, "Ready", is_ready).await?;
    // The console is a file libvirtd writes: no watch to await, so it is read until the line is there.
    let log = banlieue_tests::within(BOOT_SECS, async {
        loop {
            let log = lv.serial_log(&domain);
            if log.contains("banlieue-guest: ready") {
                return log;
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    })
    .await
    .with_context(|| format!("the guest did not finish booting: {}", lv.serial_log(&domain)))?;
    assert!(log.contains("banlieue-guest: eth0 static address=192.168.123.5/24"), "{log}");
    let config: serde_json::Value = serde_json::from_str(&lv.seed_file(&domain, "network-config")?)?;
    assert_eq!(config["ethernets"]["eth0"]["match"]["macaddress"], lv.mac(&domain)?.as_str(), "{config}");
    assert_eq!(config["ethernets"]["eth0"]["routes"][0]["via"], "192.168.123.1", "{config}");
    assert_eq!(vm_addresses(&booted), ["192.168.123.5"], "the declared address, before any report");
    let addresses_ready = booted.status.as_ref().and_then(|s| s.conditions.iter().find(|c| c.type_ == "AddressesReady")).expect("AddressesReady");
    assert_eq!((addresses_ready.status.as_str(), addresses_ready.reason.as_str()), ("False", "WaitingForAddress"), "{addresses_ready:?}");
    assert!(addresses_ready.message.contains("192.168.123.5"), "{addresses_ready:?}");

    vms.delete("db", &Default::default()).await?;
    await_deleted(&vms, "db").await?;
    assert!(lv.domains(&domain)?.is_empty());
    Ok(())
}

/// `banlieue run` as a separate process against the test's API, killed with SIGKILL when dropped.
struct BanlieueProcess(std::process::Child);

impl BanlieueProcess {
    fn start(env: &TestEnv) -> anyhow::Result<BanlieueProcess> {
        // target/debug/deps/providers-… → target/debug/banlieue (built by `cargo build --workspace`).
        let exe = std::env::current_exe()?.parent().and_then(|d| d.parent()).context("target dir")?.join("banlieue");
        anyhow::ensure!(exe.exists(), "{} is missing: build it with `cargo build -p banlieue`", exe.display());
        let log = std::fs::OpenOptions::new().create(true).append(true).open(env.dir().join("banlieue.log"))?;
        let child = std::process::Command::new(exe)
            .args(["run", "--no-leader-election", "--metrics-addr", &format!("127.0.0.1:{}", banlieue_test_backends::free_port())])
            .arg("--builtin-dir")
            .arg(banlieue_tests::control::guests_dist())
            // The test's installation (its own on a shared cluster).
            .args(env.installation().instance().iter().flat_map(|i| ["--instance", i]))
            .env("KUBECONFIG", &env.kubeconfig)
            .env("RUST_LOG", "info")
            .stdin(std::process::Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .spawn()?;
        Ok(BanlieueProcess(child))
    }

    /// SIGKILL, and reap it.
    fn kill(mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

impl Drop for BanlieueProcess {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[tokio::test]
async fn sigkill_in_the_middle_of_create_and_of_delete_leaves_one_domain_then_none() -> anyhow::Result<()> {
    let env = TestEnv::start("crash").await?;
    env.install_crds().await?;
    let lv = Libvirtd::shared()?;
    let n = libvirtd_fixtures(&env, lv).await?;
    let vms: Api<VirtualMachine> = Api::namespaced(env.client.clone(), &env.ns);
    let domain = format!("{}_crash", env.ns);
    let volumes = format!("{domain}_");

    // Create, killed as soon as libvirtd holds the first thing the create makes (the root overlay).
    let banlieue = BanlieueProcess::start(&env)?;
    env.apply(vm(&env, "crash", &n, KVM, json!({}))).await?;
    // (Polled on a libvirt connection of the test's own, every millisecond: virsh is too slow to
    // catch the create before it defines the domain.)
    let conn = banlieue_libvirt::Connections::new().get(&lv.uri).await?;
    let root = format!("{domain}_root.qcow2");
    banlieue_tests::within(BOOT_SECS, async {
        while !conn.volume_list(&lv.pool).await?.iter().any(|v| v.name == root) {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        anyhow::Ok(())
    })
    .await??;
    banlieue.kill();
    eprintln!("killed mid-create; libvirtd holds volumes {:?} and domains {:?}", lv.volumes(&volumes)?, lv.domains(&domain)?);

    // Restarted: the create finishes on what libvirtd kept; exactly one domain, the Machine's.
    let banlieue = BanlieueProcess::start(&env)?;
    let ready = wait_for(&vms, "crash", BOOT_SECS, "Ready after the restart", |v: Option<&VirtualMachine>| is_ready(v)).await?;
    assert_eq!(lv.domains(&domain)?, vec![domain.clone()]);
    assert_eq!(lv.uuid(&domain)?, machine_uid(&ready));
    assert_eq!(lv.state(&domain)?, "running");
    assert_eq!(lv.volumes(&volumes)?, vec![format!("{domain}_cidata.img"), format!("{domain}_root.qcow2")]);

    // Delete, killed while the guest is shutting down for it (its console says so).
    wait_backend("the guest's acpid", BOOT_SECS, || Ok(lv.serial_log(&domain).contains("banlieue-guest: acpid=on"))).await?;
    vms.delete("crash", &Default::default()).await?;
    wait_backend("the delete's ACPI shutdown", 60, || Ok(lv.serial_log(&domain).contains("ACPI power button: powering off"))).await?;
    banlieue.kill();
    assert!(vms.get_opt("crash").await?.is_some(), "the finalizer holds the VM while its domain may exist");

    // Restarted: the delete finishes; nothing is left on libvirtd.
    let _banlieue = BanlieueProcess::start(&env)?;
    await_deleted(&vms, "crash").await?;
    assert!(lv.domains(&domain)?.is_empty(), "{:?}", lv.domains(&domain)?);
    assert_eq!(lv.volumes(&volumes)?, Vec::<String>::new());
    Ok(())
}

/// Poll a backend query until it holds, at most `secs`.
async fn wait_backend(what: &str, secs: u64, mut check: impl FnMut() -> anyhow::Result<bool>) -> anyhow::Result<()> {
    banlieue_test_backends::libvirtd::wait_for(what, Duration::from_secs(secs), || Ok(check()?.then_some(()))).await
}

/// Backend protection: a Provider with `limits.maxConcurrentOperations: 1` gets its machines'
/// creates one after the other — checked on libvirtd's own event stream (each domain is
/// defined and started before the next is defined) — and the machines kept waiting say so
/// (`Queued`), then all come up.
#[tokio::test]
async fn a_provider_operation_limit_makes_its_vms_take_turns_on_libvirtd() -> anyhow::Result<()> {
    let env = TestEnv::start("limits").await?;
    env.install_crds().await?;
    let lv = Libvirtd::shared()?;
    let _cp = ControlPlane::start(&env)?;
    let n = libvirtd_fixtures(&env, lv).await?;
    let mut provider = libvirtd_provider(&env, lv, KVM, &n.provider_class);
    provider["spec"]["limits"] = json!({"maxConcurrentOperations": 1, "operationsPerSecond": 100});
    env.apply(provider).await?;

    // libvirtd's own account of what happens, subscribed before the first VM.
    let mut events = EventLog::subscribe(lv, env.dir(), &format!("{}_sentinel", env.ns)).await?;

    let names: Vec<String> = (0..4).map(|i| format!("turn-{i}")).collect();
    for name in &names {
        env.apply(vm(&env, name, &n, KVM, json!({"powerOffMode": "Hard"}))).await?;
    }
    let vms: Api<VirtualMachine> = Api::namespaced(env.client.clone(), &env.ns);
    for name in &names {
        wait_for(&vms, name, BOOT_SECS, "Ready", is_ready).await?;
    }
    // Every domain's Defined and Started, as libvirtd reported them: one after the other.
    let prefix = format!("{}_turn-", env.ns);
    let spans = events.creates(&prefix, names.len(), Duration::from_secs(30)).await?;
    assert_eq!(peak_concurrent(&spans), 1, "libvirtd had two creates under way at once: {spans:#?}");
    // The machines that waited said so.
    let events: Api<Event> = Api::namespaced(env.client.clone(), &env.ns);
    let queued = events.list(&ListParams::default()).await?.items.into_iter().filter(|e| e.reason.as_deref() == Some("Queued")).count();
    assert!(queued >= 1, "a machine kept waiting records a Queued event");

    for name in &names {
        vms.delete(name, &Default::default()).await?;
    }
    for name in &names {
        await_deleted(&vms, name).await?;
    }
    assert!(lv.domains(&prefix)?.is_empty());
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// Sharding: two control planes on one API server

/// Two replicas with `--shards` (each role its own process, as its ServiceAccount, as
/// `deploy/` runs them) split the Providers between them: each reaches only the backends of
/// its shards. When one is killed mid-work, the other takes its shards over within one lease
/// duration and finishes its VMs; libvirtd saw every domain defined once.
#[tokio::test]
async fn two_replicas_split_the_providers_and_a_killed_ones_shards_move_to_the_other() -> anyhow::Result<()> {
    use banlieue_controller::{shard_of, Sharding};
    const SHARDS: u32 = 8;
    const LEASE: Duration = Duration::from_secs(3);
    // Kept for the failure message of a VM that does not converge.
    let logs = banlieue_tests::ThreadLogs::capture("banlieue_controller=debug,kube_runtime=debug");
    let env = TestEnv::start("shards").await?;
    env.install_crds().await?;
    let lv = Libvirtd::shared()?;
    let replica = |identity: &'static str| {
        move |o: &mut banlieue_controller::Options| {
            o.sharding = Some(Sharding { count: SHARDS, lease_duration: LEASE });
            o.identity = identity.into();
        }
    };
    let a = ControlPlane::start_as_installed_with(&env, replica("replica-a")).await?;
    let b = ControlPlane::start_as_installed_with(&env, replica("replica-b")).await?;
    // Every sharded process (the controller and provider roles of each replica, or one
    // process per replica on an external cluster), by replica.
    let sharded = |cp: &ControlPlane| -> Vec<std::sync::Arc<banlieue_controller::Shards>> {
        use banlieue_controller::Role;
        let all = if cp.roles.is_empty() {
            vec![cp.ctx.clone()]
        } else {
            cp.roles.iter().filter(|(r, _)| matches!(r, Role::Controller | Role::Provider)).map(|(_, c)| c.clone()).collect()
        };
        all.iter().filter_map(|c| c.shards.clone()).collect()
    };
    let (shards_a, shards_b) = (sharded(&a), sharded(&b));
    let half = SHARDS as usize / 2;
    banlieue_tests::within(30, async {
        for s in shards_a.iter().chain(&shards_b) {
            let _ = s.subscribe().wait_for(|h| h.len() == half).await;
        }
    })
    .await
    .with_context(|| {
        let held: Vec<_> = shards_a.iter().chain(&shards_b).map(|s| s.held()).collect();
        format!("the two replicas did not split the shards evenly: {held:?}")
    })?;
    let held_a = shards_a[0].held();
    for (sa, sb) in shards_a.iter().zip(&shards_b) {
        assert_eq!(sa.held(), held_a, "each role of replica a holds the same shards");
        assert!(sa.held().is_disjoint(&sb.held()), "a shard held twice: {:?} {:?}", sa.held(), sb.held());
    }

    // Two Providers in each replica's shards.
    let n = libvirtd_fixtures(&env, lv).await?;
    let (mut of_a, mut of_b) = (Vec::new(), Vec::new());
    for i in 0.. {
        let name = format!("p{i}");
        let shard = shard_of(&format!("{}/{name}", env.ns), SHARDS);
        let side = if held_a.contains(&shard) { &mut of_a } else { &mut of_b };
        if side.len() < 2 {
            side.push(name);
        }
        if of_a.len() == 2 && of_b.len() == 2 {
            break;
        }
    }
    for name in of_a.iter().chain(&of_b) {
        env.apply(libvirtd_provider(&env, lv, name, &n.provider_class)).await?;
    }
    let mut events = EventLog::subscribe(lv, env.dir(), &format!("{}_sentinel", env.ns)).await?;
    let off = json!({"desiredPowerState": "PoweredOff", "powerOffMode": "Hard"});
    let vms: Api<VirtualMachine> = Api::namespaced(env.client.clone(), &env.ns);
    let mut names = Vec::new();
    for provider in of_a.iter().chain(&of_b) {
        let name = format!("{provider}-vm");
        env.apply(vm(&env, &name, &n, provider, off.clone())).await?;
        names.push(name);
    }
    for name in &names {
        wait_for(&vms, name, 60, "Ready", is_ready).await.with_context(|| {
            let held: Vec<_> = shards_a.iter().chain(&shards_b).map(|s| s.held()).collect();
            let shard = shard_of(&format!("{}/{name}", env.ns), SHARDS);
            format!("{name} (shard {shard}; held by a's roles then b's: {held:?}); its logs:\n{}\nshard logs:\n{}", logs.last_with(name, 60), logs.last_with("shard=", 40))
        })?;
    }
    // Each replica reached the backends of its own Providers only.
    let keys = |names: &[String]| names.iter().map(|p| format!("{}/{p}", env.ns)).collect::<Vec<_>>();
    let reached = |cp: &ControlPlane| cp.ctx.throttles.providers().into_iter().filter(|p| p.starts_with(&format!("{}/p", env.ns))).collect::<Vec<_>>();
    assert_eq!(reached(&a), keys(&of_a), "replica a reached other backends");
    assert_eq!(reached(&b), keys(&of_b), "replica b reached other backends");

    // Replica a is killed while its next VMs are on their way.
    let mut late = Vec::new();
    for provider in &of_a {
        let name = format!("{provider}-late");
        env.apply(vm(&env, &name, &n, provider, off.clone())).await?;
        late.push(name);
    }
    let libvirt_machines = machines(&env, "Libvirt");
    wait_for(&libvirt_machines, &late[0], 60, "a Machine made by replica a", |m: Option<&DynamicObject>| m.is_some()).await?;
    let killed = Instant::now();
    a.kill();
    banlieue_tests::within(LEASE.as_secs() * 3, async {
        for s in &shards_b {
            let _ = s.subscribe().wait_for(|h| h.len() == SHARDS as usize).await;
        }
    })
    .await
    .context("replica b did not take every shard")?;
    // The survivor looks the moment the dead replica's leases run out (at most one lease
    // duration after the kill), then needs one round of lease requests per role: about
    // LEASE, printed here; the bound above (3 × LEASE) is the failure. (A tighter bound
    // failed at 4.04 s for 4 s on a loaded machine: a figure, not a fault.)
    println!("replica b held every shard {:?} after replica a was killed (lease {LEASE:?})", killed.elapsed());
    for name in &late {
        wait_for(&vms, name, 60, "Ready, finished by replica b", is_ready).await?;
    }
    names.extend(late);
    assert!(reached(&b).iter().any(|p| of_a.iter().any(|a| p.ends_with(&format!("/{a}")))), "replica b took over replica a's backends");

    // libvirtd's account: one domain per VM, each defined once.
    events.flush(lv, env.dir(), &format!("{}_sentinel", env.ns)).await?;
    let prefix = format!("{}_p", env.ns);
    let defines = events.defines(&prefix);
    let expected: std::collections::BTreeMap<String, usize> = names.iter().map(|n| (format!("{}_{n}", env.ns), 1)).collect();
    assert_eq!(defines, expected, "every VM's domain defined exactly once");
    assert_eq!(lv.domains(&prefix)?.len(), names.len());

    for name in &names {
        vms.delete(name, &Default::default()).await?;
    }
    for name in &names {
        await_deleted(&vms, name).await?;
    }
    assert!(lv.domains(&prefix)?.is_empty());
    drop(b);
    Ok(())
}
