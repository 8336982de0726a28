//! A domain's consoles, opened on the connection for a user's session: the serial console as
//! a libvirt stream (`virDomainOpenConsole`), the display as a socket to its VNC server
//! (`virDomainOpenGraphicsFD`, so the display needs no listening port at all).

use std::os::fd::FromRawFd;

use tokio::sync::mpsc;
use virt::domain::Domain;
use virt::stream::Stream;

use crate::connection::{Libvirt, check_c_string};
use crate::error::Result;

/// Bytes queued each way before the pump waits for the other side.
const QUEUE: usize = 64;
/// The most one read from the console hands on.
const CHUNK: usize = 16 * 1024;

/// An open serial console: bytes for the guest go into `input`, what it prints comes out
/// of `output`. Dropping `input` closes the console; `output` ends when the domain's side
/// closes (the domain stopped, the connection died, another session forced it away).
pub struct SerialConsole {
    pub input: mpsc::Sender<Vec<u8>>,
    pub output: mpsc::Receiver<Vec<u8>>,
}

impl Libvirt {
    /// Open the first serial console of domain `domain`. libvirt allows one session per
    /// console: while another is open this is refused (`Invalid`), never taken over.
    pub async fn open_console(&self, domain: &str) -> Result<SerialConsole> {
        check_c_string("domain name", domain)?;
        let name = domain.to_string();
        // Its own connection: a stream's blocking read (and its abort as the session ends)
        // on the shared one held up every other call on it — a display opened right after a
        // serial console closed waited out its timeout. The threads keep it open.
        let (stream, conn) = self
            .run_alone("open-console", move |c| {
                let d = Domain::lookup_by_name(c, &name)?;
                let stream = Stream::new(c, 0)?;
                d.open_console(None, &stream, 0)?;
                Ok(stream)
            })
            .await?;
        let kept = conn.clone();
        let (input, mut from_user) = mpsc::channel::<Vec<u8>>(QUEUE);
        let (to_user, output) = mpsc::channel::<Vec<u8>>(QUEUE);
        // A blocking stream read on one thread and written on another: libvirt's client lets a
        // second thread send while the first waits for data. The writer ends the stream when
        // the user's side goes, which wakes the reader.
        let reader = stream.clone();
        std::thread::Builder::new()
            .name("libvirt-console-out".into())
            .spawn(move || {
                let mut buf = vec![0u8; CHUNK];
                while let Ok(n) = reader.recv(&mut buf) {
                    if n == 0 || to_user.blocking_send(buf[..n].to_vec()).is_err() {
                        break;
                    }
                }
                let _ = reader.abort();
                drop(kept);
            })
            .map_err(|e| crate::LibvirtError::Internal(format!("starting the console reader: {e}")))?;
        std::thread::Builder::new()
            .name("libvirt-console-in".into())
            .spawn(move || {
                while let Some(bytes) = from_user.blocking_recv() {
                    if stream.send(&bytes).is_err() {
                        break;
                    }
                }
                let _ = stream.abort();
                drop(conn);
            })
            .map_err(|e| crate::LibvirtError::Internal(format!("starting the console writer: {e}")))?;
        Ok(SerialConsole { input, output })
    }

    /// A socket connected to domain `domain`'s first graphical display (its VNC server),
    /// past the display's own authentication: who may use it was decided before this call.
    /// Works on connections that can pass a file descriptor (a local or `+unix` URI).
    pub async fn open_display(&self, domain: &str) -> Result<std::os::unix::net::UnixStream> {
        check_c_string("domain name", domain)?;
        let name = domain.to_string();
        let fd = self
            .run("open-display", move |c| {
                let d = Domain::lookup_by_name(c, &name)?;
                d.open_graphics_fd(0, virt::sys::VIR_DOMAIN_OPEN_GRAPHICS_SKIPAUTH)
            })
            .await?;
        // SAFETY: libvirt hands us a new descriptor we alone own.
        Ok(unsafe { std::os::unix::net::UnixStream::from_raw_fd(fd as i32) })
    }
}
