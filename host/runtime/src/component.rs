//! Loading a component: compile (or take it from the cache), then check the
//! contract it was built for and the imports it asks for, before anything runs.

use sha2::{Digest, Sha256};
use wasmtime::component::Component;

use crate::error::CallError;
use crate::Runtime;

/// The contracts a component can implement.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Contract {
    Placement,
    Provider,
}

/// Contract versions this host implements.
pub const PLACEMENT_VERSION: &str = "0.2.0";
pub const PROVIDER_VERSION: &str = "0.6.0";
/// Older placement contracts the host still runs, by lowering each request into
/// their shape (see `placement::legacy`).
pub const PLACEMENT_LEGACY_VERSIONS: &[&str] = &["0.1.0"];
/// Older provider contracts the host still runs (see `provider::legacy`): everything
/// but what was added since, which is refused with a reason naming the contract.
pub const PROVIDER_LEGACY_VERSIONS: &[&str] = &["0.5.0"];

impl Contract {
    pub fn world(self) -> &'static str {
        match self {
            Contract::Placement => "placement",
            Contract::Provider => "provider",
        }
    }
    fn export(self) -> &'static str {
        match self {
            Contract::Placement => "banlieue:placement/policy",
            Contract::Provider => "banlieue:provider/driver",
        }
    }
    /// The versions this host implements, the current one first.
    fn host_versions(self) -> Vec<semver::Version> {
        let versions: Vec<&str> = match self {
            Contract::Placement => [PLACEMENT_VERSION].iter().chain(PLACEMENT_LEGACY_VERSIONS).copied().collect(),
            Contract::Provider => [PROVIDER_VERSION].iter().chain(PROVIDER_LEGACY_VERSIONS).copied().collect(),
        };
        versions.into_iter().map(|v| semver::Version::parse(v).expect("valid")).collect()
    }
    /// Interfaces (name prefixes) the host provides to this contract's components.
    fn allowed_imports(self) -> Vec<&'static str> {
        let mut v = vec!["banlieue:host/log@", "banlieue:host/types@"];
        match self {
            Contract::Placement => v.push("banlieue:placement/types@"),
            Contract::Provider => v.extend(["banlieue:provider/types@", "banlieue:provider/session@", "banlieue:host/http@", "banlieue:host/libvirt@", "banlieue:host/secrets@", "banlieue:host/transfer@"]),
        }
        v.extend(crate::capability::wasi::ALLOWED);
        v
    }
}

/// A compiled, checked component.
#[derive(Clone)]
pub struct LoadedComponent {
    /// `sha256:<hex>` of the component bytes.
    pub digest: String,
    pub contract: Contract,
    /// The contract version the component was built for.
    pub contract_version: semver::Version,
    pub(crate) component: Component,
}

/// Same major, and for 0.x the same minor: what semver promises.
fn compatible(host: &semver::Version, guest: &semver::Version) -> bool {
    host.major == guest.major && (host.major != 0 || host.minor == guest.minor)
}

/// Refuse a component built for a version this host neither implements nor adapts.
fn check_version(contract: Contract, version: &semver::Version) -> Result<(), CallError> {
    let implemented = contract.host_versions();
    if implemented.iter().any(|host| compatible(host, version)) {
        return Ok(());
    }
    let implemented: Vec<String> = implemented.iter().map(ToString::to_string).collect();
    Err(CallError::Incompatible(format!(
        "component was built for {}@{version}; this host implements {}",
        contract.export(),
        implemented.join(" and ")
    )))
}

impl Runtime {
    /// Compile a component (or load it from the cache) and check it implements `contract`.
    pub fn load(&self, bytes: &[u8], contract: Contract) -> Result<LoadedComponent, CallError> {
        let digest = hex::encode(Sha256::digest(bytes));
        let component = self.compile(bytes, &digest)?;
        let ty = component.component_type();
        let engine = &self.engine;

        // Exports: the contract's interface at a compatible version.
        let export = ty
            .exports(engine)
            .map(|(name, _)| name.to_string())
            .find(|n| n.starts_with(&format!("{}@", contract.export())))
            .ok_or_else(|| {
                let found: Vec<String> = ty.exports(engine).map(|(n, _)| n.to_string()).collect();
                CallError::Incompatible(format!(
                    "component does not export {} (it exports: {}); is it a {} component?",
                    contract.export(),
                    if found.is_empty() { "nothing".into() } else { found.join(", ") },
                    contract.world()
                ))
            })?;
        let version = export.rsplit_once('@').map(|(_, v)| v).unwrap_or_default();
        let version = semver::Version::parse(version)
            .map_err(|e| CallError::Incompatible(format!("export {export} has an invalid version: {e}")))?;
        check_version(contract, &version)?;
        // Imports: nothing the host doesn't provide to this kind of component.
        let allowed = contract.allowed_imports();
        for (name, _) in ty.imports(engine) {
            if !allowed.iter().any(|p| name.starts_with(p)) {
                return Err(CallError::ForbiddenImport { import: name.to_string(), world: contract.world() });
            }
        }
        Ok(LoadedComponent { digest: format!("sha256:{digest}"), contract, contract_version: version, component })
    }

    fn compile(&self, bytes: &[u8], digest: &str) -> Result<Component, CallError> {
        if let Some(cache) = &self.cache {
            if let Some(pre) = cache.get(digest, &self.config_hash) {
                // SAFETY: the cache only returns bytes this host compiled and MACed itself.
                match unsafe { Component::deserialize(&self.engine, &pre) } {
                    Ok(c) => return Ok(c),
                    Err(e) => tracing::warn!("discarding unusable cached component {digest}: {e}"),
                }
            }
        }
        let component = Component::new(&self.engine, bytes).map_err(|e| CallError::Invalid(format!("{e:#}")))?;
        if let Some(cache) = &self.cache {
            match component.serialize() {
                Ok(pre) => {
                    if let Err(e) = cache.put(digest, &self.config_hash, &pre) {
                        tracing::warn!("could not cache component {digest}: {e}");
                    }
                }
                Err(e) => tracing::warn!("could not serialize component {digest}: {e}"),
            }
        }
        Ok(component)
    }
}

#[cfg(test)]
mod tests {
    use super::{check_version, compatible, Contract};
    use semver::Version;

    #[test]
    fn semver_compatibility() {
        let v = |s| Version::parse(s).unwrap();
        assert!(compatible(&v("0.1.0"), &v("0.1.7")));
        assert!(!compatible(&v("0.1.0"), &v("0.2.0")));
        assert!(compatible(&v("1.2.0"), &v("1.0.0")));
        assert!(!compatible(&v("1.2.0"), &v("2.0.0")));
    }

    #[test]
    fn placement_0_2_and_0_1_load_and_nothing_else() {
        let v = |s| Version::parse(s).unwrap();
        assert!(check_version(Contract::Placement, &v("0.2.1")).is_ok());
        assert!(check_version(Contract::Placement, &v("0.1.0")).is_ok());
        let refused = check_version(Contract::Placement, &v("0.3.0")).unwrap_err().to_string();
        assert!(refused.ends_with("built for banlieue:placement/policy@0.3.0; this host implements 0.2.0 and 0.1.0"), "{refused}");
        assert!(check_version(Contract::Provider, &v("0.3.0")).is_err(), "0.4.0 changed the nic record");
        assert!(check_version(Contract::Provider, &v("0.4.0")).is_err(), "0.5.0 changed the machine-status record");
        assert!(check_version(Contract::Provider, &v("0.5.0")).is_ok(), "0.6.0 only added snapshots: 0.5.0 runs through the adapter");
        assert!(check_version(Contract::Provider, &v("0.6.0")).is_ok());
    }
}

/// What a component is, for `banlieue component inspect`.
#[derive(Debug, Clone)]
pub struct Inspection {
    pub digest: String,
    /// The contract it implements, if any, and at which version.
    pub contract: Option<(Contract, semver::Version)>,
    pub imports: Vec<String>,
    pub exports: Vec<String>,
    /// Why it would be refused, if it would.
    pub refusal: Option<String>,
}

impl Runtime {
    /// The interfaces a loaded component imports (what it will ask the host for).
    pub fn imports(&self, component: &LoadedComponent) -> Vec<String> {
        component.component.component_type().imports(&self.engine).map(|(n, _)| n.to_string()).collect()
    }

    /// Describe a component without running it.
    pub fn inspect(&self, bytes: &[u8]) -> Result<Inspection, CallError> {
        let digest = hex::encode(Sha256::digest(bytes));
        let component = self.compile(bytes, &digest)?;
        let ty = component.component_type();
        let imports: Vec<String> = ty.imports(&self.engine).map(|(n, _)| n.to_string()).collect();
        let exports: Vec<String> = ty.exports(&self.engine).map(|(n, _)| n.to_string()).collect();
        let contract = [Contract::Placement, Contract::Provider].into_iter().find(|c| exports.iter().any(|e| e.starts_with(&format!("{}@", c.export()))));
        let (contract, refusal) = match contract {
            None => (None, Some("exports neither banlieue:placement/policy nor banlieue:provider/driver".to_string())),
            Some(c) => match self.load(bytes, c) {
                Ok(l) => (Some((c, l.contract_version)), None),
                Err(e) => (None, Some(e.to_string())),
            },
        };
        Ok(Inspection { digest: format!("sha256:{digest}"), contract, imports, exports, refusal })
    }
}

impl Runtime {
    /// A linker with the WASI every component may import, to which a world adds its host interfaces.
    pub(crate) fn wasi_linker(&self) -> Result<wasmtime::component::Linker<crate::state::HostState>, CallError> {
        let mut linker = wasmtime::component::Linker::new(&self.engine);
        crate::capability::wasi::link(&mut linker).map_err(|e| CallError::Invalid(format!("{e:#}")))?;
        Ok(linker)
    }
}
