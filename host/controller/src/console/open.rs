//! Opening a VM's console for a session: the VM as the cluster holds it, the Machine
//! realising it, its Provider's driver saying where the console is, and the host opening it
//! under the Provider's grant. Why one is not opened is a [`Failure`] the caller is told.

use banlieue_api::common::PowerState;
use banlieue_api::VirtualMachine;
use banlieue_runtime::capability::console::{self as capability, ConsoleStream};
use banlieue_runtime::provider::ConsoleKind;
use banlieue_runtime::{CallError, Feature};
use kube::api::Api;
use kube::ResourceExt;

use super::access::Console;
use crate::failure::{Failure, api_failure};
use crate::status::reasons::Reason;
use crate::Context;

/// A console opened for one session.
pub struct Opened {
    pub stream: ConsoleStream,
    pub vm: VirtualMachine,
    /// The Machine it was opened on: a VM realised by another one has moved.
    pub machine: String,
    pub provider: String,
}

/// Open `console` of VM `namespace/name`.
pub async fn open(ctx: &Context, namespace: &str, name: &str, console: Console) -> Result<Opened, Failure> {
    let vm = Api::<VirtualMachine>::namespaced(ctx.client.clone(), namespace)
        .get_opt(name)
        .await
        .map_err(|e| api_failure(&e))?
        .filter(|vm| ctx.options.installation.owns(&vm.metadata))
        .ok_or_else(|| Failure::until_changed(Reason::VMNotFound, format!("VirtualMachine {namespace}/{name} not found")))?;
    if vm.metadata.deletion_timestamp.is_some() {
        return Err(Failure::until_changed(Reason::Deleting, format!("VirtualMachine {namespace}/{name} is being deleted")));
    }
    let on = crate::controllers::machine::realising(ctx, &vm)
        .await?
        .ok_or_else(|| Failure::until_changed(Reason::VMNotPlaced, format!("VirtualMachine {namespace}/{name} is not on a backend yet (no Machine made for it)")))?;
    let power = vm.status.as_ref().and_then(|s| s.observed_power_state);
    if power != Some(PowerState::PoweredOn) {
        let state = power.map_or_else(|| "not known yet".to_string(), |p| format!("{p:?}"));
        return Err(Failure::until_changed(Reason::PoweredOff, format!("VirtualMachine {namespace}/{name} is not running (its power state is {state}): start it with `kubectl vm start {name}`")));
    }
    let provider = Api::<banlieue_api::Provider>::namespaced(ctx.client.clone(), namespace)
        .get_opt(&on.provider)
        .await
        .map_err(|e| api_failure(&e))?
        .ok_or_else(|| Failure::transient(Reason::ProviderNotFound, format!("Provider {:?} not found in namespace {namespace}", on.provider)))?;
    let object = crate::key(&vm);
    let backend = crate::sandbox::grants::backend(ctx, &provider, &object).await?;
    let kind = kind_of(console);
    let unsupported = |e: CallError| Failure::from(e).context(format_args!("Provider {} (class {})", on.provider, backend.class));
    backend.driver.component.offers(Feature::of_console(kind), backend.driver.limits, backend.grants.clone()).await.map_err(unsupported)?;
    let access = backend
        .drive(ctx, "console", backend.driver.component.console(&backend.config, &on.machine_ref(), kind, backend.driver.limits, backend.grants.clone()))
        .await
        .map_err(|e| Failure::from(e).context(format_args!("finding the {} of {object} on Provider {}", what(console), on.provider)))?;
    let stream = capability::open(&access, kind, &backend.grants)
        .await
        .map_err(|e| Failure::from(CallError::Guest(e.into())).context(format_args!("opening the {} of {object} on Provider {}", what(console), on.provider)))?;
    Ok(Opened { stream, machine: on.machine.name_any(), provider: on.provider, vm })
}

/// The contract's name for a console.
pub fn kind_of(console: Console) -> ConsoleKind {
    match console {
        Console::Serial => ConsoleKind::Serial,
        Console::Vnc => ConsoleKind::Vnc,
    }
}

/// A console, in words.
pub fn what(console: Console) -> &'static str {
    match console {
        Console::Serial => "serial console",
        Console::Vnc => "graphical console",
    }
}
