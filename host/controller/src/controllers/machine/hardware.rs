//! A machine's hardware: what its backend reports, against what its spec asks for — the
//! changes a class change makes to a machine that exists (CPUs, memory, disk sizes).
//! Applying them is the driver's `create` on the existing machine while it is off
//! (contract 0.5.0); this module says what differs and what may never be done.

use banlieue_api::infra::{DiskStatus, InterfaceStatus, MachineHardware, ResolvedVm};
use banlieue_runtime::provider as wit;

/// The backend's hardware in the API's words, disks and NICs the driver left unnamed
/// named after the spec's by position.
pub(super) fn reported(vm: &ResolvedVm, hw: &wit::Hardware) -> MachineHardware {
    let name = |given: &str, of_spec: Option<&str>, i: usize, what: &str| match (given, of_spec) {
        ("", Some(n)) => n.to_string(),
        ("", None) => format!("{what}{i}"),
        (given, _) => given.to_string(),
    };
    MachineHardware {
        cpus: hw.cpus,
        memory_mib: hw.memory_mib,
        disks: hw
            .disks
            .iter()
            .enumerate()
            .map(|(i, d)| DiskStatus { name: name(&d.name, vm.disks.get(i).map(|d| d.name.as_str()), i, "disk"), size_gib: d.size_gib, id: d.id.clone() })
            .collect(),
        interfaces: hw
            .nics
            .iter()
            .enumerate()
            .map(|(i, n)| InterfaceStatus {
                name: name(&n.name, vm.nics.get(i).map(|n| n.name.as_str()), i, "nic"),
                mac: n.mac.clone(),
                network: n.network.clone(),
                addresses: vm.nics.get(i).map(|n| n.ip.addresses.clone()).unwrap_or_default(),
            })
            .collect(),
    }
}

/// How the backend's hardware differs from the spec.
#[derive(Debug, Default, PartialEq, Eq)]
pub(super) struct Changes {
    /// What a reconfiguration while off brings to the spec (`2 → 4 CPUs`).
    pub apply: Vec<String>,
    /// What is never done: a disk shrunk.
    pub refused: Vec<String>,
}

impl Changes {
    pub fn none(&self) -> bool {
        self.apply.is_empty() && self.refused.is_empty()
    }

    /// `NotAppliedInPlace`'s message: what the backend still lacks after it was asked.
    pub fn not_applied(&self) -> String {
        format!("the backend still differs: {} (its driver does not apply this in place)", self.apply.join(", "))
    }
}

/// How the hardware a driver reported (`observed`) differs from `want`; nothing when the
/// driver reports none.
pub(super) fn pending(want: &ResolvedVm, observed: Option<&wit::Hardware>) -> Changes {
    observed.map(|hw| changes(want, &reported(want, hw))).unwrap_or_default()
}

/// The changes to make to a machine's hardware while it is off, and for an adopted one the
/// hardware its driver's `reconfigure` is asked for (the others take theirs from `create`).
/// An adopted machine keeps the hardware it came with unless its VM says `applyClass`.
pub(super) fn wanted(want: &ResolvedVm, observed: Option<&wit::Hardware>) -> (Changes, Option<wit::HardwareTarget>) {
    match (&want.adopt, observed) {
        (None, _) => (pending(want, observed), None),
        (Some(a), Some(hw)) if a.apply_class => {
            let (changes, target) = to_class(want, &reported(want, hw));
            (changes, Some(target))
        }
        (Some(_), _) => (Changes::default(), None),
    }
}

/// What differs between `want` (the machine's spec) and `have` (the backend). Disks are
/// matched by name (drivers name them after the spec, or the host by position); a disk
/// the backend lacks is a change too (some backends add it while off; the others leave it,
/// and the change stays pending for the user to see).
pub(super) fn changes(want: &ResolvedVm, have: &MachineHardware) -> Changes {
    let mut c = Changes::default();
    if want.cpus != have.cpus {
        c.apply.push(format!("{} → {} CPUs", have.cpus, want.cpus));
    }
    if want.memory_mib != have.memory_mib {
        c.apply.push(format!("{} → {} MiB of memory", have.memory_mib, want.memory_mib));
    }
    for d in &want.disks {
        match have.disks.iter().find(|h| h.name == d.name) {
            Some(h) if d.size_gib > h.size_gib => c.apply.push(format!("disk {} {} → {} GiB", d.name, h.size_gib, d.size_gib)),
            Some(h) if d.size_gib < h.size_gib => {
                c.refused.push(format!("disk {} holds {} GiB and is never shrunk to {} GiB", d.name, h.size_gib, d.size_gib))
            }
            Some(_) => {}
            None => c.apply.push(format!("disk {} ({} GiB) added", d.name, d.size_gib)),
        }
    }
    c
}

/// What bringing an adopted VM (`have`) to its class (`want`, `spec.adopt.applyClass`)
/// changes — CPUs, memory, each disk grown by position; a disk the class makes smaller is
/// refused, disks the VM lacks are not added — and the hardware to ask its driver for.
pub(super) fn to_class(want: &ResolvedVm, have: &MachineHardware) -> (Changes, wit::HardwareTarget) {
    let mut c = Changes::default();
    if want.cpus != have.cpus {
        c.apply.push(format!("{} → {} CPUs", have.cpus, want.cpus));
    }
    if want.memory_mib != have.memory_mib {
        c.apply.push(format!("{} → {} MiB of memory", have.memory_mib, want.memory_mib));
    }
    let mut sizes = Vec::with_capacity(have.disks.len());
    for (i, h) in have.disks.iter().enumerate() {
        let size = match want.disks.get(i) {
            Some(w) if w.size_gib > h.size_gib => {
                c.apply.push(format!("disk {} {} → {} GiB", h.name, h.size_gib, w.size_gib));
                w.size_gib
            }
            Some(w) if w.size_gib < h.size_gib => {
                c.refused.push(format!("disk {} holds {} GiB and is never shrunk to the class's {} ({} GiB)", h.name, h.size_gib, w.name, w.size_gib));
                h.size_gib
            }
            _ => h.size_gib,
        };
        sizes.push(size);
    }
    (c, wit::HardwareTarget { cpus: want.cpus, memory_mib: want.memory_mib, disk_sizes_gib: sizes })
}

/// How an adopted VM's hardware (`have`) differs from its class (`want`), disk by disk in
/// order (an adopted VM's disks are named by its backend, not after the class).
pub(super) fn differences(want: &ResolvedVm, have: &MachineHardware) -> Vec<String> {
    let mut d = Vec::new();
    if want.cpus != have.cpus {
        d.push(format!("{} CPUs, the class says {}", have.cpus, want.cpus));
    }
    if want.memory_mib != have.memory_mib {
        d.push(format!("{} MiB of memory, the class says {}", have.memory_mib, want.memory_mib));
    }
    for (i, w) in want.disks.iter().enumerate() {
        match have.disks.get(i) {
            Some(h) if h.size_gib != w.size_gib => d.push(format!("disk {} of {} GiB, the class's {} has {} GiB", h.name, h.size_gib, w.name, w.size_gib)),
            Some(_) => {}
            None => d.push(format!("no disk for the class's {} ({} GiB)", w.name, w.size_gib)),
        }
    }
    if have.disks.len() > want.disks.len() {
        d.push(format!("{} disks, the class has {}", have.disks.len(), want.disks.len()));
    }
    d
}

#[cfg(test)]
mod tests {
    use super::*;
    use banlieue_api::infra::{ResolvedDisk, ResolvedNic};

    fn spec(cpus: u32, memory_mib: u64, disks: &[(&str, u64)]) -> ResolvedVm {
        ResolvedVm {
            cpus,
            memory_mib,
            disks: disks.iter().map(|(n, s)| ResolvedDisk { name: n.to_string(), size_gib: *s, ..Default::default() }).collect(),
            nics: vec![ResolvedNic { name: "eth0".into(), ..Default::default() }],
            ..Default::default()
        }
    }

    #[test]
    fn an_adopted_vm_is_brought_to_its_class_by_position_never_shrunk() {
        let have = |disks: &[u64]| MachineHardware {
            cpus: 1,
            memory_mib: 512,
            disks: disks.iter().enumerate().map(|(i, s)| DiskStatus { name: format!("vd{i}"), size_gib: *s, id: String::new() }).collect(),
            interfaces: vec![],
        };
        let (c, target) = to_class(&spec(2, 1024, &[("root", 10), ("data", 4)]), &have(&[8, 4, 1]));
        assert_eq!(c.apply, ["1 → 2 CPUs", "512 → 1024 MiB of memory", "disk vd0 8 → 10 GiB"]);
        assert!(c.refused.is_empty());
        assert_eq!((target.cpus, target.memory_mib, target.disk_sizes_gib), (2, 1024, vec![10, 4, 1]), "the disk the class lacks is kept");
        let (c, target) = to_class(&spec(1, 512, &[("root", 4), ("data", 9)]), &have(&[8]));
        assert_eq!(c.refused, ["disk vd0 holds 8 GiB and is never shrunk to the class's root (4 GiB)"]);
        assert!(c.apply.is_empty(), "a disk the VM lacks is not added: {:?}", c.apply);
        assert_eq!(target.disk_sizes_gib, [8], "never asked to shrink");
    }

    #[test]
    fn unnamed_disks_and_nics_take_the_specs_names_by_position() {
        let hw = wit::Hardware {
            cpus: 2,
            memory_mib: 1024,
            disks: vec![
                wit::DiskStatus { name: String::new(), size_gib: 8, id: "[ds] vm/vm.vmdk".into() },
                wit::DiskStatus { name: String::new(), size_gib: 2, id: "[ds] vm/vm_1.vmdk".into() },
            ],
            nics: vec![wit::NicStatus { name: String::new(), mac: "00:50:56:00:00:01".into(), network: "VM Network".into() }],
        };
        let got = reported(&spec(2, 1024, &[("root", 8)]), &hw);
        let names: Vec<&str> = got.disks.iter().map(|d| d.name.as_str()).collect();
        assert_eq!(names, ["root", "disk1"], "a disk beyond the spec's keeps a name of its own");
        assert_eq!((got.interfaces[0].name.as_str(), got.interfaces[0].mac.as_str()), ("eth0", "00:50:56:00:00:01"));
    }

    #[test]
    fn an_adopted_vm_is_compared_with_its_class_disk_by_disk_in_order() {
        let have = MachineHardware {
            cpus: 2,
            memory_mib: 2048,
            disks: vec![DiskStatus { name: "vda".into(), size_gib: 4, id: "p".into() }, DiskStatus { name: "vdb".into(), size_gib: 1, id: "q".into() }],
            interfaces: vec![],
        };
        assert_eq!(differences(&spec(2, 2048, &[("root", 4), ("data", 1)]), &have), Vec::<String>::new(), "names differ, sizes match");
        assert_eq!(differences(&spec(1, 1024, &[("root", 8)]), &have), [
            "2 CPUs, the class says 1",
            "2048 MiB of memory, the class says 1024",
            "disk vda of 4 GiB, the class's root has 8 GiB",
            "2 disks, the class has 1"
        ]);
    }

    #[test]
    fn growth_is_applied_shrinking_is_refused_and_equal_is_nothing() {
        let have = MachineHardware {
            cpus: 1,
            memory_mib: 512,
            disks: vec![DiskStatus { name: "root".into(), size_gib: 4, id: "p".into() }],
            interfaces: vec![],
        };
        assert!(changes(&spec(1, 512, &[("root", 4)]), &have).none());
        let grown = changes(&spec(2, 1024, &[("root", 6), ("data", 1)]), &have);
        assert_eq!(grown.apply, ["1 → 2 CPUs", "512 → 1024 MiB of memory", "disk root 4 → 6 GiB", "disk data (1 GiB) added"]);
        assert!(grown.refused.is_empty());
        let fewer = changes(&spec(1, 256, &[("root", 2)]), &have);
        assert_eq!(fewer.apply, ["512 → 256 MiB of memory"], "less memory is a change like more");
        assert_eq!(fewer.refused, ["disk root holds 4 GiB and is never shrunk to 2 GiB"]);
    }
}
