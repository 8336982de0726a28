//! A VM's graphical console on vSphere: a one-time `webmks` ticket (`AcquireTicket`) and
//! the websocket it opens. The host opens it, and only inside the Provider's grant: a
//! ticket naming an ESXi host other than the Provider's endpoint is refused there. vSphere
//! has no serial console to open (a VM's serial port is a network service of the guest's
//! own), so the driver offers `vnc` alone.

use banlieue_sdk::provider::{ConsoleAccess, ConsoleFraming, ConsoleKind, MachineRef, PowerState, ProviderConfig, Result, WebsocketConsole};
use banlieue_sdk::Error;

use crate::soap::{self, Node};

/// A `webmks` ticket for the VM's display, and where it is served.
pub fn open(config: &ProviderConfig, machine: &MachineRef, kind: ConsoleKind) -> Result<ConsoleAccess> {
    if kind == ConsoleKind::Serial {
        return Err(Error::InvalidSpec(format!("vSphere VM of machine {} has no serial console banlieue can open", machine.name)));
    }
    crate::with_vim(config, |vim| {
        let vm = crate::lookup(vim, machine)?;
        let p = vim.props(&vm, &["name", "runtime.powerState"])?;
        let name = p.str("name").unwrap_or(&vm.value).to_string();
        if crate::power_state(p.str("runtime.powerState")) != PowerState::PoweredOn {
            return Err(Error::InvalidSpec(format!("vSphere VM {name} is not powered on: its console opens while it runs")).into());
        }
        let answer = vim.call(&format!("AcquireTicket(webmks) for VM {name}"), &soap::method("AcquireTicket", &vm, &soap::el("ticketType", "webmks")))?;
        Ok(access(&config.endpoint, answer.child("returnval"), &name)?)
    })
}

/// The websocket of a `VirtualMachineTicket`: `wss://HOST:PORT/ticket/TICKET`, the
/// endpoint's host when the ticket names none, port 443 when it names none.
fn access(endpoint: &str, ticket: Option<&Node>, name: &str) -> Result<ConsoleAccess> {
    let t = ticket.ok_or_else(|| Error::Internal(format!("AcquireTicket for VM {name} returned no ticket")))?;
    let value = t.str_at("ticket").filter(|v| !v.is_empty() && v.chars().all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c)));
    let value = value.ok_or_else(|| Error::Internal(format!("AcquireTicket for VM {name} returned no usable ticket")))?;
    let fallback = endpoint.split("://").nth(1).unwrap_or(endpoint).split(['/', ':']).next().unwrap_or_default();
    let host = t.str_at("host").filter(|h| !h.is_empty()).unwrap_or(fallback);
    let port = t.str_at("port").and_then(|p| p.parse::<u16>().ok()).filter(|p| *p != 0).unwrap_or(443);
    Ok(ConsoleAccess::Websocket(WebsocketConsole {
        url: format!("https://{host}:{port}/ticket/{value}"),
        headers: vec![("sec-websocket-protocol".into(), "binary".into())],
        hello: None,
        framing: ConsoleFraming::Raw,
        vnc_password: None,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(name: &str, children: &[(&str, &str)]) -> Node {
        Node {
            name: name.into(),
            xsi_type: None,
            mo_type: None,
            text: String::new(),
            children: children.iter().map(|(n, t)| Node { name: (*n).into(), xsi_type: None, mo_type: None, text: (*t).into(), children: vec![] }).collect(),
        }
    }

    #[test]
    fn a_webmks_ticket_names_its_host_or_falls_back_to_the_endpoint() {
        let url = |a: ConsoleAccess| match a {
            ConsoleAccess::Websocket(w) => w.url,
            other => panic!("{other:?}"),
        };
        let t = node("returnval", &[("ticket", "52a1-b2"), ("host", "esx1.lab"), ("port", "902")]);
        assert_eq!(url(access("https://vc.lab/sdk", Some(&t), "web").unwrap()), "https://esx1.lab:902/ticket/52a1-b2");
        let t = node("returnval", &[("ticket", "abc")]);
        assert_eq!(url(access("https://vc.lab:8989/sdk", Some(&t), "web").unwrap()), "https://vc.lab:443/ticket/abc");
        assert!(access("https://vc.lab", Some(&node("returnval", &[("ticket", "a/../b")])), "web").is_err(), "a ticket is one path segment");
        assert!(access("https://vc.lab", None, "web").is_err());
    }
}
