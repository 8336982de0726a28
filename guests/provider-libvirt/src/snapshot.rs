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

/// The domain definition a snapshot's XML embeds (`<domain …>…</domain>`): the domain as it
/// was when the snapshot was taken.
pub fn embedded_domain(xml: &str) -> Option<&str> {
    let start = xml.find("<domain ").or_else(|| xml.find("<domain>"))?;
    let end = xml.rfind("</domain>")? + "</domain>".len();
    (end > start).then(|| &xml[start..end])
}

/// The `<domainsnapshot>` that records snapshot `name` (taken of another domain, as its XML
/// `source_xml` describes it) on the domain defined by `domain_xml`, for a REDEFINE:
///
/// - libvirt refuses a redefinition without `<domain>` ("missing domain in snapshot") or
///   whose `<domain><uuid>` is not the domain's ("definition for snapshot … must use uuid …"),
///   and a revert works on the disks of the embedded definition: it must be the new domain's
///   own, never the source's (whose volumes it would revert).
/// - It says `shutoff` without memory whatever the snapshot held: a revert then applies the
///   disks' internal snapshots only (`qemu-img snapshot -a`), and the domain keeps its own
///   hardware; a memory state belongs to the source's.
/// - `disks` are the domain's `(device, restored)`: a restored disk's volume holds the
///   snapshot internally, the others (further disks, the seed) have none.
/// - No `<parent>`: the domain has none of the source's other snapshots. The `<creationTime>`
///   is the source's: libvirt requires one.
pub fn redefine_xml(name: &str, source_xml: &str, domain_xml: &str, disks: &[(String, bool)]) -> Result<String> {
    let embedded = domain_xml.trim_start();
    if !(embedded.starts_with("<domain ") || embedded.starts_with("<domain>")) {
        return Err(Error::Internal("the domain XML to embed in the snapshot is not a <domain>".into()));
    }
    let own = source_xml.split_once("<domain ").or_else(|| source_xml.split_once("<domain>")).map_or(source_xml, |(head, _)| head);
    let text = |tag: &str| element(own, tag).map(|(_, t)| unescape(t.trim()));
    let mut xml = format!("<domainsnapshot><name>{}</name>", escape(name));
    if let Some(d) = text("description").filter(|d| !d.is_empty()) {
        xml.push_str(&format!("<description>{}</description>", escape(&d)));
    }
    xml.push_str("<state>shutoff</state>");
    // libvirt refuses a redefinition without it ("missing creationTime from existing snapshot").
    let Some(time) = text("creationTime").filter(|t| !t.is_empty() && t.bytes().all(|b| b.is_ascii_digit())) else {
        return Err(Error::Internal(format!("snapshot {name} as libvirt describes it has no creationTime to record it with")));
    };
    xml.push_str(&format!("<creationTime>{time}</creationTime>"));
    xml.push_str("<memory snapshot='no'/><disks>");
    for (dev, restored) in disks.iter().filter(|(dev, _)| !dev.is_empty()) {
        xml.push_str(&format!("<disk name='{}' snapshot='{}'/>", escape(dev), if *restored { "internal" } else { "no" }));
    }
    xml.push_str("</disks>");
    xml.push_str(domain_xml.trim());
    xml.push_str("</domainsnapshot>");
    Ok(xml)
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

    /// `snapshot-dumpxml` of a running domain's snapshot as libvirt 9.0 writes it.
    const SOURCE: &str = "<domainsnapshot>\n  <name>bl-1234</name>\n  <description>before &amp; after</description>\n  <state>running</state>\n  <parent>\n    <name>older</name>\n  </parent>\n  <creationTime>1796577803</creationTime>\n  <memory snapshot='internal'/>\n  <disks>\n    <disk name='vda' snapshot='internal'/>\n    <disk name='vdb' snapshot='no'/>\n  </disks>\n  <domain type='qemu'>\n    <name>ns_src</name>\n    <uuid>aaaaaaaa-1111-4222-8333-444455556666</uuid>\n    <description>the source's</description>\n    <devices>\n      <disk type='volume' device='disk'>\n        <source pool='p' volume='ns_src_root.qcow2'/>\n        <target dev='vda' bus='virtio'/>\n      </disk>\n    </devices>\n  </domain>\n</domainsnapshot>\n";

    #[test]
    fn the_embedded_domain_is_the_one_at_the_snapshot() {
        let d = embedded_domain(SOURCE).unwrap();
        assert!(d.starts_with("<domain type='qemu'>") && d.ends_with("</domain>") && d.contains("ns_src_root.qcow2"), "{d}");
        assert_eq!(embedded_domain("<domainsnapshot><name>x</name></domainsnapshot>"), None);
    }

    #[test]
    fn a_redefinition_embeds_the_new_domain_without_memory_or_parent() {
        let new_domain = "<domain type='qemu'>\n  <name>ns_new</name>\n  <uuid>bbbbbbbb-1111-4222-8333-444455556666</uuid>\n</domain>\n";
        let disks = [("vda".to_string(), true), ("vdb".to_string(), false), ("vdc".to_string(), false)];
        let xml = redefine_xml("bl-1234", SOURCE, new_domain, &disks).unwrap();
        assert_eq!(
            xml,
            "<domainsnapshot><name>bl-1234</name><description>before &amp; after</description><state>shutoff</state><creationTime>1796577803</creationTime><memory snapshot='no'/><disks><disk name='vda' snapshot='internal'/><disk name='vdb' snapshot='no'/><disk name='vdc' snapshot='no'/></disks><domain type='qemu'>\n  <name>ns_new</name>\n  <uuid>bbbbbbbb-1111-4222-8333-444455556666</uuid>\n</domain></domainsnapshot>"
        );
        assert!(!xml.contains("aaaaaaaa") && !xml.contains("older") && !xml.contains("the source's"));
        // What `snapshot-list` then reports of it.
        let listed = parse("bl-1234", false, &xml);
        assert_eq!((listed.description.as_str(), listed.memory, listed.created_at), ("before & after", false, Some(1_796_577_803)));
        assert!(redefine_xml("x", SOURCE, "<domainsnapshot/>", &disks).is_err());
        assert!(redefine_xml("x", "<domainsnapshot><name>x</name></domainsnapshot>", new_domain, &disks).is_err());
    }
}
