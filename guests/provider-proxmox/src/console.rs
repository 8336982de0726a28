//! Where a VM's console is on Proxmox VE: a fresh `termproxy` (serial) or `vncproxy`
//! (display) ticket, and the `vncwebsocket` on the Provider's endpoint that carries it. The
//! host opens the websocket and pumps the bytes; the driver only asks for the ticket.

use banlieue_sdk::provider::{ConsoleAccess, ConsoleFraming, ConsoleKind, PowerState, ProviderConfig, Result, WebsocketConsole};
use banlieue_sdk::Error;
use serde_json::Value;

use crate::pve::Pve;
use crate::{Vm, api};

/// The serial port `termproxy` opens (banlieue's VMs get it as a socket).
const SERIAL_PORT: &str = "serial0";

/// A ticket for VM `vm`'s console of `kind`, and the websocket that carries it.
pub(crate) fn open(config: &ProviderConfig, pve: &Pve, vm: &Vm, kind: ConsoleKind) -> Result<ConsoleAccess> {
    let st = pve.get(&format!("{}/status/current", vm.path()))?;
    if crate::power_state_of(&st) != PowerState::PoweredOn {
        return Err(Error::InvalidSpec(format!("VM {} is not running: its console opens while it runs", vm.vmid)));
    }
    let (answer, framing) = match kind {
        ConsoleKind::Serial => {
            let cfg = pve.get(&format!("{}/config", vm.path()))?;
            if cfg.get(SERIAL_PORT).is_none() {
                return Err(Error::InvalidSpec(format!("VM {} has no serial port ({SERIAL_PORT}): add `{SERIAL_PORT}: socket` to its configuration", vm.vmid)));
            }
            let params = [("serial".to_string(), SERIAL_PORT.to_string())];
            (pve.request("POST", &format!("{}/termproxy", vm.path()), &params)?, ConsoleFraming::PveTerm)
        }
        ConsoleKind::Vnc => {
            // A generated password: VNC authentication reads only 8 bytes of a password, and
            // the ticket's first 8 are the same for every ticket.
            let params = [("websocket".to_string(), "1".to_string()), ("generate-password".to_string(), "1".to_string())];
            (pve.request("POST", &format!("{}/vncproxy", vm.path()), &params)?, ConsoleFraming::Raw)
        }
    };
    let ticket = Ticket::of(&answer, vm)?;
    let mut headers = pve.auth_headers()?;
    // pveproxy takes a console websocket only with a subprotocol.
    headers.push(("sec-websocket-protocol".into(), "binary".into()));
    Ok(ConsoleAccess::Websocket(WebsocketConsole {
        url: format!(
            "{}/nodes/{}/qemu/{}/vncwebsocket?port={}&vncticket={}",
            api::api_base(&config.endpoint),
            api::encode(&vm.node),
            vm.vmid,
            ticket.port,
            api::encode(&ticket.ticket)
        ),
        headers,
        hello: (kind == ConsoleKind::Serial).then(|| format!("{}:{}\n", ticket.user, ticket.ticket)),
        framing,
        vnc_password: (kind == ConsoleKind::Vnc).then(|| ticket.password.unwrap_or(ticket.ticket)),
    }))
}

/// What `termproxy` / `vncproxy` answer.
struct Ticket {
    port: u64,
    ticket: String,
    user: String,
    password: Option<String>,
}

impl Ticket {
    fn of(answer: &Value, vm: &Vm) -> Result<Ticket> {
        let port = api::num(answer.get("port")).ok_or_else(|| Error::Internal(format!("the console ticket of VM {} names no port", vm.vmid)))?;
        let ticket = api::text(answer, "ticket").to_string();
        let user = api::text(answer, "user").to_string();
        if ticket.is_empty() || user.is_empty() || ticket.contains('\n') || user.contains(['\n', ':']) {
            return Err(Error::Internal(format!("the console ticket of VM {} has no usable ticket or user", vm.vmid)));
        }
        let password = Some(api::text(answer, "password").to_string()).filter(|p| !p.is_empty());
        Ok(Ticket { port, ticket, user, password })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_ticket_takes_its_port_as_a_number_or_a_string_and_refuses_a_line_break() {
        let vm = Vm { node: "pve".into(), vmid: 100, lock: String::new(), tagged: true };
        let t = Ticket::of(&json!({"port": "5900", "ticket": "PVEVNC:AB", "user": "root@pam"}), &vm).unwrap();
        assert_eq!((t.port, t.ticket.as_str(), t.user.as_str(), t.password), (5900, "PVEVNC:AB", "root@pam", None));
        let t = Ticket::of(&json!({"port": 5901, "ticket": "T", "user": "u@pve", "password": "x1y2z3w4"}), &vm).unwrap();
        assert_eq!((t.port, t.password.as_deref()), (5901, Some("x1y2z3w4")));
        assert!(Ticket::of(&json!({"port": 5900, "ticket": "a\nb", "user": "u@pve"}), &vm).is_err());
        assert!(Ticket::of(&json!({"ticket": "T", "user": "u@pve"}), &vm).is_err());
    }
}
