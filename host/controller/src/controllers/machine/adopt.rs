//! Taking over a backend VM banlieue did not make (`spec.vm.adopt`), and letting a machine's
//! VM go instead of deleting it (`spec.vm.deletionPolicy: Orphan`).
//!
//! The driver stamps this Machine's owner mark on the VM of the backend id unless it carries
//! one, and answers with the VM as it now is; the host — not the driver — decides whether the
//! mark it carries is this Machine's ([`owned`]): another VirtualMachine's, or another
//! installation's, is refused (`AlreadyManaged`, naming it). Within this process two Machines
//! never stamp one VM at once (`Context::adopting`). From then on the machine is found by its
//! backend id — the driver checks the mark on every call — and managed like any other, except
//! that `create` is never called for it: its hardware is reported against its class
//! (`ConfigurationMatches`), and changed — by the driver's `reconfigure`, never shrinking a
//! disk — only when its VM says `applyClass` ([`super::hardware::wanted`]).

use banlieue_runtime::provider::{FoundMachine, MachineRef, MachineStatus, OwnerMark};
use kube::api::{ApiResource, DynamicObject};
use kube::{Resource, ResourceExt};

use super::{backend_uid, call, operation};
use crate::Context;
use crate::failure::{api_failure, Failure};
use crate::sandbox::grants::Backend;
use crate::status::reasons::Reason;

/// Adopt the VM `backend_id` as machine `m` (`r`, with that backend id); its status.
pub(super) async fn adopt(ctx: &Context, m: &DynamicObject, resource: &ApiResource, b: &Backend, r: &MachineRef, backend_id: &str) -> Result<MachineStatus, Failure> {
    let mark = mark(ctx, m).await?;
    let _claim = Claim::take(ctx, &format!("{}/{backend_id}", b.config.provider), &mark)?;
    let _op = operation(b)?;
    let found = match call(ctx, b, "adopt", b.driver.component.adopt(&b.config, r, &mark, b.driver.limits, b.grants.clone())).await {
        Ok(found) => found,
        Err(f) => {
            let f = f.context(format_args!("adopting backend VM {backend_id} on Provider {}", b.config.provider));
            return Err(match f.reason {
                Reason::NotFound => match elsewhere(ctx, m, &b.config.provider, backend_id).await {
                    Some(other) => Failure { message: format!("{}; Provider {other}'s discovery lists it: set spec.placement.providerRef to {other}", f.message), ..f },
                    None => f,
                },
                _ => f,
            });
        }
    };
    owned(&found, &mark)?;
    let status = call(ctx, b, "describe", b.driver.component.describe(&b.config, r, b.driver.limits, b.grants.clone())).await?;
    let note = format!("adopted backend VM {} ({backend_id}), {:?}, as it was", found.name, found.power_state);
    ctx.event(&m.object_ref(resource), false, Reason::Adopted, "Adopt", note).await;
    Ok(status)
}

/// Another Provider of the machine's namespace whose last discovery lists `backend_id`: the
/// VM a user named on the wrong Provider (its scope is another backend, or other credentials).
async fn elsewhere(ctx: &Context, m: &DynamicObject, provider: &str, backend_id: &str) -> Option<String> {
    let providers: kube::Api<banlieue_api::Provider> = kube::Api::namespaced(ctx.client.clone(), &m.namespace()?);
    let list = providers.list(&Default::default()).await.ok()?;
    let this = provider.rsplit('/').next().unwrap_or(provider);
    list.items.into_iter().find_map(|p| {
        let name = p.name_any();
        let lists = p.status.as_ref()?.discovery.as_ref()?.machines.iter().any(|d| d.backend_id == backend_id);
        (name != this && lists).then_some(name)
    })
}

/// Remove this machine's mark from its VM and leave the VM as it is (`Orphan`).
pub(super) async fn release(ctx: &Context, m: &DynamicObject, b: &Backend, r: &MachineRef) -> Result<(), Failure> {
    let mark = mark(ctx, m).await?;
    let _op = operation(b)?;
    call(ctx, b, "release", b.driver.component.release(&b.config, r, &mark, b.driver.limits, b.grants.clone())).await
}

/// The mark machine `m` puts on the VM it adopts.
async fn mark(ctx: &Context, m: &DynamicObject) -> Result<OwnerMark, Failure> {
    let installation = ctx.installation_id().await.map_err(|e| api_failure(&e).context("reading the cluster's id (the kube-system Namespace's UID)"))?;
    Ok(OwnerMark { machine_uid: backend_uid(m), machine: format!("{}/{}", m.namespace().unwrap_or_default(), m.name_any()), installation })
}

/// Whether the VM, as the driver found it after stamping, is this machine's to manage.
pub fn owned(found: &FoundMachine, mine: &OwnerMark) -> Result<(), Failure> {
    let vm = format!("backend VM {} ({})", found.name, found.backend_id);
    if found.template {
        return Err(Failure::until_changed(Reason::InvalidSpec, format!("{vm} is a template, not a VM that runs: templates are not adopted")));
    }
    match &found.owner {
        Some(o) if o.machine_uid == mine.machine_uid => Ok(()),
        Some(o) => {
            let owner = if o.installation.is_empty() || o.installation == mine.installation {
                format!("Machine {} (uid {})", o.machine, o.machine_uid)
            } else {
                format!("Machine {} of another banlieue installation ({})", o.machine, o.installation)
            };
            Err(Failure::until_changed(Reason::AlreadyManaged, format!("{vm} is already managed by {owner}: release it there first (deletionPolicy: Orphan)")))
        }
        None => Err(Failure::transient(Reason::DriverError, format!("the driver's adopt left {vm} without this machine's mark"))),
    }
}

/// This process adopting one backend VM for one machine; another machine naming the same VM
/// meanwhile waits (it finds the mark afterwards and is refused).
struct Claim<'a> {
    ctx: &'a Context,
    key: String,
}

impl<'a> Claim<'a> {
    fn take(ctx: &'a Context, key: &str, mark: &OwnerMark) -> Result<Claim<'a>, Failure> {
        let mut adopting = ctx.adopting.lock().unwrap_or_else(|e| e.into_inner());
        match adopting.get(key) {
            Some(other) if *other != mark.machine_uid => {
                Err(Failure::transient(Reason::AlreadyManaged, format!("backend VM {key} is being adopted by another Machine (uid {other})")))
            }
            _ => {
                adopting.insert(key.to_string(), mark.machine_uid.clone());
                Ok(Claim { ctx, key: key.to_string() })
            }
        }
    }
}

impl Drop for Claim<'_> {
    fn drop(&mut self) {
        self.ctx.adopting.lock().unwrap_or_else(|e| e.into_inner()).remove(&self.key);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use banlieue_runtime::provider::{Hardware, PowerState};

    fn found(owner: Option<(&str, &str)>, template: bool) -> FoundMachine {
        FoundMachine {
            backend_id: "42".into(),
            name: "legacy-db".into(),
            power_state: PowerState::PoweredOn,
            hardware: Hardware { cpus: 2, memory_mib: 2048, disks: vec![], nics: vec![] },
            addresses: vec![],
            failure_domain: "node1".into(),
            tags: vec![],
            owner: owner.map(|(uid, installation)| OwnerMark { machine_uid: uid.into(), machine: "team/db".into(), installation: installation.into() }),
            template,
        }
    }

    fn mine() -> OwnerMark {
        OwnerMark { machine_uid: "u-1".into(), machine: "team/web".into(), installation: "cluster-a".into() }
    }

    #[test]
    fn only_a_vm_carrying_this_machines_mark_is_adopted() {
        assert_eq!(owned(&found(Some(("u-1", "cluster-a")), false), &mine()), Ok(()));
        let other = owned(&found(Some(("u-2", "cluster-a")), false), &mine()).unwrap_err();
        assert_eq!((other.reason, other.retry), (Reason::AlreadyManaged, false));
        assert!(other.message.contains("legacy-db (42) is already managed by Machine team/db (uid u-2)"), "{}", other.message);
        let foreign = owned(&found(Some(("u-9", "cluster-b")), false), &mine()).unwrap_err();
        assert!(foreign.message.contains("of another banlieue installation (cluster-b)"), "{}", foreign.message);
        let template = owned(&found(None, true), &mine()).unwrap_err();
        assert_eq!(template.reason, Reason::InvalidSpec);
        assert!(template.message.contains("is a template"));
        assert_eq!(owned(&found(None, false), &mine()).unwrap_err().reason, Reason::DriverError, "a driver that did not stamp");
    }
}
