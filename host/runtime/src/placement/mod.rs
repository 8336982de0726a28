//! Placement components: `choose(request, domains) -> decision`.
//! A pure call: the component imports only `log`, and the host passes everything
//! it may look at, as the interned tables of [`Domains`].
//!
//! Components built against `banlieue:placement@0.2.0` get the tables as they
//! are; components built against 0.1.0 get them expanded into 0.1.0's shape
//! ([`legacy`]), and their answer is mapped back to a candidate index. Either
//! way the caller sees a [`Decision`] naming a candidate that exists.

use wasmtime::component::HasSelf;

use crate::capability::Grants;
use crate::component::{Contract, LoadedComponent};
use crate::error::{CallError, InvalidDecision};
use crate::limits::Limits;
use crate::state::{classify, classify_instantiate, new_store, HostState};
use crate::Runtime;

mod domains;
pub mod legacy;

pub use domains::{CandidateRef, Capacity, Domains, DomainsBuilder};

mod bindings {
    wasmtime::component::bindgen!({
        path: ["../../wit/host", "../../wit/placement"],
        world: "banlieue:placement/placement",
        imports: { default: async },
        exports: { default: async },
        with: { "banlieue:host": crate::capability::bindings::banlieue::host },
    });
}

pub use bindings::banlieue::placement::types::{AntiAffinity, Decision, Request, SelectorOp, SelectorRequirement, VmClass};

/// The request tables as they cross the boundary; [`Domains`] holds them.
pub mod wire {
    pub use super::bindings::banlieue::placement::types::{Candidates, DomainFacts, Domains, Label, VmGroup};
}

/// A loaded component, by the contract version it was built for.
#[derive(Clone)]
enum Pre {
    Current(bindings::PlacementPre<HostState>),
    Legacy(legacy::bindings::PlacementPre<HostState>),
}

/// A placement policy ready to be called many times.
#[derive(Clone)]
pub struct PlacementPolicy {
    rt: Runtime,
    pre: Pre,
    pub component: LoadedComponent,
}

impl Runtime {
    /// Load a placement component (built against the current contract or one the host adapts).
    pub fn placement(&self, bytes: &[u8]) -> Result<PlacementPolicy, CallError> {
        let component = self.load(bytes, Contract::Placement)?;
        let mut linker = self.wasi_linker()?;
        let invalid = |e: wasmtime::Error| CallError::Invalid(format!("{e:#}"));
        let incompatible = |e: wasmtime::Error| CallError::Incompatible(format!("{e:#}"));
        let pre = if legacy::adapts(&component.contract_version) {
            legacy::bindings::Placement::add_to_linker::<HostState, HasSelf<HostState>>(&mut linker, |s| s).map_err(invalid)?;
            let pre = linker.instantiate_pre(&component.component).map_err(incompatible)?;
            Pre::Legacy(legacy::bindings::PlacementPre::new(pre).map_err(incompatible)?)
        } else {
            bindings::Placement::add_to_linker::<HostState, HasSelf<HostState>>(&mut linker, |s| s).map_err(invalid)?;
            let pre = linker.instantiate_pre(&component.component).map_err(incompatible)?;
            Pre::Current(bindings::PlacementPre::new(pre).map_err(incompatible)?)
        };
        Ok(PlacementPolicy { rt: self.clone(), pre, component })
    }
}

impl PlacementPolicy {
    /// Choose one of `domains`' candidates, in a fresh instance with `limits`. The
    /// decision's index is checked: one naming no candidate is [`CallError::InvalidDecision`].
    pub async fn choose(&self, request: &Request, domains: &Domains, limits: Limits, grants: Grants) -> Result<Decision, CallError> {
        let mut store = new_store(&self.rt, Contract::Placement, limits, grants);
        let decision = match &self.pre {
            Pre::Current(pre) => {
                let instance = pre.instantiate_async(&mut store).await.map_err(|e| classify_instantiate(&store, e))?;
                instance.banlieue_placement_policy().call_choose(&mut store, request, domains.wire()).await
            }
            Pre::Legacy(pre) => {
                let (request, candidates) = legacy::expand(request, domains);
                let instance = pre.instantiate_async(&mut store).await.map_err(|e| classify_instantiate(&store, e))?;
                let answer = instance.banlieue_placement_policy().call_choose(&mut store, &request, &candidates).await;
                match answer {
                    Ok(Ok(d)) => Ok(Ok(legacy::decision(d, domains)?)),
                    Ok(Err(e)) => Ok(Err(e)),
                    Err(e) => Err(e),
                }
            }
        };
        let decision = match decision {
            Ok(Ok(d)) => d,
            Ok(Err(e)) => return Err(CallError::Guest(e.into())),
            Err(e) => return Err(classify(&store, e)),
        };
        if domains.get(decision.candidate).is_none() {
            return Err(InvalidDecision::OutOfRange { index: decision.candidate, candidates: domains.len() }.into());
        }
        Ok(decision)
    }

    /// The contract version the component reports about itself.
    pub async fn contract_version(&self) -> Result<String, CallError> {
        let mut store = new_store(&self.rt, Contract::Placement, Limits::default(), Grants::default());
        match &self.pre {
            Pre::Current(pre) => {
                let instance = pre.instantiate_async(&mut store).await.map_err(|e| classify_instantiate(&store, e))?;
                instance.banlieue_placement_policy().call_contract_version(&mut store).await
            }
            Pre::Legacy(pre) => {
                let instance = pre.instantiate_async(&mut store).await.map_err(|e| classify_instantiate(&store, e))?;
                instance.banlieue_placement_policy().call_contract_version(&mut store).await
            }
        }
        .map_err(|e| classify(&store, e))
    }
}

impl bindings::banlieue::placement::types::Host for HostState {}
