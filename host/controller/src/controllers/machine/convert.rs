//! The machine between banlieue's API and the provider contract (WIT): the driver's view
//! of a machine (user-data read by the host), power states, phases, addresses.

use std::collections::BTreeMap;

use banlieue_api::common::{AddressType, MachineAddress, MachinePhase, PowerOffMode, PowerState};
use banlieue_api::infra::InfraMachineSpec;
use banlieue_runtime::provider::{self as wit, Machine};
use k8s_openapi::api::core::v1::Secret;
use kube::api::{Api, DynamicObject};
use kube::ResourceExt;

use super::backend_uid;
use crate::Context;
use crate::failure::{api_failure, Failure};
use crate::status::reasons::Reason;

/// The driver's view of the machine; user-data is read from its Secret here, by the host.
pub(super) async fn wit_machine(ctx: &Context, m: &DynamicObject, spec: &InfraMachineSpec) -> Result<Machine, Failure> {
    let ns = m.namespace().unwrap_or_default();
    let vm = &spec.vm;
    let user_data = match &vm.user_data {
        None => None,
        Some(r) => {
            let secrets: Api<Secret> = Api::namespaced(ctx.client.clone(), &ns);
            let secret = secrets
                .get_opt(&r.name)
                .await
                .map_err(|e| api_failure(&e))?
                .ok_or_else(|| Failure::transient(Reason::UserDataNotFound, format!("user-data Secret {:?} not found", r.name)))?;
            let bytes = secret
                .data
                .as_ref()
                .and_then(|d| d.get(&r.key))
                .map(|b| b.0.clone())
                .or_else(|| secret.string_data.as_ref().and_then(|d| d.get(&r.key)).map(|s| s.clone().into_bytes()))
                .ok_or_else(|| Failure::transient(Reason::UserDataNotFound, format!("Secret {:?} has no key {:?}", r.name, r.key)))?;
            Some(String::from_utf8(bytes).map_err(|_| Failure::until_changed(Reason::InvalidUserData, format!("Secret {:?} key {:?} is not UTF-8", r.name, r.key)))?)
        }
    };
    let image = image_source(&vm.image).ok_or_else(|| Failure::until_changed(Reason::NoImageSource, "the machine's image has no template, backingFile or url"))?;
    Ok(Machine {
        uid: backend_uid(m),
        name: m.name_any(),
        namespace: ns,
        cpus: vm.cpus,
        memory_mib: vm.memory_mib,
        firmware: match vm.firmware {
            banlieue_api::class::Firmware::BIOS => wit::Firmware::Bios,
            banlieue_api::class::Firmware::UEFI => wit::Firmware::Uefi,
        },
        disks: vm.disks.iter().map(|d| wit::Disk { name: d.name.clone(), size_gib: d.size_gib, target: d.target.clone() }).collect(),
        nics: vm.nics.iter().enumerate().map(|(i, n)| wit_nic(i, n)).collect::<Result<_, _>>()?,
        image,
        user_data,
        user_data_format: match vm.user_data_format.unwrap_or_default() {
            banlieue_api::infra::UserDataFormat::CloudConfig => wit::UserDataFormat::CloudConfig,
            banlieue_api::infra::UserDataFormat::Ignition => wit::UserDataFormat::Ignition,
        },
        failure_domain: spec.backend_failure_domain().unwrap_or_default().to_string(),
        power_state: wit_power(vm.power_state),
        labels: m.labels().clone().into_iter().collect(),
    })
}

/// A NIC as the driver gets it. Its addressing is checked here, whoever wrote the Machine
/// (the VM controller checked a VM's already; a CAPI template's is checked only here).
fn wit_nic(i: usize, n: &banlieue_api::infra::ResolvedNic) -> Result<wit::Nic, Failure> {
    let ip = if n.ip.is_empty() {
        None
    } else {
        n.ip.check(&format!("spec.vm.nics[{i}]")).map_err(|m| Failure::until_changed(Reason::InvalidNetwork, m))?;
        Some(wit::IpConfig {
            addresses: n.ip.addresses.clone(),
            gateway: n.ip.gateway.clone(),
            nameservers: n.ip.nameservers.clone(),
            search_domains: n.ip.search_domains.clone(),
        })
    };
    Ok(wit::Nic { name: n.name.clone(), network: n.network.clone(), ip })
}

/// Keys of `spec.vm.image`, as the VM controller writes them from the VMImage source.
pub(super) fn image_source(image: &BTreeMap<String, String>) -> Option<wit::ImageSource> {
    if let Some(t) = image.get("template") {
        return Some(wit::ImageSource::Template(t.clone()));
    }
    if let Some(f) = image.get("backingFile") {
        return Some(wit::ImageSource::BackingFile(f.clone()));
    }
    image.get("url").map(|u| wit::ImageSource::Url(wit::UrlSource { url: u.clone(), checksum: image.get("checksum").cloned() }))
}

pub(super) fn wit_power(p: PowerState) -> wit::PowerState {
    match p {
        PowerState::PoweredOn => wit::PowerState::PoweredOn,
        PowerState::PoweredOff => wit::PowerState::PoweredOff,
        PowerState::Suspended => wit::PowerState::Suspended,
    }
}

/// How the spec asks the machine to be powered off.
pub(super) fn power_off(spec: &InfraMachineSpec) -> wit::PowerOff {
    let mode = match spec.vm.power_off_mode {
        PowerOffMode::Hard => wit::PowerOffMode::Hard,
        PowerOffMode::Soft => wit::PowerOffMode::Soft,
        PowerOffMode::TrySoft => wit::PowerOffMode::TrySoft,
    };
    wit::PowerOff { mode, timeout_ms: spec.vm.power_off_timeout_seconds.saturating_mul(1000) }
}

pub(super) fn api_phase(p: wit::MachinePhase) -> MachinePhase {
    match p {
        wit::MachinePhase::Provisioning => MachinePhase::Provisioning,
        wit::MachinePhase::Cloning => MachinePhase::Cloning,
        wit::MachinePhase::Configuring => MachinePhase::Configuring,
        wit::MachinePhase::PoweringOn => MachinePhase::PoweringOn,
        wit::MachinePhase::WaitingForAddress => MachinePhase::WaitingForAddress,
        wit::MachinePhase::Running => MachinePhase::Running,
        wit::MachinePhase::ShuttingDown => MachinePhase::ShuttingDown,
        wit::MachinePhase::PoweredOff => MachinePhase::PoweredOff,
    }
}

pub(crate) fn api_power(p: wit::PowerState) -> PowerState {
    match p {
        wit::PowerState::PoweredOn => PowerState::PoweredOn,
        wit::PowerState::PoweredOff => PowerState::PoweredOff,
        wit::PowerState::Suspended => PowerState::Suspended,
    }
}

pub(super) fn address(a: &wit::Address) -> MachineAddress {
    let type_ = match a.type_ {
        wit::AddressType::Hostname => AddressType::Hostname,
        wit::AddressType::ExternalIp => AddressType::ExternalIP,
        wit::AddressType::InternalIp => AddressType::InternalIP,
        wit::AddressType::ExternalDns => AddressType::ExternalDNS,
        wit::AddressType::InternalDns => AddressType::InternalDNS,
    };
    MachineAddress { type_, address: a.address.clone() }
}
