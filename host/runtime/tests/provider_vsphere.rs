//! The vSphere provider driver (`guests/provider-vsphere`) through the runtime, against a real
//! vcsim (`tests/backends/vcsim`, built by its build.sh) on 127.0.0.1. Every check of what the
//! driver did is made on vcsim through the fixture's own vim25 session, not only on the driver's
//! answers. Each test starts its own vcsim.

mod common;

use std::sync::Arc;
use std::time::Duration;

use banlieue_runtime::capability::Grants;
use banlieue_runtime::capability::http::HttpGrant;
use banlieue_runtime::capability::secrets::SecretsGrant;
use banlieue_runtime::capability::session::SessionStore;
use banlieue_runtime::provider::{
    AddressType, Disk, Firmware, ImageSource, IpConfig, Machine, MachinePhase, MachineRef, MachineStatus, Nic, PowerOff,
    PowerOffMode, PowerState, ProviderConfig, ProviderDriver, UserDataFormat,
};
use banlieue_runtime::{CallError, GuestError, Limits, Runtime, RuntimeConfig};
use banlieue_secrets::StaticSecrets;
use banlieue_test_backends::vcsim::{self, Vcsim};
use common::guest;

const UID: &str = "6f1c2a3e-1111-4222-8333-444455556666";
const USER_DATA: &str = "#cloud-config\nhostname: vm\n";

fn driver() -> ProviderDriver {
    Runtime::new(RuntimeConfig::default()).unwrap().provider(&guest("provider-vsphere")).unwrap()
}

async fn grants(vc: &Vcsim, password: &str, store: &Arc<SessionStore>) -> Grants {
    let secrets = StaticSecrets::new([("username", vcsim::USERNAME), ("password", password)]);
    Grants {
        http: Some(HttpGrant::for_endpoint(&vc.url).await.unwrap()),
        secrets: Some(SecretsGrant::new(Arc::new(secrets), ["username".to_string(), "password".to_string()])),
        session: Some(store.grant("infra/vcenter")),
        ..Grants::default()
    }
}

fn config(vc: &Vcsim) -> ProviderConfig {
    ProviderConfig {
        provider: "infra/vcenter".into(),
        endpoint: vc.url.clone(),
        credential_keys: vec!["username".into(), "password".into()],
        storage_classes: vec![("standard".into(), "LocalDS_0".into()), ("ghost".into(), "no-such-datastore".into())],
        network_classes: vec![("default".into(), "VM Network".into()), ("dmz".into(), "no-such-network".into())],
        features: vec!["uefi".into()],
    }
}

fn machine(template: &str) -> Machine {
    Machine {
        uid: UID.into(),
        name: "vm".into(),
        namespace: "ns".into(),
        cpus: 2,
        memory_mib: 2048,
        firmware: Firmware::Uefi,
        disks: vec![Disk { name: "root".into(), size_gib: 10, target: "LocalDS_0".into() }],
        nics: vec![Nic { name: "eth0".into(), network: "VM Network".into(), ip: None }],
        image: ImageSource::Template(template.into()),
        user_data: Some(USER_DATA.into()),
        user_data_format: UserDataFormat::CloudConfig,
        failure_domain: "DC0_C0".into(),
        power_state: PowerState::PoweredOn,
        labels: vec![],
    }
}

fn machine_ref() -> MachineRef {
    MachineRef { uid: UID.into(), name: "vm".into(), namespace: "ns".into(), provider_id: None, failure_domain: "DC0_C0".into(), backend_id: None }
}

fn off(mode: PowerOffMode) -> PowerOff {
    PowerOff { mode, timeout_ms: 2_000 }
}

fn limits() -> Limits {
    Limits::default()
}

fn b64(s: &str) -> String {
    const A: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::new();
    for c in s.as_bytes().chunks(3) {
        let b = [c[0], *c.get(1).unwrap_or(&0), *c.get(2).unwrap_or(&0)];
        let n = (u32::from(b[0]) << 16) | (u32::from(b[1]) << 8) | u32::from(b[2]);
        for i in 0..4 {
            out.push(if i <= c.len() { A[(n >> (18 - 6 * i)) as usize & 63] as char } else { '=' });
        }
    }
    out
}

/// Describe until the guest reports an address (vcsim's stand-in for VMware Tools adds one within ~50 ms).
async fn wait_for_address(d: &ProviderDriver, cfg: &ProviderConfig, g: &Grants) -> MachineStatus {
    for _ in 0..50 {
        let s = d.describe(cfg, &machine_ref(), limits(), g.clone()).await.unwrap();
        if s.phase == MachinePhase::Running {
            return s;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("no address reported within 5 s");
}

#[tokio::test]
async fn probe_reports_clusters_and_the_classes_they_have() {
    let vc = Vcsim::start().await.unwrap();
    let store = SessionStore::new();
    let inv = driver().probe(&config(&vc), limits(), grants(&vc, vcsim::PASSWORD, &store).await).await.unwrap();
    assert!(inv.backend_version.as_deref().is_some_and(|v| v.contains("vCenter")), "{inv:?}");
    let [fd] = inv.failure_domains.as_slice() else { panic!("one cluster, one failure domain: {inv:?}") };
    assert_eq!(fd.name, "DC0_C0");
    assert!(fd.labels.contains(&("topology.kubernetes.io/region".into(), "DC0".into())), "{:?}", fd.labels);
    assert!(fd.labels.contains(&("topology.kubernetes.io/zone".into(), "DC0_C0".into())), "{:?}", fd.labels);
    assert_eq!(fd.storage_classes, vec!["standard".to_string()], "a class on a missing datastore is not offered");
    assert_eq!(fd.network_classes, vec!["default".to_string()], "a class on a missing network is not offered");
    assert_eq!(fd.features, vec!["uefi".to_string()]);
    assert!(fd.capacity.cpus > 0 && fd.capacity.memory_mib > 0 && fd.capacity.storage_gib > 0, "{:?}", fd.capacity);
    assert_eq!(vc.login_count().await.unwrap(), 1, "probe logged in once");
}

#[tokio::test]
async fn machine_lifecycle() {
    let vc = Vcsim::start().await.unwrap();
    let store = SessionStore::new();
    let d = driver();
    let cfg = config(&vc);
    let g = grants(&vc, vcsim::PASSWORD, &store).await;
    let vms_before = vc.vm_names().await.unwrap();

    // create: a clone of the template, powered on, with our instanceUuid and cloud-init guestinfo.
    let created = d.create(&cfg, &machine(vcsim::TEMPLATE), limits(), g.clone()).await.unwrap();
    assert_eq!(created.power_state, PowerState::PoweredOn);
    assert!(created.provisioned);
    let vm = vc.find_vm(UID).await.unwrap().expect("a VM with the machine's UID as instanceUuid");
    assert_eq!(vc.name(&vm).await.unwrap(), "ns_vm");
    assert_eq!(vc.vm_property(&vm, "config.instanceUuid").await.unwrap().as_deref(), Some(UID));
    assert_eq!(vc.power_state(&vm).await.unwrap(), "poweredOn");
    let bios = vc.vm_property(&vm, "config.uuid").await.unwrap().unwrap();
    assert_eq!(created.provider_id, format!("vsphere://{bios}"));
    assert_eq!(vc.extra_config(&vm, "guestinfo.userdata").await.unwrap(), Some(b64(USER_DATA)));
    assert_eq!(vc.extra_config(&vm, "guestinfo.userdata.encoding").await.unwrap().as_deref(), Some("base64"));
    let meta = format!("{{\"instance-id\":\"{UID}\",\"local-hostname\":\"vm\"}}");
    assert_eq!(vc.extra_config(&vm, "guestinfo.metadata").await.unwrap(), Some(b64(&meta)));
    assert_eq!(vc.vm_property(&vm, "config.hardware.numCPU").await.unwrap().as_deref(), Some("2"));
    assert_eq!(vc.vm_property(&vm, "config.hardware.memoryMB").await.unwrap().as_deref(), Some("2048"));

    // The guest address, as vcsim reports it.
    let running = wait_for_address(&d, &cfg, &g).await;
    let ips = vc.guest_ips(&vm).await.unwrap();
    assert!(!ips.is_empty());
    assert!(
        running.addresses.iter().any(|a| a.type_ == AddressType::InternalIp && a.address == ips[0]),
        "{:?} vs {ips:?}",
        running.addresses
    );

    // create again (a retry after a crash before the status was written): still one VM.
    let again = d.create(&cfg, &machine(vcsim::TEMPLATE), limits(), g.clone()).await.unwrap();
    assert_eq!(again.provider_id, created.provider_id);
    let names = vc.vm_names().await.unwrap();
    assert_eq!(names.iter().filter(|n| *n == "ns_vm").count(), 1, "{names:?}");
    assert_eq!(names.len(), vms_before.len() + 1);

    // Power off per mode, checked on vcsim, and on again. vcsim's ShutdownGuest powers the VM off
    // at once (it does not check for VMware Tools), so soft and try-soft succeed without the hard way.
    for mode in [PowerOffMode::Soft, PowerOffMode::TrySoft, PowerOffMode::Hard] {
        let s = d.set_power(&cfg, &machine_ref(), PowerState::PoweredOff, off(mode), limits(), g.clone()).await.unwrap();
        assert_eq!((s.power_state, s.phase), (PowerState::PoweredOff, MachinePhase::PoweredOff), "{mode:?}");
        assert_eq!(vc.power_state(&vm).await.unwrap(), "poweredOff", "{mode:?}");
        // Already off: nothing to do.
        d.set_power(&cfg, &machine_ref(), PowerState::PoweredOff, off(mode), limits(), g.clone()).await.unwrap();
        let s = d.set_power(&cfg, &machine_ref(), PowerState::PoweredOn, off(mode), limits(), g.clone()).await.unwrap();
        assert_eq!(s.power_state, PowerState::PoweredOn);
        assert_eq!(vc.power_state(&vm).await.unwrap(), "poweredOn", "{mode:?}");
    }
    // Powered off behind banlieue's back: describe sees it.
    vc.power_off_outside(&vm).await.unwrap();
    let s = d.describe(&cfg, &machine_ref(), limits(), g.clone()).await.unwrap();
    assert_eq!(s.power_state, PowerState::PoweredOff);

    // delete: gone from vcsim; again is fine; then not found.
    d.delete(&cfg, &machine_ref(), off(PowerOffMode::TrySoft), limits(), g.clone()).await.unwrap();
    assert_eq!(vc.find_vm(UID).await.unwrap(), None);
    assert!(!vc.vm_names().await.unwrap().contains(&"ns_vm".to_string()));
    d.delete(&cfg, &machine_ref(), off(PowerOffMode::TrySoft), limits(), g.clone()).await.unwrap();
    let e = d.describe(&cfg, &machine_ref(), limits(), g.clone()).await.unwrap_err();
    assert!(matches!(e, CallError::Guest(GuestError::NotFound(_))), "{e}");
    assert_eq!(vc.vm_names().await.unwrap(), vms_before);

    // All of it over one session.
    assert_eq!(vc.login_count().await.unwrap(), 1);
}

#[tokio::test]
async fn a_running_machine_is_deleted_hard() {
    let vc = Vcsim::start().await.unwrap();
    let store = SessionStore::new();
    let (d, cfg, g) = (driver(), config(&vc), grants(&vc, vcsim::PASSWORD, &store).await);
    d.create(&cfg, &machine(vcsim::TEMPLATE), limits(), g.clone()).await.unwrap();
    d.delete(&cfg, &machine_ref(), off(PowerOffMode::Hard), limits(), g.clone()).await.unwrap();
    assert_eq!(vc.find_vm(UID).await.unwrap(), None);
}

#[tokio::test]
async fn sessions_are_reused_and_renewed_when_rejected() {
    let vc = Vcsim::start().await.unwrap();
    let store = SessionStore::new();
    let (d, cfg, g) = (driver(), config(&vc), grants(&vc, vcsim::PASSWORD, &store).await);
    for _ in 0..5 {
        d.probe(&cfg, limits(), g.clone()).await.unwrap();
    }
    let e = d.describe(&cfg, &machine_ref(), limits(), g.clone()).await.unwrap_err();
    assert!(matches!(e, CallError::Guest(GuestError::NotFound(_))), "{e}");
    assert_eq!(vc.login_count().await.unwrap(), 1, "6 calls, 1 login");

    // A session vCenter no longer knows (e.g. restarted): rejected, replaced once, the call succeeds.
    store.grant("infra/vcenter").set("no-such-session".into(), Duration::from_secs(600)).unwrap();
    d.probe(&cfg, limits(), g.clone()).await.unwrap();
    assert_eq!(vc.login_count().await.unwrap(), 2);
    d.probe(&cfg, limits(), g.clone()).await.unwrap();
    assert_eq!(vc.login_count().await.unwrap(), 2, "the new session is kept");
}

#[tokio::test]
async fn a_wrong_password_is_denied() {
    let vc = Vcsim::start().await.unwrap();
    let store = SessionStore::new();
    let g = grants(&vc, "wrong", &store).await;
    let e = driver().probe(&config(&vc), limits(), g).await.unwrap_err();
    assert!(matches!(&e, CallError::Guest(GuestError::Denied(m)) if m.contains("InvalidLogin")), "{e}");
    assert_eq!(vc.login_count().await.unwrap(), 0);
}

#[tokio::test]
async fn a_stopped_vcenter_is_unavailable() {
    let mut vc = Vcsim::start().await.unwrap();
    let store = SessionStore::new();
    let (d, cfg, g) = (driver(), config(&vc), grants(&vc, vcsim::PASSWORD, &store).await);
    d.probe(&cfg, limits(), g.clone()).await.unwrap();
    vc.stop();
    let e = d.probe(&cfg, limits(), g.clone()).await.unwrap_err();
    assert!(matches!(e, CallError::Guest(GuestError::Unavailable(_))), "{e}");
    let e = d.create(&cfg, &machine(vcsim::TEMPLATE), limits(), g).await.unwrap_err();
    assert!(matches!(e, CallError::Guest(GuestError::Unavailable(_))), "{e}");
}

#[tokio::test]
async fn a_missing_template_is_invalid_and_creates_nothing() {
    let vc = Vcsim::start().await.unwrap();
    let store = SessionStore::new();
    let (d, cfg, g) = (driver(), config(&vc), grants(&vc, vcsim::PASSWORD, &store).await);
    let before = vc.vm_names().await.unwrap();
    let e = d.create(&cfg, &machine("no-such-template"), limits(), g.clone()).await.unwrap_err();
    assert!(matches!(&e, CallError::Guest(GuestError::InvalidSpec(m)) if m.contains("no-such-template")), "{e}");
    assert_eq!(vc.vm_names().await.unwrap(), before);
    assert_eq!(vc.find_vm(UID).await.unwrap(), None);
    // A failure domain that is not a cluster, and a datastore the cluster lacks, are invalid too.
    let mut m = machine(vcsim::TEMPLATE);
    m.failure_domain = "nowhere".into();
    let e = d.create(&cfg, &m, limits(), g.clone()).await.unwrap_err();
    assert!(matches!(&e, CallError::Guest(GuestError::InvalidSpec(m)) if m.contains("nowhere")), "{e}");
    let mut m = machine(vcsim::TEMPLATE);
    m.disks[0].target = "no-such-datastore".into();
    let e = d.create(&cfg, &m, limits(), g).await.unwrap_err();
    assert!(matches!(&e, CallError::Guest(GuestError::InvalidSpec(m)) if m.contains("no-such-datastore")), "{e}");
    assert_eq!(vc.vm_names().await.unwrap(), before);
}

/// The machine's disks as declared, on vcsim's own view of the VM: the boot disk grown to
/// its size, a further disk added on its datastore; a create again changes nothing; a boot
/// disk declared smaller than the VM's is refused, and a disk on a datastore the cluster
/// lacks before anything is cloned.
#[tokio::test]
async fn disks_are_made_as_declared_and_never_shrunk() {
    let vc = Vcsim::start().await.unwrap();
    let store = SessionStore::new();
    let (d, cfg, g) = (driver(), config(&vc), grants(&vc, vcsim::PASSWORD, &store).await);
    let before = vc.vm_names().await.unwrap();
    let mut m = machine(vcsim::TEMPLATE);
    m.disks = vec![
        Disk { name: "root".into(), size_gib: 12, target: "LocalDS_0".into() },
        Disk { name: "data".into(), size_gib: 3, target: "LocalDS_0".into() },
    ];
    if let Err(e) = d.create(&cfg, &m, limits(), g.clone()).await {
        panic!("{e}\n{}", vc.log());
    }
    let vm = vc.find_vm(UID).await.unwrap().expect("the VM");
    let disks = vc.virtual_disks(&vm).await.unwrap();
    assert_eq!(disks.iter().map(|(kib, _)| *kib).collect::<Vec<_>>(), [12 << 20, 3 << 20], "{disks:?}");
    assert!(disks[1].1.starts_with("[LocalDS_0]"), "the data disk is on its datastore: {disks:?}");
    d.create(&cfg, &m, limits(), g.clone()).await.unwrap();
    assert_eq!(vc.virtual_disks(&vm).await.unwrap(), disks, "a create again changes nothing");
    // Declared smaller (the VM off, so its disks would be changed): refused, nothing shrunk.
    d.set_power(&cfg, &machine_ref(), PowerState::PoweredOff, off(PowerOffMode::Hard), limits(), g.clone()).await.unwrap();
    m.disks[0].size_gib = 5;
    let e = d.create(&cfg, &m, limits(), g.clone()).await.unwrap_err();
    assert!(matches!(&e, CallError::Guest(GuestError::InvalidSpec(msg)) if msg.contains("never shrunk") && msg.contains("at least 12 GiB")), "{e}");
    assert_eq!(vc.virtual_disks(&vm).await.unwrap(), disks);
    d.delete(&cfg, &machine_ref(), off(PowerOffMode::Hard), limits(), g.clone()).await.unwrap();
    assert_eq!(vc.vm_names().await.unwrap(), before);

    let mut nowhere = machine(vcsim::TEMPLATE);
    nowhere.disks.push(Disk { name: "data".into(), size_gib: 1, target: "no-such-datastore".into() });
    let e = d.create(&cfg, &nowhere, limits(), g).await.unwrap_err();
    assert!(matches!(&e, CallError::Guest(GuestError::InvalidSpec(m)) if m.contains("disk data") && m.contains("no-such-datastore")), "{e}");
    assert_eq!(vc.vm_names().await.unwrap(), before, "nothing was cloned for a machine refused");
}

/// A machine's hardware, changed after it was made (a grown class), reaches the VM when the
/// host calls `create` again with the VM off: vCenter's own numCPU, memoryMB and disk
/// capacities say so, the VM is the same one (no second clone), and `describe` reports the
/// hardware as vCenter holds it.
#[tokio::test]
async fn a_stopped_vm_is_grown_in_place_and_describe_reports_its_hardware() {
    let vc = Vcsim::start().await.unwrap();
    let store = SessionStore::new();
    let (d, cfg, g) = (driver(), config(&vc), grants(&vc, vcsim::PASSWORD, &store).await);
    let mut m = machine(vcsim::TEMPLATE);
    m.power_state = PowerState::PoweredOff;
    m.disks = vec![Disk { name: "root".into(), size_gib: 12, target: "LocalDS_0".into() }];
    d.create(&cfg, &m, limits(), g.clone()).await.unwrap();
    let vm = vc.find_vm(UID).await.unwrap().expect("the VM");
    let st = d.describe(&cfg, &machine_ref(), limits(), g.clone()).await.unwrap();
    let hw = st.hardware.expect("describe reports the hardware");
    assert_eq!((hw.cpus, hw.memory_mib), (m.cpus, m.memory_mib));
    assert_eq!(hw.disks.iter().map(|d| d.size_gib).collect::<Vec<_>>(), [12]);
    assert!(hw.disks[0].id.ends_with(".vmdk"), "{:?}", hw.disks);
    assert_eq!(hw.nics.iter().map(|n| n.mac.clone()).collect::<Vec<_>>(), vc.nic_macs(&vm).await.unwrap());

    m.cpus += 1;
    m.memory_mib *= 2;
    m.disks[0].size_gib = 16;
    d.create(&cfg, &m, limits(), g.clone()).await.unwrap();
    assert_eq!(vc.find_vm(UID).await.unwrap().as_ref(), Some(&vm), "the same VM, not a second clone");
    assert_eq!(vc.vm_property(&vm, "config.hardware.numCPU").await.unwrap(), Some(m.cpus.to_string()));
    assert_eq!(vc.vm_property(&vm, "config.hardware.memoryMB").await.unwrap(), Some(m.memory_mib.to_string()));
    assert_eq!(vc.virtual_disks(&vm).await.unwrap().iter().map(|(kib, _)| *kib).collect::<Vec<_>>(), [16 << 20]);
    let hw = d.describe(&cfg, &machine_ref(), limits(), g.clone()).await.unwrap().hardware.unwrap();
    assert_eq!((hw.cpus, hw.memory_mib, hw.disks[0].size_gib), (m.cpus, m.memory_mib, 16));
    d.delete(&cfg, &machine_ref(), off(PowerOffMode::Hard), limits(), g).await.unwrap();
}

/// A VM of this machine left without a disk (a clone that failed half-way, played by
/// taking the disks off) holds no data: the next create destroys it and says the machine
/// is being cloned again; the one after clones it anew, with its disk.
#[tokio::test]
async fn a_vm_left_without_a_disk_by_a_broken_clone_is_cloned_again() {
    let vc = Vcsim::start().await.unwrap();
    let store = SessionStore::new();
    let (d, cfg, g) = (driver(), config(&vc), grants(&vc, vcsim::PASSWORD, &store).await);
    let mut m = machine(vcsim::TEMPLATE);
    // Never powered on, as a clone that failed half-way.
    m.power_state = PowerState::PoweredOff;
    m.disks = vec![Disk { name: "root".into(), size_gib: 12, target: "LocalDS_0".into() }];
    d.create(&cfg, &m, limits(), g.clone()).await.unwrap();
    let broken = vc.find_vm(UID).await.unwrap().expect("the VM");
    vc.remove_disks(&broken).await.unwrap();
    assert_eq!(vc.virtual_disks(&broken).await.unwrap(), []);
    let e = d.create(&cfg, &m, limits(), g.clone()).await.unwrap_err();
    assert!(matches!(&e, CallError::Guest(GuestError::Unavailable(msg)) if msg.contains("without a disk") && msg.contains("cloned again")), "{e}");
    assert_eq!(vc.find_vm(UID).await.unwrap(), None, "the broken VM is destroyed");
    d.create(&cfg, &m, limits(), g.clone()).await.unwrap();
    let vm = vc.find_vm(UID).await.unwrap().expect("the VM cloned again");
    assert_ne!(vm, broken);
    assert_eq!(vc.virtual_disks(&vm).await.unwrap().iter().map(|(kib, _)| *kib).collect::<Vec<_>>(), [12 << 20]);
    d.delete(&cfg, &machine_ref(), off(PowerOffMode::Hard), limits(), g).await.unwrap();
}

/// Static addresses reach the guest as cloud-init reads them on vSphere: the
/// `guestinfo.metadata` vcsim holds, decoded, carries a version 2 network configuration
/// that matches each NIC by the MAC vcsim reports for the VM's card.
#[tokio::test]
async fn static_addresses_reach_guestinfo_metadata_matched_by_mac() {
    let vc = Vcsim::start().await.unwrap();
    let store = SessionStore::new();
    let (d, cfg, g) = (driver(), config(&vc), grants(&vc, vcsim::PASSWORD, &store).await);
    let mut m = machine(vcsim::TEMPLATE);
    m.nics[0].ip = Some(IpConfig {
        addresses: vec!["10.0.0.5/24".into()],
        gateway: Some("10.0.0.1".into()),
        nameservers: vec!["10.0.0.2".into()],
        search_domains: vec!["lab.example".into()],
    });
    d.create(&cfg, &m, limits(), g.clone()).await.unwrap();
    let vm = vc.find_vm(UID).await.unwrap().expect("the VM");
    let macs = vc.nic_macs(&vm).await.unwrap();
    let [mac] = macs.as_slice() else { panic!("one card: {macs:?}") };
    assert!(mac.starts_with("00:50:56:"), "a manual MAC in VMware's range: {mac}");
    let meta = vc.extra_config(&vm, "guestinfo.metadata").await.unwrap().expect("guestinfo.metadata");
    use base64::Engine as _;
    let meta: serde_json::Value = serde_json::from_slice(&base64::engine::general_purpose::STANDARD.decode(meta).unwrap()).unwrap();
    let eth0 = &meta["network"]["ethernets"]["eth0"];
    assert_eq!(meta["network"]["version"], 2, "{meta}");
    assert_eq!(eth0["match"]["macaddress"], mac.as_str(), "{meta}");
    assert_eq!(eth0["addresses"], serde_json::json!(["10.0.0.5/24"]), "{meta}");
    assert_eq!(eth0["routes"], serde_json::json!([{"to": "0.0.0.0/0", "via": "10.0.0.1"}]), "{meta}");
    assert_eq!(eth0["nameservers"], serde_json::json!({"addresses": ["10.0.0.2"], "search": ["lab.example"]}), "{meta}");
    assert_eq!(meta["instance-id"], UID);
    d.delete(&cfg, &machine_ref(), off(PowerOffMode::Hard), limits(), g).await.unwrap();
}

/// Ignition user-data goes where Ignition's VMware platform reads it
/// (`guestinfo.ignition.config.data`, base64), read back from vcsim; never to cloud-init's key.
#[tokio::test]
async fn ignition_reaches_guestinfo_ignition_config_data() {
    let vc = Vcsim::start().await.unwrap();
    let store = SessionStore::new();
    let (d, cfg, g) = (driver(), config(&vc), grants(&vc, vcsim::PASSWORD, &store).await);
    let mut m = machine(vcsim::TEMPLATE);
    let ignition = r#"{"ignition":{"version":"3.4.0"}}"#;
    m.user_data = Some(ignition.into());
    m.user_data_format = UserDataFormat::Ignition;
    d.create(&cfg, &m, limits(), g.clone()).await.unwrap();
    let vm = vc.find_vm(UID).await.unwrap().expect("the VM");
    assert_eq!(vc.extra_config(&vm, "guestinfo.ignition.config.data").await.unwrap(), Some(b64(ignition)));
    assert_eq!(vc.extra_config(&vm, "guestinfo.ignition.config.data.encoding").await.unwrap().as_deref(), Some("base64"));
    assert_eq!(vc.extra_config(&vm, "guestinfo.userdata").await.unwrap(), None, "not handed to cloud-init");
    d.delete(&cfg, &machine_ref(), off(PowerOffMode::Hard), limits(), g).await.unwrap();
}

fn image_request(name: &str, digest: &str, datastore: &str) -> banlieue_runtime::provider::ImageRequest {
    banlieue_runtime::provider::ImageRequest {
        name: name.into(),
        source: ImageSource::Url(banlieue_runtime::provider::UrlSource { url: "https://images.example/os.img".into(), checksum: Some(digest.into()) }),
        target: Some(datastore.into()),
    }
}

#[tokio::test]
async fn an_image_becomes_a_template_through_an_nfc_lease_the_host_streams_to() {
    let vc = Vcsim::start().await.unwrap();
    let store = SessionStore::new();
    let d = driver();
    let cfg = config(&vc);
    let g = grants(&vc, vcsim::PASSWORD, &store).await;
    let dir = tempfile::tempdir().unwrap();
    let image = common::image_grant(dir.path(), 64, "vmdk");
    let request = image_request("debian", &image.digest, "LocalDS_0");
    let template = format!("image-debian-{}", &image.digest[7..19]);

    // Without the host's image there is nothing to send, and nothing is made in vCenter.
    let denied = d.import_image(&cfg, &request, limits(), g.clone()).await.unwrap_err();
    assert!(matches!(denied, CallError::Guest(GuestError::Denied(_))), "{denied:?}");
    assert_eq!(vc.is_template(&template).await.unwrap(), None);

    // The host streams the VMDK to the lease's upload URL; vcsim receives every byte and the
    // imported VM is a template.
    let with_image = Grants { transfer: Some(image.clone()), ..g.clone() };
    let before = banlieue_runtime::usage::snapshot().transferred_bytes;
    let status = d.import_image(&cfg, &request, limits(), with_image.clone()).await.unwrap();
    assert_eq!(status.phase, banlieue_runtime::provider::ImagePhase::Ready, "{status:?}");
    assert_eq!(status.reference.as_deref(), Some(template.as_str()));
    assert_eq!(vc.is_template(&template).await.unwrap(), Some(true), "vCenter has the template");
    let uploads = vc.nfc_uploads().unwrap();
    assert_eq!(uploads.iter().map(|(_, n)| *n).collect::<Vec<_>>(), vec![image.size], "vcsim received the whole VMDK once: {uploads:?}");
    assert!(banlieue_runtime::usage::snapshot().transferred_bytes - before >= image.size);

    // Importing again finds the template: no second upload.
    d.import_image(&cfg, &request, limits(), with_image.clone()).await.unwrap();
    assert_eq!(vc.nfc_uploads().unwrap().len(), 1);

    // A machine clones from it.
    d.create(&cfg, &machine(&template), limits(), g.clone()).await.unwrap();
    assert!(vc.find_vm(UID).await.unwrap().is_some(), "the machine was cloned from the imported template");
    d.delete(&cfg, &machine_ref(), off(PowerOffMode::Hard), limits(), g.clone()).await.unwrap();

    // delete-image removes it from vCenter, and only names of this image's imports.
    let wrong = d.delete_image(&cfg, &request, vcsim::TEMPLATE, limits(), g.clone()).await.unwrap_err();
    assert!(matches!(wrong, CallError::Guest(GuestError::InvalidSpec(_))), "{wrong:?}");
    assert_eq!(vc.is_template(vcsim::TEMPLATE).await.unwrap(), Some(true));
    d.delete_image(&cfg, &request, &template, limits(), g.clone()).await.unwrap();
    assert_eq!(vc.is_template(&template).await.unwrap(), None, "the template is gone");
    d.delete_image(&cfg, &request, &template, limits(), g.clone()).await.unwrap();

    // An image in a format vSphere does not take is refused before anything is made.
    let qcow2 = common::image_grant(tempfile::tempdir().unwrap().path(), 16, "qcow2");
    let request = image_request("other", &qcow2.digest, "LocalDS_0");
    let refused = d.import_image(&cfg, &request, limits(), Grants { transfer: Some(qcow2), ..g.clone() }).await.unwrap_err();
    assert!(matches!(refused, CallError::Guest(GuestError::InvalidSpec(ref m)) if m.contains("imageFormat")), "{refused:?}");
    // A datastore vCenter does not have, likewise.
    let request = image_request("debian", &image.digest, "no-such-datastore");
    let refused = d.import_image(&cfg, &request, limits(), with_image).await.unwrap_err();
    assert!(matches!(refused, CallError::Guest(GuestError::InvalidSpec(_))), "{refused:?}");
    assert_eq!(vc.nfc_uploads().unwrap().len(), 1, "nothing more was uploaded");
}
