//! The Proxmox VE provider driver (`guests/provider-proxmox`) through the runtime against a real
//! fakepve process (`banlieue_test_backends::fakepve`; install it with
//! `tests/backends/fakepve/install.sh`). Every check of what the driver did is made on fakepve
//! through its own API, never only on what the driver reports.
//!
//! Each test starts its own fakepve (`--time-scale 0`: tasks end before their request returns).
//! The driver reaches fakepve over https with its certificate as the grant's CA bundle, or through
//! the fixture's counting proxy (plain http) where a test counts logins or credentials sent.

mod common;

use std::sync::Arc;

use banlieue_runtime::capability::Grants;
use banlieue_runtime::capability::http::HttpGrant;
use banlieue_runtime::capability::secrets::SecretsGrant;
use banlieue_runtime::capability::session::SessionStore;
use banlieue_runtime::provider::{
    Disk, Firmware, ImageSource, IpConfig, Machine, MachinePhase, MachineRef, Nic, PowerOff, PowerOffMode, PowerState,
    ProviderConfig, ProviderDriver, UserDataFormat,
};
use banlieue_runtime::{CallError, GuestError, Limits, Runtime, RuntimeConfig};
use banlieue_secrets::StaticSecrets;
use banlieue_test_backends::fakepve::{self, FakePve};
use common::guest;
use serde_json::Value;

const UID: &str = "6f1c2a3e-1111-4222-8333-444455556666";
const UID2: &str = "0b7e9a51-2222-4333-8444-555566667777";
const SCOPE: &str = "infra/pve";
const SSH_KEY: &str = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIE2e2e2e2 ops@example";

const KEYS: [&str; 4] = ["username", "password", "token-id", "token-secret"];

fn driver() -> ProviderDriver {
    let rt = Runtime::new(RuntimeConfig::default()).unwrap();
    rt.provider(&guest("provider-proxmox")).unwrap()
}

fn limits() -> Limits {
    Limits::default()
}

/// Grants for `url` (fakepve's https URL with its CA, or the proxy's http URL) with these secrets.
async fn grants_for(pve: &FakePve, url: &str, secrets: &[(&str, &str)], store: &Arc<SessionStore>) -> Grants {
    let mut http = HttpGrant::for_endpoint(url).await.unwrap();
    if url.starts_with("https://") {
        http.ca_bundle = Some(pve.ca_pem.clone());
    }
    Grants {
        http: Some(http),
        secrets: Some(SecretsGrant::new(Arc::new(StaticSecrets::new(secrets.iter().copied())), KEYS.iter().map(|k| k.to_string()))),
        session: Some(store.grant(SCOPE)),
        ..Grants::default()
    }
}

/// Ticket auth straight to fakepve over https.
async fn grants(pve: &FakePve, store: &Arc<SessionStore>) -> Grants {
    grants_for(pve, &pve.url, &[("username", &pve.username), ("password", &pve.password)], store).await
}

fn config(endpoint: &str) -> ProviderConfig {
    ProviderConfig {
        provider: SCOPE.into(),
        endpoint: endpoint.into(),
        credential_keys: KEYS.iter().map(|k| k.to_string()).collect(),
        storage_classes: vec![
            ("standard".into(), "local-lvm".into()),
            ("shared".into(), "shared-dir".into()),
            ("fast".into(), "pve2-only".into()),
            ("iso".into(), "local".into()),
            ("ghost".into(), "no-such-storage".into()),
        ],
        network_classes: vec![("default".into(), "vmbr0".into()), ("dmz".into(), "vmbr9".into())],
        features: vec!["cloud-init".into()],
    }
}

fn machine(uid: &str, name: &str) -> Machine {
    Machine {
        uid: uid.into(),
        name: name.into(),
        namespace: "ns".into(),
        cpus: 2,
        memory_mib: 2048,
        firmware: Firmware::Bios,
        disks: vec![Disk { name: "root".into(), size_gib: 4, target: "local-lvm".into() }],
        nics: vec![Nic { name: "eth0".into(), network: "vmbr0".into(), ip: None }],
        image: ImageSource::Template(fakepve::TEMPLATE_VMID.to_string()),
        user_data: Some(format!("#cloud-config\nuser: ops\nssh_authorized_keys:\n  - {SSH_KEY}\npackages:\n  - nginx\n")),
        user_data_format: UserDataFormat::CloudConfig,
        failure_domain: "pve1".into(),
        power_state: PowerState::PoweredOn,
        labels: vec![],
    }
}

fn machine_ref(uid: &str, namespace: &str, name: &str) -> MachineRef {
    MachineRef { uid: uid.into(), name: name.into(), namespace: namespace.into(), provider_id: None, failure_domain: String::new(), backend_id: None }
}

fn off(mode: PowerOffMode, timeout_ms: u32) -> PowerOff {
    PowerOff { mode, timeout_ms }
}

fn guest_err<T: std::fmt::Debug>(r: Result<T, CallError>) -> GuestError {
    match r {
        Err(CallError::Guest(e)) => e,
        other => panic!("expected a guest error, got {other:?}"),
    }
}

fn invalid_spec<T: std::fmt::Debug>(r: Result<T, CallError>, needle: &str) {
    match guest_err(r) {
        GuestError::InvalidSpec(m) => assert!(m.contains(needle), "{m:?} does not mention {needle:?}"),
        other => panic!("expected invalid-spec mentioning {needle:?}, got {other:?}"),
    }
}

async fn clone_tasks(pve: &FakePve) -> usize {
    let mut n = 0;
    for node in ["pve1", "pve2"] {
        n += pve.tasks(node).await.unwrap().iter().filter(|t| t["type"] == "qmclone").count();
    }
    n
}

async fn status_of(pve: &FakePve, node: &str, vmid: u64) -> String {
    pve.vm_status(node, vmid).await.unwrap()["status"].as_str().unwrap_or("").to_string()
}

#[tokio::test]
async fn probe_reports_nodes_with_the_classes_they_have() {
    let pve = FakePve::start().await.unwrap();
    let store = SessionStore::new();
    let inv = driver().probe(&config(&pve.url), limits(), grants(&pve, &store).await).await.unwrap();

    let version = pve.api("GET", "/version", &[]).await.unwrap();
    assert_eq!(inv.backend_version, Some(format!("Proxmox VE {}", version["version"].as_str().unwrap())));
    let names: Vec<&str> = inv.failure_domains.iter().map(|f| f.name.as_str()).collect();
    assert_eq!(names, ["pve1", "pve2"]);
    let nodes = pve.api("GET", "/nodes", &[]).await.unwrap();
    for fd in &inv.failure_domains {
        assert!(fd.labels.contains(&("topology.kubernetes.io/zone".to_string(), fd.name.clone())), "{:?}", fd.labels);
        // pve2-only exists only on pve2; local holds no images; no-such-storage and vmbr9 do not exist.
        let want: &[&str] = if fd.name == "pve2" { &["standard", "shared", "fast"] } else { &["standard", "shared"] };
        assert_eq!(fd.storage_classes, want, "{}", fd.name);
        assert_eq!(fd.network_classes, ["default"], "{}", fd.name);
        assert_eq!(fd.features, ["cloud-init"]);
        let node = nodes.as_array().unwrap().iter().find(|n| n["node"] == fd.name.as_str()).unwrap();
        assert_eq!(fd.capacity.cpus, node["maxcpu"].as_u64().unwrap());
        assert_eq!(fd.capacity.memory_mib, (node["maxmem"].as_u64().unwrap() - node["mem"].as_u64().unwrap()) >> 20);
        let storages = pve.api("GET", &format!("/nodes/{}/storage", fd.name), &[]).await.unwrap();
        let free: u64 = storages
            .as_array()
            .unwrap()
            .iter()
            .filter(|s| ["local-lvm", "shared-dir", "pve2-only"].contains(&s["storage"].as_str().unwrap()) && s["enabled"] == 1)
            .map(|s| s["avail"].as_u64().unwrap())
            .sum();
        assert_eq!(fd.capacity.storage_gib, free >> 30, "{}", fd.name);
    }
}

#[tokio::test]
async fn machine_lifecycle() {
    let pve = FakePve::start().await.unwrap();
    let store = SessionStore::new();
    let (d, cfg, g) = (driver(), config(&pve.url), grants(&pve, &store).await);
    let before = pve.vms().await.unwrap();

    // create: one full clone of the template, configured, tagged, running.
    let status = d.create(&cfg, &machine(UID, "vm1"), limits(), g.clone()).await.unwrap();
    let [vm] = pve.vms_tagged(UID).await.unwrap().try_into().unwrap();
    assert_eq!((vm.name.as_str(), vm.node.as_str(), vm.status.as_str()), ("vm1.ns", "pve1", "running"));
    assert!(!before.iter().any(|v| v.vmid == vm.vmid), "a new VMID");
    assert_eq!(status.provider_id, format!("proxmox://pve1/{}", vm.vmid));
    assert_eq!(status.power_state, PowerState::PoweredOn);
    assert!(status.provisioned);
    // A fresh clone's guest agent never answers on fakepve: running, waiting for an address.
    assert_eq!(status.phase, MachinePhase::WaitingForAddress);
    assert!(status.addresses.is_empty());
    let c = pve.vm_config("pve1", vm.vmid).await.unwrap();
    let s = |k: &str| c[k].as_str().map(String::from).unwrap_or_else(|| c[k].to_string());
    assert_eq!((s("cores"), s("memory")), ("2".into(), "2048".into()), "{c}");
    assert!(s("net0").starts_with("virtio=") && s("net0").ends_with(",bridge=vmbr0"), "MAC kept, bridge set: {c}");
    assert_eq!(s("ide2"), "local-lvm:cloudinit");
    assert_eq!(s("ipconfig0"), "ip=dhcp");
    assert_eq!(s("ciuser"), "ops");
    assert_eq!(s("sshkeys"), SSH_KEY.replace(' ', "%20").replace('@', "%40") + "%0A");
    assert_eq!(s("agent"), "1");
    assert!(s("scsi0").starts_with(&format!("local-lvm:vm-{}-disk-", vm.vmid)), "a full clone's own disk: {c}");
    assert!(s("description").contains(&format!("banlieue-uid: {UID}")), "{c}");
    let user_data = status.conditions.iter().find(|c| c.type_ == "UserData").expect("UserData condition");
    assert!(user_data.message.contains("packages"), "{user_data:?}");

    // create again: the same VM, no second clone.
    let again = d.create(&cfg, &machine(UID, "vm1"), limits(), g.clone()).await.unwrap();
    assert_eq!(again.provider_id, status.provider_id);
    assert_eq!(pve.vms_tagged(UID).await.unwrap().len(), 1);
    assert_eq!(pve.vms().await.unwrap().len(), before.len() + 1);
    assert_eq!(clone_tasks(&pve).await, 1);

    // describe
    let r = machine_ref(UID, "ns", "vm1");
    let desc = d.describe(&cfg, &r, limits(), g.clone()).await.unwrap();
    assert_eq!(desc.provider_id, status.provider_id);
    assert_eq!(desc.phase, MachinePhase::WaitingForAddress);
    let agent = desc.conditions.iter().find(|c| c.type_ == "GuestAgent").unwrap();
    assert!(agent.message.contains("guest agent is not running"), "{agent:?}");

    // power: soft off (fakepve's guest honours ACPI at once), on, hard off, on, try-soft off.
    let st = d.set_power(&cfg, &r, PowerState::PoweredOff, off(PowerOffMode::Soft, 5_000), limits(), g.clone()).await.unwrap();
    assert_eq!((st.power_state, st.phase), (PowerState::PoweredOff, MachinePhase::PoweredOff));
    assert_eq!(status_of(&pve, "pve1", vm.vmid).await, "stopped");
    d.set_power(&cfg, &r, PowerState::PoweredOn, off(PowerOffMode::Soft, 5_000), limits(), g.clone()).await.unwrap();
    assert_eq!(status_of(&pve, "pve1", vm.vmid).await, "running");
    d.set_power(&cfg, &r, PowerState::PoweredOff, off(PowerOffMode::Hard, 0), limits(), g.clone()).await.unwrap();
    assert_eq!(status_of(&pve, "pve1", vm.vmid).await, "stopped");
    d.set_power(&cfg, &r, PowerState::PoweredOn, off(PowerOffMode::Hard, 0), limits(), g.clone()).await.unwrap();
    d.set_power(&cfg, &r, PowerState::PoweredOff, off(PowerOffMode::TrySoft, 5_000), limits(), g.clone()).await.unwrap();
    assert_eq!(status_of(&pve, "pve1", vm.vmid).await, "stopped");
    let tasks: Vec<String> = pve.tasks("pve1").await.unwrap().iter().map(|t| t["type"].as_str().unwrap().to_string()).collect();
    assert_eq!(tasks.iter().filter(|t| *t == "qmshutdown").count(), 2, "soft and try-soft asked the guest: {tasks:?}");
    assert_eq!(tasks.iter().filter(|t| *t == "qmstop").count(), 1, "only hard pulled the plug: {tasks:?}");
    d.set_power(&cfg, &r, PowerState::PoweredOn, off(PowerOffMode::Hard, 0), limits(), g.clone()).await.unwrap();

    // delete (running: powered off first), then again.
    d.delete(&cfg, &r, off(PowerOffMode::TrySoft, 5_000), limits(), g.clone()).await.unwrap();
    assert!(pve.vms_tagged(UID).await.unwrap().is_empty());
    assert!(pve.vms().await.unwrap().iter().all(|v| v.vmid != vm.vmid));
    let vols = pve.api("GET", "/nodes/pve1/storage/local-lvm/content", &[]).await.unwrap();
    assert!(!vols.to_string().contains(&format!("vm-{}-", vm.vmid)), "disks purged: {vols}");
    d.delete(&cfg, &r, off(PowerOffMode::Hard, 0), limits(), g.clone()).await.unwrap();
    assert!(matches!(guest_err(d.describe(&cfg, &r, limits(), g.clone()).await), GuestError::NotFound(_)));
}

#[tokio::test]
async fn create_on_another_node_clones_to_shared_storage_powered_off() {
    let pve = FakePve::start().await.unwrap();
    let store = SessionStore::new();
    let (d, cfg, g) = (driver(), config(&pve.url), grants(&pve, &store).await);
    let mut m = machine(UID2, "vm2");
    m.failure_domain = "pve2".into();
    m.disks = vec![
        Disk { name: "root".into(), size_gib: 8, target: "shared-dir".into() },
        Disk { name: "data".into(), size_gib: 2, target: "pve2-only".into() },
    ];
    m.power_state = PowerState::PoweredOff;
    m.image = ImageSource::Template(fakepve::TEMPLATE_NAME.into());
    m.user_data = None;
    let st = d.create(&cfg, &m, limits(), g.clone()).await.unwrap();
    let [vm] = pve.vms_tagged(UID2).await.unwrap().try_into().unwrap();
    assert_eq!((vm.node.as_str(), vm.status.as_str()), ("pve2", "stopped"));
    assert_eq!(st.provider_id, format!("proxmox://pve2/{}", vm.vmid));
    assert_eq!((st.power_state, st.phase), (PowerState::PoweredOff, MachinePhase::PoweredOff));
    let c = pve.vm_config("pve2", vm.vmid).await.unwrap();
    assert!(c["scsi0"].as_str().unwrap().starts_with("shared-dir:"), "{c}");
    assert_eq!(c["scsi1"], "pve2-only:2", "{c}");
    assert_eq!(c["ide2"], "shared-dir:cloudinit", "{c}");
    assert!(c.get("ciuser").is_none(), "{c}");
}

#[tokio::test]
async fn describe_reports_guest_agent_addresses() {
    let pve = FakePve::start().await.unwrap();
    let store = SessionStore::new();
    let (d, cfg, g) = (driver(), config(&pve.url), grants(&pve, &store).await);
    let st = d.describe(&cfg, &machine_ref(fakepve::AGENT_VM_UID, "default", "existing"), limits(), g).await.unwrap();
    let agent = pve.api("GET", &format!("/nodes/pve2/qemu/{}/agent/network-get-interfaces", fakepve::AGENT_VM_VMID), &[]).await.unwrap();
    assert!(agent.to_string().contains("192.0.2.10"), "{agent}");
    let addrs: Vec<&str> = st.addresses.iter().map(|a| a.address.as_str()).collect();
    assert_eq!(addrs, ["192.0.2.10"], "loopback left out");
    assert_eq!(st.provider_id, format!("proxmox://pve2/{}", fakepve::AGENT_VM_VMID));
    assert_eq!((st.power_state, st.phase), (PowerState::PoweredOn, MachinePhase::Running));
}

#[tokio::test]
async fn soft_power_off_of_a_guest_without_acpi() {
    let pve = FakePve::start().await.unwrap();
    let store = SessionStore::new();
    let (d, cfg, g) = (driver(), config(&pve.url), grants(&pve, &store).await);
    let r = machine_ref(fakepve::NO_ACPI_VM_UID, "default", "no-acpi");
    let vmid = fakepve::NO_ACPI_VM_VMID;
    // soft: fakepve's shutdown task fails ("got timeout"), the guest keeps running, never forced.
    let started = std::time::Instant::now();
    let e = guest_err(d.set_power(&cfg, &r, PowerState::PoweredOff, off(PowerOffMode::Soft, 1_000), limits(), g.clone()).await);
    assert!(matches!(&e, GuestError::Unavailable(m) if m.contains("1000 ms")), "{e:?}");
    assert!(started.elapsed() >= std::time::Duration::from_millis(900));
    assert_eq!(status_of(&pve, "pve1", vmid).await, "running");
    let tasks = pve.tasks("pve1").await.unwrap();
    assert!(tasks.iter().any(|t| t["type"] == "qmshutdown" && t["status"].as_str().unwrap_or("").contains("got timeout")), "{tasks:?}");
    assert!(!tasks.iter().any(|t| t["type"] == "qmstop"));
    // try-soft: asked, then stopped hard at the timeout.
    d.set_power(&cfg, &r, PowerState::PoweredOff, off(PowerOffMode::TrySoft, 1_000), limits(), g.clone()).await.unwrap();
    assert_eq!(status_of(&pve, "pve1", vmid).await, "stopped");
    assert!(pve.tasks("pve1").await.unwrap().iter().any(|t| t["type"] == "qmstop"));
}

fn static_ip(addresses: &[&str], gateway: Option<&str>) -> IpConfig {
    IpConfig {
        addresses: addresses.iter().map(|a| a.to_string()).collect(),
        gateway: gateway.map(str::to_string),
        nameservers: vec!["10.0.0.2".into(), "10.0.0.3".into()],
        search_domains: vec!["lab.example".into()],
    }
}

/// Static addresses as PVE's cloud-init takes them, read back from the VM's configuration
/// (fakepve checks each value against PVE's own schema): `ipconfigN` per NIC, DNS for the VM.
#[tokio::test]
async fn static_addresses_become_ipconfig_and_dns() {
    let pve = FakePve::start().await.unwrap();
    let store = SessionStore::new();
    let (d, cfg, g) = (driver(), config(&pve.url), grants(&pve, &store).await);
    let mut m = machine(UID, "vm1");
    m.nics[0].ip = Some(static_ip(&["10.0.0.5/24", "2001:db8::5/64"], Some("10.0.0.1")));
    m.nics.push(Nic { name: "eth1".into(), network: "vmbr0".into(), ip: None });
    d.create(&cfg, &m, limits(), g.clone()).await.unwrap();
    let [vm] = pve.vms_tagged(UID).await.unwrap().try_into().unwrap();
    let c = pve.vm_config(&vm.node, vm.vmid).await.unwrap();
    let s = |k: &str| c[k].as_str().map(String::from).unwrap_or_default();
    assert_eq!(s("ipconfig0"), "ip=10.0.0.5/24,gw=10.0.0.1,ip6=2001:db8::5/64", "{c}");
    assert_eq!(s("ipconfig1"), "ip=dhcp", "{c}");
    assert_eq!((s("nameserver"), s("searchdomain")), ("10.0.0.2 10.0.0.3".into(), "lab.example".into()), "{c}");
    d.delete(&cfg, &machine_ref(UID, "ns", "vm1"), off(PowerOffMode::Hard, 0), limits(), g).await.unwrap();
}

/// A machine's CPUs and memory, changed after it was made (a grown class), reach the VM
/// when the host calls `create` again with the VM stopped: PVE's own config says so, no
/// second clone is made, and `describe` reports the hardware from that config.
#[tokio::test]
async fn a_stopped_vm_is_grown_in_place_and_describe_reports_its_hardware() {
    let pve = FakePve::start().await.unwrap();
    let store = SessionStore::new();
    let (d, cfg, g) = (driver(), config(&pve.url), grants(&pve, &store).await);
    let mut m = machine(UID, "vm1");
    m.power_state = PowerState::PoweredOff;
    d.create(&cfg, &m, limits(), g.clone()).await.unwrap();
    let [vm] = pve.vms_tagged(UID).await.unwrap().try_into().unwrap();
    let hw = d.describe(&cfg, &machine_ref(UID, "ns", "vm1"), limits(), g.clone()).await.unwrap().hardware.expect("describe reports the hardware");
    assert_eq!((hw.cpus, hw.memory_mib), (2, 2048));
    let c = pve.vm_config(&vm.node, vm.vmid).await.unwrap();
    assert_eq!(hw.disks.len(), 1, "{c}");
    assert!(c.as_object().unwrap().values().any(|v| v.as_str().is_some_and(|v| v.starts_with(&format!("{},", hw.disks[0].id)))), "the disk's id is its volume: {:?} in {c}", hw.disks);
    assert_eq!(hw.nics.len(), 1);
    assert!(c["net0"].as_str().unwrap().to_ascii_lowercase().contains(&hw.nics[0].mac), "{c} {:?}", hw.nics);
    assert_eq!(hw.nics[0].network, "vmbr0");

    let clones = clone_tasks(&pve).await;
    m.cpus = 4;
    m.memory_mib = 4096;
    d.create(&cfg, &m, limits(), g.clone()).await.unwrap();
    let c = pve.vm_config(&vm.node, vm.vmid).await.unwrap();
    let number = |k: &str| c[k].as_u64().or_else(|| c[k].as_str()?.parse().ok());
    assert_eq!((number("cores"), number("memory")), (Some(4), Some(4096)), "{c}");
    assert_eq!(clone_tasks(&pve).await, clones, "the same VM, not a second clone");
    assert_eq!(pve.vms_tagged(UID).await.unwrap().len(), 1);
    let hw = d.describe(&cfg, &machine_ref(UID, "ns", "vm1"), limits(), g.clone()).await.unwrap().hardware.unwrap();
    assert_eq!((hw.cpus, hw.memory_mib), (4, 4096));
    // Running, the same change is not made: the host calls `create` only on a machine that is off.
    d.set_power(&cfg, &machine_ref(UID, "ns", "vm1"), PowerState::PoweredOn, off(PowerOffMode::Hard, 0), limits(), g.clone()).await.unwrap();
    m.power_state = PowerState::PoweredOn;
    m.cpus = 1;
    d.create(&cfg, &m, limits(), g.clone()).await.unwrap();
    let c = pve.vm_config(&vm.node, vm.vmid).await.unwrap();
    assert_eq!(c["cores"].as_u64().or_else(|| c["cores"].as_str()?.parse().ok()), Some(4), "a running VM is left as it is: {c}");
    d.delete(&cfg, &machine_ref(UID, "ns", "vm1"), off(PowerOffMode::Hard, 0), limits(), g).await.unwrap();
}

#[tokio::test]
async fn bad_specs_are_invalid_and_leave_nothing() {
    let pve = FakePve::start().await.unwrap();
    let store = SessionStore::new();
    let (d, cfg, g) = (driver(), config(&pve.url), grants(&pve, &store).await);
    let before = pve.vms().await.unwrap();

    let mut m = machine(UID, "vm1");
    m.image = ImageSource::Template("9999".into());
    invalid_spec(d.create(&cfg, &m, limits(), g.clone()).await, "9999");
    let mut m = machine(UID, "vm1");
    m.image = ImageSource::Template("no-such-template".into());
    invalid_spec(d.create(&cfg, &m, limits(), g.clone()).await, "no-such-template");
    let mut m = machine(UID, "vm1");
    m.disks[0].target = "no-such-storage".into();
    invalid_spec(d.create(&cfg, &m, limits(), g.clone()).await, "no-such-storage");
    let mut m = machine(UID, "vm1");
    m.disks[0].target = "local".into();
    invalid_spec(d.create(&cfg, &m, limits(), g.clone()).await, "\"local\"");
    // The template's boot disk is 4 GiB: a disk is never shrunk.
    let mut m = machine(UID, "vm1");
    m.disks[0].size_gib = 2;
    invalid_spec(d.create(&cfg, &m, limits(), g.clone()).await, "never shrunk");
    let mut m = machine(UID, "vm1");
    m.nics[0].network = "vmbr9".into();
    invalid_spec(d.create(&cfg, &m, limits(), g.clone()).await, "vmbr9");
    // Two IPv4 addresses on one NIC: PVE's cloud-init takes one per family.
    let mut m = machine(UID, "vm1");
    m.nics[0].ip = Some(static_ip(&["10.0.0.5/24", "10.0.0.6/24"], None));
    invalid_spec(d.create(&cfg, &m, limits(), g.clone()).await, "one IPv4 and one IPv6");
    // Ignition: PVE's cloud-init cannot take it, and it is never passed on as cloud-init.
    let mut m = machine(UID, "vm1");
    m.user_data = Some(r#"{"ignition":{"version":"3.4.0"}}"#.into());
    m.user_data_format = UserDataFormat::Ignition;
    invalid_spec(d.create(&cfg, &m, limits(), g.clone()).await, "cannot deliver Ignition");
    let mut m = machine(UID, "vm1");
    m.failure_domain = "pve7".into();
    invalid_spec(d.create(&cfg, &m, limits(), g.clone()).await, "pve7");
    // A clone to another node from non-shared storage: PVE refuses the clone itself.
    let mut m = machine(UID, "vm1");
    m.failure_domain = "pve2".into();
    invalid_spec(d.create(&cfg, &m, limits(), g.clone()).await, "non-shared");
    let mut m = machine(UID, "vm1");
    m.image = ImageSource::BackingFile("/x.qcow2".into());
    invalid_spec(d.create(&cfg, &m, limits(), g.clone()).await, "template");
    invalid_spec(d.create(&cfg, &machine("NOT A UID", "vm1"), limits(), g.clone()).await, "UID");

    assert_eq!(pve.vms().await.unwrap(), before, "nothing created");
    assert_eq!(clone_tasks(&pve).await, 0);
}

#[tokio::test]
async fn wrong_password_is_denied() {
    let pve = FakePve::start().await.unwrap();
    let store = SessionStore::new();
    let g = grants_for(&pve, &pve.url, &[("username", &pve.username), ("password", "wrong")], &store).await;
    let d = driver();
    assert!(matches!(guest_err(d.probe(&config(&pve.url), limits(), g.clone()).await), GuestError::Denied(_)));
    assert!(matches!(guest_err(d.create(&config(&pve.url), &machine(UID, "vm1"), limits(), g).await), GuestError::Denied(_)));
    assert!(pve.vms_tagged(UID).await.unwrap().is_empty());
    let g = grants_for(&pve, &pve.url, &[], &store).await;
    assert!(matches!(guest_err(d.probe(&config(&pve.url), limits(), g).await), GuestError::InvalidSpec(_)), "no credentials at all");
}

#[tokio::test]
async fn backend_down_is_unavailable() {
    let mut pve = FakePve::start().await.unwrap();
    let store = SessionStore::new();
    let (d, cfg, g) = (driver(), config(&pve.url), grants(&pve, &store).await);
    d.probe(&cfg, limits(), g.clone()).await.unwrap();
    pve.stop();
    let r = machine_ref(UID, "ns", "vm1");
    assert!(matches!(guest_err(d.probe(&cfg, limits(), g.clone()).await), GuestError::Unavailable(_)));
    assert!(matches!(guest_err(d.describe(&cfg, &r, limits(), g.clone()).await), GuestError::Unavailable(_)));
    // Through the proxy, which answers 502 with fakepve gone.
    let cfg = config(&pve.proxy_url);
    let g = grants_for(&pve, &pve.proxy_url.clone(), &[("username", "root@pam"), ("password", "x")], &SessionStore::new()).await;
    assert!(matches!(guest_err(d.probe(&cfg, limits(), g).await), GuestError::Unavailable(_)));
}

#[tokio::test]
async fn one_ticket_login_serves_many_calls() {
    let pve = FakePve::start().await.unwrap();
    let store = SessionStore::new();
    let url = pve.proxy_url.clone();
    let (d, cfg) = (driver(), config(&url));
    let g = grants_for(&pve, &url, &[("username", &pve.username), ("password", &pve.password)], &store).await;

    d.probe(&cfg, limits(), g.clone()).await.unwrap();
    d.create(&cfg, &machine(UID, "vm1"), limits(), g.clone()).await.unwrap();
    let r = machine_ref(UID, "ns", "vm1");
    for _ in 0..3 {
        d.describe(&cfg, &r, limits(), g.clone()).await.unwrap();
    }
    d.set_power(&cfg, &r, PowerState::PoweredOff, off(PowerOffMode::Hard, 0), limits(), g.clone()).await.unwrap();
    assert_eq!(pve.logins(), 1, "six calls, one login");
    let seen = pve.requests();
    assert!(seen.len() > 20, "{}", seen.len());
    assert!(seen.iter().filter(|s| !s.path.ends_with("/access/ticket")).all(|s| s.auth == "ticket"), "{seen:?}");

    // A ticket PVE no longer accepts: cleared, one new login, the call succeeds.
    store.grant(SCOPE).set("PVE:root@pam:00000000::forged\nforged-csrf".into(), std::time::Duration::from_secs(600)).unwrap();
    d.describe(&cfg, &r, limits(), g.clone()).await.unwrap();
    assert_eq!(pve.logins(), 2);
    d.describe(&cfg, &r, limits(), g.clone()).await.unwrap();
    assert_eq!(pve.logins(), 2);

    // Another Provider's store (scope) has no session: it logs in itself.
    let other = SessionStore::new();
    let g2 = grants_for(&pve, &url, &[("username", &pve.username), ("password", &pve.password)], &other).await;
    d.describe(&cfg, &r, limits(), g2).await.unwrap();
    assert_eq!(pve.logins(), 3);
}

#[tokio::test]
async fn api_token_is_sent_as_pveapitoken_without_login() {
    // fakepve's CLI cannot configure API tokens, so it refuses every token: this proves the header
    // is sent, no ticket login happens, and a refusal is `denied`.
    let pve = FakePve::start().await.unwrap();
    let store = SessionStore::new();
    let url = pve.proxy_url.clone();
    let g = grants_for(&pve, &url, &[("token-id", "root@pam!banlieue"), ("token-secret", "00000000-0000-0000-0000-000000000000")], &store).await;
    let e = guest_err(driver().probe(&config(&url), limits(), g).await);
    assert!(matches!(&e, GuestError::Denied(m) if m.contains("authentication failure")), "{e:?}");
    assert_eq!(pve.logins(), 0);
    let seen = pve.requests();
    assert!(!seen.is_empty() && seen.iter().all(|s| s.auth == "token"), "{seen:?}");
    assert!(store.grant(SCOPE).get().is_none(), "no session stored for token auth");
}

#[tokio::test]
async fn create_finishes_a_clone_left_by_an_interrupted_create() {
    // What a crash between the clone and the config write leaves: a clone named after the machine
    // with its UID in the description (set by the clone request) but no UID tag yet.
    let pve = FakePve::start().await.unwrap();
    let store = SessionStore::new();
    let (d, cfg, g) = (driver(), config(&pve.url), grants(&pve, &store).await);
    let description = format!("banlieue machine ns/vm3\nbanlieue-uid: {UID}\n");
    let upid = pve
        .api("POST", &format!("/nodes/pve1/qemu/{}/clone", fakepve::TEMPLATE_VMID), &[
            ("newid", "500"),
            ("name", "vm3.ns"),
            ("full", "1"),
            ("storage", "local-lvm"),
            ("description", &description),
        ])
        .await
        .unwrap();
    assert!(upid.as_str().unwrap().starts_with("UPID:"));
    assert!(pve.vms_tagged(UID).await.unwrap().is_empty());

    let st = d.create(&cfg, &machine(UID, "vm3"), limits(), g).await.unwrap();
    assert_eq!(st.provider_id, "proxmox://pve1/500");
    let [vm] = pve.vms_tagged(UID).await.unwrap().try_into().unwrap();
    assert_eq!((vm.vmid, vm.status.as_str()), (500, "running"));
    assert_eq!(clone_tasks(&pve).await, 1, "the driver did not clone again");
    let c = pve.vm_config("pve1", 500).await.unwrap();
    assert_eq!((c["cores"].clone(), c["ide2"].clone()), (Value::from("2"), Value::from("local-lvm:cloudinit")), "{c}");
}

fn image_request(name: &str, digest: &str, storage: &str) -> banlieue_runtime::provider::ImageRequest {
    banlieue_runtime::provider::ImageRequest {
        name: name.into(),
        source: ImageSource::Url(banlieue_runtime::provider::UrlSource { url: "https://images.example/debian-12.qcow2".into(), checksum: Some(digest.into()) }),
        target: Some(storage.into()),
    }
}

/// Every task of `kind` on either node: (node, upid).
async fn tasks_of(pve: &FakePve, kind: &str) -> Vec<(String, String)> {
    let mut out = Vec::new();
    for node in ["pve1", "pve2"] {
        for t in pve.tasks(node).await.unwrap().iter().filter(|t| t["type"] == kind) {
            out.push((node.to_string(), t["upid"].as_str().unwrap_or("").to_string()));
        }
    }
    out
}

/// What fakepve can prove of an import: PVE was asked to download the image's URL with its
/// sha256 (fakepve records the request but fetches nothing, so the bytes PVE would receive and
/// convert are not checked here), a template was made whose disk is imported from that file,
/// and the downloaded file was removed.
#[tokio::test]
async fn an_image_is_downloaded_by_pve_and_becomes_a_template() {
    let pve = FakePve::start().await.unwrap();
    let store = SessionStore::new();
    let d = driver();
    let cfg = config(&pve.url);
    let g = grants(&pve, &store).await;
    let dir = tempfile::tempdir().unwrap();
    let image = common::image_grant(dir.path(), 16, "qcow2");
    let request = image_request("debian", &image.digest, "shared-dir");
    let template = format!("image-debian-{}", &image.digest[7..19]);
    let vms_before = pve.vms().await.unwrap();

    // Without the host's image (only an import-image call holds one) nothing is asked of PVE.
    let denied = guest_err(d.import_image(&cfg, &request, limits(), g.clone()).await);
    assert!(matches!(denied, GuestError::Denied(_)), "{denied:?}");
    assert!(tasks_of(&pve, "download").await.is_empty());

    let with_image = Grants { transfer: Some(image.clone()), ..g.clone() };
    let status = d.import_image(&cfg, &request, limits(), with_image.clone()).await.unwrap();
    assert_eq!(status.phase, banlieue_runtime::provider::ImagePhase::Ready, "{status:?}");
    assert_eq!(status.reference.as_deref(), Some(template.as_str()));
    // PVE downloaded the URL (its task says so) …
    let downloads = tasks_of(&pve, "download").await;
    assert_eq!(downloads.len(), 1, "{downloads:?}");
    let log = pve.task_log(&downloads[0].0, &downloads[0].1).await.unwrap().join("\n");
    assert!(log.contains("https://images.example/debian-12.qcow2") && log.contains(&format!("{template}.qcow2")), "{log}");
    // … into a template tagged as an image, whose disk is imported from that file on `shared-dir` …
    let made: Vec<_> = pve.vms().await.unwrap().into_iter().filter(|v| v.name == template).collect();
    assert_eq!(made.len(), 1, "{made:?}");
    assert!(made[0].template && made[0].tags.contains("banlieue-image"), "{made:?}");
    let cfg_of = pve.vm_config(&made[0].node, made[0].vmid).await.unwrap();
    let scsi0 = cfg_of["scsi0"].as_str().unwrap_or("");
    assert!(scsi0.starts_with("shared-dir:") && scsi0.contains(&format!("import-from=local:import/{template}.qcow2")), "{cfg_of}");
    assert!(cfg_of["description"].as_str().unwrap_or("").contains(&image.digest), "{cfg_of}");
    // … and the downloaded file is gone.
    for node in ["pve1", "pve2"] {
        assert!(pve.storage_content(node, "local", Some("import")).await.unwrap().is_empty(), "nothing left on {node}'s import storage");
    }

    // Importing again finds the template: no second download.
    d.import_image(&cfg, &request, limits(), with_image.clone()).await.unwrap();
    assert_eq!(tasks_of(&pve, "download").await.len(), 1);

    // A machine clones from it.
    let mut m = machine(UID, "from-image");
    m.image = ImageSource::Template(template.clone());
    m.disks[0].target = "shared-dir".into();
    m.failure_domain = made[0].node.clone();
    d.create(&cfg, &m, limits(), g.clone()).await.unwrap();
    assert_eq!(pve.vms_tagged(UID).await.unwrap().len(), 1, "the machine was cloned from the imported template");
    d.delete(&cfg, &machine_ref(UID, "ns", "from-image"), off(PowerOffMode::Hard, 0), limits(), g.clone()).await.unwrap();

    // delete-image removes the template, and refuses names that are not this image's imports.
    invalid_spec(d.delete_image(&cfg, &request, "ubuntu-template", limits(), g.clone()).await, "not a template imported");
    d.delete_image(&cfg, &request, &template, limits(), g.clone()).await.unwrap();
    assert_eq!(pve.vms().await.unwrap(), vms_before, "nothing of the import is left");
    d.delete_image(&cfg, &request, &template, limits(), g.clone()).await.unwrap();

    // An import cut off before it reported (a VM named like the template, not yet one) is found
    // again: the next import replaces it, and a delete-image with no reference removes it.
    pve.api("POST", "/nodes/pve1/qemu", &[("vmid", "4242"), ("name", &template)]).await.unwrap();
    let status = d.import_image(&cfg, &request, limits(), with_image.clone()).await.unwrap();
    assert_eq!(status.reference.as_deref(), Some(template.as_str()));
    let now: Vec<_> = pve.vms().await.unwrap().into_iter().filter(|v| v.name == template).collect();
    assert!(now.len() == 1 && now[0].template && now[0].vmid != 4242, "the leftover was replaced by a template: {now:?}");
    pve.api("POST", "/nodes/pve2/qemu", &[("vmid", "4243"), ("name", &format!("image-debian-{}", "ab".repeat(6)))]).await.unwrap();
    d.delete_image(&cfg, &request, "", limits(), g.clone()).await.unwrap();
    assert_eq!(pve.vms().await.unwrap(), vms_before, "an empty reference removes everything imported for the image");

    // A format PVE does not import, and a storage no node has, are refused before anything is asked.
    let vpc = common::image_grant(tempfile::tempdir().unwrap().path(), 16, "vpc");
    invalid_spec(d.import_image(&cfg, &request, limits(), Grants { transfer: Some(vpc), ..g.clone() }).await, "qcow2, raw or vmdk");
    invalid_spec(d.import_image(&cfg, &image_request("debian", &image.digest, "no-such-storage"), limits(), with_image).await, "no-such-storage");
    assert_eq!(tasks_of(&pve, "download").await.len(), 2, "no further download was asked for");
}
