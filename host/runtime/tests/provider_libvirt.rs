//! The libvirt provider driver (`guests/provider-libvirt`) against libvirt's `test:///default`
//! driver, through the runtime with a libvirt grant. Every check of what the driver did is made on
//! the same connection it was granted.
//!
//! Within one process, `test:///default` connections open at the same time share one state (it
//! resets once every connection is closed), so each test holds [`LOCK`] while its connection is open.

mod common;

use banlieue_libvirt::{DomainState, Libvirt};
use banlieue_runtime::capability::Grants;
use banlieue_runtime::capability::libvirt::LibvirtGrant;
use banlieue_runtime::provider::{
    Disk, Firmware, ImageSource, IpConfig, Machine, MachinePhase, MachineRef, Nic, PowerOff, PowerOffMode, PowerState,
    ProviderConfig, ProviderDriver, UserDataFormat,
};
use banlieue_runtime::{CallError, GuestError, Limits, Runtime, RuntimeConfig};
use common::guest;

const URI: &str = "test:///default";
const UID: &str = "6f1c2a3e-1111-4222-8333-444455556666";
const OTHER_UID: &str = "0b7e9a51-2222-4333-8444-555566667777";

/// Serialises the tests: they share the test driver's state.
static LOCK: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// The turn to use the test driver (declared first, so dropped after the connection), the driver,
/// and a test:///default connection granted to it.
async fn setup() -> (tokio::sync::MutexGuard<'static, ()>, ProviderDriver, Libvirt, Grants) {
    let turn = LOCK.lock().await;
    let conn = banlieue_libvirt::Connections::new().get(URI).await.expect("open test:///default");
    let rt = Runtime::new(RuntimeConfig::default()).unwrap();
    let driver = rt.provider(&guest("provider-libvirt")).unwrap();
    let grants = Grants { libvirt: Some(LibvirtGrant { conn: conn.clone() }), ..Grants::default() };
    (turn, driver, conn, grants)
}

fn config() -> ProviderConfig {
    ProviderConfig {
        provider: "infra/host-a".into(),
        endpoint: URI.into(),
        credential_keys: vec![],
        storage_classes: vec![("standard".into(), "default-pool".into()), ("ghost".into(), "no-such-pool".into())],
        network_classes: vec![("default".into(), "default".into()), ("dmz".into(), "no-such-network".into())],
        features: vec!["uefi".into()],
    }
}

fn machine(uid: &str) -> Machine {
    Machine {
        uid: uid.into(),
        name: "vm".into(),
        namespace: "ns".into(),
        cpus: 2,
        memory_mib: 512,
        firmware: Firmware::Uefi,
        disks: vec![
            Disk { name: "root".into(), size_gib: 10, target: "default-pool".into() },
            Disk { name: "data".into(), size_gib: 1, target: "default-pool".into() },
        ],
        nics: vec![Nic { name: "eth0".into(), network: "default".into(), ip: None }],
        image: ImageSource::BackingFile("/var/lib/banlieue/images/debian-12 & co.qcow2".into()),
        user_data: Some("#cloud-config\nhostname: vm\n".into()),
        user_data_format: UserDataFormat::CloudConfig,
        failure_domain: "host-a".into(),
        power_state: PowerState::PoweredOn,
        labels: vec![],
    }
}

fn machine_ref(uid: &str) -> MachineRef {
    MachineRef {
        uid: uid.into(),
        name: "vm".into(),
        namespace: "ns".into(),
        provider_id: None,
        failure_domain: "host-a".into(),
        backend_id: None,
    }
}

fn power_off(mode: PowerOffMode) -> PowerOff {
    PowerOff { mode, timeout_ms: 5_000 }
}

fn limits() -> Limits {
    Limits::default()
}

async fn domains_named(conn: &Libvirt, name: &str) -> Vec<banlieue_libvirt::DomainInfo> {
    conn.domain_list().await.unwrap().into_iter().filter(|d| d.name == name).collect()
}

async fn volumes(conn: &Libvirt) -> Vec<String> {
    let mut names: Vec<String> = conn.volume_list("default-pool").await.unwrap().into_iter().map(|v| v.name).collect();
    names.sort();
    names
}

fn invalid_spec(result: Result<impl std::fmt::Debug, CallError>, needle: &str) {
    match result {
        Err(CallError::Guest(GuestError::InvalidSpec(m))) => {
            assert!(m.contains(needle), "{m:?} does not mention {needle:?}")
        }
        other => panic!("expected invalid-spec mentioning {needle:?}, got {other:?}"),
    }
}

/// Static addresses on libvirt's test driver (no seed there: the driver records the
/// network-config in the domain's metadata, as it would write it into the seed): each NIC
/// carries the MAC the configuration matches it by, read back from libvirt's domain XML.
#[tokio::test]
async fn static_addresses_pin_each_mac_and_the_network_config_matches_it() {
    let (_turn, driver, conn, grants) = setup().await;
    let mut m = machine(UID);
    m.nics[0].ip = Some(IpConfig {
        addresses: vec!["192.168.122.50/24".into()],
        gateway: Some("192.168.122.1".into()),
        nameservers: vec![],
        search_domains: vec![],
    });
    m.nics.push(Nic { name: "eth1".into(), network: "default".into(), ip: None });
    driver.create(&config(), &m, limits(), grants.clone()).await.unwrap();
    let xml = conn.domain_xml("ns_vm").await.unwrap();
    let macs: Vec<&str> = xml.split("<mac address=").skip(1).filter_map(|r| r.get(1..18)).collect();
    assert_eq!(macs.len(), 2, "{xml}");
    let encoded = xml.split("<banlieue:network-config").nth(1).and_then(|r| r.split_once('>')).and_then(|(_, r)| r.split('<').next()).expect("network-config in the metadata");
    use base64::Engine as _;
    let network: serde_json::Value = serde_json::from_slice(&base64::engine::general_purpose::STANDARD.decode(encoded).unwrap()).unwrap();
    assert_eq!(network["ethernets"]["eth0"]["match"]["macaddress"], macs[0], "{network}");
    assert_eq!(network["ethernets"]["eth0"]["addresses"], serde_json::json!(["192.168.122.50/24"]));
    assert_eq!(network["ethernets"]["eth1"]["match"]["macaddress"], macs[1]);
    assert_eq!(network["ethernets"]["eth1"]["dhcp4"], true);
    driver.delete(&config(), &machine_ref(UID), power_off(PowerOffMode::Hard), limits(), grants).await.unwrap();
}

/// Ignition user-data goes to the QEMU firmware configuration entry Ignition reads, as
/// libvirt holds the domain; not to cloud-init.
#[tokio::test]
async fn ignition_reaches_the_firmware_configuration() {
    let (_turn, driver, conn, grants) = setup().await;
    let mut m = machine(UID);
    m.user_data = Some(r#"{"ignition":{"version":"3.4.0"}}"#.into());
    m.user_data_format = UserDataFormat::Ignition;
    driver.create(&config(), &m, limits(), grants.clone()).await.unwrap();
    let xml = conn.domain_xml("ns_vm").await.unwrap();
    let entry = xml.split("<entry name=").nth(1).expect("a fw_cfg entry");
    assert!(entry.starts_with("'opt/com.coreos/config'>") || entry.starts_with("\"opt/com.coreos/config\">"), "{xml}");
    assert!(entry.contains("{&quot;ignition&quot;:{&quot;version&quot;:&quot;3.4.0&quot;}}") || entry.contains(r#"{"ignition":{"version":"3.4.0"}}"#), "{xml}");
    assert!(xml.contains("<sysinfo type=") && xml.contains("fwcfg"), "{xml}");
    assert!(!xml.contains("banlieue:user-data"), "not recorded as cloud-init user-data: {xml}");
    driver.delete(&config(), &machine_ref(UID), power_off(PowerOffMode::Hard), limits(), grants).await.unwrap();
}

#[tokio::test]
async fn probe_reports_the_host_and_its_mapped_classes() {
    let (_turn, driver, conn, grants) = setup().await;
    let inv = driver.probe(&config(), limits(), grants).await.unwrap();
    assert!(inv.backend_version.as_deref().is_some_and(|v| v.contains("libvirt")), "{inv:?}");
    let [fd] = inv.failure_domains.as_slice() else { panic!("one failure domain: {inv:?}") };
    assert_eq!(fd.name, "host-a");
    assert!(fd.labels.contains(&("banlieue.io/host".to_string(), "host-a".to_string())), "{:?}", fd.labels);
    assert_eq!(fd.storage_classes, vec!["standard".to_string()], "the unmapped pool is not offered");
    assert_eq!(fd.network_classes, vec!["default".to_string()], "the unmapped network is not offered");
    assert_eq!(fd.features, vec!["uefi".to_string()]);
    // The test node has 16 CPUs; storage is what default-pool has free (100 GiB when untouched).
    let pool = conn.pool_list().await.unwrap().into_iter().find(|p| p.name == "default-pool").unwrap();
    assert_eq!((fd.capacity.cpus, fd.capacity.storage_gib), (16, pool.available_bytes >> 30), "{:?}", fd.capacity);
}

#[tokio::test]
async fn machine_lifecycle() {
    let (_turn, driver, conn, grants) = setup().await;
    let cfg = config();

    // create: one domain with the machine's UID as its UUID, running, with its volumes.
    let status = driver.create(&cfg, &machine(UID), limits(), grants.clone()).await.unwrap();
    assert_eq!(status.provider_id, format!("libvirt://{UID}"));
    assert_eq!(status.power_state, PowerState::PoweredOn);
    assert!(status.provisioned);
    let [domain] = domains_named(&conn, "ns_vm").await.try_into().unwrap();
    assert_eq!(domain.uuid, UID);
    assert_eq!(domain.state, DomainState::Running);
    assert_eq!((domain.vcpus, domain.memory_kib), (2, 512 * 1024));
    assert_eq!(volumes(&conn).await, vec!["ns_vm_data.qcow2".to_string(), "ns_vm_root.qcow2".to_string()]);
    let xml = conn.domain_xml("ns_vm").await.unwrap();
    for part in [
        "<title>ns/vm</title>",
        "https://banlieue.io/libvirt/v1",
        "firmware='efi'",
        "volume='ns_vm_root.qcow2'",
        "network='default'",
    ] {
        assert!(xml.contains(part), "{part} not in {xml}");
    }

    // create again with the same UID: the same machine, no second domain.
    let again = driver.create(&cfg, &machine(UID), limits(), grants.clone()).await.unwrap();
    assert_eq!(again.provider_id, status.provider_id);
    assert_eq!(domains_named(&conn, "ns_vm").await.len(), 1);
    assert_eq!(conn.domain_list().await.unwrap().iter().filter(|d| d.uuid == UID).count(), 1);

    // Another machine (UID) with the same namespace/name is refused.
    invalid_spec(
        driver.create(&cfg, &machine(OTHER_UID), limits(), grants.clone()).await,
        "belongs to another machine",
    );
    // ...and does not see, power or delete this one.
    let e = driver.describe(&cfg, &machine_ref(OTHER_UID), limits(), grants.clone()).await.unwrap_err();
    assert!(matches!(e, CallError::Guest(GuestError::NotFound(_))), "{e}");
    driver.delete(&cfg, &machine_ref(OTHER_UID), power_off(PowerOffMode::TrySoft), limits(), grants.clone()).await.unwrap();
    assert_eq!(domains_named(&conn, "ns_vm").await.len(), 1);

    let described = driver.describe(&cfg, &machine_ref(UID), limits(), grants.clone()).await.unwrap();
    assert_eq!(described.provider_id, format!("libvirt://{UID}"));
    assert_eq!(described.power_state, PowerState::PoweredOn);
    // The addresses are what libvirt reports for the domain's interfaces (the test driver makes some up).
    let leased: Vec<String> = conn
        .domain_addresses("ns_vm", banlieue_libvirt::AddressSource::Lease)
        .await
        .unwrap()
        .into_iter()
        .flat_map(|i| i.addresses.into_iter().map(|a| a.address))
        .collect();
    assert!(!leased.is_empty());
    assert_eq!(described.addresses.iter().map(|a| a.address.clone()).collect::<Vec<_>>(), leased);

    // Power off in every mode (the test driver honours an ACPI shutdown at once) and on again.
    for mode in [PowerOffMode::Soft, PowerOffMode::TrySoft, PowerOffMode::Hard] {
        let off = driver.set_power(&cfg, &machine_ref(UID), PowerState::PoweredOff, power_off(mode), limits(), grants.clone()).await.unwrap();
        assert_eq!(off.power_state, PowerState::PoweredOff, "{mode:?}");
        assert_eq!(off.phase, MachinePhase::PoweredOff, "{mode:?}");
        assert_eq!(conn.domain_state("ns_vm").await.unwrap(), DomainState::Shutoff, "{mode:?}");
        let off_again = driver.set_power(&cfg, &machine_ref(UID), PowerState::PoweredOff, power_off(mode), limits(), grants.clone()).await.unwrap();
        assert_eq!(off_again.power_state, PowerState::PoweredOff);
        let on = driver.set_power(&cfg, &machine_ref(UID), PowerState::PoweredOn, power_off(mode), limits(), grants.clone()).await.unwrap();
        assert_eq!(on.power_state, PowerState::PoweredOn);
        assert_eq!(on.phase, MachinePhase::Running);
        assert_eq!(conn.domain_state("ns_vm").await.unwrap(), DomainState::Running);
    }
    invalid_spec(
        driver.set_power(&cfg, &machine_ref(UID), PowerState::Suspended, power_off(PowerOffMode::TrySoft), limits(), grants.clone()).await,
        "does not suspend",
    );

    // delete: domain and volumes gone; again is fine; then the machine is not found.
    driver.delete(&cfg, &machine_ref(UID), power_off(PowerOffMode::TrySoft), limits(), grants.clone()).await.unwrap();
    assert!(domains_named(&conn, "ns_vm").await.is_empty());
    assert!(volumes(&conn).await.is_empty(), "{:?}", volumes(&conn).await);
    driver.delete(&cfg, &machine_ref(UID), power_off(PowerOffMode::TrySoft), limits(), grants.clone()).await.unwrap();
    let e = driver.describe(&cfg, &machine_ref(UID), limits(), grants.clone()).await.unwrap_err();
    assert!(matches!(e, CallError::Guest(GuestError::NotFound(_))), "{e}");
    let e = driver.set_power(&cfg, &machine_ref(UID), PowerState::PoweredOn, power_off(PowerOffMode::TrySoft), limits(), grants).await.unwrap_err();
    assert!(matches!(e, CallError::Guest(GuestError::NotFound(_))), "{e}");
    assert_eq!(
        conn.domain_state("test").await.unwrap(),
        DomainState::Running,
        "the test driver's own domain is untouched"
    );
}

#[tokio::test]
async fn retries_after_a_crash_reuse_and_clean_up_volumes() {
    let (_turn, driver, conn, grants) = setup().await;
    let cfg = config();
    // A create that crashed after its first volume; a volume of another machine alongside.
    for name in ["ns_vm_root.qcow2", "ns_vm-2_root.qcow2"] {
        let xml = format!("<volume><name>{name}</name><capacity unit='GiB'>10</capacity></volume>");
        conn.volume_create("default-pool", xml).await.unwrap();
    }
    let mut m = machine(UID);
    m.power_state = PowerState::PoweredOff;
    let status = driver.create(&cfg, &m, limits(), grants.clone()).await.unwrap();
    assert_eq!(status.power_state, PowerState::PoweredOff);
    assert_eq!(conn.domain_state("ns_vm").await.unwrap(), DomainState::Shutoff);
    assert_eq!(
        volumes(&conn).await,
        vec!["ns_vm-2_root.qcow2".to_string(), "ns_vm_data.qcow2".to_string(), "ns_vm_root.qcow2".to_string()]
    );

    // A delete that crashed after undefining the domain left the volumes behind: a retry removes them.
    conn.domain_undefine("ns_vm").await.unwrap();
    driver.delete(&cfg, &machine_ref(UID), power_off(PowerOffMode::TrySoft), limits(), grants).await.unwrap();
    assert_eq!(volumes(&conn).await, vec!["ns_vm-2_root.qcow2".to_string()], "only this machine's volumes go");
}

#[tokio::test]
async fn invalid_specs_are_refused_and_create_nothing() {
    let (_turn, driver, conn, grants) = setup().await;
    let cfg = config();
    let mut m = machine(UID);
    m.nics[0].network = "no-such-network".into();
    invalid_spec(driver.create(&cfg, &m, limits(), grants.clone()).await, "no-such-network");
    let mut m = machine(UID);
    m.disks[1].target = "no-such-pool".into();
    invalid_spec(driver.create(&cfg, &m, limits(), grants.clone()).await, "no-such-pool");
    let mut m = machine(UID);
    m.image = ImageSource::Template("debian-12".into());
    invalid_spec(driver.create(&cfg, &m, limits(), grants.clone()).await, "backingFile");
    let mut m = machine(UID);
    m.disks.clear();
    invalid_spec(driver.create(&cfg, &m, limits(), grants.clone()).await, "at least one disk");
    let mut m = machine("not-a-uuid");
    m.name = "vm".into();
    invalid_spec(driver.create(&cfg, &m, limits(), grants).await, "not a UUID");
    assert!(domains_named(&conn, "ns_vm").await.is_empty());
    assert!(volumes(&conn).await.is_empty());
}

#[tokio::test]
async fn without_the_libvirt_grant_every_call_is_denied() {
    let (_turn, driver, conn, _) = setup().await;
    let cfg = config();
    let denied = |e: CallError| assert!(matches!(e, CallError::Guest(GuestError::Denied(_))), "{e}");
    denied(driver.probe(&cfg, limits(), Grants::default()).await.unwrap_err());
    denied(driver.create(&cfg, &machine(UID), limits(), Grants::default()).await.unwrap_err());
    denied(driver.describe(&cfg, &machine_ref(UID), limits(), Grants::default()).await.unwrap_err());
    denied(driver.delete(&cfg, &machine_ref(UID), power_off(PowerOffMode::TrySoft), limits(), Grants::default()).await.unwrap_err());
    assert!(domains_named(&conn, "ns_vm").await.is_empty());
}

/// Snapshots on the test driver, checked on libvirt's own list: taken once (a retry with the
/// same name adopts it), memory only when running, reverted to, deleted; a domain with
/// snapshots is still deleted whole.
#[tokio::test]
async fn snapshots_are_taken_once_reverted_to_and_deleted() {
    use banlieue_runtime::provider::SnapshotRequest;
    let (_turn, driver, conn, grants) = setup().await;
    let mut m = machine(UID);
    m.power_state = PowerState::PoweredOff;
    driver.create(&config(), &m, limits(), grants.clone()).await.unwrap();
    let r = machine_ref(UID);
    let names = |list: Vec<banlieue_libvirt::SnapshotInfo>| list.into_iter().map(|s| s.name).collect::<Vec<_>>();
    let request = |name: &str, memory: bool| SnapshotRequest { name: name.into(), description: "before the upgrade".into(), memory, quiesce: false };

    // Memory of a shut-off domain and quiesce: refused, nothing taken.
    invalid_spec(driver.snapshot_create(&config(), &r, &request("bl-a", true), limits(), grants.clone()).await, "spec.memory");
    let quiesce = SnapshotRequest { quiesce: true, ..request("bl-a", false) };
    invalid_spec(driver.snapshot_create(&config(), &r, &quiesce, limits(), grants.clone()).await, "spec.quiesce");
    assert!(conn.snapshot_list("ns_vm").await.unwrap().is_empty());

    let a = driver.snapshot_create(&config(), &r, &request("bl-a", false), limits(), grants.clone()).await.unwrap();
    assert_eq!((a.id.as_str(), a.description.as_str(), a.memory, a.current), ("bl-a", "before the upgrade", false, true));
    assert!(a.created_at.is_some());
    let again = driver.snapshot_create(&config(), &r, &request("bl-a", false), limits(), grants.clone()).await.unwrap();
    assert_eq!(again.id, a.id);
    assert_eq!(names(conn.snapshot_list("ns_vm").await.unwrap()), ["bl-a"], "a retry adopts, never takes a second");

    // Running: the snapshot holds the memory.
    driver.set_power(&config(), &r, PowerState::PoweredOn, power_off(PowerOffMode::Hard), limits(), grants.clone()).await.unwrap();
    let b = driver.snapshot_create(&config(), &r, &request("bl-b", true), limits(), grants.clone()).await.unwrap();
    assert!(b.memory && b.current, "{b:?}");
    let listed = driver.snapshot_list(&config(), &r, limits(), grants.clone()).await.unwrap();
    assert_eq!(listed.iter().map(|s| (s.id.as_str(), s.current)).collect::<Vec<_>>(), [("bl-a", false), ("bl-b", true)]);

    // Revert to the first (the host powers off first), then libvirt says it is current.
    driver.set_power(&config(), &r, PowerState::PoweredOff, power_off(PowerOffMode::Hard), limits(), grants.clone()).await.unwrap();
    driver.snapshot_revert(&config(), &r, "bl-a", limits(), grants.clone()).await.unwrap();
    let current: Vec<_> = conn.snapshot_list("ns_vm").await.unwrap().into_iter().filter(|s| s.current).map(|s| s.name).collect();
    assert_eq!(current, ["bl-a"]);
    match driver.snapshot_revert(&config(), &r, "bl-nope", limits(), grants.clone()).await {
        Err(CallError::Guest(GuestError::NotFound(_))) => {}
        other => panic!("{other:?}"),
    }

    driver.snapshot_delete(&config(), &r, "bl-b", limits(), grants.clone()).await.unwrap();
    driver.snapshot_delete(&config(), &r, "bl-b", limits(), grants.clone()).await.expect("already gone is success");
    assert_eq!(names(conn.snapshot_list("ns_vm").await.unwrap()), ["bl-a"]);

    // The domain goes with its remaining snapshot.
    driver.delete(&config(), &r, power_off(PowerOffMode::Hard), limits(), grants.clone()).await.unwrap();
    assert!(domains_named(&conn, "ns_vm").await.is_empty());
    driver.snapshot_delete(&config(), &r, "bl-a", limits(), grants).await.expect("no domain, no snapshot");
}
