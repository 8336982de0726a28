//! A machine's console, opened by the host where its driver said it is, inside the
//! Provider's grant: a libvirt domain on the granted connection, or a websocket on the
//! granted endpoint (checked by [`HttpGrant::websocket`](super::http::HttpGrant::websocket),
//! the same choke point as every request). The bytes are pumped here, never through the
//! component. A display behind a one-time VNC password is logged in to here ([`rfb`]).

use futures::{SinkExt, StreamExt};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::mpsc;
use tokio_tungstenite::WebSocketStream;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::tungstenite::protocol::Role;

use super::{Grants, WitError};
use crate::provider::{ConsoleAccess, ConsoleFraming, ConsoleKind, WebsocketConsole};

mod rfb;

/// Bytes queued each way before a pump waits for the other side.
const QUEUE: usize = 64;
/// The most one read hands on.
const CHUNK: usize = 16 * 1024;
/// How often a Proxmox VE terminal is pinged.
const PVE_TERM_PING: std::time::Duration = std::time::Duration::from_secs(30);

/// An open console: bytes for the machine go into `input`, what it sends comes out of
/// `output`. Dropping `input` closes it; `output` ends when the backend's side closes.
pub struct ConsoleStream {
    pub input: mpsc::Sender<Vec<u8>>,
    pub output: mpsc::Receiver<Vec<u8>>,
}

/// Open `kind` of a machine at `access` (its driver's answer) with the Provider's `grants`.
pub async fn open(access: &ConsoleAccess, kind: ConsoleKind, grants: &Grants) -> Result<ConsoleStream, WitError> {
    match access {
        ConsoleAccess::LibvirtDomain(domain) => {
            let libvirt = grants.libvirt.as_ref().ok_or_else(|| WitError::Denied("this Provider has no libvirt connection to open a console on".into()))?;
            match kind {
                ConsoleKind::Serial => {
                    let c = libvirt.conn.open_console(domain).await.map_err(super::libvirt::err)?;
                    Ok(ConsoleStream { input: c.input, output: c.output })
                }
                ConsoleKind::Vnc => {
                    let socket = libvirt.conn.open_display(domain).await.map_err(super::libvirt::err)?;
                    socket.set_nonblocking(true).map_err(|e| WitError::Internal(format!("the display's socket: {e}")))?;
                    let socket = tokio::net::UnixStream::from_std(socket).map_err(|e| WitError::Internal(format!("the display's socket: {e}")))?;
                    Ok(pump_socket(socket))
                }
            }
        }
        ConsoleAccess::Websocket(ws) => {
            let http = grants.http.as_ref().ok_or_else(|| WitError::Denied("this Provider has no endpoint to open a console on".into()))?;
            let upgraded = http.websocket(&ws.url, &ws.headers).await?;
            let socket = WebSocketStream::from_raw_socket(upgraded, Role::Client, None).await;
            let stream = pump_websocket(socket, ws).await?;
            match (&ws.vnc_password, kind) {
                (Some(password), ConsoleKind::Vnc) => rfb::behind_password(stream, password).await,
                _ => Ok(stream),
            }
        }
    }
}

/// Pump a socket (a display's) both ways.
fn pump_socket<S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Send + 'static>(socket: S) -> ConsoleStream {
    let (input, mut from_user) = mpsc::channel::<Vec<u8>>(QUEUE);
    let (to_user, output) = mpsc::channel::<Vec<u8>>(QUEUE);
    let (mut rd, mut wr) = tokio::io::split(socket);
    tokio::spawn(async move {
        let mut buf = vec![0u8; CHUNK];
        while let Ok(n) = rd.read(&mut buf).await {
            if n == 0 || to_user.send(buf[..n].to_vec()).await.is_err() {
                break;
            }
        }
    });
    tokio::spawn(async move {
        while let Some(bytes) = from_user.recv().await {
            if wr.write_all(&bytes).await.is_err() {
                break;
            }
        }
        let _ = wr.shutdown().await;
    });
    ConsoleStream { input, output }
}

/// Pump a backend's console websocket both ways, framed as it says.
async fn pump_websocket<S>(mut socket: WebSocketStream<S>, ws: &WebsocketConsole) -> Result<ConsoleStream, WitError>
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let closed = |e| WitError::Unavailable(format!("the console websocket: {e}"));
    if let Some(hello) = &ws.hello {
        socket.send(Message::text(hello.as_str())).await.map_err(closed)?;
    }
    let framing = ws.framing;
    let (mut sink, mut stream) = socket.split();
    let (input, mut from_user) = mpsc::channel::<Vec<u8>>(QUEUE);
    let (to_user, output) = mpsc::channel::<Vec<u8>>(QUEUE);
    tokio::spawn(async move {
        // termproxy answers the login line with `OK` before the terminal's output.
        let mut greeting = framing == ConsoleFraming::PveTerm;
        while let Some(Ok(message)) = stream.next().await {
            let mut bytes = match message {
                Message::Binary(b) => b.to_vec(),
                Message::Text(t) => t.as_bytes().to_vec(),
                Message::Close(_) => break,
                _ => continue,
            };
            if std::mem::take(&mut greeting) && bytes.starts_with(b"OK") {
                bytes.drain(..2);
            }
            if !bytes.is_empty() && to_user.send(bytes).await.is_err() {
                break;
            }
        }
    });
    tokio::spawn(async move {
        // termproxy ends a terminal idle for five minutes; PVE's own page pings it every 30 s.
        let mut ping = tokio::time::interval(PVE_TERM_PING);
        ping.tick().await;
        loop {
            let message = tokio::select! {
                bytes = from_user.recv() => match bytes {
                    Some(bytes) => frame(framing, bytes),
                    None => break,
                },
                _ = ping.tick(), if framing == ConsoleFraming::PveTerm => Message::text("2"),
            };
            if sink.send(message).await.is_err() {
                break;
            }
        }
        let _ = sink.close().await;
    });
    Ok(ConsoleStream { input, output })
}

/// One message of the user's bytes, as the backend's console takes them.
fn frame(framing: ConsoleFraming, bytes: Vec<u8>) -> Message {
    match framing {
        ConsoleFraming::Raw => Message::binary(bytes),
        // A text message, as PVE's own terminal sends it (termproxy reads input from text
        // frames); bytes that are not UTF-8 (a character split across reads) go as binary.
        ConsoleFraming::PveTerm => {
            let mut framed = format!("0:{}:", bytes.len()).into_bytes();
            framed.extend_from_slice(&bytes);
            match String::from_utf8(framed) {
                Ok(text) => Message::text(text),
                Err(e) => Message::binary(e.into_bytes()),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn termproxy_input_is_framed_with_its_byte_length_as_text() {
        let Message::Text(m) = frame(ConsoleFraming::PveTerm, "é\n".as_bytes().to_vec()) else { panic!("not text") };
        assert_eq!(m.as_str(), "0:3:é\n");
        let Message::Binary(m) = frame(ConsoleFraming::PveTerm, vec![0xc3]) else { panic!("not binary") };
        assert_eq!(&m[..], b"0:1:\xc3");
        let Message::Binary(m) = frame(ConsoleFraming::Raw, b"RFB".to_vec()) else { panic!("not binary") };
        assert_eq!(&m[..], b"RFB");
    }
}
