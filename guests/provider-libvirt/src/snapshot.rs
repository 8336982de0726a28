//! Snapshots on libvirt: internal snapshots inside the domain's qcow2 volumes, which
//! `virDomainSnapshotCreateXML` takes without a second file per disk. The read-only NoCloud
//! seed (raw) is left out: it is rebuilt from the user-data at every create anyway.
//!
//! A running domain's internal snapshot always holds its memory (qemu's `savevm`: libvirt
//! has no internal disk-only snapshot of a running domain), so it reports `memory: true`
//! whatever was asked; a shut-off domain's holds its disks only.

use banlieue_sdk::provider::{Snapshot, SnapshotRequest};
use banlieue_sdk::xml::{escape, unescape};
use banlieue_sdk::{Error, Result};

use crate::xml::{DomainDisk, attribute, element, opening};

/// `<domainsnapshot>` for `request` on a domain with `disks`, running or not.
pub fn request_xml(request: &SnapshotRequest, disks: &[DomainDisk], running: bool) -> Result<String> {
    if request.quiesce {
        return Err(Error::InvalidSpec(
            "spec.quiesce: libvirt's internal snapshots cannot quiesce the guest's file systems; take it without quiesce (or power the VM off first)".into(),
        ));
    }
    if request.memory && !running {
        return Err(Error::InvalidSpec("spec.memory: the VM is not running, it has no memory to keep".into()));
    }
    let mut xml = format!("<domainsnapshot><name>{}</name><description>{}</description>", escape(&request.name), escape(&request.description));
    if running {
        xml.push_str("<memory snapshot='internal'/>");
    }
    xml.push_str("<disks>");
    for d in disks.iter().filter(|d| !d.dev.is_empty()) {
        let how = if d.readonly { "no" } else { "internal" };
        xml.push_str(&format!("<disk name='{}' snapshot='{how}'/>", escape(&d.dev)));
    }
    xml.push_str("</disks></domainsnapshot>");
    Ok(xml)
}

/// A snapshot as libvirt describes it. Only the snapshot's own elements are read: the
/// domain definition it embeds has a `<name>` and `<description>` of its own.
pub fn parse(name: &str, current: bool, xml: &str) -> Snapshot {
    let own = xml.split_once("<domain ").or_else(|| xml.split_once("<domain>")).map_or(xml, |(head, _)| head);
    let text = |tag: &str| element(own, tag).map(|(_, t)| unescape(t.trim()));
    let state = text("state").unwrap_or_default();
    let memory = opening(own, "memory").and_then(|m| attribute(m, "snapshot")).is_some_and(|how| how == "internal")
        || (state == "running" || state == "paused") && opening(own, "memory").is_none();
    Snapshot {
        id: name.to_string(),
        name: name.to_string(),
        description: text("description").unwrap_or_default(),
        created_at: text("creationTime").and_then(|t| t.parse().ok()),
        size_bytes: None,
        memory,
        current,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn disks() -> Vec<DomainDisk> {
        vec![
            DomainDisk { dev: "vda".into(), pool: "p".into(), volume: "ns_vm_root.qcow2".into(), readonly: false },
            DomainDisk { dev: "vdb".into(), pool: "p".into(), volume: "ns_vm_data.qcow2".into(), readonly: false },
            DomainDisk { dev: "vdc".into(), pool: "p".into(), volume: "ns_vm_cidata.img".into(), readonly: true },
        ]
    }

    fn request(memory: bool, quiesce: bool) -> SnapshotRequest {
        SnapshotRequest { name: "bl-1234".into(), description: "before <upgrade> & co".into(), memory, quiesce }
    }

    #[test]
    fn the_seed_is_left_out_and_a_running_domain_keeps_its_memory() {
        let off = request_xml(&request(false, false), &disks(), false).unwrap();
        assert_eq!(
            off,
            "<domainsnapshot><name>bl-1234</name><description>before &lt;upgrade&gt; &amp; co</description><disks><disk name='vda' snapshot='internal'/><disk name='vdb' snapshot='internal'/><disk name='vdc' snapshot='no'/></disks></domainsnapshot>"
        );
        let on = request_xml(&request(false, false), &disks(), true).unwrap();
        assert!(on.contains("<memory snapshot='internal'/><disks>"), "{on}");
    }

    #[test]
    fn memory_of_a_stopped_domain_and_quiesce_are_refused_naming_the_field() {
        let e = request_xml(&request(true, false), &disks(), false).unwrap_err();
        assert!(matches!(&e, Error::InvalidSpec(m) if m.starts_with("spec.memory")), "{e:?}");
        let e = request_xml(&request(false, true), &disks(), true).unwrap_err();
        assert!(matches!(&e, Error::InvalidSpec(m) if m.starts_with("spec.quiesce")), "{e:?}");
    }

    #[test]
    fn only_the_snapshots_own_elements_are_read() {
        let xml = "<domainsnapshot>\n  <name>bl-1234</name>\n  <description>before &lt;upgrade&gt;</description>\n  <state>running</state>\n  <creationTime>1765000000</creationTime>\n  <memory snapshot='internal'/>\n  <disks>\n    <disk name='vda' snapshot='internal'/>\n  </disks>\n  <domain type='qemu'>\n    <name>ns_vm</name>\n    <description>the domain's own</description>\n  </domain>\n</domainsnapshot>\n";
        let s = parse("bl-1234", true, xml);
        assert_eq!((s.id.as_str(), s.name.as_str(), s.description.as_str()), ("bl-1234", "bl-1234", "before <upgrade>"));
        assert_eq!((s.created_at, s.memory, s.current), (Some(1_765_000_000), true, true));
        let off = parse("x", false, "<domainsnapshot><name>x</name><state>shutoff</state><memory snapshot='no'/><domain><description>d</description></domain></domainsnapshot>");
        assert_eq!((off.description.as_str(), off.memory, off.created_at), ("", false, None));
    }
}
