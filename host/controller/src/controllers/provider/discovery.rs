//! Discovery (`kubectl vm discover`): the machines on a Provider's backend, listed by its
//! driver (`list-machines`, a page at a time) when the Provider asks — annotation
//! `banlieue.io/discover` set to a value its `status.discovery` does not answer yet — into
//! `status.discovery`: banlieue's own machines too, with the Machine their mark names. Only
//! when asked: a backend of thousands of VMs is not listed every probe interval.

use banlieue_api::infra::{DiskStatus, InterfaceStatus};
use banlieue_api::provider::{DiscoveredMachine, Discovery, MachineOwner, DISCOVER_ANNOTATION};
use banlieue_api::Provider;
use banlieue_runtime::provider::FoundMachine;
use banlieue_runtime::Feature;
use kube::ResourceExt;

use crate::Context;
use crate::controllers::machine::convert::api_power;
use crate::failure::Failure;
use crate::sandbox::grants::Backend;

/// Machines a status holds (a Provider object stays well under the API server's limit).
pub const MAX_DISCOVERED: usize = 2_000;

/// The discovery the Provider asks for and its status does not answer yet.
pub fn asked(provider: &Provider) -> Option<String> {
    let want = provider.annotations().get(DISCOVER_ANNOTATION).filter(|v| !v.is_empty())?;
    let answered = provider.status.as_ref().and_then(|s| s.discovery.as_ref()).map(|d| d.requested.as_str());
    (answered != Some(want.as_str())).then(|| want.clone())
}

/// List the backend's machines through the driver, page after page, up to [`MAX_DISCOVERED`].
pub async fn discover(ctx: &Context, b: &Backend, requested: String, features: &[Feature]) -> Discovery {
    let mut found = Discovery { requested, time: Some(k8s_openapi::jiff::Timestamp::now().to_string()), ..Default::default() };
    if !features.contains(&Feature::Adopt) {
        found.message = Some(format!("the driver of ProviderClass {} does not list the backend's machines (it offers no `adopt`)", b.class));
        return found;
    }
    let mut page: Option<String> = None;
    let mut seen = std::collections::HashSet::new();
    loop {
        let listed = b.drive(ctx, "list-machines", b.driver.component.list_machines(&b.config, page.as_deref(), b.driver.limits, b.grants.clone())).await;
        let listed = match listed {
            Ok(p) => p,
            Err(e) => {
                found.message = Some(format!("listing the backend's machines: {}", Failure::from(e).message));
                return found;
            }
        };
        // Pages are cut by offset: a VM made or removed meanwhile may shift one onto the next page too.
        for m in &listed.machines {
            if seen.insert(m.backend_id.clone()) {
                found.machines.push(discovered(m));
            }
        }
        if found.machines.len() > MAX_DISCOVERED || (found.machines.len() == MAX_DISCOVERED && listed.next.is_some()) {
            found.machines.truncate(MAX_DISCOVERED);
            found.truncated = true;
            found.message = Some(format!("the backend holds more than {MAX_DISCOVERED} machines; the first {MAX_DISCOVERED} are listed"));
            return found;
        }
        match listed.next {
            // A driver handing the same page token back would list forever.
            Some(next) if page.as_deref() != Some(next.as_str()) => page = Some(next),
            Some(next) => {
                found.message = Some(format!("the driver gave page token {next:?} twice; listing stopped there"));
                return found;
            }
            None => return found,
        }
    }
}

/// A machine as the driver found it, in the API's words.
fn discovered(m: &FoundMachine) -> DiscoveredMachine {
    DiscoveredMachine {
        backend_id: m.backend_id.clone(),
        name: m.name.clone(),
        power_state: api_power(m.power_state),
        cpus: m.hardware.cpus,
        memory_mib: m.hardware.memory_mib,
        disks: m.hardware.disks.iter().map(|d| DiskStatus { name: d.name.clone(), size_gib: d.size_gib, id: d.id.clone() }).collect(),
        interfaces: m.hardware.nics.iter().map(|n| InterfaceStatus { name: n.name.clone(), mac: n.mac.clone(), network: n.network.clone(), addresses: vec![] }).collect(),
        addresses: m.addresses.iter().map(|a| a.address.clone()).collect(),
        failure_domain: m.failure_domain.clone(),
        tags: m.tags.clone(),
        template: m.template,
        owner: m.owner.as_ref().map(|o| MachineOwner { machine: o.machine.clone(), machine_uid: o.machine_uid.clone(), installation: o.installation.clone() }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn provider(annotation: Option<&str>, answered: Option<&str>) -> Provider {
        let mut p = crate::fixtures::provider("team", "p", true, serde_json::json!([]));
        if let Some(a) = annotation {
            p.metadata.annotations = Some([(DISCOVER_ANNOTATION.to_string(), a.to_string())].into());
        }
        if let Some(r) = answered {
            p.status.get_or_insert_with(Default::default).discovery = Some(Discovery { requested: r.into(), ..Default::default() });
        }
        p
    }

    #[test]
    fn a_discovery_is_made_once_per_new_request() {
        assert_eq!(asked(&provider(None, None)), None);
        assert_eq!(asked(&provider(Some("t1"), None)).as_deref(), Some("t1"));
        assert_eq!(asked(&provider(Some("t1"), Some("t1"))), None, "answered");
        assert_eq!(asked(&provider(Some("t2"), Some("t1"))).as_deref(), Some("t2"), "asked again");
        assert_eq!(asked(&provider(Some(""), None)), None);
    }
}
