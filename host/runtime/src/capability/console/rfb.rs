//! A display behind a one-time VNC password (Proxmox VE's `vncproxy`): the host answers the
//! display's VNC authentication itself, then hands the user a display that asks for none —
//! the user was authorized by the cluster, and the password never leaves the host.
//!
//! RFB 3.8 (RFC 6143 §7.1–7.2): each side sends its version; the server lists its security
//! types, the client picks one; for VNC authentication (type 2) the client answers a
//! 16-byte challenge encrypted with DES under the password (its first 8 bytes, each byte's
//! bits reversed); the server says whether it passed. What follows (ClientInit onwards) is
//! passed through untouched.

use std::time::Duration;

use des::Des;
use des::cipher::{Array, BlockCipherEncrypt, KeyInit};
use tokio::sync::mpsc;

use super::{CHUNK, ConsoleStream, QUEUE};
use crate::capability::WitError;

const VERSION: &[u8; 12] = b"RFB 003.008\n";
const NONE: u8 = 1;
const VNC_AUTH: u8 = 2;
/// How long the display's handshake may take.
const HANDSHAKE: Duration = Duration::from_secs(30);

/// Log in to the display at `backend` with `password`, and return a display for the user
/// that offers security type None.
pub async fn behind_password(backend: ConsoleStream, password: &str) -> Result<ConsoleStream, WitError> {
    let ConsoleStream { input: to_backend, output } = backend;
    let mut from_backend = Bytes::new(output);
    tokio::time::timeout(HANDSHAKE, login(&to_backend, &mut from_backend, password))
        .await
        .map_err(|_| WitError::Unavailable(format!("the display did not finish its VNC handshake within {HANDSHAKE:?}")))??;
    let (input, from_user) = mpsc::channel::<Vec<u8>>(QUEUE);
    let (to_user, output) = mpsc::channel::<Vec<u8>>(QUEUE);
    tokio::spawn(async move {
        let mut from_user = Bytes::new(from_user);
        if greet(&to_user, &mut from_user).await.is_none() {
            return;
        }
        // The user's ClientInit and all after it go to the display as they come.
        let early = from_user.rest();
        if !early.is_empty() && to_backend.send(early).await.is_err() {
            return;
        }
        let (mut from_user, mut from_backend) = (from_user.rx, from_backend);
        let held = from_backend.rest();
        if !held.is_empty() && to_user.send(held).await.is_err() {
            return;
        }
        let mut from_backend = from_backend.rx;
        loop {
            tokio::select! {
                bytes = from_user.recv() => {
                    let Some(b) = bytes else { break };
                    if to_backend.send(b).await.is_err() {
                        break;
                    }
                }
                bytes = from_backend.recv() => {
                    let Some(b) = bytes else { break };
                    if to_user.send(b).await.is_err() {
                        break;
                    }
                }
            }
        }
    });
    Ok(ConsoleStream { input, output })
}

/// The client's side of the handshake with the display, up to a passed authentication.
async fn login(to: &mpsc::Sender<Vec<u8>>, from: &mut Bytes, password: &str) -> Result<(), WitError> {
    let closed = || WitError::Unavailable("the display closed during its VNC handshake".into());
    let version = from.take(12).await.ok_or_else(closed)?;
    if !version.starts_with(b"RFB 003.") {
        return Err(WitError::Unavailable(format!("the display does not speak RFB (it began {:?})", String::from_utf8_lossy(&version))));
    }
    to.send(VERSION.to_vec()).await.map_err(|_| closed())?;
    let count = from.take(1).await.ok_or_else(closed)?[0];
    if count == 0 {
        let reason = failure_reason(from).await.unwrap_or_default();
        return Err(WitError::Unavailable(format!("the display refused the connection: {reason}")));
    }
    let types = from.take(count as usize).await.ok_or_else(closed)?;
    if types.contains(&VNC_AUTH) {
        to.send(vec![VNC_AUTH]).await.map_err(|_| closed())?;
        let challenge = from.take(16).await.ok_or_else(closed)?;
        to.send(answer(password, &challenge)).await.map_err(|_| closed())?;
    } else if types.contains(&NONE) {
        to.send(vec![NONE]).await.map_err(|_| closed())?;
    } else {
        return Err(WitError::Unavailable(format!("the display offers no security type the host speaks (it offers {types:?})")));
    }
    let result = from.take(4).await.ok_or_else(closed)?;
    if result != [0, 0, 0, 0] {
        let reason = failure_reason(from).await.unwrap_or_default();
        return Err(WitError::Denied(format!("the display refused the console's one-time password: {reason}")));
    }
    Ok(())
}

/// The server's side towards the user: version, one security type (None), passed.
async fn greet(to: &mpsc::Sender<Vec<u8>>, from: &mut Bytes) -> Option<()> {
    to.send(VERSION.to_vec()).await.ok()?;
    from.take(12).await?;
    to.send(vec![1, NONE]).await.ok()?;
    from.take(1).await?;
    to.send(vec![0, 0, 0, 0]).await.ok()
}

/// A failure's reason string (a 4-byte length, then the text).
async fn failure_reason(from: &mut Bytes) -> Option<String> {
    let len = from.take(4).await?;
    let len = u32::from_be_bytes([len[0], len[1], len[2], len[3]]).min(4096) as usize;
    Some(String::from_utf8_lossy(&from.take(len).await?).into_owned())
}

/// VNC authentication's answer: the challenge encrypted, block by block, with DES under the
/// password's first 8 bytes, each byte's bits reversed (as VNC has always done it).
fn answer(password: &str, challenge: &[u8]) -> Vec<u8> {
    let mut key = [0u8; 8];
    for (k, b) in key.iter_mut().zip(password.as_bytes()) {
        *k = b.reverse_bits();
    }
    let cipher = Des::new(&Array::from(key));
    let mut out = Vec::with_capacity(16);
    for block in challenge.chunks(8) {
        let mut b = [0u8; 8];
        b[..block.len()].copy_from_slice(block);
        let mut b = Array::from(b);
        cipher.encrypt_block(&mut b);
        out.extend_from_slice(&b);
    }
    out
}

/// A stream of chunks read as bytes: exactly `n` at a time, and what is left over.
struct Bytes {
    rx: mpsc::Receiver<Vec<u8>>,
    held: Vec<u8>,
}

impl Bytes {
    fn new(rx: mpsc::Receiver<Vec<u8>>) -> Bytes {
        Bytes { rx, held: Vec::with_capacity(CHUNK) }
    }

    /// The next `n` bytes; `None` when the stream ends first.
    async fn take(&mut self, n: usize) -> Option<Vec<u8>> {
        while self.held.len() < n {
            self.held.extend(self.rx.recv().await?);
        }
        Some(self.held.drain(..n).collect())
    }

    /// What was received and not taken yet.
    fn rest(&mut self) -> Vec<u8> {
        std::mem::take(&mut self.held)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_answer_is_des_under_the_bit_reversed_password() {
        // The VNC password "password" and an all-zero challenge, as libvncserver's
        // vncEncryptBytes computes it.
        let got = answer("password", &[0u8; 16]);
        let key: Vec<u8> = b"password".iter().map(|b| b.reverse_bits()).collect();
        let cipher = Des::new(&Array::try_from(&key[..]).unwrap());
        let mut block = Array::from([0u8; 8]);
        cipher.encrypt_block(&mut block);
        assert_eq!(&got[..8], &block[..]);
        assert_eq!(&got[8..], &block[..], "each 8-byte block alone (ECB)");
        assert_ne!(answer("passwore", &[0u8; 16]), got);
        // Only 8 bytes of a password count.
        assert_eq!(answer("password-and-more", &[0u8; 16]), got);
    }

    #[tokio::test]
    async fn the_host_logs_in_and_the_user_gets_a_display_without_a_password() {
        let (to_host, mut display_in) = mpsc::channel::<Vec<u8>>(16);
        let (display_out, from_display) = mpsc::channel::<Vec<u8>>(16);
        // The display: version, VNC auth, a challenge; checks the answer; then ServerInit bytes.
        let display = tokio::spawn(async move {
            display_out.send(b"RFB 003.008\n".to_vec()).await.unwrap();
            let mut got = Vec::new();
            while got.len() < 12 {
                got.extend(display_in.recv().await.unwrap());
            }
            display_out.send(vec![1, VNC_AUTH]).await.unwrap();
            display_in.recv().await.unwrap();
            // The challenge split across two chunks, as a websocket may deliver it.
            display_out.send(vec![7u8; 10]).await.unwrap();
            display_out.send(vec![7u8; 6]).await.unwrap();
            let reply = display_in.recv().await.unwrap();
            assert_eq!(reply, answer("s3cret!x", &[7u8; 16]));
            display_out.send(vec![0, 0, 0, 0]).await.unwrap();
            let client_init = display_in.recv().await.unwrap();
            assert_eq!(client_init, vec![1], "the user's ClientInit is passed on");
            display_out.send(b"server-init".to_vec()).await.unwrap();
        });
        let user = behind_password(ConsoleStream { input: to_host, output: from_display }, "s3cret!x").await.unwrap();
        let ConsoleStream { input, output } = user;
        let mut from = Bytes::new(output);
        assert_eq!(from.take(12).await.unwrap(), VERSION.to_vec());
        input.send(VERSION.to_vec()).await.unwrap();
        assert_eq!(from.take(2).await.unwrap(), vec![1, NONE], "the user is offered None alone");
        input.send(vec![NONE]).await.unwrap();
        assert_eq!(from.take(4).await.unwrap(), vec![0, 0, 0, 0]);
        input.send(vec![1]).await.unwrap();
        assert_eq!(from.take(11).await.unwrap(), b"server-init".to_vec());
        display.await.unwrap();
    }

    #[tokio::test]
    async fn a_wrong_password_is_refused_with_the_displays_reason() {
        let (to_host, _display_in) = mpsc::channel::<Vec<u8>>(16);
        let (display_out, from_display) = mpsc::channel::<Vec<u8>>(16);
        for chunk in [b"RFB 003.008\n".to_vec(), vec![1, VNC_AUTH], vec![0u8; 16], vec![0, 0, 0, 1], 6u32.to_be_bytes().to_vec(), b"denied".to_vec()] {
            display_out.send(chunk).await.unwrap();
        }
        let Err(e) = behind_password(ConsoleStream { input: to_host, output: from_display }, "wrong").await else { panic!("logged in") };
        assert!(matches!(&e, WitError::Denied(m) if m.contains("denied")), "{e:?}");
    }
}
