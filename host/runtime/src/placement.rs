//! Placement components: `choose(request, candidates) -> decision`.
//! A pure call: the component imports only `log`, and the host passes everything
//! it may look at.

use wasmtime::component::HasSelf;

use crate::capability::Grants;
use crate::component::{Contract, LoadedComponent};
use crate::error::CallError;
use crate::limits::Limits;
use crate::state::{classify, classify_instantiate, new_store, HostState};
use crate::Runtime;

mod bindings {
    wasmtime::component::bindgen!({
        path: ["../../wit/host", "../../wit/placement"],
        world: "banlieue:placement/placement",
        imports: { default: async },
        exports: { default: async },
        with: { "banlieue:host": crate::capability::bindings::banlieue::host },
    });
}

pub use bindings::banlieue::placement::types::{
    AntiAffinity, Candidate, Capacity, Decision, PlacedVm, Request, SelectorOp, SelectorRequirement, VmClass,
};

/// A placement policy ready to be called many times.
#[derive(Clone)]
pub struct PlacementPolicy {
    rt: Runtime,
    pre: bindings::PlacementPre<HostState>,
    pub component: LoadedComponent,
}

impl Runtime {
    /// Load a placement component.
    pub fn placement(&self, bytes: &[u8]) -> Result<PlacementPolicy, CallError> {
        let component = self.load(bytes, Contract::Placement)?;
        let mut linker = self.wasi_linker()?;
        bindings::Placement::add_to_linker::<HostState, HasSelf<HostState>>(&mut linker, |s| s)
            .map_err(|e| CallError::Invalid(format!("{e:#}")))?;
        let pre = linker
            .instantiate_pre(&component.component)
            .map_err(|e| CallError::Incompatible(format!("{e:#}")))?;
        let pre = bindings::PlacementPre::new(pre).map_err(|e| CallError::Incompatible(format!("{e:#}")))?;
        Ok(PlacementPolicy { rt: self.clone(), pre, component })
    }
}

impl PlacementPolicy {
    /// Choose a candidate, in a fresh instance with `limits`.
    pub async fn choose(&self, request: &Request, candidates: &[Candidate], limits: Limits, grants: Grants) -> Result<Decision, CallError> {
        let mut store = new_store(&self.rt, Contract::Placement, limits, grants);
        let instance = match self.pre.instantiate_async(&mut store).await {
            Ok(i) => i,
            Err(e) => return Err(classify_instantiate(&store, e)),
        };
        match instance.banlieue_placement_policy().call_choose(&mut store, request, candidates).await {
            Ok(Ok(d)) => Ok(d),
            Ok(Err(e)) => Err(CallError::Guest(e.into())),
            Err(e) => Err(classify(&store, e)),
        }
    }

    /// The contract version the component reports about itself.
    pub async fn contract_version(&self) -> Result<String, CallError> {
        let mut store = new_store(&self.rt, Contract::Placement, Limits::default(), Grants::default());
        let instance = self.pre.instantiate_async(&mut store).await.map_err(|e| classify_instantiate(&store, e))?;
        instance.banlieue_placement_policy().call_contract_version(&mut store).await.map_err(|e| classify(&store, e))
    }
}

impl bindings::banlieue::placement::types::Host for HostState {}
