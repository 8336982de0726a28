//! How machines map onto libvirt names.

use banlieue_sdk::{Error, Result};

/// The domain of machine `namespace/name`: `{namespace}_{name}`. An underscore
/// cannot occur in a Kubernetes name, so the mapping is unambiguous.
pub fn domain_name(namespace: &str, name: &str) -> String {
    format!("{namespace}_{name}")
}

/// What every volume of machine `namespace/name` starts with.
pub fn volume_prefix(namespace: &str, name: &str) -> String {
    format!("{namespace}_{name}_")
}

/// The volume of disk `disk` of machine `namespace/name`: `{namespace}_{name}_{disk}.qcow2`.
pub fn volume_name(namespace: &str, name: &str, disk: &str) -> String {
    format!("{}{disk}.qcow2", volume_prefix(namespace, name))
}

/// The NoCloud seed volume of machine `namespace/name`: `{namespace}_{name}_cidata.img`
/// (a disk's volume ends in `.qcow2`, so no disk name can take it).
pub fn seed_volume_name(namespace: &str, name: &str) -> String {
    format!("{}cidata.img", volume_prefix(namespace, name))
}

/// The volume an imported image lands in: `image@{vmimage}@{12 hex digits of its sha256}`.
/// `@` occurs in no Kubernetes name, so no machine's volume (`{namespace}_{name}_…`) can take it.
pub fn image_volume_name(image: &str, digest: &str) -> Result<String> {
    let hex = digest.strip_prefix("sha256:").filter(|h| h.len() >= 12 && h.bytes().all(|b| b.is_ascii_hexdigit()));
    let Some(hex) = hex else {
        return Err(Error::InvalidSpec(format!("image digest {digest:?} is not sha256:<hex>")));
    };
    Ok(format!("{}{}", image_volume_prefix(image)?, &hex[..12]))
}

/// What every imported volume of VMImage `image` starts with: `image@{vmimage}@`.
pub fn image_volume_prefix(image: &str) -> Result<String> {
    if image.is_empty() || image.contains(['_', '/', '@']) {
        return Err(Error::InvalidSpec(format!("image name {image:?} is not a Kubernetes name")));
    }
    Ok(format!("image@{image}@"))
}

/// Where libvirtd logs the serial console of domain `domain` (libvirt's own log directory).
pub fn serial_log(domain: &str) -> String {
    format!("/var/log/libvirt/qemu/{domain}.serial.log")
}

/// Refuse a namespace or name that would make the names above ambiguous.
pub fn check_machine(namespace: &str, name: &str) -> Result<()> {
    for (what, value) in [("namespace", namespace), ("name", name)] {
        if value.is_empty() || value.contains(['_', '/']) {
            return Err(Error::InvalidSpec(format!(
                "machine {what} {value:?} is not a Kubernetes name (empty, or contains '_' or '/')"
            )));
        }
    }
    Ok(())
}

/// Refuse a disk name that cannot be part of a volume name.
pub fn check_disk(disk: &str) -> Result<()> {
    if disk.is_empty() || disk.contains('/') {
        return Err(Error::InvalidSpec(format!("disk name {disk:?} is empty or contains '/'")));
    }
    Ok(())
}

/// Whether two UUIDs are the same, ignoring case and hyphens.
pub fn same_uuid(a: &str, b: &str) -> bool {
    let canon = |s: &str| s.chars().filter(|&c| c != '-').map(|c| c.to_ascii_lowercase()).collect::<String>();
    canon(a) == canon(b)
}

/// Refuse a machine UID libvirt could not use as a domain UUID.
pub fn check_uuid(uid: &str) -> Result<()> {
    let hex: Vec<char> = uid.chars().filter(|&c| c != '-').collect();
    let hyphens_ok = uid.len() == 32 || (uid.len() == 36 && [8, 13, 18, 23].iter().all(|&i| uid.as_bytes()[i] == b'-'));
    if hex.len() == 32 && hex.iter().all(char::is_ascii_hexdigit) && hyphens_ok {
        Ok(())
    } else {
        Err(Error::InvalidSpec(format!(
            "machine uid {uid:?} is not a UUID; the libvirt driver uses it as the domain UUID"
        )))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names() {
        assert_eq!(domain_name("ns", "vm"), "ns_vm");
        assert_eq!(volume_name("ns", "vm", "root"), "ns_vm_root.qcow2");
        assert!(volume_name("ns", "vm", "root").starts_with(&volume_prefix("ns", "vm")));
        // `ns/vm`'s prefix does not catch `ns/vm-2`'s volumes.
        assert!(!volume_name("ns", "vm-2", "root").starts_with(&volume_prefix("ns", "vm")));
    }

    #[test]
    fn ambiguous_names_are_refused() {
        assert!(check_machine("ns", "vm-1.a").is_ok());
        for (ns, name) in [("", "vm"), ("ns", ""), ("a_b", "vm"), ("ns", "v_m"), ("ns", "a/b")] {
            assert!(matches!(check_machine(ns, name), Err(Error::InvalidSpec(_))), "{ns}/{name}");
        }
        assert!(check_disk("root").is_ok());
        assert!(check_disk("../x").is_err() && check_disk("").is_err());
    }

    #[test]
    fn uuids() {
        assert!(same_uuid("6F1C2A3E-1111-4222-8333-444455556666", "6f1c2a3e-1111-4222-8333-444455556666"));
        assert!(same_uuid("6f1c2a3e111142228333444455556666", "6f1c2a3e-1111-4222-8333-444455556666"));
        assert!(!same_uuid("6f1c2a3e-1111-4222-8333-444455556667", "6f1c2a3e-1111-4222-8333-444455556666"));
        assert!(check_uuid("6f1c2a3e-1111-4222-8333-444455556666").is_ok());
        assert!(check_uuid("6f1c2a3e111142228333444455556666").is_ok());
        for bad in ["", "uid-1", "6f1c2a3e-1111-4222-8333-44445555666g", "6f1c2a3e1-111-4222-8333-444455556666"] {
            assert!(check_uuid(bad).is_err(), "{bad}");
        }
    }
}
