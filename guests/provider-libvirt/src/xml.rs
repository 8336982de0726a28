//! Domain and volume XML, built with plain formatting: every string that goes
//! into the XML is checked ([`text`]) and escaped ([`escape`]).

use std::fmt::Write as _;

use banlieue_sdk::provider::{Firmware, Machine, OwnerMark, UserDataFormat};
use banlieue_sdk::{Error, Result};

use crate::naming;

/// The XML namespace of the `<metadata>` element the driver writes.
pub const METADATA_NS: &str = "https://banlieue.io/libvirt/v1";
/// The XML namespace of an adopted domain's owner mark: an element of its own, so setting
/// and removing it touches nothing else of the domain.
pub const OWNER_NS: &str = "https://banlieue.io/libvirt/owner/v1";
/// The prefix libvirt writes the owner mark with.
pub const OWNER_KEY: &str = "banlieue-owner";

pub use banlieue_sdk::xml::escape;

/// `s` escaped, or `InvalidSpec` when it holds a character XML 1.0 cannot carry
/// at all (control characters other than tab/newline/CR, U+FFFE, U+FFFF).
pub fn text(what: &str, s: &str) -> Result<String> {
    if let Some(c) = s.chars().find(|&c| !allowed_in_xml(c)) {
        return Err(Error::InvalidSpec(format!("{what} {s:?} contains the character {c:?}, which XML cannot carry")));
    }
    Ok(escape(s))
}

fn allowed_in_xml(c: char) -> bool {
    matches!(c, '\t' | '\n' | '\r') || (c >= ' ' && c != '\u{FFFE}' && c != '\u{FFFF}')
}

/// Standard base64 with padding (RFC 4648 §4).
pub fn base64(bytes: &[u8]) -> String {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::with_capacity(bytes.len().div_ceil(3) * 4);
    for chunk in bytes.chunks(3) {
        let b = [chunk[0], *chunk.get(1).unwrap_or(&0), *chunk.get(2).unwrap_or(&0)];
        let n = (u32::from(b[0]) << 16) | (u32::from(b[1]) << 8) | u32::from(b[2]);
        for i in 0..4 {
            if i <= chunk.len() {
                out.push(ALPHABET[((n >> (18 - 6 * i)) & 63) as usize] as char);
            } else {
                out.push('=');
            }
        }
    }
    out
}

/// The guest device name of the `index`th disk: `vda`..`vdz`, `vdaa`, ... (as Linux names them).
pub fn disk_dev(index: usize) -> String {
    let mut letters = Vec::new();
    let mut n = index + 1;
    while n > 0 {
        n -= 1;
        letters.push(b'a' + (n % 26) as u8);
        n /= 26;
    }
    letters.reverse();
    format!("vd{}", String::from_utf8(letters).expect("ascii"))
}

/// A qcow2 volume of `size_gib` GiB, on top of `backing` (a qcow2 file) when given.
pub fn volume(name: &str, size_gib: u64, backing: Option<&str>) -> Result<String> {
    let mut xml = format!(
        "<volume><name>{}</name><capacity unit='GiB'>{size_gib}</capacity><allocation>0</allocation><target><format type='qcow2'/></target>",
        text("volume name", name)?
    );
    if let Some(path) = backing {
        write!(xml, "<backingStore><path>{}</path><format type='qcow2'/></backingStore>", text("backing file", path)?)?;
    }
    xml.push_str("</volume>");
    Ok(xml)
}

/// The qcow2 volume `volume-clone` makes as a copy of another of `capacity_bytes` (the
/// source's: libvirt copies the content, the XML names and sizes the new volume).
pub fn cloned_volume(name: &str, capacity_bytes: u64) -> Result<String> {
    Ok(format!(
        "<volume><name>{}</name><capacity unit='bytes'>{capacity_bytes}</capacity><target><format type='qcow2'/></target></volume>",
        text("volume name", name)?
    ))
}

/// A raw volume of `bytes` bytes (the NoCloud seed, filled by an upload).
pub fn raw_volume(name: &str, bytes: u64) -> Result<String> {
    Ok(format!(
        "<volume><name>{}</name><capacity unit='bytes'>{bytes}</capacity><allocation unit='bytes'>{bytes}</allocation><target><format type='raw'/></target></volume>",
        text("volume name", name)?
    ))
}

/// The volume an imported image is uploaded into: exactly `bytes` bytes, declared raw
/// (the host streams the image file as it is; machines name its real format when they use
/// it as a backing file).
pub fn image_volume(name: &str, bytes: u64) -> Result<String> {
    Ok(format!(
        "<volume><name>{}</name><capacity unit='bytes'>{bytes}</capacity><allocation unit='bytes'>0</allocation><target><format type='raw'/></target></volume>",
        text("volume name", name)?
    ))
}

/// What a domain gets besides the machine's own disks and NICs.
#[derive(Debug, Default, Clone, Copy)]
pub struct Extras<'a> {
    /// The NoCloud seed `(pool, volume)`, attached read-only after the disks.
    /// Without one, the user-data is only recorded in the domain's metadata.
    pub seed: Option<(&'a str, &'a str)>,
    /// A file on the libvirt host that receives the serial console.
    pub serial_log: Option<&'a str>,
}

/// The QEMU firmware configuration entry Ignition reads on the `qemu` platform.
pub const IGNITION_FW_CFG: &str = "opt/com.coreos/config";

/// The user-data cloud-init gets: the machine's, unless it is Ignition (which goes to
/// the firmware configuration instead, never to cloud-init).
pub fn cloud_init_user_data(machine: &Machine) -> Option<&str> {
    match machine.user_data_format {
        UserDataFormat::CloudConfig => machine.user_data.as_deref(),
        UserDataFormat::Ignition => None,
    }
}

/// The MAC of the machine's `index`-th NIC when it has static addresses (QEMU's prefix).
pub fn mac(machine: &Machine, index: usize) -> String {
    banlieue_sdk::network::stable_mac([0x52, 0x54, 0x00], 0xff, &machine.uid, index)
}

/// The seed's `network-config` (cloud-init version 2), when a NIC has static addresses;
/// without, the guest keeps its default (DHCP).
pub fn network_config(machine: &Machine) -> Option<String> {
    banlieue_sdk::network::any_static(&machine.nics).then(|| banlieue_sdk::network::config_v2(&machine.nics, |i| mac(machine, i)).to_string())
}

/// The persistent domain for `machine`. `virt_type` is the `<domain type>`
/// (`qemu`, or `test` for libvirt's test driver).
pub fn domain(virt_type: &str, machine: &Machine, extras: Extras<'_>) -> Result<String> {
    let ns = text("namespace", &machine.namespace)?;
    let name = text("name", &machine.name)?;
    let uid = text("machine uid", &machine.uid)?;
    let mut xml = String::with_capacity(2048);
    write!(xml, "<domain type='{}'>", text("domain type", virt_type)?)?;
    write!(xml, "<name>{}</name>", text("domain name", &naming::domain_name(&machine.namespace, &machine.name))?)?;
    write!(xml, "<uuid>{uid}</uuid>")?;
    write!(xml, "<title>{ns}/{name}</title>")?;
    write!(xml, "<metadata><banlieue:machine xmlns:banlieue='{METADATA_NS}'>")?;
    write!(
        xml,
        "<banlieue:uid>{uid}</banlieue:uid><banlieue:namespace>{ns}</banlieue:namespace><banlieue:name>{name}</banlieue:name>"
    )?;
    if let (Some(user_data), None) = (cloud_init_user_data(machine), extras.seed) {
        write!(xml, "<banlieue:user-data encoding='base64'>{}</banlieue:user-data>", base64(user_data.as_bytes()))?;
    }
    if let (Some(config), None) = (network_config(machine), extras.seed) {
        write!(xml, "<banlieue:network-config encoding='base64'>{}</banlieue:network-config>", base64(config.as_bytes()))?;
    }
    xml.push_str("</banlieue:machine></metadata>");
    write!(xml, "<memory unit='MiB'>{}</memory><vcpu>{}</vcpu>", machine.memory_mib, machine.cpus)?;
    let firmware = match machine.firmware {
        Firmware::Uefi => " firmware='efi'",
        Firmware::Bios => "",
    };
    write!(xml, "<os{firmware}><type arch='x86_64'>hvm</type><boot dev='hd'/></os>")?;
    if let (UserDataFormat::Ignition, Some(config)) = (machine.user_data_format, &machine.user_data) {
        // Ignition's QEMU platform reads its config from this fw_cfg entry.
        write!(xml, "<sysinfo type='fwcfg'><entry name='{IGNITION_FW_CFG}'>{}</entry></sysinfo>", text("Ignition config", config)?)?;
    }
    xml.push_str("<features><acpi/><apic/></features><devices>");
    for (i, disk) in machine.disks.iter().enumerate() {
        let volume = naming::volume_name(&machine.namespace, &machine.name, &disk.name);
        write!(
            xml,
            "<disk type='volume' device='disk'><driver name='qemu' type='qcow2'/><source pool='{}' volume='{}'/><target dev='{}' bus='virtio'/></disk>",
            text("storage pool", &disk.target)?,
            text("volume name", &volume)?,
            disk_dev(i)
        )?;
    }
    if let Some((pool, volume)) = extras.seed {
        write!(
            xml,
            "<disk type='volume' device='disk'><driver name='qemu' type='raw'/><source pool='{}' volume='{}'/><target dev='{}' bus='virtio'/><readonly/></disk>",
            text("storage pool", pool)?,
            text("volume name", volume)?,
            disk_dev(machine.disks.len())
        )?;
    }
    let pinned = banlieue_sdk::network::any_static(&machine.nics);
    for (i, nic) in machine.nics.iter().enumerate() {
        // With static addresses, every NIC gets the MAC the seed's network-config matches it by.
        let mac = if pinned { format!("<mac address='{}'/>", mac(machine, i)) } else { String::new() };
        write!(
            xml,
            "<interface type='network'>{mac}<source network='{}'/><model type='virtio'/></interface>",
            text("network", &nic.network)?
        )?;
    }
    if let Some(path) = extras.serial_log {
        // A pty with a log: `virsh console` still works, and the host keeps what the guest printed
        // since it last started (not appended: a new machine of the same name starts a new log).
        let path = text("serial log path", path)?;
        write!(
            xml,
            "<serial type='pty'><log file='{path}' append='off'/><target port='0'/></serial><console type='pty'><target type='serial' port='0'/></console>"
        )?;
        // The QEMU guest agent's channel: addresses from inside the guest when it runs one.
        xml.push_str("<channel type='unix'><target type='virtio' name='org.qemu.guest_agent.0'/></channel>");
        // A display listening nowhere: the host reaches it through libvirt alone
        // (`virDomainOpenGraphicsFD`), after the cluster authorized the user.
        xml.push_str("<graphics type='vnc'><listen type='none'/></graphics>");
    }
    xml.push_str("</devices></domain>");
    Ok(xml)
}

/// What the `<banlieue:restore>` mark of a domain says: the domain is being made of snapshot
/// `snapshot` of machine `source`, and is not the machine yet until the mark is gone.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Restore {
    /// The source machine's UID.
    pub source: String,
    /// The source domain's snapshot.
    pub snapshot: String,
}

/// The domain's restore mark, if it carries one.
pub fn restore_marker(domain_xml: &str) -> Option<Restore> {
    let mark = opening(domain_xml, "banlieue:restore")?;
    let get = |name| attribute(mark, name).map(banlieue_sdk::xml::unescape).unwrap_or_default();
    Some(Restore { source: get("source"), snapshot: get("snapshot") })
}

/// `domain_xml` (the driver's, or libvirt's dump of it) with a restore mark in its banlieue
/// metadata: defined so, the domain says a restore into it is not finished.
pub fn with_restore_marker(domain_xml: &str, restore: &Restore) -> Result<String> {
    let close = "</banlieue:machine>";
    let at = domain_xml.find(close).ok_or_else(|| Error::Internal("the domain XML has no banlieue metadata to mark".into()))?;
    let mark = format!(
        "<banlieue:restore source='{}' snapshot='{}'/>",
        text("source machine uid", &restore.source)?,
        text("snapshot name", &restore.snapshot)?
    );
    Ok(format!("{}{mark}{}", &domain_xml[..at], &domain_xml[at..]))
}

/// `domain_xml` without its restore mark (the definition a finished restore is redefined with).
pub fn without_restore_marker(domain_xml: &str) -> String {
    let Some(start) = domain_xml.find("<banlieue:restore") else { return domain_xml.to_string() };
    let rest = &domain_xml[start..];
    let end = match (rest.find("/>"), rest.find('>')) {
        // Self-closing, as written and as libvirt dumps an empty element.
        (Some(sc), Some(gt)) if sc + 1 == gt => sc + 2,
        _ => rest.find("</banlieue:restore>").map_or(rest.len(), |e| e + "</banlieue:restore>".len()),
    };
    format!("{}{}", &domain_xml[..start], &domain_xml[start + end..])
}

/// The owner mark element for `virDomainSetMetadata`.
pub fn owner_mark(mark: &OwnerMark) -> Result<String> {
    Ok(format!(
        "<owner machine-uid='{}' machine='{}' installation='{}'/>",
        text("machine uid", &mark.machine_uid)?,
        text("machine", &mark.machine)?,
        text("installation", &mark.installation)?
    ))
}

/// Whether the domain carries an adoption mark (not only the metadata of a domain the driver made).
pub fn owner_marked(domain_xml: &str) -> bool {
    opening(domain_xml, &format!("{OWNER_KEY}:owner")).is_some()
}

/// Who the domain is banlieue's for: its adoption mark, else the machine the driver made it
/// for (its metadata's UID, namespace and name; no installation recorded).
pub fn owner(domain_xml: &str) -> Option<OwnerMark> {
    let unescaped = |v: Option<&str>| v.map(banlieue_sdk::xml::unescape).unwrap_or_default();
    if let Some(mark) = opening(domain_xml, &format!("{OWNER_KEY}:owner")) {
        return Some(OwnerMark {
            machine_uid: unescaped(attribute(mark, "machine-uid")),
            machine: unescaped(attribute(mark, "machine")),
            installation: unescaped(attribute(mark, "installation")),
        });
    }
    let (_, uid) = element(domain_xml, "banlieue:uid")?;
    let part = |tag| element(domain_xml, tag).map(|(_, t)| banlieue_sdk::xml::unescape(t.trim())).unwrap_or_default();
    Some(OwnerMark {
        machine_uid: banlieue_sdk::xml::unescape(uid.trim()),
        machine: format!("{}/{}", part("banlieue:namespace"), part("banlieue:name")),
        installation: String::new(),
    })
}

/// The MAC addresses of the domain's interfaces, in document order.
pub fn macs(domain_xml: &str) -> Vec<String> {
    let mut found = Vec::new();
    let mut rest = domain_xml;
    while let Some(at) = rest.find("<mac ") {
        rest = &rest[at + 5..];
        let element = &rest[..rest.find('>').unwrap_or(rest.len())];
        if let Some(value) = attribute(element, "address") {
            found.push(value.to_string());
        }
    }
    found
}

/// Whether the domain's XML has a serial console (`<console>`).
pub fn has_serial_console(domain_xml: &str) -> bool {
    opening(domain_xml, "console").is_some()
}

/// Whether the domain's XML has a VNC display (`<graphics type='vnc'>`).
pub fn has_vnc_display(domain_xml: &str) -> bool {
    let mut rest = domain_xml;
    while let Some(element) = opening(rest, "graphics") {
        if attribute(element, "type") == Some("vnc") {
            return true;
        }
        rest = &rest[rest.find("<graphics").map_or(rest.len(), |at| at + 9)..];
    }
    false
}

/// One `<disk>` of a domain, as its XML names it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DomainDisk {
    /// Guest device (`vda`).
    pub dev: String,
    pub pool: String,
    pub volume: String,
    /// Read-only (the NoCloud seed).
    pub readonly: bool,
}

/// What a domain's XML says of its hardware.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct DomainHardware {
    pub cpus: u32,
    pub memory_mib: u64,
    pub disks: Vec<DomainDisk>,
    /// Each interface's MAC and network, in document order.
    pub nics: Vec<(String, String)>,
}

/// Read the hardware from domain XML as libvirt returns it (`<memory unit='KiB'>`,
/// `<vcpu placement='static'>`, volume disks, network interfaces).
pub fn hardware(domain_xml: &str) -> DomainHardware {
    let memory_mib = element(domain_xml, "memory")
        .and_then(|(attrs, text)| {
            let n: u64 = text.trim().parse().ok()?;
            Some(match attribute(attrs, "unit").unwrap_or("KiB") {
                "b" | "bytes" => n >> 20,
                "KiB" | "k" => n >> 10,
                "MiB" | "M" => n,
                "GiB" | "G" => n << 10,
                _ => n >> 10,
            })
        })
        .unwrap_or(0);
    let cpus = element(domain_xml, "vcpu").and_then(|(_, t)| t.trim().parse().ok()).unwrap_or(0);
    let disks = blocks(domain_xml, "disk")
        .filter_map(|(attrs, body)| {
            (attribute(attrs, "device").unwrap_or("disk") == "disk").then_some(())?;
            let source = opening(body, "source")?;
            Some(DomainDisk {
                dev: opening(body, "target").and_then(|t| attribute(t, "dev")).unwrap_or_default().to_string(),
                pool: attribute(source, "pool").unwrap_or_default().to_string(),
                volume: attribute(source, "volume").or_else(|| attribute(source, "file")).unwrap_or_default().to_string(),
                readonly: body.contains("<readonly"),
            })
        })
        .collect();
    let nics = blocks(domain_xml, "interface")
        .map(|(_, body)| {
            let mac = opening(body, "mac").and_then(|m| attribute(m, "address")).unwrap_or_default();
            let network = opening(body, "source").and_then(|s| attribute(s, "network").or_else(|| attribute(s, "bridge"))).unwrap_or_default();
            (mac.to_string(), network.to_string())
        })
        .collect();
    DomainHardware { cpus, memory_mib, disks, nics }
}

/// `domain_xml` with `cpus` vCPUs and `memory_mib` of memory (maximum and current), the
/// rest as it was: the definition a shut-off domain is redefined with.
pub fn with_cpus_and_memory(domain_xml: &str, cpus: u32, memory_mib: u64) -> Result<String> {
    let mut xml = domain_xml.to_string();
    for (tag, text) in [("memory", memory_mib.to_string()), ("currentMemory", memory_mib.to_string()), ("vcpu", cpus.to_string())] {
        let Some(start) = xml.find(&format!("<{tag}")).filter(|at| xml[at + tag.len() + 1..].starts_with([' ', '>'])) else {
            if tag == "currentMemory" {
                continue;
            }
            return Err(Error::Internal(format!("the domain XML has no <{tag}> element")));
        };
        let close = format!("</{tag}>");
        let end = xml[start..].find(&close).map(|e| start + e + close.len()).ok_or_else(|| Error::Internal(format!("the domain XML's <{tag}> is not closed")))?;
        // Memory in MiB whatever unit libvirt wrote; vcpu keeps its attributes.
        let replacement = if tag == "vcpu" {
            let open_end = start + xml[start..].find('>').unwrap_or(0) + 1;
            format!("{}{text}{close}", &xml[start..open_end])
        } else {
            format!("<{tag} unit='MiB'>{text}{close}")
        };
        xml.replace_range(start..end, &replacement);
    }
    Ok(xml)
}

/// The first `<tag …>text</tag>`: its attribute text and its text.
pub(crate) fn element<'a>(xml: &'a str, tag: &'a str) -> Option<(&'a str, &'a str)> {
    blocks(xml, tag).next()
}

/// Every `<tag …>…</tag>` (not self-closing), as (attribute text, body).
fn blocks<'a>(xml: &'a str, tag: &'a str) -> impl Iterator<Item = (&'a str, &'a str)> + 'a {
    let (open, close) = (format!("<{tag}"), format!("</{tag}>"));
    let mut rest = xml;
    std::iter::from_fn(move || loop {
        let at = rest.find(&open)?;
        let after = &rest[at + open.len()..];
        // `<disk` must not match `<diskx`.
        if !after.starts_with([' ', '>', '\n', '\t']) {
            rest = after;
            continue;
        }
        let head_end = after.find('>')?;
        let attrs = &after[..head_end];
        if attrs.ends_with('/') {
            rest = &after[head_end..];
            continue;
        }
        let body_start = &after[head_end + 1..];
        let body_end = body_start.find(&close)?;
        rest = &body_start[body_end + close.len()..];
        return Some((attrs, &body_start[..body_end]));
    })
}

/// The attribute text of the first `<tag …>` or `<tag …/>` in `xml`.
pub(crate) fn opening<'a>(xml: &'a str, tag: &str) -> Option<&'a str> {
    let open = format!("<{tag}");
    let mut rest = xml;
    loop {
        let at = rest.find(&open)?;
        let after = &rest[at + open.len()..];
        if after.starts_with([' ', '>', '/', '\n', '\t']) {
            let end = after.find('>')?;
            return Some(after[..end].trim_end_matches('/'));
        }
        rest = after;
    }
}

/// The value of `name='…'` or `name="…"` inside one element's attribute text.
pub(crate) fn attribute<'a>(element: &'a str, name: &str) -> Option<&'a str> {
    let mut rest = element;
    while let Some(at) = rest.find(name) {
        let before_ok = at == 0 || rest[..at].ends_with(|c: char| c.is_ascii_whitespace());
        let after = rest[at + name.len()..].trim_start();
        if before_ok && let Some(after) = after.strip_prefix('=') {
            let after = after.trim_start();
            let quote = after.chars().next()?;
            if quote == '\'' || quote == '"' {
                let value = &after[1..];
                return value.find(quote).map(|end| &value[..end]);
            }
        }
        rest = &rest[at + name.len()..];
    }
    None
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use banlieue_sdk::provider::{Disk, ImageSource, Nic, PowerState, UserDataFormat};

    pub(crate) fn machine() -> Machine {
        Machine {
            uid: "6f1c2a3e-1111-4222-8333-444455556666".into(),
            name: "vm".into(),
            namespace: "ns".into(),
            cpus: 2,
            memory_mib: 512,
            firmware: Firmware::Bios,
            disks: vec![
                Disk { name: "root".into(), size_gib: 10, target: "default-pool".into() },
                Disk { name: "data".into(), size_gib: 1, target: "fast".into() },
            ],
            nics: vec![Nic { name: "eth0".into(), network: "default".into(), ip: None }],
            image: ImageSource::BackingFile("/var/lib/images/base.qcow2".into()),
            user_data: None,
            user_data_format: UserDataFormat::CloudConfig,
            failure_domain: "host-a".into(),
            power_state: PowerState::PoweredOn,
            labels: vec![],
        }
    }

    #[test]
    fn escapes_the_five_xml_specials() {
        assert_eq!(escape(r#"a&b<c>d'e"f"#), "a&amp;b&lt;c&gt;d&apos;e&quot;f");
        assert_eq!(escape("plain/path_1.qcow2"), "plain/path_1.qcow2");
        assert!(text("x", "tab\tok").is_ok());
        let e = text("backing file", "bad\u{1}path").unwrap_err();
        assert!(matches!(&e, Error::InvalidSpec(m) if m.contains("backing file")), "{e:?}");
    }

    #[test]
    fn base64_matches_rfc4648_vectors() {
        for (plain, encoded) in [
            ("", ""),
            ("f", "Zg=="),
            ("fo", "Zm8="),
            ("foo", "Zm9v"),
            ("foob", "Zm9vYg=="),
            ("fooba", "Zm9vYmE="),
            ("foobar", "Zm9vYmFy"),
        ] {
            assert_eq!(base64(plain.as_bytes()), encoded, "{plain:?}");
        }
    }

    #[test]
    fn disk_devices_count_like_linux() {
        assert_eq!(disk_dev(0), "vda");
        assert_eq!(disk_dev(1), "vdb");
        assert_eq!(disk_dev(25), "vdz");
        assert_eq!(disk_dev(26), "vdaa");
        assert_eq!(disk_dev(27), "vdab");
        assert_eq!(disk_dev(701), "vdzz");
        assert_eq!(disk_dev(702), "vdaaa");
    }

    #[test]
    fn boot_volume_has_a_qcow2_backing_store() {
        let xml = volume("ns_vm_root.qcow2", 10, Some("/images/a&b.qcow2")).unwrap();
        assert_eq!(
            xml,
            "<volume><name>ns_vm_root.qcow2</name><capacity unit='GiB'>10</capacity><allocation>0</allocation><target><format type='qcow2'/></target>\
             <backingStore><path>/images/a&amp;b.qcow2</path><format type='qcow2'/></backingStore></volume>"
        );
        let data = volume("ns_vm_data.qcow2", 1, None).unwrap();
        assert!(!data.contains("backingStore"), "{data}");
    }

    #[test]
    fn domain_xml_carries_identity_devices_and_metadata() {
        let mut m = machine();
        m.firmware = Firmware::Uefi;
        m.user_data = Some("#cloud-config\n".into());
        let xml = domain("qemu", &m, Extras::default()).unwrap();
        for part in [
            "<domain type='qemu'>",
            "<name>ns_vm</name>",
            "<uuid>6f1c2a3e-1111-4222-8333-444455556666</uuid>",
            "<title>ns/vm</title>",
            "<banlieue:machine xmlns:banlieue='https://banlieue.io/libvirt/v1'>",
            "<banlieue:uid>6f1c2a3e-1111-4222-8333-444455556666</banlieue:uid>",
            "<banlieue:user-data encoding='base64'>I2Nsb3VkLWNvbmZpZwo=</banlieue:user-data>",
            "<memory unit='MiB'>512</memory><vcpu>2</vcpu>",
            "<os firmware='efi'><type arch='x86_64'>hvm</type>",
            "<source pool='default-pool' volume='ns_vm_root.qcow2'/><target dev='vda' bus='virtio'/>",
            "<source pool='fast' volume='ns_vm_data.qcow2'/><target dev='vdb' bus='virtio'/>",
            "<interface type='network'><source network='default'/><model type='virtio'/></interface>",
        ] {
            assert!(xml.contains(part), "missing {part} in {xml}");
        }
        let bios = domain("test", &machine(), Extras::default()).unwrap();
        assert!(
            bios.starts_with("<domain type='test'>") && bios.contains("<os><type") && !bios.contains("user-data"),
            "{bios}"
        );
    }

    #[test]
    fn the_seed_is_a_read_only_disk_after_the_others_and_replaces_the_recorded_user_data() {
        let mut m = machine();
        m.user_data = Some("#cloud-config\n".into());
        let extras = Extras { seed: Some(("default-pool", "ns_vm_cidata.img")), serial_log: Some("/var/log/x.log") };
        let xml = domain("qemu", &m, extras).unwrap();
        assert!(
            xml.contains("<driver name='qemu' type='raw'/><source pool='default-pool' volume='ns_vm_cidata.img'/><target dev='vdc' bus='virtio'/><readonly/>"),
            "{xml}"
        );
        assert!(!xml.contains("user-data"), "{xml}");
        assert!(xml.contains("<serial type='pty'><log file='/var/log/x.log' append='off'/>"), "{xml}");
        assert!(has_serial_console(&xml) && has_vnc_display(&xml), "{xml}");
        assert!(xml.contains("<graphics type='vnc'><listen type='none'/></graphics>"), "a display with no port: {xml}");
        assert!(xml.contains("org.qemu.guest_agent.0"), "{xml}");
        assert_eq!(
            raw_volume("s.img", 65536).unwrap(),
            "<volume><name>s.img</name><capacity unit='bytes'>65536</capacity><allocation unit='bytes'>65536</allocation><target><format type='raw'/></target></volume>"
        );
    }

    #[test]
    fn every_string_in_the_domain_is_escaped() {
        let mut m = machine();
        m.disks[0].target = "pool'><evil/>".into();
        m.nics[0].network = "net\"&".into();
        let xml = domain("qemu", &m, Extras::default()).unwrap();
        assert!(xml.contains("pool='pool&apos;&gt;&lt;evil/&gt;'"), "{xml}");
        assert!(xml.contains("network='net&quot;&amp;'"), "{xml}");
        assert!(!xml.contains("<evil/>"));
        m.nics[0].network = "nul\0".into();
        assert!(matches!(domain("qemu", &m, Extras::default()), Err(Error::InvalidSpec(_))));
    }

    #[test]
    fn static_addresses_pin_each_nics_mac_and_the_network_config_matches_it() {
        let mut m = machine();
        assert!(!domain("test", &m, Extras::default()).unwrap().contains("<mac "), "DHCP leaves MACs to libvirt");
        assert_eq!(network_config(&m), None);
        m.nics.push(Nic { name: "eth1".into(), network: "default".into(), ip: None });
        m.nics[0].ip = Some(banlieue_sdk::provider::IpConfig {
            addresses: vec!["192.168.123.50/24".into()],
            gateway: Some("192.168.123.1".into()),
            nameservers: vec![],
            search_domains: vec![],
        });
        let xml = domain("test", &m, Extras::default()).unwrap();
        assert_eq!(macs(&xml), [mac(&m, 0), mac(&m, 1)]);
        let config: serde_json::Value = serde_json::from_str(&network_config(&m).unwrap()).unwrap();
        assert_eq!(config["ethernets"]["eth0"]["match"]["macaddress"], mac(&m, 0));
        assert_eq!(config["ethernets"]["eth0"]["addresses"][0], "192.168.123.50/24");
        assert_eq!(config["ethernets"]["eth1"]["dhcp4"], true);
        assert!(xml.contains(&format!("<banlieue:network-config encoding='base64'>{}</banlieue:network-config>", base64(network_config(&m).unwrap().as_bytes()))));
        let seeded = domain("qemu", &m, Extras { seed: Some(("p", "v")), serial_log: None }).unwrap();
        assert!(!seeded.contains("network-config"), "with a seed, the config is in the seed");
    }

    #[test]
    fn ignition_goes_to_the_firmware_configuration_never_to_cloud_init() {
        let mut m = machine();
        m.user_data = Some(r#"{"ignition":{"version":"3.4.0"},"x":"<&>"}"#.into());
        m.user_data_format = UserDataFormat::Ignition;
        let xml = domain("test", &m, Extras::default()).unwrap();
        assert!(xml.contains("<sysinfo type='fwcfg'><entry name='opt/com.coreos/config'>{&quot;ignition&quot;:{&quot;version&quot;:&quot;3.4.0&quot;},&quot;x&quot;:&quot;&lt;&amp;&gt;&quot;}</entry></sysinfo>"), "{xml}");
        assert!(!xml.contains("banlieue:user-data"), "not recorded as cloud-init user-data: {xml}");
        assert_eq!(cloud_init_user_data(&m), None);
        m.user_data_format = UserDataFormat::CloudConfig;
        assert!(!domain("test", &m, Extras::default()).unwrap().contains("sysinfo"));
    }

    /// The shape of `virsh dumpxml` for a domain this driver defined (libvirt rewrites
    /// memory in KiB, adds placement, indexes and MACs).
    const DUMPED: &str = "<domain type='test'>\n  <name>ns_vm</name>\n  <memory unit='KiB'>524288</memory>\n  <currentMemory unit='KiB'>524288</currentMemory>\n  <vcpu placement='static'>2</vcpu>\n  <devices>\n    <disk type='volume' device='disk'>\n      <driver name='qemu' type='qcow2'/>\n      <source pool='default-pool' volume='ns_vm_root.qcow2' index='2'/>\n      <target dev='vda' bus='virtio'/>\n    </disk>\n    <disk type='volume' device='disk'>\n      <source pool='fast' volume='ns_vm_data.qcow2'/>\n      <target dev='vdb' bus='virtio'/>\n    </disk>\n    <disk type='volume' device='disk'>\n      <source pool='default-pool' volume='ns_vm_cidata.img'/>\n      <target dev='vdc' bus='virtio'/>\n      <readonly/>\n    </disk>\n    <disk type='file' device='cdrom'>\n      <target dev='hda' bus='ide'/>\n    </disk>\n    <interface type='network'>\n      <mac address='52:54:00:aa:bb:cc'/>\n      <source network='default'/>\n    </interface>\n  </devices>\n</domain>";

    #[test]
    fn hardware_is_read_from_dumped_domain_xml() {
        let hw = hardware(DUMPED);
        assert_eq!((hw.cpus, hw.memory_mib), (2, 512));
        let disks: Vec<(&str, &str, &str, bool)> = hw.disks.iter().map(|d| (d.dev.as_str(), d.pool.as_str(), d.volume.as_str(), d.readonly)).collect();
        assert_eq!(
            disks,
            [("vda", "default-pool", "ns_vm_root.qcow2", false), ("vdb", "fast", "ns_vm_data.qcow2", false), ("vdc", "default-pool", "ns_vm_cidata.img", true)],
            "the cdrom is no disk"
        );
        assert_eq!(hw.nics, [("52:54:00:aa:bb:cc".to_string(), "default".to_string())]);
        let ours = hardware(&domain("test", &machine(), Extras::default()).unwrap());
        assert_eq!((ours.cpus, ours.memory_mib, ours.disks.len(), ours.nics.len()), (2, 512, 2, 1), "and from the XML this driver writes");
    }

    #[test]
    fn cpus_and_memory_are_rewritten_and_nothing_else() {
        let xml = with_cpus_and_memory(DUMPED, 4, 2048).unwrap();
        assert!(xml.contains("<memory unit='MiB'>2048</memory>") && xml.contains("<currentMemory unit='MiB'>2048</currentMemory>"), "{xml}");
        assert!(xml.contains("<vcpu placement='static'>4</vcpu>"), "{xml}");
        assert_eq!(xml.replace("<memory unit='MiB'>2048", "<memory unit='KiB'>524288").replace("<currentMemory unit='MiB'>2048", "<currentMemory unit='KiB'>524288").replace("'static'>4<", "'static'>2<"), DUMPED);
        assert_eq!(hardware(&xml).memory_mib, 2048);
        assert!(with_cpus_and_memory("<domain/>", 1, 1).is_err());
    }

    #[test]
    fn a_restore_mark_is_added_read_and_removed_as_libvirt_dumps_it() {
        let restore = Restore { source: "aaaaaaaa-1111-4222-8333-444455556666".into(), snapshot: "bl-<1>".into() };
        let ours = domain("test", &machine(), Extras::default()).unwrap();
        assert_eq!(restore_marker(&ours), None);
        let marked = with_restore_marker(&ours, &restore).unwrap();
        assert!(marked.contains("<banlieue:restore source='aaaaaaaa-1111-4222-8333-444455556666' snapshot='bl-&lt;1&gt;'/></banlieue:machine>"), "{marked}");
        assert_eq!(restore_marker(&marked), Some(restore.clone()));
        assert_eq!(without_restore_marker(&marked), ours);
        // libvirt's dump: double quotes, its own indentation.
        let dumped = "<domain type='qemu'>\n  <metadata>\n    <banlieue:machine xmlns:banlieue=\"https://banlieue.io/libvirt/v1\">\n      <banlieue:uid>u</banlieue:uid>\n      <banlieue:restore source=\"aaaaaaaa-1111-4222-8333-444455556666\" snapshot=\"bl-&lt;1&gt;\"/>\n    </banlieue:machine>\n  </metadata>\n</domain>";
        assert_eq!(restore_marker(dumped), Some(restore));
        let unmarked = without_restore_marker(dumped);
        assert!(!unmarked.contains("restore") && unmarked.contains("<banlieue:uid>u</banlieue:uid>") && unmarked.contains("</banlieue:machine>"), "{unmarked}");
        assert!(with_restore_marker("<domain/>", &Restore { source: String::new(), snapshot: String::new() }).is_err());
    }

    #[test]
    fn a_cloned_volume_is_named_and_sized_only() {
        assert_eq!(
            cloned_volume("ns_vm_root.qcow2", 1 << 30).unwrap(),
            "<volume><name>ns_vm_root.qcow2</name><capacity unit='bytes'>1073741824</capacity><target><format type='qcow2'/></target></volume>"
        );
    }

    #[test]
    fn the_owner_is_the_adoption_mark_else_the_machine_the_domain_was_made_for() {
        let mark = OwnerMark { machine_uid: "u-1".into(), machine: "ns/web".into(), installation: "c1/a&b".into() };
        assert_eq!(owner_mark(&mark).unwrap(), "<owner machine-uid='u-1' machine='ns/web' installation='c1/a&amp;b'/>");
        // As libvirt dumps a mark set with virDomainSetMetadata.
        let dumped = "<domain type='kvm'>\n  <name>legacy</name>\n  <metadata>\n    <banlieue-owner:owner xmlns:banlieue-owner=\"https://banlieue.io/libvirt/owner/v1\" machine-uid=\"u-1\" machine=\"ns/web\" installation=\"c1/a&amp;b\"/>\n  </metadata>\n</domain>";
        assert_eq!(owner(dumped), Some(mark));
        let made = domain("qemu", &machine(), Extras::default()).unwrap();
        let o = owner(&made).unwrap();
        assert_eq!((o.machine_uid.as_str(), o.machine.as_str(), o.installation.as_str()), (machine().uid.as_str(), "ns/vm", ""));
        assert_eq!(owner("<domain><name>by-hand</name><metadata><other:x xmlns:other='o'/></metadata></domain>"), None);
    }

    #[test]
    fn macs_are_read_from_the_domain_xml() {
        let xml = "<domain><devices><interface type='network'>\n  <mac address='52:54:00:e4:b8:f3'/>\n</interface>\
                   <interface><mac address=\"52:54:00:00:00:01\"/></interface><macaddr x='1'/></devices></domain>";
        assert_eq!(macs(xml), vec!["52:54:00:e4:b8:f3".to_string(), "52:54:00:00:00:01".to_string()]);
        assert!(macs("<domain/>").is_empty());
    }
}
