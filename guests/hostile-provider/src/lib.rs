//! A provider driver that misbehaves on purpose. `probe` does what the Provider
//! name says, so one component covers the hostile-guest suite:
//!
//! | provider name | behaviour |
//! |---|---|
//! | `spin` | infinite loop |
//! | `alloc` | allocates 1 GiB |
//! | `recurse` | unbounded recursion |
//! | `panic` | panics |
//! | `log-flood` | logs 100,000 lines |
//! | `http` | GETs the URL in `endpoint` (the host decides whether it may) |
//! | `secret:KEY` | reads secret KEY and reports its length |
//! | `session` | reports the backend session the host hands it, then clears it |
//! | `env` | reports the environment it can see |
//! | `libvirt` | lists the domains of its libvirt connection |
//! | `domains-N` | reports N failure domains (`fd-0`…) |
//! | `huge-domain` | one failure domain whose name and backend version are 8 MiB each |
//! | `bad-labels` | one failure domain with 5,000 labels whose keys are not label keys |
//! | `alias-N` | N failure domains whose names all point at one 32 MiB string in guest memory (the host copies each) |
//! | `hang` | a good probe and `create` (a machine still powering on, so the host looks again soon); then `describe` blocks on the endpoint (a blackholed address) until the host's request timeout, as a backend that stopped answering |
//! | `huge-status` | a good probe; `create`/`describe` return an 8 MiB provider ID and message |
//! | `bad-addresses` | a good probe; machines have 5,000 addresses that are not IPs |
//! | `bad-conditions` | a good probe; machines report 1,000 conditions with invalid types and reasons |
//! | `bad-enum` | a good probe; machines report power state discriminant 7, which the contract does not have |
//! | anything else | a well-behaved probe |
//!
//! A good probe offers storage class `standard` and network class `default`, so VMs
//! may be placed on the Provider and its `create` is called.

use banlieue_sdk::provider::{
    Address, AddressType, Capacity, Condition, ConditionStatus, Driver, FailureDomain, Inventory, Machine, MachinePhase, MachineRef,
    MachineStatus, PowerOff, PowerState, ProviderConfig, Result,
};
use banlieue_sdk::Error;

pub struct Hostile;

fn good() -> Inventory {
    let mut inv = domain("ok".into());
    let fd = &mut inv.failure_domains[0];
    fd.capacity = Capacity { cpus: 64, memory_mib: 1 << 20, storage_gib: 1 << 14 };
    fd.storage_classes = vec!["standard".into()];
    fd.network_classes = vec!["default".into()];
    inv
}

/// `count` failure domains named `fd-0`, `fd-1`, ….
fn domains(count: usize) -> Inventory {
    let template = domain(String::new()).failure_domains.remove(0);
    Inventory {
        backend_version: Some("hostile".into()),
        failure_domains: (0..count).map(|i| FailureDomain { name: format!("fd-{i}"), ..template.clone() }).collect(),
    }
}

const MIB: usize = 1 << 20;

/// What a machine call returns for the Provider named `what` (a good status otherwise).
fn machine_status(what: &str) -> MachineStatus {
    let mut st = MachineStatus {
        provider_id: "hostile://machine".into(),
        hardware: None,
        power_state: PowerState::PoweredOn,
        addresses: vec![Address { type_: AddressType::InternalIp, address: "192.0.2.10".into() }],
        conditions: vec![],
        provisioned: true,
        phase: MachinePhase::Running,
    };
    match what {
        // Still on its way: the host looks again within seconds, and each look describes.
        "hang" => st.phase = MachinePhase::PoweringOn,
        "huge-status" => {
            st.provider_id = "x".repeat(8 * MIB);
            st.conditions = vec![Condition {
                type_: "Backend".into(),
                status: ConditionStatus::True,
                reason: "Huge".into(),
                message: "m".repeat(8 * MIB),
            }];
        }
        "bad-addresses" => {
            st.addresses = (0..5_000).map(|i| Address { type_: AddressType::InternalIp, address: format!("not-an-ip-{i}") }).collect();
        }
        "bad-conditions" => {
            st.conditions = (0..1_000)
                .map(|i| Condition {
                    type_: format!("not a condition type {i}!"),
                    status: ConditionStatus::Unknown,
                    reason: "not a reason either".into(),
                    message: String::new(),
                })
                .collect();
        }
        "bad-enum" => {
            // The contract's enum has three cases; force discriminant 7 into the value the
            // bindings lower (the host must refuse it as it lifts the result).
            let seven: u8 = std::hint::black_box(7);
            st.power_state = unsafe { std::mem::transmute::<u8, PowerState>(seven) };
        }
        _ => {}
    }
    st
}

/// `count` strings that all point at one buffer of `len` bytes: the canonical ABI lets a
/// guest return overlapping strings, and the host copies each one as it lifts the result.
fn aliased(count: usize, len: usize) -> Vec<String> {
    let mut buf = std::mem::ManuallyDrop::new(vec![b'a'; len]);
    let ptr = buf.as_mut_ptr();
    // Safety (of a kind): each String claims the same bytes; the call's instance is
    // dropped after the host copies them, and a double free only hurts the guest.
    (0..count).map(|_| unsafe { String::from_raw_parts(ptr, len, len) }).collect()
}

/// Wait on the endpoint (a blackholed address: the connection or the answer never comes),
/// so the call waits on the host, using no guest time, until the host's request timeout.
fn hang(config: &ProviderConfig) -> Result<MachineStatus> {
    let resp = banlieue_sdk::http::Client::new(&config.endpoint).get("")?;
    Err(Error::Unavailable(format!("the blackhole answered {}", resp.status)))
}

fn domain(name: String) -> Inventory {
    Inventory {
        backend_version: None,
        failure_domains: vec![FailureDomain {
            name,
            labels: vec![],
            capacity: Capacity { cpus: 1, memory_mib: 1, storage_gib: 1 },
            storage_classes: vec![],
            network_classes: vec![],
            features: vec![],
        }],
    }
}

#[inline(never)]
#[allow(unconditional_recursion)]
fn recurse(n: u64, sink: &mut [u64; 64]) -> u64 {
    sink[(n % 64) as usize] = n;
    let r = recurse(n + 1, sink);
    r.wrapping_add(sink[(n % 7) as usize])
}

impl Driver for Hostile {
    fn probe(config: &ProviderConfig) -> Result<Inventory> {
        // The Provider's name (config.provider is `namespace/name`).
        let what = config.provider.rsplit('/').next().unwrap_or_default();
        match what {
            "spin" => {
                let mut x: u64 = 0;
                loop {
                    x = std::hint::black_box(x.wrapping_mul(6364136223846793005).wrapping_add(1));
                }
            }
            "alloc" => {
                let v: Vec<u8> = vec![1u8; 1 << 30];
                Ok(domain(format!("{}", v.iter().map(|&b| b as u64).sum::<u64>())))
            }
            "recurse" => {
                let mut sink = [0u64; 64];
                Ok(domain(format!("{}", recurse(0, &mut sink))))
            }
            "panic" => panic!("hostile guest panics on purpose"),
            "log-flood" => {
                for i in 0..100_000 {
                    banlieue_sdk::log::info(&format!("flood line {i}"));
                }
                Ok(domain("flooded".into()))
            }
            "http" => {
                let resp = banlieue_sdk::http::Client::new(&config.endpoint).get("")?;
                Ok(domain(format!("status-{}-len-{}", resp.status, resp.body.len())))
            }
            "libvirt" => {
                let domains = banlieue_sdk::provider::libvirt::domain_list()?;
                let names: Vec<String> = domains.into_iter().map(|d| d.name).collect();
                Ok(domain(format!("domains-{}", names.join(","))))
            }
            "env" => {
                let vars: Vec<String> = std::env::vars().map(|(k, _)| k).collect();
                let args: Vec<String> = std::env::args().collect();
                Ok(domain(format!("env-{}-args-{}", vars.len(), args.len())))
            }
            "session" => {
                let seen = banlieue_sdk::session::get().unwrap_or_else(|| "none".into());
                banlieue_sdk::session::clear();
                Ok(domain(format!("session-{seen}")))
            }
            other if other.starts_with("secret:") => {
                let v = banlieue_sdk::secrets::get(&other["secret:".len()..])?;
                Ok(domain(format!("secret-len-{}", v.len())))
            }
            "huge-domain" => {
                let mut inv = domain("d".repeat(8 * MIB));
                inv.backend_version = Some("v".repeat(8 * MIB));
                Ok(inv)
            }
            "bad-labels" => {
                let mut inv = good();
                inv.failure_domains[0].labels = (0..5_000).map(|i| (format!("not a label key {i}!"), "v".repeat(1000))).collect();
                Ok(inv)
            }
            "hang" |
            "huge-status" | "bad-addresses" | "bad-conditions" | "bad-enum" => Ok(good()),
            other if other.starts_with("domains-") => Ok(domains(other["domains-".len()..].parse().unwrap_or(0))),
            other if other.starts_with("alias-") => {
                let count = other["alias-".len()..].parse().unwrap_or(0);
                let mut inv = domains(count);
                for (fd, name) in inv.failure_domains.iter_mut().zip(aliased(count, 32 * MIB)) {
                    fd.name = name;
                }
                Ok(inv)
            }
            _ => Ok(domain("ok".into())),
        }
    }
    fn create(config: &ProviderConfig, _: &Machine) -> Result<MachineStatus> {
        let what = config.provider.rsplit('/').next().unwrap_or_default();
        match what {
            "hang" | "huge-status" | "bad-addresses" | "bad-conditions" | "bad-enum" => Ok(machine_status(what)),
            _ => Err(Error::Internal("not a real driver".into())),
        }
    }
    fn describe(config: &ProviderConfig, _: &MachineRef) -> Result<MachineStatus> {
        let what = config.provider.rsplit('/').next().unwrap_or_default();
        match what {
            "hang" => hang(config),
            "huge-status" | "bad-addresses" | "bad-conditions" | "bad-enum" => Ok(machine_status(what)),
            _ => Err(Error::Internal("not a real driver".into())),
        }
    }
    fn set_power(_: &ProviderConfig, _: &MachineRef, _: PowerState, _: &PowerOff) -> Result<MachineStatus> {
        Err(Error::Internal("not a real driver".into()))
    }
    fn delete(_: &ProviderConfig, _: &MachineRef, _: &PowerOff) -> Result<()> {
        Ok(())
    }
}

banlieue_sdk::export_provider!(Hostile);
