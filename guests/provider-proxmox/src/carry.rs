//! `disk-import`: a machine made from the disks carried from another backend (a move that
//! keeps the VM's data). There is no `disk-export`: see the crate's documentation.
//!
//! PVE fetches the carried disks itself, as it fetches images ([`crate::import`]): the host
//! serves each at a one-time URL (`transfer.carried-url`), `download-url` puts it on a storage
//! of the machine's node that holds `import` content as `carry-{uid}-{i}.{qcow2|raw}`, and the
//! VM is created with `scsi{i}` = `{disks[i].target}:0,import-from={that file}` (the boot disk
//! `scsi0`), named and described as `create` names and describes a clone (`{name}.{namespace}`,
//! the `banlieue-uid:` line). It then gets `create`'s configuration (CPUs, memory, firmware,
//! NICs, cloud-init, further declared disks, the UID tag last) and its disks grow to their
//! declared sizes; it is left powered off and the downloaded files are removed. The host's
//! `create` afterwards finds it by its UID tag as it finds any machine's VM, and only has its
//! power state left to bring.
//!
//! - Idempotent by UID: a VM tagged with it is returned as it is. One that carries the UID only
//!   in its description was made by a call cut off before its configuration: while PVE still
//!   holds it locked (importing) it is `unavailable`, to be asked again; else it is configured
//!   now. Files a cut-off call downloaded are removed before anything is downloaded again.
//! - Refused with nothing made (`invalid-spec`): a carried disk that is neither qcow2 nor raw
//!   (what the host converts to follows the ProviderClass's `imageFormat`), fewer declared
//!   disks than carried ones, a declared disk smaller than its carried disk's virtual size.
//! - A failure removes the VM and the files the call made, except when PVE may still be
//!   importing from the files (the create task's end could not be learnt): the VM and files
//!   stay for the retry, which finishes the VM and removes them.

use banlieue_sdk::provider::{Condition, Firmware, Machine, MachineStatus, ProviderConfig, Result};
use banlieue_sdk::transfer::{self, CarriedDisk};
use banlieue_sdk::{Error, info, warn};

use crate::pve::Pve;
use crate::{Vm, api, import};

/// Disks a VM can have on its SCSI controller (`scsi0` to `scsi30`).
const SCSI_SLOTS: usize = 31;
const GIB: u64 = 1 << 30;

/// What the downloaded files of machine `uid` start with.
pub fn file_prefix(uid: &str) -> String {
    format!("carry-{uid}-")
}

/// The file carried disk `index` of machine `uid` is downloaded to. PVE takes a file of
/// `import` content only with a disk image's extension, and reads its format from it.
pub fn file_name(uid: &str, index: usize, format: &str) -> String {
    format!("{}{index}.{format}", file_prefix(uid))
}

/// One carried disk on its way into the VM.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Landing {
    /// The host's name for the carried disk.
    pub carried: String,
    /// The file it is downloaded to, on the node's `import` storage.
    pub file: String,
    /// The VM's drive it becomes (`scsi0` for the boot disk).
    pub drive: String,
    /// The storage it is imported onto: the declared disk's.
    pub target: String,
}

impl Landing {
    /// The downloaded file's volume id on import storage `stage`.
    pub fn volid(&self, stage: &str) -> String {
        format!("{stage}:import/{}", self.file)
    }
}

/// Which declared disk each carried disk becomes, by position (the boot disk first): refused
/// when none was carried, more were than a VM takes, the machine declares fewer disks than
/// were carried or one smaller than what it carries (a disk is never shrunk), or a carried
/// disk is in a format PVE is not given here.
pub fn plan(machine: &Machine, carried: &[CarriedDisk]) -> Result<Vec<Landing>> {
    let who = format!("machine {}/{}", machine.namespace, machine.name);
    if carried.is_empty() {
        return Err(Error::InvalidSpec(format!("no disks were carried for {who}")));
    }
    if carried.len() > SCSI_SLOTS {
        return Err(Error::InvalidSpec(format!("{} disks were carried for {who}; a Proxmox VE VM takes at most {SCSI_SLOTS} SCSI disks", carried.len())));
    }
    if machine.disks.len() < carried.len() {
        return Err(Error::InvalidSpec(format!(
            "{} disks were carried; {who} declares {}: declare at least as many",
            carried.len(),
            machine.disks.len()
        )));
    }
    let mut out = Vec::new();
    for (i, (disk, from)) in machine.disks.iter().zip(carried).enumerate() {
        // The host converts carried disks to what the ProviderClass's imageFormat says (qcow2
        // for `source`); PVE reads the format from the file name, so only what it imports as
        // is taken (a stream-optimised VMDK is an upload format, not a disk to run from).
        if !matches!(from.format.as_str(), "qcow2" | "raw") {
            return Err(Error::InvalidSpec(format!(
                "carried disk {} is {}; the Proxmox VE driver imports qcow2 or raw (set the ProviderClass's imageFormat to source, qcow2 or raw)",
                from.name, from.format
            )));
        }
        if disk.size_gib.saturating_mul(GIB) < from.virtual_size {
            let need = from.virtual_size.div_ceil(GIB);
            return Err(Error::InvalidSpec(format!(
                "carried disk {} holds {need} GiB; disk {} declares {} GiB and a disk is never shrunk: declare at least {need} GiB",
                from.name, disk.name, disk.size_gib
            )));
        }
        out.push(Landing { carried: from.name.clone(), file: file_name(&machine.uid, i, &from.format), drive: format!("scsi{i}"), target: disk.target.clone() });
    }
    Ok(out)
}

/// The create request of the machine's VM (all but `vmid`): named and described as `create`
/// names and describes a clone, so that a call cut off after it is found and finished; each
/// carried disk imported from its file on import storage `stage`, booting from the first.
pub fn create_params(machine: &Machine, vm_name: &str, plan: &[Landing], stage: &str) -> Vec<(String, String)> {
    let mut params: Vec<(String, String)> = vec![
        ("name".into(), vm_name.to_string()),
        ("description".into(), api::description(&machine.namespace, &machine.name, &machine.uid)),
        ("scsihw".into(), "virtio-scsi-pci".into()),
    ];
    for l in plan {
        // Size 0 with import-from: the new volume takes the imported disk's virtual size.
        params.push((l.drive.clone(), format!("{}:0,import-from={}", l.target, l.volid(stage))));
    }
    params.push(("boot".into(), "order=scsi0".into()));
    // As for an imported image: the guests banlieue makes are Linux, and the type only tunes
    // PVE's defaults for the guest.
    params.push(("ostype".into(), "l26".into()));
    if machine.firmware == Firmware::Uefi {
        // A UEFI guest keeps its boot entries in EFI variables: without this disk OVMF starts
        // from a temporary copy each boot (`configure` sets `bios=ovmf`).
        params.push(("efidisk0".into(), format!("{}:1,efitype=4m", machine.disks[0].target)));
    }
    params
}

/// Make `machine` from the carried disks, or return the VM already made for it.
pub fn import(config: &ProviderConfig, machine: &Machine) -> Result<MachineStatus> {
    let vm_name = crate::check_machine(machine)?;
    let pve = Pve::connect(config)?;
    if let Some(vm) = crate::find(&pve, &machine.uid, &vm_name)? {
        if vm.tagged {
            return crate::status(&pve, &vm, Vec::new());
        }
        return resume(&pve, vm, machine, &vm_name);
    }

    let carried = transfer::carried()?;
    let plan = plan(machine, &carried)?;
    let node = if machine.failure_domain.is_empty() { import::place(&pve, &machine.disks[0].target)?.0 } else { machine.failure_domain.clone() };
    crate::check_target(&pve, machine, &node)?;
    let stage = import::import_storage(&pve, &node)?;
    // What a call cut off downloaded, before the files are downloaded again under the same names.
    for (n, volid) in import::staged(&pve, &file_prefix(&machine.uid))? {
        warn!("removing {volid}, downloaded by a disk-import that did not finish");
        import::remove_volume(&pve, &n, &volid)?;
    }

    let mut downloaded = Vec::new();
    let what = format!("{vm_name} from {} carried disk(s)", plan.len());
    let made = download(&pve, &node, &stage, &plan, &mut downloaded)
        .and_then(|()| import::create_vm(&pve, &node, &create_params(machine, &vm_name, &plan, &stage), import::DOWNLOAD_TIMEOUT_MS, &what));
    let vmid = match made {
        Ok(vmid) => vmid,
        Err(e) => {
            // A create whose end could not be learnt may still be importing from the files:
            // they stay while its VM does, and the retry that finishes it removes them.
            match crate::find(&pve, &machine.uid, &vm_name) {
                Ok(None) => remove(&pve, &downloaded),
                _ => warn!("VM {vm_name} may still be importing the carried disks: the downloaded files stay until a retry finishes it"),
            }
            return Err(e);
        }
    };
    info!("created VM {vmid} ({vm_name}) on {node} from {} carried disk(s)", plan.len());
    settle(&pve, Vm { node, vmid, lock: String::new(), tagged: false }, machine, &downloaded)
}

/// A VM a cut-off call made (it carries the UID in its description, not yet the tag):
/// configured now unless PVE is still at it.
fn resume(pve: &Pve, vm: Vm, machine: &Machine, vm_name: &str) -> Result<MachineStatus> {
    let lock = api::text(&pve.get(&format!("{}/status/current", vm.path()))?, "lock").to_string();
    let lock = if lock.is_empty() { vm.lock.clone() } else { lock };
    if !lock.is_empty() {
        return Err(Error::Unavailable(format!(
            "VM {} ({vm_name}) on {} is still being made from the carried disks (locked: {lock}); a lock its node left when it went down is lifted with `qm unlock {}`",
            vm.vmid, vm.node, vm.vmid
        )));
    }
    info!("configuring VM {} ({vm_name}), made from carried disks by a disk-import that did not finish", vm.vmid);
    let files = import::staged(pve, &file_prefix(&machine.uid))?;
    settle(pve, vm, machine, &files)
}

/// Give the VM `create`'s configuration and the declared disk sizes, then remove the files it
/// was imported from; a VM that cannot be finished is removed too.
fn settle(pve: &Pve, mut vm: Vm, machine: &Machine, files: &[(String, String)]) -> Result<MachineStatus> {
    let finished = finish(pve, &vm, machine);
    if let Err(e) = &finished {
        warn!("removing VM {}, made from carried disks: {}", vm.vmid, e.message());
        if let Err(d) = import::destroy(pve, &vm.node, vm.vmid) {
            warn!("could not remove VM {}: {}", vm.vmid, d.message());
        }
    }
    remove(pve, files);
    let extra = finished?;
    vm.tagged = true;
    crate::status(pve, &vm, extra)
}

/// What `create` does to a VM it cloned, without powering it on: the configuration (the UID
/// tag last), then every disk grown to its declared size.
fn finish(pve: &Pve, vm: &Vm, machine: &Machine) -> Result<Vec<Condition>> {
    let extra = crate::configure(pve, vm, machine)?;
    crate::apply_hardware(pve, vm, machine)?;
    Ok(extra)
}

/// Have `node` download each carried disk to its file on `stage`, one after the other (each
/// URL works for a short time only); `downloaded` gets every file asked for.
fn download(pve: &Pve, node: &str, stage: &str, plan: &[Landing], downloaded: &mut Vec<(String, String)>) -> Result<()> {
    let path = format!("/nodes/{}/storage/{}/download-url", api::encode(node), api::encode(stage));
    for l in plan {
        let url = transfer::carried_url(&l.carried)?;
        let volid = l.volid(stage);
        let what = format!("downloading carried disk {} to {volid}", l.carried);
        info!("Proxmox VE node {node} downloads carried disk {} to {volid}", l.carried);
        let params = [("content".to_string(), "import".to_string()), ("filename".to_string(), l.file.clone()), ("url".to_string(), url)];
        let upid = pve.task("POST", &path, &params).map_err(|e| e.context(&what))?;
        downloaded.push((node.to_string(), volid));
        pve.wait_task(&upid, import::DOWNLOAD_TIMEOUT_MS, &what)?;
    }
    Ok(())
}

/// Remove downloaded files: a file that stays is only space, so a failure is reported, not returned.
fn remove(pve: &Pve, files: &[(String, String)]) {
    for (node, volid) in files {
        if let Err(e) = import::remove_volume(pve, node, volid) {
            warn!("could not remove the downloaded {volid}: {}", e.message());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use banlieue_sdk::provider::{Disk, ImageSource, PowerState, UserDataFormat};

    const UID: &str = "0a1b2c3d-0000-4000-8000-0000000003aa";

    fn machine(sizes: &[u64]) -> Machine {
        Machine {
            uid: UID.into(),
            name: "web".into(),
            namespace: "default".into(),
            cpus: 2,
            memory_mib: 2048,
            firmware: Firmware::Bios,
            disks: sizes
                .iter()
                .enumerate()
                .map(|(i, s)| Disk { name: ["root", "data", "more"][i].into(), size_gib: *s, target: ["local-lvm", "shared-dir", "local-lvm"][i].into() })
                .collect(),
            nics: vec![],
            image: ImageSource::Template("9000".into()),
            user_data: None,
            user_data_format: UserDataFormat::CloudConfig,
            failure_domain: "pve1".into(),
            power_state: PowerState::PoweredOn,
            labels: vec![],
        }
    }

    fn carried(name: &str, format: &str, virtual_size: u64) -> CarriedDisk {
        CarriedDisk { name: name.into(), format: format.into(), size: 1 << 20, virtual_size }
    }

    #[test]
    fn files_are_named_after_the_machine_and_the_disks_position_and_format() {
        assert_eq!(file_name(UID, 0, "qcow2"), format!("carry-{UID}-0.qcow2"));
        assert_eq!(file_name(UID, 2, "raw"), format!("carry-{UID}-2.raw"));
        assert!(file_name(UID, 1, "qcow2").starts_with(&file_prefix(UID)));
        // PVE's names of import files: letters, digits and `-._+=`.
        assert!(file_name(UID, 30, "qcow2").bytes().all(|b| b.is_ascii_alphanumeric() || b"-._+=".contains(&b)));
    }

    #[test]
    fn each_carried_disk_lands_on_its_declared_disks_storage_boot_disk_first() {
        let plan = plan(&machine(&[10, 2, 5]), &[carried("root", "qcow2", 10 * GIB), carried("data", "raw", 3 * GIB / 2)]).unwrap();
        let got: Vec<(&str, &str, &str, &str)> = plan.iter().map(|l| (l.carried.as_str(), l.file.as_str(), l.drive.as_str(), l.target.as_str())).collect();
        assert_eq!(got, [
            ("root", format!("carry-{UID}-0.qcow2").as_str(), "scsi0", "local-lvm"),
            ("data", format!("carry-{UID}-1.raw").as_str(), "scsi1", "shared-dir"),
        ]);
        assert_eq!(plan[1].volid("local"), format!("local:import/carry-{UID}-1.raw"));
    }

    #[test]
    fn the_vm_is_created_named_and_described_for_create_with_one_imported_drive_per_carried_disk() {
        let m = machine(&[10, 2, 5]);
        let plan = plan(&m, &[carried("root", "qcow2", 10 * GIB), carried("data", "qcow2", GIB)]).unwrap();
        let params = create_params(&m, "web.default", &plan, "local");
        let want: Vec<(String, String)> = [
            ("name", "web.default".to_string()),
            ("description", format!("banlieue machine default/web\nbanlieue-uid: {UID}\n")),
            ("scsihw", "virtio-scsi-pci".into()),
            ("scsi0", format!("local-lvm:0,import-from=local:import/carry-{UID}-0.qcow2")),
            ("scsi1", format!("shared-dir:0,import-from=local:import/carry-{UID}-1.qcow2")),
            ("boot", "order=scsi0".into()),
            ("ostype", "l26".into()),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v))
        .collect();
        assert_eq!(params, want);
        // The description is what `find` recognises a VM left by a cut-off call by; the tag
        // comes with the configuration.
        let description = &params[1].1;
        assert!(api::description_has_uid(description, UID));
        assert!(!params.iter().any(|(k, _)| k == "tags" || k == "start" || k == "vmid"));
    }

    #[test]
    fn a_uefi_machine_gets_a_disk_for_its_efi_variables_on_the_boot_disks_storage() {
        let mut m = machine(&[10]);
        m.firmware = Firmware::Uefi;
        let plan = plan(&m, &[carried("root", "qcow2", GIB)]).unwrap();
        let params = create_params(&m, "web.default", &plan, "local");
        assert_eq!(params.last(), Some(&("efidisk0".to_string(), "local-lvm:1,efitype=4m".to_string())));
    }

    #[test]
    fn fewer_or_smaller_disks_other_formats_or_none_are_refused() {
        let refused = |sizes: &[u64], disks: &[CarriedDisk], says: &str| {
            let e = plan(&machine(sizes), disks).unwrap_err();
            assert!(matches!(&e, Error::InvalidSpec(m) if m.contains(says)), "{says}: {e:?}");
        };
        refused(&[10], &[carried("root", "qcow2", 10 * GIB), carried("data", "qcow2", GIB)], "declare at least as many");
        refused(&[9], &[carried("root", "qcow2", 10 * GIB)], "at least 10 GiB");
        // A virtual size past a whole GiB needs the next one.
        refused(&[10], &[carried("root", "raw", 10 * GIB + 1)], "at least 11 GiB");
        refused(&[10], &[carried("root", "vmdk", GIB)], "imageFormat");
        refused(&[10], &[], "no disks were carried");
        let many: Vec<CarriedDisk> = (0..32).map(|i| carried(&format!("d{i}"), "qcow2", GIB)).collect();
        refused(&[10], &many, "at most 31");
        assert!(plan(&machine(&[10]), &[carried("root", "raw", 10 * GIB)]).is_ok(), "a disk exactly as large fits");
    }
}
