//! The libvirt provider driver on a real hypervisor: libvirtd with qemu (TCG), the shared test
//! backend of `banlieue-test-backends` (pool and DHCP network `banlieue`, a busybox guest that
//! boots in ~10 s). Every check is made on libvirt's side: `virsh`, the network's DHCP leases and
//! the serial console log libvirt keeps — never only on what the driver reports.
//!
//! Needs root (libvirtd); a machine that cannot start libvirtd fails these tests.

mod common;

use std::time::{Duration, Instant};

use banlieue_runtime::capability::Grants;
use banlieue_runtime::capability::libvirt::LibvirtGrant;
use banlieue_runtime::provider::{
    Disk, Firmware, ImageSource, Machine, MachineRef, Nic, PowerOff, PowerOffMode, PowerState, ProviderConfig, ProviderDriver, UserDataFormat,
};
use banlieue_runtime::{CallError, GuestError, Limits, Runtime, RuntimeConfig};
use banlieue_test_backends::libvirtd::{Libvirtd, wait_for, wait_for_async};
use common::guest;

const BOOT: Duration = Duration::from_secs(120);

struct Env {
    lv: &'static Libvirtd,
    driver: ProviderDriver,
    grants: Grants,
    config: ProviderConfig,
}

async fn env() -> Env {
    let lv = Libvirtd::shared().expect("libvirtd with qemu (tests/backends/libvirtd/start.sh, needs root)");
    let conn = banlieue_libvirt::Connections::new().get(&lv.uri).await.expect("connect to libvirtd");
    let rt = Runtime::new(RuntimeConfig::default()).unwrap();
    let driver = rt.provider(&guest("provider-libvirt")).unwrap();
    let config = ProviderConfig {
        provider: "infra/kvm-1".into(),
        endpoint: lv.uri.clone(),
        credential_keys: vec![],
        storage_classes: vec![("standard".into(), lv.pool.clone())],
        network_classes: vec![("default".into(), lv.network.clone())],
        features: vec![],
    };
    Env { lv, driver, grants: Grants { libvirt: Some(LibvirtGrant { conn }), ..Grants::default() }, config }
}

/// A one-CPU, 256 MiB machine in namespace `ns` booting the test guest, with `user_data`.
fn machine(lv: &Libvirtd, name: &str, uid: &str, user_data: &str) -> Machine {
    Machine {
        uid: uid.into(),
        name: name.into(),
        namespace: "qemu-test".into(),
        cpus: 1,
        memory_mib: 256,
        firmware: Firmware::Bios,
        disks: vec![Disk { name: "root".into(), size_gib: 2, target: lv.pool.clone() }],
        nics: vec![Nic { name: "eth0".into(), network: lv.network.clone(), ip: None }],
        image: ImageSource::BackingFile(lv.guest_disk()),
        user_data: Some(user_data.into()),
        user_data_format: UserDataFormat::CloudConfig,
        failure_domain: "kvm-1".into(),
        power_state: PowerState::PoweredOn,
        labels: vec![],
    }
}

fn machine_ref(m: &Machine) -> MachineRef {
    MachineRef { uid: m.uid.clone(), name: m.name.clone(), namespace: m.namespace.clone(), provider_id: None, failure_domain: m.failure_domain.clone(), backend_id: None }
}

fn off(mode: PowerOffMode, seconds: u32) -> PowerOff {
    PowerOff { mode, timeout_ms: seconds * 1000 }
}

fn limits() -> Limits {
    Limits::default()
}

fn domain(m: &Machine) -> String {
    format!("{}_{}", m.namespace, m.name)
}

/// Wait until the guest printed `needle` on its serial console.
async fn console_shows(lv: &Libvirtd, domain: &str, needle: &str) {
    wait_for(&format!("{domain} printing {needle:?}"), BOOT, || Ok(lv.serial_log(domain).contains(needle).then_some(())))
        .await
        .unwrap_or_else(|e| panic!("{e}\nserial log:\n{}", lv.serial_log(domain)));
}

#[tokio::test]
async fn a_guest_boots_with_its_user_data_and_reports_its_dhcp_address() {
    let env = env().await;
    let lv = env.lv;
    let uid = "9a7f3c10-0000-4000-8000-00000000b007";
    let m = machine(lv, "boot", uid, "#cloud-config\n#banlieue-marker: booted-with-user-data\n");
    let name = domain(&m);
    lv.remove(&name, &format!("{name}_"));

    let status = env.driver.create(&env.config, &m, limits(), env.grants.clone()).await.unwrap();
    assert_eq!(status.provider_id, format!("libvirt://{uid}"));
    assert_eq!(status.power_state, PowerState::PoweredOn);
    // libvirt's view: one running domain with the machine's UID, the overlay (resized to the
    // class's 2 GiB) and the seed in the pool.
    assert_eq!(lv.state(&name).unwrap(), "running");
    assert_eq!(lv.uuid(&name).unwrap(), uid);
    assert_eq!(lv.volumes(&format!("{name}_")).unwrap(), vec![format!("{name}_cidata.img"), format!("{name}_root.qcow2")]);
    let info = lv.virsh(&["vol-info", "--pool", &lv.pool, &format!("{name}_root.qcow2"), "--bytes"]).unwrap();
    assert!(info.contains(&(2u64 << 30).to_string()), "{info}");
    let vol_xml = lv.virsh(&["vol-dumpxml", "--pool", &lv.pool, &format!("{name}_root.qcow2")]).unwrap();
    assert!(vol_xml.contains(&lv.guest_disk()), "the overlay's backing file is the image: {vol_xml}");

    // The guest read the seed: the instance ID from meta-data, the marker from user-data.
    console_shows(lv, &name, "banlieue-guest: marker=booted-with-user-data").await;
    assert!(lv.serial_log(&name).contains(&format!("banlieue-guest: instance-id={uid}")), "{}", lv.serial_log(&name));

    // The address the driver reports is the network's lease for the domain's MAC.
    let mac = lv.mac(&name).unwrap();
    let described = wait_for_async("an address in describe", BOOT, || async {
        let s = env.driver.describe(&env.config, &machine_ref(&m), limits(), env.grants.clone()).await?;
        Ok((!s.addresses.is_empty()).then_some(s))
    })
    .await
    .unwrap();
    let leased = lv.leases(&mac).unwrap();
    assert_eq!(described.addresses.iter().map(|a| a.address.clone()).collect::<Vec<_>>(), leased);
    assert!(leased[0].starts_with("192.168.123."), "{leased:?}");
    // (udhcpc prints it once its lease script ran, a moment after dnsmasq recorded the lease.)
    console_shows(lv, &name, &format!("banlieue-guest: eth0 address={}/", leased[0])).await;

    // delete: domain, overlay and seed gone.
    env.driver.delete(&env.config, &machine_ref(&m), off(PowerOffMode::Hard, 0), limits(), env.grants.clone()).await.unwrap();
    assert!(lv.domains(&name).unwrap().is_empty());
    assert!(lv.volumes(&format!("{name}_")).unwrap().is_empty());
}

/// A machine's hardware, changed after it was made (a grown class), reaches the domain when
/// the host calls `create` again with it shut off: libvirt's own definition says so (vCPUs,
/// memory), the root volume is grown (`vol-info`), the domain keeps its UUID, and `describe`
/// reports the hardware as libvirt holds it. A smaller disk is refused and changes nothing.
#[tokio::test]
async fn a_shut_off_domain_is_grown_in_place_and_describe_reports_its_hardware() {
    let env = env().await;
    let lv = env.lv;
    let uid = "9a7f3c10-0000-4000-8000-00000000b0b0";
    let mut m = machine(lv, "grow", uid, "#cloud-config\n");
    m.power_state = PowerState::PoweredOff;
    let name = domain(&m);
    lv.remove(&name, &format!("{name}_"));
    env.driver.create(&env.config, &m, limits(), env.grants.clone()).await.unwrap();
    let hw = env.driver.describe(&env.config, &machine_ref(&m), limits(), env.grants.clone()).await.unwrap().hardware.expect("describe reports the hardware");
    assert_eq!((hw.cpus, hw.memory_mib), (1, 256));
    let root = format!("{name}_root.qcow2");
    assert_eq!(hw.disks.iter().map(|d| (d.name.as_str(), d.size_gib)).collect::<Vec<_>>(), [("root", 2)], "the seed is no disk of the machine");
    assert!(hw.disks[0].id.ends_with(&root), "{:?}", hw.disks);
    assert_eq!(hw.nics.iter().map(|n| (n.mac.clone(), n.network.clone())).collect::<Vec<_>>(), [(lv.mac(&name).unwrap(), lv.network.clone())]);

    m.cpus = 2;
    m.memory_mib = 512;
    m.disks[0].size_gib = 3;
    env.driver.create(&env.config, &m, limits(), env.grants.clone()).await.unwrap();
    let xml = lv.virsh(&["dumpxml", "--inactive", &name]).unwrap();
    assert!(xml.contains("<memory unit='KiB'>524288</memory>") && xml.contains(">2</vcpu>"), "{xml}");
    assert_eq!(lv.uuid(&name).unwrap(), uid, "the same domain");
    let info = lv.virsh(&["vol-info", "--pool", &lv.pool, &root, "--bytes"]).unwrap();
    assert!(info.contains(&(3u64 << 30).to_string()), "{info}");
    let hw = env.driver.describe(&env.config, &machine_ref(&m), limits(), env.grants.clone()).await.unwrap().hardware.unwrap();
    assert_eq!((hw.cpus, hw.memory_mib, hw.disks[0].size_gib), (2, 512, 3));

    m.disks[0].size_gib = 2;
    let e = env.driver.create(&env.config, &m, limits(), env.grants.clone()).await.unwrap_err();
    assert!(matches!(&e, CallError::Guest(GuestError::InvalidSpec(msg)) if msg.contains("never shrunk")), "{e}");
    let info = lv.virsh(&["vol-info", "--pool", &lv.pool, &root, "--bytes"]).unwrap();
    assert!(info.contains(&(3u64 << 30).to_string()), "nothing shrunk: {info}");

    env.driver.delete(&env.config, &machine_ref(&m), off(PowerOffMode::Hard, 0), limits(), env.grants.clone()).await.unwrap();
    assert!(lv.domains(&name).unwrap().is_empty());
}

#[tokio::test]
async fn soft_power_off_is_honoured_and_try_soft_escalates_on_a_guest_that_ignores_acpi() {
    let env = env().await;
    let lv = env.lv;
    let polite = machine(lv, "polite", "9a7f3c10-0000-4000-8000-0000000acb01", "#banlieue-marker: polite\n");
    let deaf = machine(lv, "deaf", "9a7f3c10-0000-4000-8000-0000000acb02", "#banlieue-marker: deaf\n#banlieue-acpid: off\n");
    for m in [&polite, &deaf] {
        lv.remove(&domain(m), &format!("{}_", domain(m)));
        env.driver.create(&env.config, m, limits(), env.grants.clone()).await.unwrap();
    }
    console_shows(lv, &domain(&polite), "banlieue-guest: acpid=on").await;
    console_shows(lv, &domain(&deaf), "banlieue-guest: acpid=off").await;
    console_shows(lv, &domain(&polite), "banlieue-guest: ready").await;
    console_shows(lv, &domain(&deaf), "banlieue-guest: ready").await;

    // Soft on a guest that handles ACPI: it powers itself off (its console says so).
    let s = env
        .driver
        .set_power(&env.config, &machine_ref(&polite), PowerState::PoweredOff, off(PowerOffMode::Soft, 60), limits(), env.grants.clone())
        .await
        .unwrap();
    assert_eq!(s.power_state, PowerState::PoweredOff);
    assert_eq!(lv.state(&domain(&polite)).unwrap(), "shut off");
    assert!(lv.serial_log(&domain(&polite)).contains("ACPI power button: powering off"), "{}", lv.serial_log(&domain(&polite)));

    // Soft on a guest that ignores ACPI: refused (retryable) at the timeout, and still running.
    let e = env
        .driver
        .set_power(&env.config, &machine_ref(&deaf), PowerState::PoweredOff, off(PowerOffMode::Soft, 3), limits(), env.grants.clone())
        .await
        .unwrap_err();
    assert!(matches!(e, CallError::Guest(GuestError::Unavailable(_))), "{e}");
    assert_eq!(lv.state(&domain(&deaf)).unwrap(), "running");
    // TrySoft: asks, waits out the timeout, then destroys.
    let started = Instant::now();
    let s = env
        .driver
        .set_power(&env.config, &machine_ref(&deaf), PowerState::PoweredOff, off(PowerOffMode::TrySoft, 4), limits(), env.grants.clone())
        .await
        .unwrap();
    assert!(started.elapsed() >= Duration::from_secs(4), "escalated before the timeout: {:?}", started.elapsed());
    assert_eq!(s.power_state, PowerState::PoweredOff);
    assert_eq!(lv.state(&domain(&deaf)).unwrap(), "shut off");
    assert!(!lv.serial_log(&domain(&deaf)).contains("ACPI power button"));

    for m in [&polite, &deaf] {
        env.driver.delete(&env.config, &machine_ref(m), off(PowerOffMode::Hard, 0), limits(), env.grants.clone()).await.unwrap();
        assert!(lv.domains(&domain(m)).unwrap().is_empty());
        assert!(lv.volumes(&format!("{}_", domain(m))).unwrap().is_empty());
    }
}

#[tokio::test]
async fn bad_input_is_named_and_leaves_nothing_behind() {
    let env = env().await;
    let lv = env.lv;
    let uid = "9a7f3c10-0000-4000-8000-0000000bad01";
    let prefix = "qemu-test_bad_";
    lv.remove("qemu-test_bad", prefix);
    let create = |m: Machine| {
        let (driver, config, grants) = (&env.driver, &env.config, env.grants.clone());
        async move { driver.create(config, &m, limits(), grants).await }
    };
    let message = |r: Result<_, CallError>| match r {
        Err(CallError::Guest(e)) => e.to_string(),
        other => panic!("expected a guest error, got {other:?}"),
    };

    // A backing file that does not exist.
    let mut m = machine(lv, "bad", uid, "");
    m.image = ImageSource::BackingFile("/nonexistent/banlieue/disk.qcow2".into());
    let msg = message(create(m).await);
    assert!(msg.contains("/nonexistent/banlieue/disk.qcow2"), "{msg}");
    assert_eq!(lv.volumes(prefix).unwrap(), Vec::<String>::new());

    // A seed above the documented size.
    let big = format!("#cloud-config\n{}", "#".repeat(1024 * 1024));
    let r = create(machine(lv, "bad", uid, &big)).await;
    assert!(matches!(&r, Err(CallError::Guest(GuestError::InvalidSpec(m))) if m.contains("at most 1048576 bytes")), "{r:?}");

    // A network that is defined but not active.
    let net = "banlieue-down";
    let _ = lv.virsh(&["net-undefine", net]);
    let net_xml = std::env::temp_dir().join("banlieue-down-net.xml");
    std::fs::write(&net_xml, format!("<network><name>{net}</name><bridge name='virbr-bl-down'/></network>")).unwrap();
    lv.virsh(&["net-define", net_xml.to_str().unwrap()]).unwrap();
    let mut m = machine(lv, "bad", uid, "");
    m.nics[0].network = net.into();
    let r = create(m).await;
    lv.virsh(&["net-undefine", net]).unwrap();
    assert!(matches!(&r, Err(CallError::Guest(GuestError::Unavailable(m))) if m.contains("banlieue-down") && m.contains("not active")), "{r:?}");

    // A pool with no room: a dir pool on a 1 MiB tmpfs.
    let dir = tempfile_dir("banlieue-tiny-pool");
    let mount = std::process::Command::new("mount").args(["-t", "tmpfs", "-o", "size=1m", "tmpfs"]).arg(&dir).status().unwrap();
    assert!(mount.success(), "mount a 1 MiB tmpfs on {}", dir.display());
    let _ = lv.virsh(&["pool-destroy", "tiny"]);
    let _ = lv.virsh(&["pool-undefine", "tiny"]);
    lv.virsh(&["pool-create-as", "tiny", "dir", "--target", dir.to_str().unwrap()]).unwrap();
    let mut m = machine(lv, "bad", uid, "#banlieue-marker: x\n");
    m.disks[0].target = "tiny".into();
    let r = create(m).await;
    let left = lv.virsh(&["vol-list", "tiny"]).unwrap();
    let _ = lv.virsh(&["pool-destroy", "tiny"]);
    let _ = std::process::Command::new("umount").arg(&dir).status();
    assert!(matches!(&r, Err(CallError::Guest(GuestError::Unavailable(m))) if m.contains("\"tiny\"") && m.contains("bytes free")), "{r:?}");
    assert!(left.trim().is_empty(), "volumes left in the tiny pool: {left}");

    assert!(lv.domains("qemu-test_bad").unwrap().is_empty());
    assert_eq!(lv.volumes(prefix).unwrap(), Vec::<String>::new());
}

fn tempfile_dir(name: &str) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("{name}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// The transfer grant of an `import-image` call for the image file at `path` (qcow2).
fn transfer_grant(path: &str) -> banlieue_runtime::capability::transfer::TransferGrant {
    use sha2::Digest as _;
    let bytes = std::fs::read(path).unwrap();
    let info = std::process::Command::new("qemu-img").args(["info", "--output=json", path]).output().unwrap();
    let info: serde_json::Value = serde_json::from_slice(&info.stdout).unwrap();
    banlieue_runtime::capability::transfer::TransferGrant {
        file: std::sync::Arc::new(std::fs::File::open(path).unwrap()),
        digest: format!("sha256:{}", hex::encode(sha2::Sha256::digest(&bytes))),
        format: "qcow2".into(),
        size: bytes.len() as u64,
        virtual_size: info["virtual-size"].as_u64().unwrap(),
    }
}

#[tokio::test]
async fn an_image_is_streamed_by_the_host_into_a_volume_and_a_guest_boots_from_it() {
    let env = env().await;
    let lv = env.lv;
    let grant = transfer_grant(&lv.guest_disk());
    let request = banlieue_runtime::provider::ImageRequest {
        name: "guest-image".into(),
        source: ImageSource::Url(banlieue_runtime::provider::UrlSource { url: "https://images.example/guest.qcow2".into(), checksum: Some(grant.digest.clone()) }),
        target: Some(lv.pool.clone()),
    };
    let volume = format!("image@guest-image@{}", &grant.digest[7..19]);
    let _ = lv.virsh(&["vol-delete", "--pool", &lv.pool, &volume]);

    // Without the host's image (no transfer grant) nothing can be sent, and nothing is left.
    let denied = env.driver.import_image(&env.config, &request, limits(), env.grants.clone()).await.unwrap_err();
    assert!(matches!(denied, CallError::Guest(GuestError::Denied(_))), "{denied:?}");
    assert!(lv.volumes("image@guest-image@").unwrap().is_empty());
    // With it but without the libvirt grant, neither.
    let only_transfer = Grants { transfer: Some(grant.clone()), ..Grants::default() };
    let denied = env.driver.import_image(&env.config, &request, limits(), only_transfer).await.unwrap_err();
    assert!(matches!(denied, CallError::Guest(GuestError::Denied(_))), "{denied:?}");

    // Streamed by the host: the volume holds exactly the image, byte for byte.
    let before = banlieue_runtime::usage::snapshot().transferred_bytes;
    let grants = Grants { transfer: Some(grant.clone()), ..env.grants.clone() };
    let status = env.driver.import_image(&env.config, &request, limits(), grants.clone()).await.unwrap();
    assert_eq!(status.phase, banlieue_runtime::provider::ImagePhase::Ready, "{status:?}");
    let path = lv.virsh(&["vol-path", "--pool", &lv.pool, &volume]).unwrap().trim().to_string();
    assert_eq!(status.reference.as_deref(), Some(path.as_str()));
    use sha2::Digest as _;
    assert_eq!(format!("sha256:{}", hex::encode(sha2::Sha256::digest(std::fs::read(&path).unwrap()))), grant.digest, "the volume's content is the image");
    assert!(banlieue_runtime::usage::snapshot().transferred_bytes - before >= grant.size, "the host sent the bytes");
    // Importing again replaces the volume (an earlier try may have been cut off).
    env.driver.import_image(&env.config, &request, limits(), grants).await.unwrap();
    assert_eq!(lv.volumes("image@guest-image@").unwrap(), vec![volume.clone()]);

    // A guest boots from the imported volume.
    let mut m = machine(lv, "from-import", "9a7f3c10-0000-4000-8000-0000000c0de1", "#banlieue-marker: booted-from-import\n");
    m.image = ImageSource::BackingFile(path.clone());
    let name = domain(&m);
    lv.remove(&name, &format!("{name}_"));
    env.driver.create(&env.config, &m, limits(), env.grants.clone()).await.unwrap();
    let vol_xml = lv.virsh(&["vol-dumpxml", "--pool", &lv.pool, &format!("{name}_root.qcow2")]).unwrap();
    assert!(vol_xml.contains(&path), "the overlay's backing file is the imported volume: {vol_xml}");
    console_shows(lv, &name, "banlieue-guest: marker=booted-from-import").await;
    env.driver.delete(&env.config, &machine_ref(&m), off(PowerOffMode::Hard, 0), limits(), env.grants.clone()).await.unwrap();
    lv.virsh(&["vol-delete", "--pool", &lv.pool, &volume]).unwrap();
}
