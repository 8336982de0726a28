//! What a provider driver may return: the one place where a driver's results are
//! checked before the host acts on them or writes them into a Provider's or a
//! Machine's status. A driver is untrusted code; what it returns is untrusted data.
//!
//! Every call's result is checked here, in [`crate::provider::ProviderDriver`], so
//! every caller (the Provider and Machine reconcilers, `banlieue bootstrap`) sees a
//! result within these limits or a [`CallError::InvalidResult`] that says what was
//! wrong, never a status the API server refuses or an object of megabytes.
//!
//! The limits (docs/security.md, "What a driver may return"):
//!
//! | what | limit |
//! |---|---|
//! | failure domains per `probe` | [`MAX_FAILURE_DOMAINS`], names unique, each a [`MAX_NAME`]-byte printable string |
//! | labels per failure domain | [`MAX_LABELS`]; keys Kubernetes label keys, values at most [`MAX_LABEL_VALUE`] printable bytes |
//! | classes and features per failure domain | [`MAX_CLASSES`] each, [`MAX_NAME`]-byte printable names |
//! | backend version | [`MAX_SHORT`] printable bytes |
//! | provider ID | [`MAX_PROVIDER_ID`] bytes, printable, no whitespace |
//! | addresses per machine | [`MAX_ADDRESSES`]; IP types parse as IPv4/IPv6, DNS and hostname types are DNS names |
//! | conditions per machine | [`MAX_CONDITIONS`]; Kubernetes condition type and reason syntax, messages at most [`MAX_MESSAGE`] bytes |
//! | disks and NICs in a machine's hardware | [`MAX_DEVICES`] each; names, MACs and networks [`MAX_NAME`], disk ids [`MAX_REFERENCE`] printable bytes |
//! | image reference and message | [`MAX_REFERENCE`] and [`MAX_MESSAGE`] bytes |
//! | snapshots per machine | [`MAX_SNAPSHOTS`]; ids and names [`MAX_NAME`] printable bytes, ids unique, descriptions [`MAX_MESSAGE`] bytes |
//! | machines per `list-machines` page | [`MAX_FOUND_PER_PAGE`]; backend ids non-empty, unique, [`MAX_NAME`] printable bytes; names, failure domains and mark fields [`MAX_NAME`], tags [`MAX_LABELS`] of [`MAX_LABEL_VALUE`]; addresses and hardware as a machine's; a page token [`MAX_REFERENCE`] |
//!
//! Results the component model itself refuses while copying them out of the sandbox (an
//! enum discriminant the contract does not have, more than [`MAX_RESULT_COPY`] bytes) are
//! the same failure: see `state::classify`.

use std::net::IpAddr;

use crate::error::CallError;
use crate::provider::{AddressType, FoundMachine, Hardware, ImageStatus, Inventory, MachinePage, MachineStatus, OwnerMark, Snapshot};

/// Failure domains one `probe` may report (a vCenter's clusters, a Proxmox cluster's nodes).
pub const MAX_FAILURE_DOMAINS: usize = 1_000;
/// Labels of one failure domain.
pub const MAX_LABELS: usize = 64;
/// Storage classes, network classes and features of one failure domain, each.
pub const MAX_CLASSES: usize = 256;
/// A failure domain's name, a class or a feature (a DNS subdomain's length).
pub const MAX_NAME: usize = 253;
/// A label value. Not Kubernetes' 63-byte syntax: backends name datacenters and clusters
/// with spaces, and these labels are matched by placement, never written as labels.
pub const MAX_LABEL_VALUE: usize = 253;
/// The backend version and other short strings.
pub const MAX_SHORT: usize = 256;
/// A CAPI provider ID.
pub const MAX_PROVIDER_ID: usize = 512;
/// Addresses of one machine.
pub const MAX_ADDRESSES: usize = 64;
/// Conditions one machine reports.
pub const MAX_CONDITIONS: usize = 16;
/// Disks, and NICs, of one machine's hardware.
pub const MAX_DEVICES: usize = 64;
/// A condition's message (the host shortens the messages it writes further).
pub const MAX_MESSAGE: usize = 4096;
/// An imported image's reference.
pub const MAX_REFERENCE: usize = 1024;
/// Snapshots of one machine (vSphere allows 496 in a chain; schedules keep far fewer).
pub const MAX_SNAPSHOTS: usize = 1_000;
/// Machines on one page of `list-machines` (drivers page at 100; more is a driver ignoring
/// paging, which would make one result as large as the backend).
pub const MAX_FOUND_PER_PAGE: usize = 500;
/// Bytes the host copies out of a sandbox for one call's result (wasmtime's hostcall fuel):
/// a guest returning the same string many times over (the canonical ABI allows overlapping
/// strings) cannot make the host allocate more than this.
pub const MAX_RESULT_COPY: usize = 64 << 20;

/// Check what `probe` returned.
pub fn inventory(inv: &Inventory) -> Result<(), CallError> {
    invalid("probe", check_inventory(inv))
}

/// Check what `create`, `describe` or `set-power` (`function`) returned.
pub fn machine_status(function: &'static str, st: &MachineStatus) -> Result<(), CallError> {
    invalid(function, check_machine_status(st))
}

/// Check what `import-image` returned.
pub fn image_status(st: &ImageStatus) -> Result<(), CallError> {
    invalid("import-image", check_image_status(st))
}

/// Check what `snapshot-create` or `snapshot-list` (`function`) returned.
pub fn snapshots(function: &'static str, list: &[Snapshot]) -> Result<(), CallError> {
    invalid(function, check_snapshots(list))
}

/// Check a page of `list-machines`.
pub fn machine_page(page: &MachinePage) -> Result<(), CallError> {
    invalid("list-machines", check_machine_page(page))
}

/// Check the machine `adopt` returned.
pub fn found_machine(m: &FoundMachine) -> Result<(), CallError> {
    invalid("adopt", check_found(m))
}

/// Check where `console` says a console is (the host checks it against the grant when it
/// opens it).
pub fn console_access(access: &crate::provider::ConsoleAccess) -> Result<(), CallError> {
    use crate::provider::ConsoleAccess;
    invalid("console", match access {
        ConsoleAccess::LibvirtDomain(domain) => printable("a domain name", domain, MAX_NAME),
        ConsoleAccess::Websocket(ws) => (|| {
            printable("a console URL", &ws.url, MAX_REFERENCE)?;
            count("console headers", ws.headers.len(), 16)?;
            for (k, v) in &ws.headers {
                printable("a header name", k, MAX_NAME)?;
                printable("a header value", v, MAX_MESSAGE)?;
            }
            // A login line may end its line.
            ws.hello.as_deref().map_or(Ok(()), |h| printable("a console greeting", h.strip_suffix('\n').unwrap_or(h), MAX_MESSAGE))?;
            ws.vnc_password.as_deref().map_or(Ok(()), |p| printable("a VNC password", p, MAX_MESSAGE))
        })(),
    })
}

/// What `features` returned, as the features the host knows. A name the host does not know
/// (a newer driver's) is passed over; more than a handful of names, or an unprintable one, is
/// refused.
pub fn features(names: &[String]) -> Result<Vec<crate::Feature>, CallError> {
    use crate::Feature;
    invalid("features", count("features", names.len(), 32).and_then(|()| names.iter().try_for_each(|n| printable("a feature", n, MAX_NAME))))?;
    Ok([Feature::Snapshots, Feature::DiskExport, Feature::DiskImport, Feature::Adopt, Feature::Console, Feature::Vnc].into_iter().filter(|f| names.iter().any(|n| n == f.name())).collect())
}

fn invalid(function: &'static str, r: Result<(), String>) -> Result<(), CallError> {
    r.map_err(|problem| CallError::InvalidResult(format!("the driver's {function} returned {problem}")))
}

fn check_inventory(inv: &Inventory) -> Result<(), String> {
    let n = inv.failure_domains.len();
    if n > MAX_FAILURE_DOMAINS {
        return Err(format!("{} failure domains; at most {} are accepted", thousands(n), thousands(MAX_FAILURE_DOMAINS)));
    }
    if let Some(v) = &inv.backend_version {
        printable("a backend version", v, MAX_SHORT)?;
    }
    let mut names = std::collections::HashSet::new();
    for (i, fd) in inv.failure_domains.iter().enumerate() {
        printable(&format!("failure domain {i}'s name"), &fd.name, MAX_NAME)?;
        if fd.name.is_empty() {
            return Err(format!("failure domain {i} with an empty name"));
        }
        if !names.insert(fd.name.as_str()) {
            return Err(format!("failure domain {:?} twice", fd.name));
        }
        let at = format!("failure domain {:?}", fd.name);
        count(&format!("labels on {at}"), fd.labels.len(), MAX_LABELS)?;
        for (k, v) in &fd.labels {
            label_key(k).map_err(|why| format!("label key {} on {at}: {why}", quoted(k)))?;
            printable(&format!("the value of label {k} on {at}"), v, MAX_LABEL_VALUE)?;
        }
        for (what, list) in [("storage classes", &fd.storage_classes), ("network classes", &fd.network_classes), ("features", &fd.features)] {
            count(&format!("{what} on {at}"), list.len(), MAX_CLASSES)?;
            for s in list {
                printable(&format!("one of the {what} on {at}"), s, MAX_NAME)?;
            }
        }
    }
    Ok(())
}

fn check_machine_status(st: &MachineStatus) -> Result<(), String> {
    printable("a provider ID", &st.provider_id, MAX_PROVIDER_ID)?;
    if st.provider_id.chars().any(char::is_whitespace) {
        return Err(format!("provider ID {} with whitespace", quoted(&st.provider_id)));
    }
    count("addresses", st.addresses.len(), MAX_ADDRESSES)?;
    for a in &st.addresses {
        match a.type_ {
            AddressType::InternalIp | AddressType::ExternalIp => {
                if a.address.parse::<IpAddr>().is_err() {
                    return Err(format!("address {} of type {:?}, which is not an IPv4 or IPv6 address", quoted(&a.address), a.type_));
                }
            }
            AddressType::Hostname | AddressType::InternalDns | AddressType::ExternalDns => {
                dns_subdomain(&a.address).map_err(|why| format!("address {} of type {:?}: {why}", quoted(&a.address), a.type_))?;
            }
        }
    }
    if let Some(hw) = &st.hardware {
        count("disks", hw.disks.len(), MAX_DEVICES)?;
        for d in &hw.disks {
            printable("a disk name", &d.name, MAX_NAME)?;
            printable("a disk id", &d.id, MAX_REFERENCE)?;
        }
        count("NICs", hw.nics.len(), MAX_DEVICES)?;
        for n in &hw.nics {
            printable("a NIC name", &n.name, MAX_NAME)?;
            printable("a MAC address", &n.mac, MAX_NAME)?;
            printable("a NIC's network", &n.network, MAX_NAME)?;
        }
    }
    count("conditions", st.conditions.len(), MAX_CONDITIONS)?;
    for c in &st.conditions {
        condition_type(&c.type_).map_err(|why| format!("condition type {}: {why}", quoted(&c.type_)))?;
        condition_reason(&c.reason).map_err(|why| format!("reason {} on condition {}: {why}", quoted(&c.reason), c.type_))?;
        if c.message.len() > MAX_MESSAGE {
            return Err(format!("a {} message on condition {}; at most {} bytes are accepted", bytes(c.message.len()), c.type_, thousands(MAX_MESSAGE)));
        }
    }
    Ok(())
}

fn check_machine_page(page: &MachinePage) -> Result<(), String> {
    count("machines on one page", page.machines.len(), MAX_FOUND_PER_PAGE)?;
    if let Some(next) = &page.next {
        printable("a page token", next, MAX_REFERENCE)?;
    }
    let mut ids = std::collections::HashSet::new();
    for m in &page.machines {
        check_found(m)?;
        if !ids.insert(m.backend_id.as_str()) {
            return Err(format!("backend id {} twice", quoted(&m.backend_id)));
        }
    }
    Ok(())
}

fn check_found(m: &FoundMachine) -> Result<(), String> {
    printable("a backend id", &m.backend_id, MAX_NAME)?;
    if m.backend_id.is_empty() {
        return Err("a machine with an empty backend id".into());
    }
    let at = format!("machine {}", quoted(&m.backend_id));
    printable(&format!("the name of {at}"), &m.name, MAX_NAME)?;
    printable(&format!("the failure domain of {at}"), &m.failure_domain, MAX_NAME)?;
    count(&format!("tags on {at}"), m.tags.len(), MAX_LABELS)?;
    for t in &m.tags {
        printable(&format!("a tag on {at}"), t, MAX_LABEL_VALUE)?;
    }
    if let Some(OwnerMark { machine_uid, machine, installation }) = &m.owner {
        for (what, v) in [("machine uid", machine_uid), ("machine", machine), ("installation", installation)] {
            printable(&format!("the owner mark's {what} on {at}"), v, MAX_NAME)?;
        }
    }
    // Addresses and hardware as a machine's status has them.
    let as_status = MachineStatus {
        provider_id: String::new(),
        hardware: Some(Hardware { cpus: m.hardware.cpus, memory_mib: m.hardware.memory_mib, disks: m.hardware.disks.clone(), nics: m.hardware.nics.clone() }),
        power_state: m.power_state,
        addresses: m.addresses.clone(),
        conditions: vec![],
        provisioned: true,
        phase: crate::provider::MachinePhase::Provisioning,
    };
    check_machine_status(&as_status).map_err(|why| format!("{why} on {at}"))
}

fn check_image_status(st: &ImageStatus) -> Result<(), String> {
    if let Some(r) = &st.reference {
        printable("an image reference", r, MAX_REFERENCE)?;
    }
    if let Some(m) = &st.message {
        if m.len() > MAX_MESSAGE {
            return Err(format!("a {} message; at most {} bytes are accepted", bytes(m.len()), thousands(MAX_MESSAGE)));
        }
    }
    Ok(())
}

fn check_snapshots(list: &[Snapshot]) -> Result<(), String> {
    count("snapshots", list.len(), MAX_SNAPSHOTS)?;
    let mut ids = std::collections::HashSet::new();
    for s in list {
        printable("a snapshot id", &s.id, MAX_NAME)?;
        if s.id.is_empty() {
            return Err("a snapshot with an empty id".into());
        }
        if !ids.insert(s.id.as_str()) {
            return Err(format!("snapshot id {} twice", quoted(&s.id)));
        }
        printable("a snapshot name", &s.name, MAX_NAME)?;
        if s.description.len() > MAX_MESSAGE {
            return Err(format!("a {} description on snapshot {}; at most {} bytes are accepted", bytes(s.description.len()), quoted(&s.id), thousands(MAX_MESSAGE)));
        }
    }
    Ok(())
}

fn count(what: &str, n: usize, max: usize) -> Result<(), String> {
    if n > max {
        return Err(format!("{} {what}; at most {} are accepted", thousands(n), thousands(max)));
    }
    Ok(())
}

/// At most `max` bytes, no control characters.
fn printable(what: &str, s: &str, max: usize) -> Result<(), String> {
    if s.len() > max {
        return Err(format!("{what} of {}; at most {} bytes are accepted", bytes(s.len()), thousands(max)));
    }
    if s.chars().any(char::is_control) {
        return Err(format!("{what} {} with control characters", quoted(s)));
    }
    Ok(())
}

/// A Kubernetes label key: `[prefix/]name`, the prefix a DNS subdomain, the name at
/// most 63 bytes of alphanumerics, `-`, `_` and `.`, starting and ending alphanumeric.
fn label_key(k: &str) -> Result<(), String> {
    let (prefix, name) = match k.rsplit_once('/') {
        Some((p, n)) => (Some(p), n),
        None => (None, k),
    };
    if let Some(p) = prefix {
        dns_subdomain(p).map_err(|why| format!("its prefix: {why}"))?;
    }
    qualified_name(name, 63)
}

/// A condition type: a label key's syntax, at most 316 bytes (Kubernetes' `metav1.Condition`).
fn condition_type(t: &str) -> Result<(), String> {
    if t.len() > 316 {
        return Err(format!("{}; at most 316 are accepted", bytes(t.len())));
    }
    label_key(t)
}

/// A condition reason: CamelCase, `^[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?$`, at most 1024 bytes.
fn condition_reason(r: &str) -> Result<(), String> {
    if r.is_empty() || r.len() > 1024 {
        return Err("reasons have 1 to 1024 bytes".into());
    }
    let b = r.as_bytes();
    let ok = b[0].is_ascii_alphabetic()
        && b.iter().all(|c| c.is_ascii_alphanumeric() || b"_,:".contains(c))
        && (b[b.len() - 1].is_ascii_alphanumeric() || b[b.len() - 1] == b'_');
    if !ok {
        return Err("reasons are CamelCase: letters, digits, `_`, `,` and `:`, starting with a letter".into());
    }
    Ok(())
}

fn qualified_name(n: &str, max: usize) -> Result<(), String> {
    let b = n.as_bytes();
    if b.is_empty() || b.len() > max {
        return Err(format!("names have 1 to {max} bytes"));
    }
    let ok = b[0].is_ascii_alphanumeric()
        && b[b.len() - 1].is_ascii_alphanumeric()
        && b.iter().all(|c| c.is_ascii_alphanumeric() || b"-_.".contains(c));
    if !ok {
        return Err("names are alphanumerics, `-`, `_` and `.`, starting and ending with an alphanumeric".into());
    }
    Ok(())
}

/// A DNS subdomain (RFC 1123): at most 253 bytes of dot-separated labels of at most 63
/// lowercase alphanumerics and `-`, starting and ending alphanumeric.
fn dns_subdomain(s: &str) -> Result<(), String> {
    if s.is_empty() || s.len() > 253 {
        return Err("DNS names have 1 to 253 bytes".into());
    }
    for label in s.split('.') {
        let b = label.as_bytes();
        let ok = !b.is_empty()
            && b.len() <= 63
            && b[0].is_ascii_alphanumeric()
            && b[b.len() - 1].is_ascii_alphanumeric()
            && b.iter().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == b'-');
        if !ok {
            return Err("not a DNS name (lowercase alphanumerics and `-` in dot-separated labels)".into());
        }
    }
    Ok(())
}

/// A value for a message: at most 64 bytes of it, quoted.
fn quoted(s: &str) -> String {
    const SHOWN: usize = 64;
    if s.len() <= SHOWN {
        return format!("{s:?}");
    }
    let mut end = SHOWN;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    format!("{:?}… ({})", &s[..end], bytes(s.len()))
}

/// `8,388,608 bytes`.
fn bytes(n: usize) -> String {
    format!("{} bytes", thousands(n))
}

/// `2,000,000`.
pub(crate) fn thousands(n: usize) -> String {
    let digits = n.to_string();
    let mut out = String::with_capacity(digits.len() + digits.len() / 3);
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i) % 3 == 0 {
            out.push(',');
        }
        out.push(c);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::provider::{Address, Capacity, Condition, ConditionStatus, DiskStatus, FailureDomain, Hardware, MachinePhase, NicStatus, PowerState};

    fn fd(name: &str) -> FailureDomain {
        FailureDomain {
            name: name.into(),
            labels: vec![("topology.kubernetes.io/zone".into(), "Datacenter 1".into())],
            capacity: Capacity { cpus: 1, memory_mib: 1, storage_gib: 1 },
            storage_classes: vec!["standard".into()],
            network_classes: vec![],
            features: vec![],
        }
    }

    fn status() -> MachineStatus {
        MachineStatus {
            provider_id: "libvirt://5e1c".into(),
            hardware: Some(Hardware {
                cpus: 2,
                memory_mib: 1024,
                disks: vec![DiskStatus { name: "root".into(), size_gib: 8, id: "/pool/root.qcow2".into() }],
                nics: vec![NicStatus { name: String::new(), mac: "52:54:00:00:00:01".into(), network: "default".into() }],
            }),
            power_state: PowerState::PoweredOn,
            addresses: vec![
                Address { type_: AddressType::InternalIp, address: "192.0.2.1".into() },
                Address { type_: AddressType::ExternalIp, address: "2001:db8::1".into() },
                Address { type_: AddressType::Hostname, address: "web-0.example.com".into() },
            ],
            conditions: vec![Condition { type_: "GuestAgent".into(), status: ConditionStatus::True, reason: "Running".into(), message: "ok".into() }],
            provisioned: true,
            phase: MachinePhase::Running,
        }
    }

    fn err(r: Result<(), CallError>) -> String {
        match r {
            Err(CallError::InvalidResult(m)) => m,
            other => panic!("expected an invalid result, got {other:?}"),
        }
    }

    #[test]
    fn what_real_drivers_return_passes() {
        let inv = Inventory { backend_version: Some("libvirt 10.0.0".into()), failure_domains: vec![fd("host-a"), fd("DC0_C0")] };
        inventory(&inv).unwrap();
        machine_status("describe", &status()).unwrap();
        machine_status("describe", &MachineStatus { provider_id: String::new(), addresses: vec![], conditions: vec![], ..status() }).unwrap();
    }

    #[test]
    fn too_many_failure_domains_says_how_many_and_the_limit() {
        let inv = Inventory { backend_version: None, failure_domains: (0..2_000).map(|i| fd(&format!("fd-{i}"))).collect() };
        assert_eq!(err(inventory(&inv)), "the driver's probe returned 2,000 failure domains; at most 1,000 are accepted");
    }

    #[test]
    fn names_labels_and_versions_are_bounded_and_well_formed() {
        let huge = Inventory { backend_version: None, failure_domains: vec![fd(&"d".repeat(8 << 20))] };
        let m = err(inventory(&huge));
        assert!(m.contains("8,388,608 bytes") && m.contains("at most 253"), "{m}");
        assert!(m.len() < 300, "the message stays short: {m}");
        let mut bad = fd("a");
        bad.labels = vec![("not a key!".into(), "v".into())];
        let m = err(inventory(&Inventory { backend_version: None, failure_domains: vec![bad] }));
        assert!(m.contains("label key \"not a key!\""), "{m}");
        let twice = Inventory { backend_version: None, failure_domains: vec![fd("a"), fd("a")] };
        assert!(err(inventory(&twice)).contains("twice"));
        let version = Inventory { backend_version: Some("v\n1".into()), failure_domains: vec![] };
        assert!(err(inventory(&version)).contains("control characters"));
    }

    #[test]
    fn addresses_must_be_what_their_type_says() {
        let mut st = status();
        st.addresses = vec![Address { type_: AddressType::InternalIp, address: "not-an-ip".into() }];
        let m = err(machine_status("create", &st));
        assert!(m.starts_with("the driver's create returned address \"not-an-ip\""), "{m}");
        st.addresses = vec![Address { type_: AddressType::Hostname, address: "Not A Host".into() }];
        assert!(err(machine_status("create", &st)).contains("not a DNS name"));
        st.addresses = (0..5_000).map(|i| Address { type_: AddressType::InternalIp, address: format!("10.0.{}.{}", i / 250, i % 250) }).collect();
        assert!(err(machine_status("create", &st)).contains("5,000 addresses; at most 64 are accepted"));
    }

    #[test]
    fn hardware_is_bounded() {
        machine_status("describe", &status()).unwrap();
        let mut st = status();
        st.hardware.as_mut().unwrap().disks = (0..1_000).map(|i| DiskStatus { name: format!("d{i}"), size_gib: 1, id: "x".into() }).collect();
        assert!(err(machine_status("describe", &st)).contains("1,000 disks; at most 64 are accepted"));
        let mut st = status();
        st.hardware.as_mut().unwrap().disks[0].id = "x".repeat(1 << 20);
        assert!(err(machine_status("describe", &st)).contains("a disk id of 1,048,576 bytes"));
        let mut st = status();
        st.hardware.as_mut().unwrap().nics[0].mac = "52:54\n".into();
        assert!(err(machine_status("describe", &st)).contains("control characters"));
    }

    #[test]
    fn provider_ids_and_conditions_are_bounded() {
        let st = MachineStatus { provider_id: "x".repeat(8 << 20), ..status() };
        assert!(err(machine_status("describe", &st)).contains("provider ID of 8,388,608 bytes"));
        let mut st = status();
        st.conditions[0].reason = "not a reason".into();
        assert!(err(machine_status("describe", &st)).contains("CamelCase"));
        st.conditions[0].reason = "Fine".into();
        st.conditions[0].type_ = "bad type!".into();
        assert!(err(machine_status("describe", &st)).contains("condition type"));
    }

    #[test]
    fn thousands_are_grouped() {
        assert_eq!(thousands(0), "0");
        assert_eq!(thousands(999), "999");
        assert_eq!(thousands(1_000), "1,000");
        assert_eq!(thousands(2_000_000), "2,000,000");
    }

    #[test]
    fn snapshots_need_unique_printable_ids() {
        let snap = |id: &str| Snapshot { id: id.into(), name: "bl-1".into(), description: String::new(), created_at: None, size_bytes: None, memory: false, current: false };
        assert!(snapshots("snapshot-list", &[snap("snapshot-1"), snap("snapshot-2")]).is_ok());
        assert!(err(snapshots("snapshot-list", &[snap("a"), snap("a")])).contains("snapshot id \"a\" twice"));
        assert!(err(snapshots("snapshot-create", &[snap("")])).contains("empty id"));
        assert!(err(snapshots("snapshot-list", &[snap("a\nb")])).contains("control characters"));
        let long = Snapshot { description: "x".repeat(MAX_MESSAGE + 1), ..snap("a") };
        assert!(err(snapshots("snapshot-list", &[long])).contains("description"));
    }
}
