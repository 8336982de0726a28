//! The libvirt provider driver: one libvirt host per Provider, reached only
//! through the host's `banlieue:host/libvirt` capability (the grant is the
//! connection to the Provider's URI) and `log`. It keeps no state: libvirt is
//! the source of truth, and every call is idempotent.
//!
//! # Mapping
//!
//! - Machine `namespace/name` is the persistent domain `{namespace}_{name}`
//!   (an underscore cannot occur in a Kubernetes name, so this is unambiguous).
//!   Its `<uuid>` is the Machine UID — the idempotency key — and it carries
//!   `<title>{namespace}/{name}</title>` and a `<metadata>` element in the
//!   `https://banlieue.io/libvirt/v1` namespace with the UID, namespace, name
//!   and, when given, the user-data (base64). The user-data is only recorded:
//!   building a cloud-init (NoCloud) ISO is out of scope for now, so nothing
//!   hands it to the guest yet. Anyone who can read the domain XML can read it.
//! - Disk `d` is the qcow2 volume `{namespace}_{name}_{d}.qcow2` in storage pool
//!   `disk.target`; the first (boot) disk has the image's backing file as its
//!   qcow2 `<backingStore>`. Only `backingFile` image sources are supported.
//! - NICs are `<interface type='network'>` on `nic.network`, virtio.
//! - `<domain type>` is `test` when the endpoint starts with `test` (libvirt's
//!   test driver), otherwise `qemu` (TCG, so no `/dev/kvm` is needed).
//!
//! # Calls
//!
//! - `create`: a domain of that name with the machine's UID is the machine
//!   (its power state is driven to the requested one); with another UUID it
//!   belongs to another machine (`invalid-spec`). Otherwise the spec is checked
//!   against the host (pools, networks, image kind), missing volumes are
//!   created (volumes left by an interrupted create are reused), the domain is
//!   defined and, if asked for, started.
//! - `describe`: `libvirt://{uuid}`, the power state from the domain state, no
//!   addresses (unknown without a guest agent), the NIC MACs in the
//!   `PoweredOn` condition's message. A domain of that name with another UUID
//!   is `not-found` for this machine.
//! - `set-power`: on starts the domain; off follows the power-off mode
//!   (`banlieue_sdk::provider::power_off`): `hard` is `domain-destroy`, `soft`
//!   an ACPI `domain-shutdown` polled until the domain is off, `try-soft` the
//!   same then `domain-destroy` at the timeout; suspend is refused.
//! - `delete`: power off per the mode, undefine, then delete every volume whose name starts
//!   with `{namespace}_{name}_` in every active pool, so a delete retried after
//!   a crash still removes leftovers. A domain of that name with another UUID
//!   is left alone (and so are the volumes, which are its).
//! - `probe`: the host is one failure domain named after the Provider; memory
//!   is the node's (libvirt hosts overcommit, and a domain's maximum says little
//!   about what it uses, so defined domains are not subtracted), storage is the
//!   free space of the mapped pools (volumes are thin: allocation 0); a class is offered only if its pool or network
//!   exists and is active.
//! - `import-image` is not supported (the SDK default).

use banlieue_sdk::provider::libvirt::{self, DomainInfo, DomainState};
use banlieue_sdk::provider::{
    Driver, Inventory, Machine, MachineRef, MachineStatus, PowerOff, PowerOffOps, PowerState, ProviderConfig, Result,
    ignore_not_found, power_off,
};
use banlieue_sdk::{Error, info, warn};

pub mod naming;
pub mod spec;
pub mod xml;

pub struct Libvirt;

/// A machine created powered off is defined, never started: nothing to shut down.
const CREATE_POWER_OFF: PowerOff = PowerOff { mode: banlieue_sdk::provider::PowerOffMode::Hard, timeout_ms: 0 };

/// The domain named `name`, if any (a lookup: hosts with thousands of domains stay fast).
fn find(name: &str) -> Result<Option<DomainInfo>> {
    match libvirt::domain_get(name) {
        Ok(d) => Ok(Some(d)),
        Err(Error::NotFound(_)) => Ok(None),
        Err(e) => Err(e),
    }
}

/// The machine's domain, or `not-found` (also when the name is taken by another machine's domain).
fn lookup(machine: &MachineRef) -> Result<DomainInfo> {
    naming::check_machine(&machine.namespace, &machine.name)?;
    let name = naming::domain_name(&machine.namespace, &machine.name);
    match find(&name)? {
        None => Err(Error::NotFound(format!("libvirt domain {name} does not exist"))),
        Some(d) if !machine.uid.is_empty() && !naming::same_uuid(&d.uuid, &machine.uid) => Err(Error::NotFound(
            format!("libvirt domain {name} belongs to another machine (uuid {}, not {})", d.uuid, machine.uid),
        )),
        Some(d) => Ok(d),
    }
}

fn describe_domain(name: &str) -> Result<MachineStatus> {
    let domain = find(name)?.ok_or_else(|| Error::NotFound(format!("libvirt domain {name} does not exist")))?;
    let xml = libvirt::domain_xml(name)?;
    Ok(spec::status(&domain, &xml))
}

/// Drive domain `name`, now in `state`, towards `target`; powering off follows `off`.
fn ensure_power(name: &str, state: DomainState, target: PowerState, off: &PowerOff) -> Result<()> {
    match target {
        PowerState::Suspended => Err(Error::InvalidSpec("the libvirt driver does not suspend VMs".into())),
        PowerState::PoweredOn => match state {
            DomainState::Running | DomainState::Blocked => Ok(()),
            DomainState::Paused | DomainState::PmSuspended => Err(Error::InvalidSpec(format!(
                "libvirt domain {name} was suspended outside banlieue; the libvirt driver does not resume VMs"
            ))),
            DomainState::Shutdown => {
                Err(Error::Unavailable(format!("libvirt domain {name} is shutting down; start it once it is off")))
            }
            DomainState::Shutoff | DomainState::Crashed | DomainState::NoState => {
                info!("starting libvirt domain {name}");
                match libvirt::domain_start(name) {
                    // Started by someone else meanwhile.
                    Err(Error::InvalidSpec(_))
                        if spec::power_state(libvirt::domain_get_state(name)?) == PowerState::PoweredOn =>
                    {
                        Ok(())
                    }
                    other => other,
                }
            }
        },
        PowerState::PoweredOff => power_off(&mut Domain(name), off),
    }
}

/// Powering one domain off: ACPI shutdown, destroy, and its state.
struct Domain<'a>(&'a str);

impl PowerOffOps for Domain<'_> {
    fn request_shutdown(&mut self) -> Result<()> {
        info!("shutting down (ACPI) libvirt domain {}", self.0);
        match libvirt::domain_shutdown(self.0) {
            // Went off between the state check and the request.
            Err(Error::InvalidSpec(_)) if self.is_off()? => Ok(()),
            other => other,
        }
    }

    fn hard_off(&mut self) -> Result<()> {
        info!("powering off (destroying) libvirt domain {}", self.0);
        match libvirt::domain_destroy(self.0) {
            // Already off by the time the call arrived.
            Err(Error::InvalidSpec(_)) if self.is_off()? => Ok(()),
            other => other,
        }
    }

    fn is_off(&mut self) -> Result<bool> {
        Ok(!spec::is_active(libvirt::domain_get_state(self.0)?))
    }
}

impl Driver for Libvirt {
    fn probe(config: &ProviderConfig) -> Result<Inventory> {
        let node = libvirt::node_info()?;
        let pools = libvirt::pool_list()?;
        let networks = libvirt::network_list()?;
        Ok(spec::inventory(config, &node, &pools, &networks))
    }

    fn create(config: &ProviderConfig, machine: &Machine) -> Result<MachineStatus> {
        naming::check_machine(&machine.namespace, &machine.name)?;
        naming::check_uuid(&machine.uid)?;
        let name = naming::domain_name(&machine.namespace, &machine.name);
        if let Some(existing) = find(&name)? {
            if !naming::same_uuid(&existing.uuid, &machine.uid) {
                return Err(Error::InvalidSpec(format!(
                    "libvirt domain {name} exists and belongs to another machine (uuid {}, not {})",
                    existing.uuid, machine.uid
                )));
            }
            ensure_power(&name, existing.state, machine.power_state, &CREATE_POWER_OFF)?;
            return describe_domain(&name);
        }
        // (A UID already used by a domain of another name is refused by libvirt's define.)

        let pools = libvirt::pool_list()?;
        let networks = libvirt::network_list()?;
        let backing = spec::validate(machine, &pools, &networks)?;
        // Built before anything is created: a spec the XML cannot carry creates nothing.
        let domain_xml = xml::domain(spec::virt_type(config), machine)?;
        for (i, disk) in machine.disks.iter().enumerate() {
            let volume = naming::volume_name(&machine.namespace, &machine.name, &disk.name);
            let backing = if i == 0 { Some(backing) } else { None };
            match libvirt::volume_create(&disk.target, &xml::volume(&volume, disk.size_gib, backing)?) {
                Ok(_) => info!("created volume {volume} ({} GiB) in pool {}", disk.size_gib, disk.target),
                // Left by an earlier attempt that did not get as far as the domain: reuse it.
                // (Listing only on failure keeps the usual path independent of the pool's size.)
                Err(e) => {
                    let exists = libvirt::volume_list(&disk.target)?.iter().any(|v| v.name == volume);
                    if !exists {
                        return Err(e.context(format!("creating volume {volume} in pool {}", disk.target)));
                    }
                    info!("reusing volume {volume} in pool {}", disk.target);
                }
            }
        }
        let defined =
            libvirt::domain_define(&domain_xml).map_err(|e| e.context(format!("defining libvirt domain {name}")))?;
        info!("defined libvirt domain {name} ({})", defined.uuid);
        ensure_power(&name, defined.state, machine.power_state, &CREATE_POWER_OFF)?;
        describe_domain(&name)
    }

    fn describe(_config: &ProviderConfig, machine: &MachineRef) -> Result<MachineStatus> {
        let domain = lookup(machine)?;
        describe_domain(&domain.name)
    }

    fn set_power(_config: &ProviderConfig, machine: &MachineRef, state: PowerState, off: &PowerOff) -> Result<MachineStatus> {
        if state == PowerState::Suspended {
            return Err(Error::InvalidSpec("the libvirt driver does not suspend VMs".into()));
        }
        let domain = lookup(machine)?;
        ensure_power(&domain.name, domain.state, state, off)?;
        describe_domain(&domain.name)
    }

    fn delete(_config: &ProviderConfig, machine: &MachineRef, off: &PowerOff) -> Result<()> {
        naming::check_machine(&machine.namespace, &machine.name)?;
        let name = naming::domain_name(&machine.namespace, &machine.name);
        if let Some(domain) = find(&name)? {
            if !machine.uid.is_empty() && !naming::same_uuid(&domain.uuid, &machine.uid) {
                warn!(
                    "not deleting libvirt domain {name}: it belongs to another machine (uuid {}, not {})",
                    domain.uuid, machine.uid
                );
                return Ok(());
            }
            if spec::is_active(domain.state) {
                ignore_not_found(power_off(&mut Domain(&name), off))
                    .map_err(|e| e.context(format!("powering off libvirt domain {name}")))?;
            }
            ignore_not_found(libvirt::domain_undefine(&name))
                .map_err(|e| e.context(format!("undefining libvirt domain {name}")))?;
            info!("undefined libvirt domain {name}");
        }
        let prefix = naming::volume_prefix(&machine.namespace, &machine.name);
        for pool in libvirt::pool_list()?.into_iter().filter(|p| p.active) {
            let volumes = match libvirt::volume_list(&pool.name) {
                Err(Error::NotFound(_)) => continue,
                other => other?,
            };
            for volume in volumes.into_iter().filter(|v| v.name.starts_with(&prefix)) {
                ignore_not_found(libvirt::volume_delete(&pool.name, &volume.name))
                    .map_err(|e| e.context(format!("deleting volume {} in pool {}", volume.name, pool.name)))?;
                info!("deleted volume {} in pool {}", volume.name, pool.name);
            }
        }
        Ok(())
    }
}

banlieue_sdk::export_provider!(Libvirt);
