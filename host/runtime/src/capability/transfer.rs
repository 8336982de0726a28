//! `banlieue:host/transfer`: image bytes from the host's image cache to the backend,
//! streamed by the host — they never pass through the component. The grant is the one
//! image of the current `import-image` call, an open file of the cache; without it every
//! call is `denied` ([`HostState::transfer`] is the choke point). The target is checked
//! by the capability that owns it: a libvirt volume only on the granted connection, an
//! HTTP upload only to a URL the http grant allows (its one choke point, [`HttpGrant::check`]).
//!
//! [`HttpGrant::check`]: super::http::HttpGrant::check

use std::os::unix::fs::FileExt;
use std::sync::Arc;

use super::bindings::banlieue::host::transfer as wit;
use super::WitError;
use crate::state::HostState;

/// The image a component may send, for one call.
#[derive(Clone)]
pub struct TransferGrant {
    /// Opened by the host in its cache; read at offsets, so clones share no position.
    pub file: Arc<std::fs::File>,
    /// `sha256:<hex>` of the downloaded image.
    pub digest: String,
    /// `qcow2`, `raw` or `vmdk`.
    pub format: String,
    pub size: u64,
    pub virtual_size: u64,
}

impl std::fmt::Debug for TransferGrant {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TransferGrant").field("digest", &self.digest).field("format", &self.format).field("size", &self.size).finish()
    }
}

/// Reads the granted file from the start, whatever else reads it.
struct FromStart {
    file: Arc<std::fs::File>,
    pos: u64,
}

impl std::io::Read for FromStart {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = self.file.read_at(buf, self.pos)?;
        self.pos += n as u64;
        Ok(n)
    }
}

/// The file from the start as an HTTP body: 256 KiB positional reads, off the async threads.
fn body_of(file: Arc<std::fs::File>, len: u64) -> reqwest::Body {
    const CHUNK: u64 = 256 << 10;
    let chunks = futures::stream::try_unfold(0u64, move |pos| {
        let file = file.clone();
        async move {
            if pos >= len {
                return Ok(None);
            }
            let want = CHUNK.min(len - pos) as usize;
            let buf = tokio::task::spawn_blocking(move || {
                let mut buf = vec![0u8; want];
                let n = file.read_at(&mut buf, pos)?;
                if n == 0 {
                    return Err(std::io::Error::new(std::io::ErrorKind::UnexpectedEof, "the cached image is shorter than its size"));
                }
                buf.truncate(n);
                Ok(buf)
            })
            .await
            .map_err(std::io::Error::other)??;
            let next = pos + buf.len() as u64;
            Ok::<_, std::io::Error>(Some((bytes::Bytes::from(buf), next)))
        }
    });
    reqwest::Body::wrap_stream(chunks)
}

impl HostState {
    fn transfer(&self) -> Result<&TransferGrant, WitError> {
        self.grants.transfer.as_ref().ok_or_else(|| WitError::Denied("no image to transfer: only an import-image call holds one".into()))
    }
}

impl wit::Host for HostState {
    async fn current(&mut self) -> Result<wit::Image, WitError> {
        let g = self.transfer()?;
        Ok(wit::Image { digest: g.digest.clone(), format: g.format.clone(), size: g.size, virtual_size: g.virtual_size })
    }

    async fn to_libvirt_volume(&mut self, pool: String, name: String) -> Result<u64, WitError> {
        let g = self.transfer()?.clone();
        let conn = self.libvirt()?;
        let reader = FromStart { file: g.file.clone(), pos: 0 };
        let sent = conn.volume_upload_from(&pool, &name, reader, g.size).await.map_err(super::libvirt::err)?;
        crate::usage::transferred(sent);
        Ok(sent)
    }

    async fn to_http(&mut self, method: String, url: String, headers: Vec<(String, String)>) -> Result<u16, WitError> {
        let g = self.transfer()?.clone();
        let http = self.grants.http.clone().ok_or_else(|| WitError::Denied("the http capability is not granted to this component".into()))?;
        let status = http.upload(&method, &url, &headers, body_of(g.file.clone(), g.size), g.size).await?;
        if (200..300).contains(&status) {
            crate::usage::transferred(g.size);
        }
        Ok(status)
    }
}
