//! Talking to the registry (ORAS' `oci-client`): bytes in, bytes out, sizes capped.
//! Nothing here decides what is trusted; callers hash and verify what comes back.

use std::sync::Once;

use futures_util::StreamExt as _;
use oci_client::client::{ClientConfig, ClientProtocol};
use oci_client::errors::{DigestError, OciDistributionError};
use oci_client::manifest::{OCI_IMAGE_MEDIA_TYPE, OciDescriptor};
use oci_client::secrets::RegistryAuth;
use sha2::{Digest as _, Sha256};

use crate::artifact::{Blob, MAX_METADATA_BYTES, sha256_digest};
use crate::auth::Auth;
use crate::error::{Error, Result};
use crate::reference::Reference;

/// A client bound to one repository.
pub(crate) struct Registry {
    client: oci_client::Client,
    auth: RegistryAuth,
    reference: Reference,
}

/// rustls needs a process-wide crypto provider; reqwest is built without one so we pick ring
/// (the workspace's provider). If the embedding binary installed one first, that one stays.
fn install_crypto_provider() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        let _ = rustls::crypto::ring::default_provider().install_default();
    });
}

/// Loopback registries (tests, `banlieue dev`) speak plain HTTP; everything else HTTPS.
pub(crate) fn is_loopback(registry: &str) -> bool {
    let host = match registry.rsplit_once(':') {
        Some((host, port)) if !port.contains(']') => host,
        _ => registry,
    };
    matches!(host, "localhost" | "[::1]")
        || host
            .parse::<std::net::Ipv4Addr>()
            .is_ok_and(|ip| ip.is_loopback())
}

impl Registry {
    pub async fn connect(reference: &Reference, auth: &Auth) -> Result<Registry> {
        install_crypto_provider();
        let registry = reference.registry().to_string();
        let protocol = if is_loopback(&registry) {
            ClientProtocol::HttpsExcept(vec![registry.clone()])
        } else {
            ClientProtocol::Https
        };
        let config = ClientConfig {
            protocol,
            // POST then one PUT with the whole blob: works on docker-registry 2.8, which drops
            // a body sent with POST ...?digest= (oci-client never does that).
            use_monolithic_push: true,
            ..Default::default()
        };
        let client = oci_client::Client::try_from(config).map_err(Error::from)?;
        let auth = RegistryAuth::from(auth);
        client.store_auth_if_needed(&registry, &auth).await;
        Ok(Registry {
            client,
            auth,
            reference: reference.clone(),
        })
    }

    /// Upload a blob unless the registry already has it.
    pub async fn push_blob(&self, blob: &Blob) -> Result<()> {
        let image = self.reference.to_oci();
        if self
            .client
            .blob_exists(&image, &blob.descriptor.digest)
            .await
            .unwrap_or(false)
        {
            return Ok(());
        }
        self.client
            .push_blob(&image, blob.data.clone(), &blob.descriptor.digest)
            .await?;
        Ok(())
    }

    /// PUT manifest bytes at `tag_or_digest`. Returns the digest of the bytes sent.
    pub async fn push_manifest(&self, at: &Reference, manifest: Vec<u8>) -> Result<String> {
        let digest = sha256_digest(&manifest);
        let content_type = OCI_IMAGE_MEDIA_TYPE.parse().expect("static header value");
        self.client
            .push_manifest_raw(&at.to_oci(), manifest, content_type)
            .await?;
        Ok(digest)
    }

    /// GET a manifest. The returned digest is computed from the returned bytes, and
    /// oci-client refuses bytes that do not match a pinned digest or the registry's
    /// `Docker-Content-Digest` header.
    pub async fn fetch_manifest(&self, at: &Reference) -> Result<(Vec<u8>, String)> {
        let (bytes, _) = self
            .client
            .pull_manifest_raw(&at.to_oci(), &self.auth, &[OCI_IMAGE_MEDIA_TYPE])
            .await
            .map_err(|e| match e {
                OciDistributionError::ImageManifestNotFoundError(_) => {
                    Error::NotFound(at.to_string())
                }
                e => Error::from(e),
            })?;
        if bytes.len() as u64 > MAX_METADATA_BYTES {
            return Err(Error::TooLarge {
                what: format!("manifest {at}"),
                size: bytes.len() as u64,
                limit: MAX_METADATA_BYTES,
            });
        }
        let digest = sha256_digest(&bytes);
        if let Some(pinned) = at.digest()
            && pinned != digest
        {
            return Err(Error::DigestMismatch(format!(
                "manifest {at} hashes to {digest}"
            )));
        }
        Ok((bytes.to_vec(), digest))
    }

    /// Like [`Registry::fetch_manifest`], but a missing manifest is `None`.
    pub async fn fetch_manifest_if_exists(
        &self,
        at: &Reference,
    ) -> Result<Option<(Vec<u8>, String)>> {
        match self.fetch_manifest(at).await {
            Ok(found) => Ok(Some(found)),
            Err(Error::NotFound(_)) => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// GET a blob, refusing more than `limit` bytes or anything that does not hash to the
    /// descriptor's digest and size.
    pub async fn fetch_blob(&self, descriptor: &OciDescriptor, limit: u64) -> Result<Vec<u8>> {
        let what = || format!("blob {}", descriptor.digest);
        let expected_size = u64::try_from(descriptor.size)
            .map_err(|_| Error::InvalidArtifact(format!("{} has a negative size", what())))?;
        if expected_size > limit {
            return Err(Error::TooLarge {
                what: what(),
                size: expected_size,
                limit,
            });
        }
        let mut stream = self
            .client
            .pull_blob_stream(&self.reference.to_oci(), descriptor)
            .await?;
        if let Some(length) = stream.content_length
            && length != expected_size
        {
            return Err(Error::DigestMismatch(format!(
                "{} is {length} bytes, its descriptor says {expected_size}",
                what()
            )));
        }
        let mut hasher = Sha256::new();
        let mut data = Vec::with_capacity(expected_size as usize);
        while let Some(chunk) = stream.next().await {
            let chunk = chunk.map_err(|e| stream_error(e, &what()))?;
            if (data.len() + chunk.len()) as u64 > expected_size {
                return Err(Error::DigestMismatch(format!(
                    "{} is longer than its descriptor's {expected_size} bytes",
                    what()
                )));
            }
            hasher.update(&chunk);
            data.extend_from_slice(&chunk);
        }
        if data.len() as u64 != expected_size {
            return Err(Error::DigestMismatch(format!(
                "{} is {} bytes, its descriptor says {expected_size}",
                what(),
                data.len()
            )));
        }
        let actual = format!("sha256:{}", hex::encode(hasher.finalize()));
        if actual != descriptor.digest {
            return Err(Error::DigestMismatch(format!(
                "{} hashes to {actual}",
                what()
            )));
        }
        Ok(data)
    }
}

/// oci-client's verifying stream reports a digest failure as an `io::Error` wrapping a `DigestError`.
fn stream_error(err: std::io::Error, what: &str) -> Error {
    let inner = err.get_ref();
    if inner.is_some_and(|i| {
        i.is::<DigestError>()
            || i.downcast_ref::<OciDistributionError>()
                .is_some_and(|e| matches!(e, OciDistributionError::DigestError(_)))
    }) {
        Error::DigestMismatch(format!("{what}: {err}"))
    } else {
        Error::Registry(format!("reading {what}: {err}"))
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn only_loopback_is_plain_http() {
        for r in [
            "127.0.0.1:5000",
            "localhost:5000",
            "localhost",
            "[::1]:5000",
            "127.1.2.3",
        ] {
            assert!(super::is_loopback(r), "{r}");
        }
        for r in [
            "ghcr.io",
            "127.0.0.1.nip.io:5000",
            "registry.local:5000",
            "10.0.0.1:5000",
        ] {
            assert!(!super::is_loopback(r), "{r}");
        }
    }
}
