//! From a VMClass, a VMImage and the Provider chosen for it to a machine in the
//! backend's terms: the storage and network classes mapped to the Provider's targets,
//! the image source for its class. Shared by the VM controller and CAPI's machines.

use std::collections::BTreeMap;

use banlieue_api::class::{ImportPhase, DEFAULT_POWER_OFF_TIMEOUT_SECONDS};
use banlieue_api::infra::{ResolvedDisk, ResolvedNic, ResolvedVm};
use banlieue_api::{Provider, VMClass, VMImage};
use kube::ResourceExt;

use crate::failure::Failure;
use crate::status::reasons::Reason;

/// The image of a `url` source as imported into Provider `provider` (`namespace/name`): the
/// machine's image key and value. A reference that is a path is a backing file (libvirt),
/// anything else a template (vSphere, Proxmox VE). Why not, when it is not imported (for
/// that checksum) yet. Placement asks the same question (`scheduling::prefer_imported`).
pub fn imported(image: &VMImage, provider: &str, checksum: Option<&str>) -> Result<(&'static str, String), String> {
    let import = image.status.as_ref().and_then(|s| s.providers.iter().find(|i| i.provider == provider));
    match import {
        None => Err("not imported yet".into()),
        Some(i) if i.phase == ImportPhase::Ready && i.digest.as_deref() == checksum => match &i.reference {
            Some(r) if r.starts_with('/') => Ok(("backingFile", r.clone())),
            Some(r) => Ok(("template", r.clone())),
            None => Err("the import reports no reference".into()),
        },
        Some(i) if i.phase == ImportPhase::Ready => Err("the import is of another checksum".into()),
        Some(i) => Err(format!("import {:?}: {}", i.phase, i.message.clone().unwrap_or_default())),
    }
}

/// The resolved VM of `class` and `image` on `provider` (of class `provider_class`),
/// powered on, without user-data: the caller adds what its object asks for. `made_from` is
/// the image of a machine that exists already: it keeps it (a machine is not remade when
/// its VMImage's source changes, and must not wait for the new import).
pub fn machine_vm(class: &VMClass, image: Option<&VMImage>, provider: &Provider, provider_class: &str, made_from: Option<BTreeMap<String, String>>) -> Result<ResolvedVm, Failure> {
    let c = &class.spec;
    let caps = &provider.spec.capabilities;
    let image_map = match (made_from.filter(|m| !m.is_empty()), image) {
        (Some(m), _) => m,
        (None, Some(image)) => image_of(image, provider, provider_class)?,
        // An adopted machine: not made from an image.
        (None, None) => BTreeMap::new(),
    };
    Ok(ResolvedVm {
        cpus: c.cpus,
        memory_mib: c.memory_mib,
        firmware: c.firmware,
        disks: c
            .disks
            .iter()
            .map(|d| ResolvedDisk { name: d.name.clone(), size_gib: d.size_gib, target: caps.storage_classes.get(&d.storage_class).cloned().unwrap_or_default() })
            .collect(),
        nics: c
            .nics
            .iter()
            .map(|n| ResolvedNic { name: n.name.clone(), network: caps.network_classes.get(&n.network_class).cloned().unwrap_or_default(), ..Default::default() })
            .collect(),
        image: image_map,
        power_off_timeout_seconds: c.power_off_timeout_seconds.unwrap_or(DEFAULT_POWER_OFF_TIMEOUT_SECONDS),
        ..Default::default()
    })
}

/// The machine's image key and value for `image` on `provider`.
fn image_of(image: &VMImage, provider: &Provider, provider_class: &str) -> Result<BTreeMap<String, String>, Failure> {
    let source = image
        .source_for(provider_class)
        .ok_or_else(|| Failure::until_changed(Reason::NoImageSource, format!("VMImage {:?} has no source for class {provider_class:?}", image.name_any())))?;
    if source.is_built() {
        return Err(Failure::transient(Reason::ImageNotReady, format!("VMImage {:?} is not built yet", image.name_any())));
    }
    let mut image_map = BTreeMap::new();
    match &source.url {
        // A URL is imported by the imagebuilder; machines boot from what it imported.
        Some(url) => {
            let at = crate::key(provider);
            let (key, reference) = imported(image, &at, source.checksum.as_deref())
                .map_err(|why| Failure::transient(Reason::ImageNotReady, format!("VMImage {:?} ({url}) is not on Provider {at} yet: {why}", image.name_any())))?;
            image_map.insert(key.to_string(), reference);
        }
        None => {
            for (k, v) in [("template", &source.template), ("backingFile", &source.backing_file)] {
                if let Some(v) = v {
                    image_map.insert(k.to_string(), v.clone());
                }
            }
        }
    }
    Ok(image_map)
}

#[cfg(test)]
mod tests {
    use super::*;
    use banlieue_api::class::{ImageImport, ImageSource, VMImageSpec, VMImageStatus};

    const SUM: &str = "sha256:0000000000000000000000000000000000000000000000000000000000000001";

    fn provider() -> Provider {
        crate::fixtures::provider("infra", "kvm", true, serde_json::json!([]))
    }

    fn image(import: Option<ImageImport>) -> VMImage {
        let source = ImageSource { provider_class: "libvirt".into(), url: Some("https://images.example/os.qcow2".into()), checksum: Some(SUM.into()), ..Default::default() };
        let mut i = VMImage::new("os", VMImageSpec { sources: vec![source], ..Default::default() });
        i.status = import.map(|i| VMImageStatus { providers: vec![i], ..Default::default() });
        i
    }

    fn import(phase: ImportPhase, digest: &str) -> ImageImport {
        ImageImport { provider: "infra/kvm".into(), phase, digest: Some(digest.into()), reference: Some("/var/lib/pool/image@os@000000000000".into()), message: Some("m".into()) }
    }

    #[test]
    fn a_url_image_is_used_as_imported_and_waited_for_until_then() {
        let class = VMClass::new("small", Default::default());
        let p = provider();
        let vm = machine_vm(&class, Some(&image(Some(import(ImportPhase::Ready, SUM)))), &p, "libvirt", None).unwrap();
        assert_eq!(vm.image.get("backingFile").map(String::as_str), Some("/var/lib/pool/image@os@000000000000"));
        assert!(!vm.image.contains_key("url"), "the URL is not handed to the driver");
        for not_yet in [None, Some(import(ImportPhase::Importing, SUM)), Some(import(ImportPhase::Ready, "sha256:other"))] {
            let Failure { reason, message, retry } = machine_vm(&class, Some(&image(not_yet.clone())), &p, "libvirt", None).unwrap_err();
            assert_eq!(reason, Reason::ImageNotReady, "{not_yet:?}");
            assert!(message.contains("infra/kvm") && retry, "{message}");
        }
        // A machine that exists keeps what it was made from, whatever the import is now.
        let made_from: BTreeMap<String, String> = [("backingFile".to_string(), "/var/lib/pool/image@os@111111111111".to_string())].into();
        let kept = machine_vm(&class, Some(&image(Some(import(ImportPhase::Importing, SUM)))), &p, "libvirt", Some(made_from.clone())).unwrap();
        assert_eq!(kept.image, made_from);
    }
}
