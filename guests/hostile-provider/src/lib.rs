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
//! | anything else | a well-behaved probe |

use banlieue_sdk::provider::{
    Capacity, Driver, FailureDomain, Inventory, Machine, MachineRef, MachineStatus, PowerOff, PowerState, ProviderConfig, Result,
};
use banlieue_sdk::Error;

pub struct Hostile;

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
            _ => Ok(domain("ok".into())),
        }
    }
    fn create(_: &ProviderConfig, _: &Machine) -> Result<MachineStatus> {
        Err(Error::Internal("not a real driver".into()))
    }
    fn describe(_: &ProviderConfig, _: &MachineRef) -> Result<MachineStatus> {
        Err(Error::Internal("not a real driver".into()))
    }
    fn set_power(_: &ProviderConfig, _: &MachineRef, _: PowerState, _: &PowerOff) -> Result<MachineStatus> {
        Err(Error::Internal("not a real driver".into()))
    }
    fn delete(_: &ProviderConfig, _: &MachineRef, _: &PowerOff) -> Result<()> {
        Ok(())
    }
}

banlieue_sdk::export_provider!(Hostile);
