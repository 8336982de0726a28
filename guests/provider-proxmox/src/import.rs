//! `import-image` and `delete-image`: a VMImage `url` source becomes a PVE template.
//!
//! PVE fetches the image itself: `download-url` (content `import`, with the source's
//! sha256 for PVE to check again) onto a storage of the node that holds `import`
//! content, then a VM is created whose `scsi0` is `<target>:0,import-from=<that file>`
//! on the requested storage, converted to a template, and the downloaded file removed.
//! The bytes never pass through the driver, nor through banlieue: the image builder has
//! already downloaded the same URL and verified its checksum and that it is a disk
//! image, and the ProviderClass's `imageFormat: source` leaves it unconverted so the
//! file name PVE is given carries the format the bytes are in.
//!
//! The template is named `image-{vmimage}-{12 hex of the sha256}` and tagged
//! `banlieue-image`; a non-template VM of that name is what an interrupted import left
//! (removed, then the import starts again). The reference is the template's name, which
//! `create` clones from.

use banlieue_sdk::provider::{ImagePhase, ImageRequest, ImageSource, ImageStatus, ProviderConfig, Result};
use banlieue_sdk::{transfer, Error, info, warn};
use serde_json::Value;

use crate::pve::Pve;
use crate::{api, online_nodes, vms, TASK_TIMEOUT_MS};

/// Tag on every imported template.
pub const IMAGE_TAG: &str = "banlieue-image";
/// How long a download, or a create that imports a downloaded disk, may take.
pub(crate) const DOWNLOAD_TIMEOUT_MS: u64 = 3_600_000;
const CREATE_ATTEMPTS: u32 = 8;

/// What every template (and downloaded file) of VMImage `image` starts with.
pub fn prefix(image: &str) -> Result<String> {
    if image.is_empty() || !image.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-' || c == '.') {
        return Err(Error::InvalidSpec(format!("image name {image:?} is not a Kubernetes name")));
    }
    Ok(format!("image-{image}-"))
}

/// The template of VMImage `image` at `digest` (`sha256:<hex>`).
pub fn template_name(image: &str, digest: &str) -> Result<String> {
    let hex = sha256_hex(digest)?;
    Ok(format!("{}{}", prefix(image)?, &hex[..12]))
}

fn sha256_hex(digest: &str) -> Result<&str> {
    digest
        .strip_prefix("sha256:")
        .filter(|h| h.len() == 64 && h.chars().all(|c| c.is_ascii_hexdigit()))
        .ok_or_else(|| Error::InvalidSpec(format!("image digest {digest:?} is not sha256:<64 hex>")))
}

fn storages(pve: &Pve, node: &str) -> Result<Vec<Value>> {
    Ok(pve.get(&format!("/nodes/{}/storage", api::encode(node)))?.as_array().cloned().unwrap_or_default())
}

fn holds(s: &Value, content: &str) -> bool {
    api::num(s.get("active")).unwrap_or(1) != 0
        && api::num(s.get("enabled")).unwrap_or(1) != 0
        && api::text(s, "content").split(',').any(|c| c.trim() == content)
}

/// The first online node with storage `target` for VM images and a storage for `import`
/// content: (node, import storage).
pub(crate) fn place(pve: &Pve, target: &str) -> Result<(String, String)> {
    let mut nodes: Vec<String> = online_nodes(pve)?.iter().map(|n| api::text(n, "node").to_string()).collect();
    nodes.sort();
    for node in nodes {
        let list = storages(pve, &node)?;
        let has_target = list.iter().any(|s| api::text(s, "storage") == target && holds(s, "images"));
        if let Some(stage) = list.iter().find(|s| holds(s, "import")).filter(|_| has_target) {
            return Ok((node, api::text(stage, "storage").to_string()));
        }
    }
    Err(Error::InvalidSpec(format!(
        "no online Proxmox VE node has both storage {target:?} for VM images and a storage with `import` content to download the image to"
    )))
}

/// A storage of `node` that holds `import` content, where files to import are downloaded.
pub(crate) fn import_storage(pve: &Pve, node: &str) -> Result<String> {
    storages(pve, node)?.iter().find(|s| holds(s, "import")).map(|s| api::text(s, "storage").to_string()).ok_or_else(|| {
        Error::InvalidSpec(format!(
            "Proxmox VE node {node} has no active storage with `import` content to download disks to (add `import` to a file storage's content, PVE 8.4 or later)"
        ))
    })
}

/// Remove one storage volume (a downloaded file); gone already is fine.
pub(crate) fn remove_volume(pve: &Pve, node: &str, volid: &str) -> Result<()> {
    let (storage, _) = volid.split_once(':').unwrap_or((volid, ""));
    let path = format!("/nodes/{}/storage/{}/content/{}", api::encode(node), api::encode(storage), api::encode(volid));
    match pve.request("DELETE", &path, &[]) {
        Ok(Value::String(upid)) if upid.starts_with("UPID:") => {
            banlieue_sdk::provider::ignore_not_found(pve.wait_task(&upid, TASK_TIMEOUT_MS, &format!("removing {volid}")))
        }
        Ok(_) | Err(Error::NotFound(_)) => Ok(()),
        Err(e) => Err(e),
    }
}

/// Files whose name starts with `file_prefix` (`import/image-{vmimage}-…`, `import/carry-{uid}-…`)
/// downloaded on any node's import storages: (node, volid).
pub(crate) fn staged(pve: &Pve, file_prefix: &str) -> Result<Vec<(String, String)>> {
    let mut out = Vec::new();
    for n in online_nodes(pve)? {
        let node = api::text(&n, "node").to_string();
        for s in storages(pve, &node)?.iter().filter(|s| holds(s, "import")) {
            let path = format!("/nodes/{}/storage/{}/content?content=import", api::encode(&node), api::encode(api::text(s, "storage")));
            for item in pve.get(&path)?.as_array().into_iter().flatten() {
                let volid = api::text(item, "volid");
                if volid.split_once(":import/").is_some_and(|(_, file)| file.starts_with(file_prefix)) {
                    out.push((node.clone(), volid.to_string()));
                }
            }
        }
    }
    out.sort();
    out.dedup_by(|a, b| a.1 == b.1); // a shared storage shows on every node
    Ok(out)
}

/// VMs named `name`: (node, vmid, is a template).
fn named(pve: &Pve, name: &str) -> Result<Vec<(String, u64, bool)>> {
    Ok(vms(pve)?
        .iter()
        .filter(|v| api::text(v, "name") == name)
        .filter_map(|v| Some((api::text(v, "node").to_string(), api::num(v.get("vmid"))?, api::flag(v, "template"))))
        .collect())
}

/// Destroy VM `vmid` of `node` with its disks; gone already is fine.
pub(crate) fn destroy(pve: &Pve, node: &str, vmid: u64) -> Result<()> {
    let path = format!("/nodes/{}/qemu/{vmid}", api::encode(node));
    let params = [("purge".to_string(), "1".to_string()), ("destroy-unreferenced-disks".to_string(), "1".to_string())];
    match pve.task("DELETE", &path, &params) {
        Ok(upid) => banlieue_sdk::provider::ignore_not_found(pve.wait_task(&upid, TASK_TIMEOUT_MS, &format!("destroying VM {vmid}"))),
        Err(Error::NotFound(_)) => Ok(()),
        Err(e) => Err(e),
    }
}

/// Create a VM on `node` from `params` (every create parameter but `vmid`) under a free VMID,
/// waiting up to `timeout_ms` for the task (`import-from` copies whole disks); its VMID. A
/// create PVE says failed is removed; one whose end could not be learnt (a poll failed, still
/// running) is left as it is: it may still succeed, and the caller's retry finds it by name.
pub(crate) fn create_vm(pve: &Pve, node: &str, params: &[(String, String)], timeout_ms: u64, what: &str) -> Result<u64> {
    let mut last = String::new();
    for attempt in 0..CREATE_ATTEMPTS {
        let next = api::num(Some(&pve.get("/cluster/nextid")?)).ok_or_else(|| Error::Internal("/cluster/nextid did not answer a VMID".into()))?;
        // PVE does not reserve the ID it answers: see `api::candidate_vmid`.
        let vmid = api::candidate_vmid(next, attempt, crate::random());
        let mut all: Vec<(String, String)> = vec![("vmid".into(), vmid.to_string())];
        all.extend(params.iter().cloned());
        let path = format!("/nodes/{}/qemu", api::encode(node));
        let upid = match pve.task("POST", &path, &all) {
            Ok(u) => u,
            Err(e) if api::is_collision(e.message()) => {
                last = e.message().to_string();
                continue;
            }
            Err(e) => return Err(e.context(format_args!("creating {what}"))),
        };
        match pve.task_outcome(&upid, timeout_ms, &format!("creating {what} as VM {vmid}"))? {
            Ok(()) => return Ok(vmid),
            Err(e) if api::is_collision(e.message()) => last = e.message().to_string(),
            Err(e) => {
                let _ = destroy(pve, node, vmid);
                return Err(e);
            }
        }
    }
    Err(Error::Unavailable(format!("no free VMID after {CREATE_ATTEMPTS} attempts: {last}")))
}

/// Create the template VM on `node` with its disk imported from `volid`; its VMID.
fn create_template(pve: &Pve, node: &str, name: &str, target: &str, volid: &str, description: &str) -> Result<u64> {
    let params: Vec<(String, String)> = vec![
        ("name".into(), name.into()),
        ("scsihw".into(), "virtio-scsi-pci".into()),
        ("scsi0".into(), format!("{target}:0,import-from={volid}")),
        ("boot".into(), "order=scsi0".into()),
        ("ostype".into(), "l26".into()),
        ("tags".into(), IMAGE_TAG.into()),
        ("description".into(), description.into()),
    ];
    create_vm(pve, node, &params, DOWNLOAD_TIMEOUT_MS, &format!("template VM {name} from {volid}"))
}

pub fn import(config: &ProviderConfig, request: &ImageRequest) -> Result<ImageStatus> {
    let ImageSource::Url(src) = &request.source else {
        return Err(Error::InvalidSpec(format!("image {}: only url sources are imported", request.name)));
    };
    let target = request.target.as_deref().filter(|t| !t.is_empty()).ok_or_else(|| {
        Error::InvalidSpec(format!("image {}: no storage to import into (map a storage class to a storage)", request.name))
    })?;
    let image = transfer::image()?;
    if !matches!(image.format.as_str(), "qcow2" | "raw" | "vmdk") {
        return Err(Error::InvalidSpec(format!("Proxmox VE imports qcow2, raw or vmdk images; {} is {}", src.url, image.format)));
    }
    let hex = sha256_hex(&image.digest)?;
    let name = template_name(&request.name, &image.digest)?;
    let pve = Pve::connect(config)?;
    for (node, vmid, template) in named(&pve, &name)? {
        if template {
            return Ok(ready(&name, vmid, &node, &image.digest, "already imported"));
        }
        warn!("destroying VM {vmid} ({name}), left by an interrupted import");
        destroy(&pve, &node, vmid)?;
    }
    let (node, stage) = place(&pve, target)?;
    let file = format!("{name}.{}", image.format);
    let volid = format!("{stage}:import/{file}");
    info!("Proxmox VE node {node} downloads {} to {volid}", src.url);
    let params: Vec<(String, String)> = vec![
        ("content".into(), "import".into()),
        ("filename".into(), file.clone()),
        ("url".into(), src.url.clone()),
        ("checksum".into(), hex.to_string()),
        ("checksum-algorithm".into(), "sha256".into()),
    ];
    let path = format!("/nodes/{}/storage/{}/download-url", api::encode(&node), api::encode(&stage));
    let upid = pve.task("POST", &path, &params).map_err(|e| e.context(format_args!("downloading {} to {volid}", src.url)))?;
    let downloaded = pve.wait_task(&upid, DOWNLOAD_TIMEOUT_MS, &format!("downloading {} to {volid}", src.url));
    let made = downloaded.and_then(|()| {
        let description = format!("banlieue VMImage {}\nbanlieue-image-digest: {}", request.name, image.digest);
        create_template(&pve, &node, &name, target, &volid, &description)
    });
    let made = made.and_then(|vmid| {
        let upid = pve.task("POST", &format!("/nodes/{}/qemu/{vmid}/template", api::encode(&node)), &[])?;
        match pve.wait_task(&upid, TASK_TIMEOUT_MS, &format!("converting VM {vmid} to a template")) {
            Ok(()) => Ok(vmid),
            Err(e) => {
                let _ = destroy(&pve, &node, vmid);
                Err(e)
            }
        }
    });
    // The downloaded file is only a step: nothing stays on the import storage.
    if let Err(e) = remove_volume(&pve, &node, &volid) {
        warn!("could not remove the downloaded {volid}: {}", e.message());
    }
    let vmid = made?;
    Ok(ready(&name, vmid, &node, &image.digest, &format!("imported from {} on storage {target}", src.url)))
}

fn ready(name: &str, vmid: u64, node: &str, digest: &str, what: &str) -> ImageStatus {
    ImageStatus { phase: ImagePhase::Ready, reference: Some(name.to_string()), message: Some(format!("template {name} (VM {vmid} on {node}, {digest}): {what}")) }
}

/// Remove the template `reference` and any file left downloaded for it (every template,
/// VM and file named like the VMImage's imports, for an empty reference).
pub fn delete(config: &ProviderConfig, request: &ImageRequest, reference: &str) -> Result<()> {
    let image_prefix = prefix(&request.name)?;
    if !reference.is_empty() && !reference.starts_with(&image_prefix) {
        return Err(Error::InvalidSpec(format!("{reference:?} is not a template imported for image {}", request.name)));
    }
    let pattern = if reference.is_empty() { image_prefix.as_str() } else { reference };
    let pve = Pve::connect(config)?;
    let doomed: Vec<(String, u64, String)> = vms(&pve)?
        .iter()
        .filter(|v| {
            let name = api::text(v, "name");
            if reference.is_empty() { name.starts_with(pattern) } else { name == reference }
        })
        .filter_map(|v| Some((api::text(v, "node").to_string(), api::num(v.get("vmid"))?, api::text(v, "name").to_string())))
        .collect();
    for (node, vmid, name) in doomed {
        info!("destroying Proxmox VE template {vmid} ({name})");
        destroy(&pve, &node, vmid)?;
    }
    for (node, volid) in staged(&pve, pattern)? {
        remove_volume(&pve, &node, &volid)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_carry_the_image_and_digest() {
        let digest = format!("sha256:{}", "0f".repeat(32));
        assert_eq!(template_name("debian", &digest).unwrap(), "image-debian-0f0f0f0f0f0f");
        assert!(template_name("Debian", &digest).is_err());
        assert!(template_name("debian", "sha256:0f").is_err());
    }
}
