//! `import-image` and `delete-image`: a VMImage becomes a vSphere template.
//!
//! The host holds the image as a stream-optimised VMDK (the ProviderClass's
//! `imageFormat: vmdk`). The driver asks vCenter for a VM with one disk of the
//! image's virtual size (`ImportVApp` with a `VirtualMachineImportSpec`, as
//! `govc import.vmdk` does — no OVF descriptor is needed for one disk), waits for
//! the `HttpNfcLease` to be ready, and has the host stream the file to the disk's
//! upload URL (`transfer.to-http`, checked against the http grant: the URL is on the
//! Provider's endpoint). The lease is completed, the VM marked as a template, and the
//! template's name is the reference VMs clone from.
//!
//! The template is named `image-{vmimage}-{12 hex of the sha256}`; its annotation
//! names the VMImage and digest. A VM of that name that is not a template is what an
//! interrupted import left: it is destroyed and the import starts again. A failed
//! upload aborts the lease and destroys the VM, so nothing partial stays.
//!
//! Known limit: the driver cannot report lease progress while the host streams (the
//! call is synchronous), and vCenter expires a lease left without progress for its
//! timeout (5 minutes by default); images that take longer to upload need a longer
//! `config.vpxd.httpNfcLease.timeout`-style setting on vCenter.

use banlieue_sdk::provider::{ImagePhase, ImageRequest, ImageStatus, ImageSource, ProviderConfig, Result};
use banlieue_sdk::session::SessionError;
use banlieue_sdk::{transfer, Error, info, warn};

use crate::soap::{self, MoRef, Node};
use crate::vim::{VResult, Vim};
use crate::{Inv, INVENTORY, VMS, with_vim};

const LEASE_READY_MS: u64 = 120_000;

/// What every template imported for VMImage `image` is called before its digest.
pub fn template_prefix(image: &str) -> Result<String> {
    if image.is_empty() || !image.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-' || c == '.') {
        return Err(Error::InvalidSpec(format!("image name {image:?} is not a Kubernetes name")));
    }
    Ok(format!("image-{image}-"))
}

/// The template of VMImage `image` at `digest` (`sha256:<hex>`); vCenter names are at most 80 characters.
pub fn template_name(image: &str, digest: &str) -> Result<String> {
    let hex = digest.strip_prefix("sha256:").filter(|h| h.len() >= 12 && h.chars().all(|c| c.is_ascii_hexdigit()));
    let Some(hex) = hex else {
        return Err(Error::InvalidSpec(format!("image digest {digest:?} is not sha256:<hex>")));
    };
    let name = format!("{}{}", template_prefix(image)?, &hex[..12]);
    if name.len() > 80 {
        return Err(Error::InvalidSpec(format!("image name {image:?} is too long for a vSphere template name (80 characters)")));
    }
    Ok(name)
}

/// The lease's upload URL: vCenter writes `*` for "the host you called", so that becomes the
/// Provider's endpoint (scheme and authority). A URL naming another host (an ESXi host) is
/// kept, and the host's http grant refuses it unless it is the endpoint.
pub fn upload_url(device_url: &str, endpoint: &str) -> String {
    let (scheme, rest) = endpoint.split_once("://").unwrap_or(("https", endpoint));
    let authority = rest.split('/').next().unwrap_or("");
    match device_url.split_once("://*/") {
        Some((_, path)) => format!("{scheme}://{authority}/{path}"),
        None => device_url.to_string(),
    }
}

/// VMs named `name`: (reference, is a template).
fn named(inv: &Inv, name: &str) -> Vec<(MoRef, bool)> {
    inv.of_kind("VirtualMachine")
        .filter(|v| v.str("name") == Some(name))
        .filter_map(|v| Some((v.obj.clone()?, v.str("config.template") == Some("true"))))
        .collect()
}

/// Destroy VM `vm` (named `name`, for messages); one already gone is success.
pub(crate) fn destroy(vim: &Vim, vm: &MoRef, name: &str) -> VResult<()> {
    match vim.run_task(&format!("Destroy_Task {name}"), &soap::simple("Destroy_Task", vm)) {
        Err(SessionError::Failed(e)) if e.is_not_found() => Ok(()),
        other => other.map(|_| ()),
    }
}

/// Wait for the lease to be ready; its `info`.
pub(crate) fn lease_info(vim: &Vim, lease: &MoRef) -> VResult<Node> {
    let mut info = None;
    let mut failure = None;
    let ready = banlieue_sdk::time::wait_until(LEASE_READY_MS, 200, || {
        let p = match vim.props(lease, &["state", "info", "error"]) {
            Ok(p) => p,
            Err(SessionError::Failed(e)) => return Err(e),
            Err(r) => {
                failure = Some(r);
                return Ok(true);
            }
        };
        match p.str("state") {
            Some("ready") => {
                info = p.props.get("info").cloned();
                Ok(true)
            }
            Some("error") => {
                let fault = p.props.get("error").map(soap::localized_fault);
                failure = Some(Error::Unavailable(format!("the import lease failed: {}", fault.map(|f| format!("{}: {}", f.kind, f.message)).unwrap_or_default())).into());
                Ok(true)
            }
            _ => Ok(false),
        }
    })?;
    if let Some(f) = failure {
        return Err(f);
    }
    match info {
        Some(i) if ready => Ok(i),
        _ => Err(Error::Unavailable(format!("import lease {lease} not ready within {LEASE_READY_MS} ms")).into()),
    }
}

/// Stream the image through the lease and complete it; the imported VM.
fn upload(vim: &Vim, config: &ProviderConfig, lease: &MoRef) -> VResult<MoRef> {
    let info = lease_info(vim, lease)?;
    let vm = info.child("entity").and_then(Node::as_ref).ok_or_else(|| Error::Internal(format!("import lease {lease} names no VM")))?;
    let disk = info
        .all("deviceUrl")
        .find(|d| d.str_at("disk") == Some("true"))
        .and_then(|d| d.str_at("url"))
        .ok_or_else(|| Error::Internal(format!("import lease {lease} offers no disk upload URL")))?;
    let url = upload_url(disk, &config.endpoint);
    let headers = [
        ("Content-Type".to_string(), "application/x-vnd.vmware-streamVmdk".to_string()),
        ("Cookie".to_string(), format!("{}={}", crate::vim::COOKIE, vim.cookie)),
    ];
    let status = transfer::to_http("POST", &url, &headers)?;
    if !(200..300).contains(&status) {
        return Err(Error::Unavailable(format!("vCenter refused the disk upload to {url}: HTTP {status}")).into());
    }
    vim.call(&format!("HttpNfcLeaseComplete {lease}"), &soap::simple("HttpNfcLeaseComplete", lease))?;
    Ok(vm)
}

/// Import the call's image as a template on the datastore `request.target`.
pub fn import(config: &ProviderConfig, request: &ImageRequest) -> Result<ImageStatus> {
    if !matches!(request.source, ImageSource::Url(_)) {
        return Err(Error::InvalidSpec(format!("image {}: only url sources are imported", request.name)));
    }
    let datastore = request.target.as_deref().filter(|t| !t.is_empty()).ok_or_else(|| {
        Error::InvalidSpec(format!("image {}: no datastore to import into (map a storage class to a datastore)", request.name))
    })?;
    let image = transfer::image()?;
    if image.format != "vmdk" {
        return Err(Error::InvalidSpec(format!(
            "the vSphere driver imports stream-optimised VMDK; the host holds {} (set the ProviderClass's imageFormat to vmdk)",
            image.format
        )));
    }
    let name = template_name(&request.name, &image.digest)?;
    with_vim(config, |vim| {
        let mut specs: Vec<soap::PropSpec> = INVENTORY.to_vec();
        specs.extend_from_slice(VMS);
        let inv = Inv::read(vim, &specs)?;
        for (vm, template) in named(&inv, &name) {
            if template {
                return Ok(ready(&name, &image.digest, datastore, "already imported"));
            }
            warn!("destroying VM {name}, left by an interrupted import");
            destroy(vim, &vm, &name)?;
        }
        let clusters = inv.clusters();
        let cluster = clusters
            .iter()
            .find(|c| inv.datastore_in(c, datastore).is_some())
            .ok_or_else(|| Error::InvalidSpec(format!("datastore {datastore:?} is not available in any cluster of this vCenter")))?;
        let pool = cluster.obj.reference("resourcePool").ok_or_else(|| Error::Internal(format!("cluster {} has no resource pool", cluster.name)))?;
        let folder = cluster.datacenter.reference("vmFolder").ok_or_else(|| Error::Internal("the datacenter has no VM folder".into()))?;
        let annotation = format!("banlieue VMImage {} ({})", request.name, image.digest);
        let body = soap::import_vapp(&pool, &folder, &name, &annotation, datastore, image.virtual_size.div_ceil(1024));
        info!("importing image {} into vSphere template {name} on datastore {datastore} (cluster {})", request.name, cluster.name);
        let lease = vim
            .call(&format!("ImportVApp {name}"), &body)?
            .child("returnval")
            .and_then(Node::as_ref)
            .ok_or_else(|| Error::Internal(format!("ImportVApp {name}: vCenter returned no lease")))?;
        let vm = match upload(vim, config, &lease) {
            Ok(vm) => vm,
            Err(e) => {
                // Nothing partial stays: the lease is aborted and its VM destroyed.
                let _ = vim.call(&format!("HttpNfcLeaseAbort {lease}"), &soap::simple("HttpNfcLeaseAbort", &lease));
                let again = Inv::read(vim, &specs)?;
                for (vm, _) in named(&again, &name) {
                    let _ = destroy(vim, &vm, &name);
                }
                return Err(e);
            }
        };
        vim.call(&format!("MarkAsTemplate {name}"), &soap::simple("MarkAsTemplate", &vm))?;
        Ok(ready(&name, &image.digest, datastore, &format!("{} bytes of VMDK uploaded", image.size)))
    })
}

fn ready(name: &str, digest: &str, datastore: &str, what: &str) -> ImageStatus {
    ImageStatus {
        phase: ImagePhase::Ready,
        reference: Some(name.to_string()),
        message: Some(format!("template {name} on datastore {datastore} ({digest}): {what}")),
    }
}

/// Destroy the template `reference`, if it is one this driver imported for the VMImage
/// (every VM named like one, template or an import cut off, for an empty reference).
pub fn delete(config: &ProviderConfig, request: &ImageRequest, reference: &str) -> Result<()> {
    let prefix = template_prefix(&request.name)?;
    if !reference.is_empty() && !reference.starts_with(&prefix) {
        return Err(Error::InvalidSpec(format!("{reference:?} is not a template imported for image {}", request.name)));
    }
    with_vim(config, |vim| {
        let inv = Inv::read(vim, VMS)?;
        let doomed: Vec<(MoRef, String)> = inv
            .of_kind("VirtualMachine")
            .filter_map(|v| Some((v.obj.clone()?, v.str("name")?.to_string())))
            .filter(|(_, name)| if reference.is_empty() { name.starts_with(&prefix) } else { name == reference })
            .collect();
        for (vm, name) in doomed {
            info!("destroying vSphere template {name}");
            destroy(vim, &vm, &name)?;
        }
        Ok(())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_carry_the_image_and_digest() {
        let digest = format!("sha256:{}", "ab".repeat(32));
        assert_eq!(template_name("ubuntu", &digest).unwrap(), "image-ubuntu-abababababab");
        assert!(template_name("Ubuntu_x", &digest).is_err());
        assert!(template_name("ubuntu", "md5:abc").is_err());
        assert!(template_name(&"a".repeat(70), &digest).is_err());
    }

    #[test]
    fn upload_urls_point_at_the_endpoint() {
        assert_eq!(upload_url("https://*/nfc/52a/disk-0.vmdk", "https://127.0.0.1:8989/sdk"), "https://127.0.0.1:8989/nfc/52a/disk-0.vmdk");
        assert_eq!(upload_url("https://*/nfc/52a/disk-0.vmdk", "http://127.0.0.1:8989/sdk"), "http://127.0.0.1:8989/nfc/52a/disk-0.vmdk");
        assert_eq!(upload_url("https://esx1.lab/nfc/52a/disk-0.vmdk", "https://vc.lab"), "https://esx1.lab/nfc/52a/disk-0.vmdk");
    }
}
