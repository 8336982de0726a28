//! The Proxmox VE API as this driver speaks it, with no host calls: form and
//! path encoding, the `{"data": …}` envelope and PVE's errors, the naming and
//! tagging that make a VM findable by its Machine UID, config values, UPIDs,
//! guest-agent addresses and the cloud-init keys a user-data document maps to.

use banlieue_sdk::Error;
use banlieue_sdk::provider::{Address, AddressType};
use serde_json::Value;

/// Prefix of the PVE tag that carries the Machine UID (`banlieue-<uid>`).
pub const UID_TAG_PREFIX: &str = "banlieue-";
/// Line of the VM description that carries the Machine UID (set by the clone itself).
pub const UID_LINE_PREFIX: &str = "banlieue-uid: ";
/// Line of the VM description that names the Machine (`namespace/name`), for people and for
/// the owner [`crate::adopt`] reports for a VM this driver made.
pub const MACHINE_LINE_PREFIX: &str = "banlieue machine ";

/// Percent-encode everything but RFC 3986 unreserved characters (as JavaScript's
/// `encodeURIComponent`, which PVE expects for `sshkeys`, and safe for forms and paths).
pub fn encode(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b'~') {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// An `application/x-www-form-urlencoded` body.
pub fn form(pairs: &[(String, String)]) -> Vec<u8> {
    pairs.iter().map(|(k, v)| format!("{}={}", encode(k), encode(v))).collect::<Vec<_>>().join("&").into_bytes()
}

/// The endpoint without a trailing `/` or `/api2/json`, so paths can be appended.
pub fn api_base(endpoint: &str) -> String {
    let mut base = endpoint.trim_end_matches('/').to_string();
    for suffix in ["/api2/json", "/api2/extjs"] {
        if let Some(stripped) = base.strip_suffix(suffix) {
            base = stripped.to_string();
        }
    }
    format!("{base}/api2/json")
}

/// PVE's answer to a request: the `data` on success, or the error kind for its status and message.
pub fn parse_response(method: &str, path: &str, status: u16, body: &[u8]) -> Result<Value, Error> {
    let parsed: Option<Value> = serde_json::from_slice(body).ok();
    if (200..300).contains(&status) {
        let v = parsed.ok_or_else(|| {
            Error::Internal(format!("{method} {path}: HTTP {status} with a body that is not JSON: {}", snippet(body)))
        })?;
        return match v {
            Value::Object(mut m) => Ok(m.remove("data").unwrap_or(Value::Null)),
            other => Err(Error::Internal(format!("{method} {path}: answer is not a {{\"data\": …}} object: {other}"))),
        };
    }
    let (message, errors) = match &parsed {
        Some(Value::Object(m)) => (
            m.get("message").and_then(Value::as_str).map(|s| s.trim().to_string()).unwrap_or_default(),
            m.get("errors").filter(|e| !e.is_null()).map(|e| e.to_string()),
        ),
        _ => (String::new(), None),
    };
    let mut msg = if message.is_empty() { snippet(body) } else { message };
    if let Some(errs) = errors {
        msg = format!("{msg} {errs}");
    }
    Err(pve_error(status, format!("{method} {path}: HTTP {status}: {msg}")))
}

fn snippet(body: &[u8]) -> String {
    let mut s = String::from_utf8_lossy(body).trim().to_string();
    if s.len() > 300 {
        let mut cut = 300;
        while !s.is_char_boundary(cut) {
            cut -= 1;
        }
        s.truncate(cut);
        s.push('…');
    }
    s
}

/// The error kind for a PVE status and message. PVE answers most failures with
/// 500 and a message, so the message decides between "gone", "never works" and
/// "try again".
pub fn pve_error(status: u16, msg: String) -> Error {
    let lower = msg.to_ascii_lowercase();
    match status {
        401 | 403 => Error::Denied(msg),
        400 => Error::InvalidSpec(msg),
        404 => Error::NotFound(msg),
        500 if is_missing(&lower) => Error::NotFound(msg),
        500 if is_never(&lower) => Error::InvalidSpec(msg),
        501 => Error::Internal(msg),
        408 | 429 | 500..=599 => Error::Unavailable(msg),
        _ => Error::Internal(msg),
    }
}

/// A message saying the VM (or another object) does not exist.
pub fn is_missing(lower: &str) -> bool {
    (lower.contains("configuration file") && lower.contains("does not exist")) || lower.contains("no such vm")
}

/// Messages of requests that can never succeed as written.
fn is_never(lower: &str) -> bool {
    lower.contains("can't clone to non-shared storage")
        || lower.contains("does not support vm images")
        || lower.contains("no such cluster node")
        || (lower.contains("storage '") && lower.contains("does not exist"))
}

/// A VMID or node collision while cloning: try another VMID.
pub fn is_collision(msg: &str) -> bool {
    let lower = msg.to_ascii_lowercase();
    lower.contains("already exists") || lower.contains("config file already exists")
}

/// Machine UIDs go into a PVE tag, whose characters are restricted: accept what a
/// Kubernetes UID is (lowercase hex and `-`), refuse anything else.
pub fn check_uid(uid: &str) -> Result<(), Error> {
    if uid.is_empty() || uid.len() > 64 || !uid.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'z').contains(&b) || b == b'-') {
        return Err(Error::InvalidSpec(format!("machine UID {uid:?} is not lowercase letters, digits and '-'")));
    }
    Ok(())
}

/// The tag carrying the UID.
pub fn uid_tag(uid: &str) -> String {
    format!("{UID_TAG_PREFIX}{uid}")
}

/// The tags of a VM (PVE separates them with `;`, and accepts `,` and spaces).
pub fn split_tags(tags: &str) -> Vec<&str> {
    tags.split([';', ',', ' ']).map(str::trim).filter(|t| !t.is_empty()).collect()
}

pub fn has_uid_tag(tags: &str, uid: &str) -> bool {
    let want = uid_tag(uid);
    split_tags(tags).iter().any(|t| *t == want)
}

/// `tags` with the UID tag added (existing tags kept).
pub fn with_uid_tag(tags: &str, uid: &str) -> String {
    let mut all: Vec<String> = split_tags(tags).into_iter().map(String::from).collect();
    let want = uid_tag(uid);
    if !all.contains(&want) {
        all.push(want);
    }
    all.join(";")
}

/// `tags` with the UID tag of `uid` and no other machine's (a tag `banlieue-<UUID>`), the
/// rest kept: a VM cloned from another machine's snapshot is this machine's only.
pub fn with_only_uid_tag(tags: &str, uid: &str) -> String {
    let want = uid_tag(uid);
    let foreign = |t: &str| t != want && t.strip_prefix(UID_TAG_PREFIX).is_some_and(is_uuid);
    with_uid_tag(&split_tags(tags).into_iter().filter(|t| !foreign(t)).collect::<Vec<_>>().join(";"), uid)
}

/// Whether `s` is a UUID in its usual text form (8-4-4-4-12 hex digits), as Kubernetes writes UIDs.
pub fn is_uuid(s: &str) -> bool {
    let groups: Vec<&str> = s.split('-').collect();
    groups.len() == 5 && groups.iter().zip([8, 4, 4, 4, 12]).all(|(g, n)| g.len() == n && g.bytes().all(|b| b.is_ascii_hexdigit()))
}

/// The description written at clone time: a human line, then the UID line.
pub fn description(namespace: &str, name: &str, uid: &str) -> String {
    format!("{MACHINE_LINE_PREFIX}{namespace}/{name}\n{UID_LINE_PREFIX}{uid}\n")
}

pub fn description_has_uid(description: &str, uid: &str) -> bool {
    description.lines().any(|l| l.trim().strip_prefix(UID_LINE_PREFIX.trim_end()).map(str::trim) == Some(uid))
}

/// The PVE VM name for `namespace/name`: `{name}.{namespace}`, a valid DNS name
/// (a namespace is a DNS label, so the last label is always the namespace).
pub fn vm_name(namespace: &str, name: &str) -> Result<String, Error> {
    let label_ok = |l: &str| {
        !l.is_empty()
            && l.len() <= 63
            && l.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
            && !l.starts_with('-')
            && !l.ends_with('-')
    };
    if !label_ok(namespace) {
        return Err(Error::InvalidSpec(format!("namespace {namespace:?} is not a DNS label")));
    }
    if name.is_empty() || !name.split('.').all(label_ok) {
        return Err(Error::InvalidSpec(format!("machine name {name:?} is not a DNS subdomain")));
    }
    let full = format!("{name}.{namespace}");
    if full.len() > 253 {
        return Err(Error::InvalidSpec(format!("VM name {full:?} is longer than 253 characters")));
    }
    Ok(full)
}

/// The provider ID: `proxmox://<node>/<vmid>`.
pub fn provider_id(node: &str, vmid: u64) -> String {
    format!("proxmox://{node}/{vmid}")
}

/// A number PVE sends as a JSON number or as a string (config values are strings).
pub fn num(v: Option<&Value>) -> Option<u64> {
    match v? {
        Value::Number(n) => n.as_u64().or_else(|| n.as_f64().map(|f| f.max(0.0) as u64)),
        Value::String(s) => s.trim().parse::<u64>().ok().or_else(|| s.trim().parse::<f64>().ok().map(|f| f.max(0.0) as u64)),
        Value::Bool(b) => Some(u64::from(*b)),
        _ => None,
    }
}

pub fn text<'a>(v: &'a Value, key: &str) -> &'a str {
    v.get(key).and_then(Value::as_str).unwrap_or("")
}

/// A flag PVE sends as 1/0, "1"/"0" or true/false.
pub fn flag(v: &Value, key: &str) -> bool {
    num(v.get(key)).unwrap_or(0) != 0
}

/// The node a task runs on, from its UPID (`UPID:<node>:…`).
pub fn upid_node(upid: &str) -> Result<&str, Error> {
    let mut parts = upid.split(':');
    match (parts.next(), parts.next()) {
        (Some("UPID"), Some(node)) if !node.is_empty() => Ok(node),
        _ => Err(Error::Internal(format!("not a PVE task id (UPID): {upid:?}"))),
    }
}

/// Where a task is: still running, done, or failed with PVE's exit status.
#[derive(Debug, PartialEq, Eq)]
pub enum TaskState {
    Running,
    Ok,
    Failed(String),
}

pub fn task_state(status: &Value) -> TaskState {
    if text(status, "status") != "stopped" {
        return TaskState::Running;
    }
    match text(status, "exitstatus") {
        "OK" => TaskState::Ok,
        // PVE's "WARNINGS: n" is a finished task that worked.
        s if s.starts_with("WARNINGS") => TaskState::Ok,
        "" => TaskState::Failed("task stopped without an exit status".into()),
        s => TaskState::Failed(s.to_string()),
    }
}

/// The error for a failed task: PVE's exit status, kind from its wording.
pub fn task_error(what: &str, exitstatus: &str) -> Error {
    let msg = format!("{what}: task failed: {exitstatus}");
    let lower = exitstatus.to_ascii_lowercase();
    if is_missing(&lower) {
        Error::NotFound(msg)
    } else if is_never(&lower) || lower.contains("you can't start a vm if it's a template") {
        Error::InvalidSpec(msg)
    } else {
        Error::Unavailable(msg)
    }
}

/// `netN` for a NIC on a bridge, keeping the MAC of an existing value (so a
/// re-apply does not change the guest's MAC).
pub fn net_value(bridge: &str, existing: Option<&str>) -> String {
    let mac = existing.and_then(|v| {
        v.split(',').find_map(|part| {
            let (k, val) = part.split_once('=')?;
            (k == "virtio" && val.len() == 17).then(|| val.to_string())
        })
    });
    match mac {
        Some(mac) => format!("virtio={mac},bridge={bridge}"),
        None => format!("virtio,bridge={bridge}"),
    }
}

/// The bridge of a `netN` value.
pub fn net_bridge(value: &str) -> Option<&str> {
    value.split(',').find_map(|p| p.strip_prefix("bridge="))
}

/// The storage of a drive value (`local-lvm:vm-100-disk-0,size=4G` → `local-lvm`).
pub fn drive_storage(value: &str) -> Option<&str> {
    let vol = value.split(',').next()?;
    let (sid, _) = vol.split_once(':')?;
    (!sid.is_empty() && !sid.starts_with('/')).then_some(sid)
}

/// Addresses from the agent's `network-get-interfaces` result: every address
/// but loopback and IPv6 link-local, as internal IPs.
pub fn agent_addresses(data: &Value) -> Vec<Address> {
    let list = data.get("result").unwrap_or(data);
    let mut out = Vec::new();
    for iface in list.as_array().into_iter().flatten() {
        if text(iface, "name") == "lo" {
            continue;
        }
        for addr in iface.get("ip-addresses").and_then(Value::as_array).into_iter().flatten() {
            let ip = text(addr, "ip-address");
            if ip.is_empty() || ip.starts_with("127.") || ip == "::1" || ip.to_ascii_lowercase().starts_with("fe80:") {
                continue;
            }
            if !out.iter().any(|a: &Address| a.address == ip) {
                out.push(Address { type_: AddressType::InternalIp, address: ip.to_string() });
            }
        }
    }
    out
}

/// What a user-data document maps to in PVE's own cloud-init keys.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct CloudInit {
    /// `ciuser`, `cipassword`, `sshkeys` (already percent-encoded as PVE wants).
    pub params: Vec<(String, String)>,
    /// Top-level keys that PVE's cloud-init keys cannot carry (dropped).
    pub ignored: Vec<String>,
}

/// Map a `#cloud-config` document onto PVE's cloud-init keys. PVE's API cannot
/// store a whole user-data document (`cicustom` needs a snippet file on a
/// storage, and snippets cannot be uploaded through the API), so only the
/// top-level `user`, `password` and `ssh_authorized_keys` are carried; every
/// other key is reported as ignored. A document that is not `#cloud-config`
/// is ignored entirely.
pub fn cloud_init(user_data: &str) -> CloudInit {
    let mut ci = CloudInit::default();
    let mut lines = user_data.lines().peekable();
    if !lines.peek().is_some_and(|l| l.trim_start().starts_with("#cloud-config")) {
        ci.ignored.push("(not a #cloud-config document)".into());
        return ci;
    }
    let mut keys: Vec<String> = Vec::new();
    let mut current: Option<String> = None;
    let mut user = None;
    let mut password = None;
    for line in lines {
        if line.trim().is_empty() || line.trim_start().starts_with('#') {
            continue;
        }
        if !line.starts_with([' ', '\t', '-']) {
            let (key, value) = match line.split_once(':') {
                Some((k, v)) => (k.trim().to_string(), unquote(v.trim())),
                None => (line.trim().to_string(), String::new()),
            };
            match key.as_str() {
                "user" if !value.is_empty() => user = Some(value),
                "password" if !value.is_empty() => password = Some(value),
                "ssh_authorized_keys" => {}
                _ => ci.ignored.push(key.clone()),
            }
            current = Some(key);
            continue;
        }
        if current.as_deref() == Some("ssh_authorized_keys") {
            if let Some(item) = line.trim_start().strip_prefix('-') {
                let item = unquote(item.trim());
                if !item.is_empty() {
                    keys.push(item);
                }
            }
        }
    }
    if let Some(u) = user {
        ci.params.push(("ciuser".into(), u));
    }
    if let Some(p) = password {
        ci.params.push(("cipassword".into(), p));
    }
    if !keys.is_empty() {
        ci.params.push(("sshkeys".into(), encode(&(keys.join("\n") + "\n"))));
    }
    ci
}

fn unquote(s: &str) -> String {
    let s = s.trim();
    for q in ['"', '\''] {
        if s.len() >= 2 && s.starts_with(q) && s.ends_with(q) {
            return s[1..s.len() - 1].to_string();
        }
    }
    s.to_string()
}

/// The VMID to try on attempt `attempt` (from 0) when `/cluster/nextid` answered `next`:
/// `next` itself first, then a random one above it in a window that doubles per attempt
/// (16, 32, …), so concurrent creates that collided spread out instead of colliding again.
pub fn candidate_vmid(next: u64, attempt: u32, random: u64) -> u64 {
    if attempt == 0 {
        return next;
    }
    let window = 8u64 << attempt.min(16);
    next + 1 + random % window
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn collided_creates_spread_over_a_growing_window() {
        assert_eq!(candidate_vmid(100, 0, 12345), 100);
        for r in [0, 7, 15, u64::MAX] {
            let id = candidate_vmid(100, 1, r);
            assert!((101..=116).contains(&id), "{id}");
        }
        assert!((101..=164).contains(&candidate_vmid(100, 3, u64::MAX)));
        assert!(candidate_vmid(100, 30, u64::MAX) < 100 + (8 << 16) + 2, "the window is bounded");
    }
    use serde_json::json;

    #[test]
    fn encoding_is_encode_uri_component() {
        assert_eq!(encode("ssh-ed25519 AAAA x@y"), "ssh-ed25519%20AAAA%20x%40y");
        assert_eq!(encode("virtio,bridge=vmbr0"), "virtio%2Cbridge%3Dvmbr0");
        assert_eq!(encode("UPID:pve1:00:"), "UPID%3Apve1%3A00%3A");
        assert_eq!(
            String::from_utf8(form(&[("a".into(), "b c".into()), ("tags".into(), "x;y".into())])).unwrap(),
            "a=b%20c&tags=x%3By"
        );
    }

    #[test]
    fn api_base_appends_api2_json_once() {
        assert_eq!(api_base("https://pve:8006"), "https://pve:8006/api2/json");
        assert_eq!(api_base("https://pve:8006/"), "https://pve:8006/api2/json");
        assert_eq!(api_base("https://pve:8006/api2/json/"), "https://pve:8006/api2/json");
    }

    #[test]
    fn responses_map_to_data_or_error_kinds() {
        assert_eq!(parse_response("GET", "/x", 200, br#"{"data": [1]}"#).unwrap(), json!([1]));
        assert_eq!(parse_response("GET", "/x", 200, br#"{"data": null}"#).unwrap(), Value::Null);
        assert!(matches!(parse_response("GET", "/x", 200, b"<html>"), Err(Error::Internal(_))));
        let missing = br#"{"data": null, "message": "Configuration file 'nodes/pve1/qemu-server/555.conf' does not exist\n"}"#;
        assert!(matches!(parse_response("GET", "/x", 500, missing), Err(Error::NotFound(_))));
        assert!(matches!(parse_response("GET", "/x", 500, br#"{"message": "VM is locked (clone)"}"#), Err(Error::Unavailable(_))));
        assert!(matches!(parse_response("GET", "/x", 500, b"oops"), Err(Error::Unavailable(m)) if m.contains("oops")));
        assert!(matches!(parse_response("GET", "/x", 401, br#"{"message": "authentication failure"}"#), Err(Error::Denied(_))));
        let bad = br#"{"data": null, "message": "Parameter verification failed.\n", "errors": {"tags": "invalid format"}}"#;
        assert!(matches!(parse_response("PUT", "/x", 400, bad), Err(Error::InvalidSpec(m)) if m.contains("invalid format")));
        assert!(matches!(
            parse_response("POST", "/x", 500, br#"{"message": "can't clone to non-shared storage 'local-lvm'"}"#),
            Err(Error::InvalidSpec(_))
        ));
        assert!(is_collision("unable to create VM 100: config file already exists"));
    }

    #[test]
    fn uid_tags_and_descriptions_round_trip() {
        let uid = "0a1b2c3d-0000-4000-8000-000000000101";
        check_uid(uid).unwrap();
        assert!(check_uid("UPPER").is_err() && check_uid("a;b").is_err() && check_uid("").is_err());
        assert!(has_uid_tag(&format!("x;banlieue-{uid}"), uid));
        assert!(has_uid_tag(&format!("banlieue-{uid},x"), uid));
        assert!(!has_uid_tag(&format!("banlieue-{uid}0"), uid));
        assert_eq!(with_uid_tag("x", "ab"), "x;banlieue-ab");
        assert_eq!(with_uid_tag("banlieue-ab", "ab"), "banlieue-ab");
        assert!(description_has_uid(&description("ns", "n", uid), uid));
        assert!(!description_has_uid(&description("ns", "n", "other"), uid));
    }

    #[test]
    fn a_clone_keeps_only_its_own_uid_tag() {
        let source = "banlieue-0a1b2c3d-0000-4000-8000-000000000101";
        let uid = "0a1b2c3d-0000-4000-8000-0000000002aa";
        // The source machine's tag (copied by PVE's clone) goes, tags of people stay, even
        // those that merely start like ours.
        assert_eq!(with_only_uid_tag(&format!("prod;{source},banlieue-team"), uid), format!("prod;banlieue-team;banlieue-{uid}"));
        assert_eq!(with_only_uid_tag(&format!("banlieue-{uid}"), uid), format!("banlieue-{uid}"));
        assert_eq!(with_only_uid_tag("", uid), format!("banlieue-{uid}"));
        assert!(!is_uuid("0a1b2c3d-0000-4000-8000-00000000010") && !is_uuid("team") && is_uuid(&source["banlieue-".len()..]));
    }

    #[test]
    fn vm_names_are_dns_names() {
        assert_eq!(vm_name("default", "vm1").unwrap(), "vm1.default");
        assert_eq!(vm_name("ns", "a.b").unwrap(), "a.b.ns");
        assert!(vm_name("ns", "Bad_Name").is_err());
        assert!(vm_name("a.b", "x").is_err());
        assert!(vm_name("ns", "").is_err());
    }

    #[test]
    fn numbers_come_as_numbers_or_strings() {
        assert_eq!(num(Some(&json!(4))), Some(4));
        assert_eq!(num(Some(&json!("2048"))), Some(2048));
        assert_eq!(num(Some(&json!(0.5))), Some(0));
        assert_eq!(num(None), None);
        assert!(flag(&json!({"template": 1}), "template"));
        assert!(!flag(&json!({}), "template"));
    }

    #[test]
    fn tasks_parse() {
        assert_eq!(upid_node("UPID:pve2:000003E8:00001B58:6B11A7E6:qmclone:9000:root@pam:").unwrap(), "pve2");
        assert!(upid_node("nope").is_err());
        assert_eq!(task_state(&json!({"status": "running"})), TaskState::Running);
        assert_eq!(task_state(&json!({"status": "stopped", "exitstatus": "OK"})), TaskState::Ok);
        assert_eq!(
            task_state(&json!({"status": "stopped", "exitstatus": "clone failed: no space"})),
            TaskState::Failed("clone failed: no space".into())
        );
        assert!(matches!(task_error("clone", "clone failed: no space"), Error::Unavailable(m) if m.contains("no space")));
    }

    #[test]
    fn nets_and_drives() {
        assert_eq!(net_value("vmbr1", None), "virtio,bridge=vmbr1");
        assert_eq!(net_value("vmbr1", Some("virtio=BC:24:11:00:90:00,bridge=vmbr0")), "virtio=BC:24:11:00:90:00,bridge=vmbr1");
        assert_eq!(net_bridge("virtio=BC:24:11:00:90:00,bridge=vmbr0,firewall=1"), Some("vmbr0"));
        assert_eq!(drive_storage("local-lvm:vm-100-disk-0,size=4G"), Some("local-lvm"));
        assert_eq!(drive_storage("none,media=cdrom"), None);
    }

    #[test]
    fn agent_addresses_skip_loopback_and_link_local() {
        let data = json!({"result": [
            {"name": "lo", "ip-addresses": [{"ip-address": "127.0.0.1"}]},
            {"name": "eth0", "ip-addresses": [{"ip-address": "192.0.2.10"}, {"ip-address": "fe80::1"}, {"ip-address": "2001:db8::5"}]}
        ]});
        let got: Vec<String> = agent_addresses(&data).into_iter().map(|a| a.address).collect();
        assert_eq!(got, ["192.0.2.10", "2001:db8::5"]);
    }

    #[test]
    fn cloud_config_maps_user_password_and_keys() {
        let doc = "#cloud-config\nuser: ubuntu\npassword: 'pw'\nssh_authorized_keys:\n  - ssh-ed25519 AAAA a@b\n  - \"ssh-rsa BBBB c@d\"\npackages:\n  - nginx\n";
        let ci = cloud_init(doc);
        assert_eq!(
            ci.params,
            vec![
                ("ciuser".to_string(), "ubuntu".to_string()),
                ("cipassword".to_string(), "pw".to_string()),
                ("sshkeys".to_string(), encode("ssh-ed25519 AAAA a@b\nssh-rsa BBBB c@d\n")),
            ]
        );
        assert_eq!(ci.ignored, ["packages"]);
        assert!(cloud_init("#!/bin/sh\necho hi").params.is_empty());
    }
}
