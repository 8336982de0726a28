//! From a VMClass, a VMImage and the Provider chosen for it to a machine in the
//! backend's terms: the storage and network classes mapped to the Provider's targets,
//! the image source for its class. Shared by the VM controller and CAPI's machines.

use std::collections::BTreeMap;

use banlieue_api::class::DEFAULT_POWER_OFF_TIMEOUT_SECONDS;
use banlieue_api::infra::{ResolvedDisk, ResolvedNic, ResolvedVm};
use banlieue_api::{Provider, VMClass, VMImage};
use kube::ResourceExt;

use crate::reasons::{Failure, Reason};

/// The resolved VM of `class` and `image` on `provider` (of class `provider_class`),
/// powered on, without user-data: the caller adds what its object asks for.
pub fn machine_vm(class: &VMClass, image: &VMImage, provider: &Provider, provider_class: &str) -> Result<ResolvedVm, Failure> {
    let c = &class.spec;
    let caps = &provider.spec.capabilities;
    let source = image
        .spec
        .sources
        .iter()
        .find(|s| s.provider_class == provider_class)
        .ok_or_else(|| (Reason::NoImageSource, format!("VMImage {:?} has no source for class {provider_class:?}", image.name_any()), false))?;
    let mut image_map = BTreeMap::new();
    for (k, v) in [("template", &source.template), ("backingFile", &source.backing_file), ("url", &source.url), ("checksum", &source.checksum)] {
        if let Some(v) = v {
            image_map.insert(k.to_string(), v.clone());
        }
    }
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
            .map(|n| ResolvedNic { name: n.name.clone(), network: caps.network_classes.get(&n.network_class).cloned().unwrap_or_default() })
            .collect(),
        image: image_map,
        power_off_timeout_seconds: c.power_off_timeout_seconds.unwrap_or(DEFAULT_POWER_OFF_TIMEOUT_SECONDS),
        ..Default::default()
    })
}
