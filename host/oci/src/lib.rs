//! Wasm components as signed OCI artifacts.
//!
//! Three steps kept apart, as in Kubewarden's policy-server: the registry client only moves
//! bytes ([`registry`]), the signature module decides whether a manifest digest is trusted
//! ([`signature`]), and [`pull_verified`] hands back the bytes of exactly the manifest whose
//! digest was verified, checked against that manifest's layer digest and size.
//!
//! Artifacts follow the CNCF Wasm OCI artifact layout ([`artifact`]); signatures are
//! cosign-compatible keyed signatures stored at the `sha256-<hex>.sig` tag (no referrers API
//! needed). Public entry points map one-to-one onto `banlieue component keygen|push|sign|verify|inspect`.

pub mod artifact;
mod auth;
mod error;
mod reference;
mod registry;
pub mod signature;

use oci_client::manifest::{OciDescriptor, OciImageManifest};

pub use artifact::{MAX_COMPONENT_BYTES, WasmConfig};
pub use auth::{Auth, auth_from_docker_config};
pub use error::{Error, Result};
pub use reference::Reference;
pub use signature::{keygen, signature_tag};

use registry::Registry;

/// What must hold before a component's bytes are returned.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Policy {
    /// The manifest digest must carry a cosign signature that verifies with one of these
    /// PEM public keys (ECDSA P-256).
    Verify { public_keys: Vec<String> },
    /// Skip signature checks (development only; must be chosen explicitly).
    AllowUnsigned,
}

/// A component whose manifest digest passed the policy, and whose bytes hash to that
/// manifest's layer digest.
#[derive(Clone, PartialEq, Eq)]
pub struct Verified {
    /// Manifest digest (`sha256:…`) that was verified; pin the resource to it.
    pub digest: String,
    /// The component.
    pub bytes: Vec<u8>,
}

impl std::fmt::Debug for Verified {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Verified")
            .field("digest", &self.digest)
            .field("bytes", &self.bytes.len())
            .finish()
    }
}

/// What `banlieue component inspect` shows.
#[derive(Debug, Clone)]
pub struct Inspection {
    /// The reference pinned to the manifest digest.
    pub pinned: Reference,
    /// Manifest digest.
    pub digest: String,
    /// The parsed manifest.
    pub manifest: OciImageManifest,
    /// The Wasm layer's descriptor.
    pub layer: OciDescriptor,
    /// The artifact config, when it is a Wasm config.
    pub config: Option<WasmConfig>,
    /// Signatures stored at the `.sig` tag (counted, not verified).
    pub signatures: usize,
}

/// Push `wasm` (a component) to `reference` as a Wasm OCI artifact. Returns the manifest digest.
///
/// With a tag the manifest is stored at that tag; with a digest only, it is stored by digest
/// and the digest must be the one the artifact hashes to.
pub async fn push(reference: &Reference, wasm: Vec<u8>, auth: &Auth) -> Result<String> {
    let artifact = artifact::build(wasm)?;
    if let Some(pinned) = reference.digest()
        && pinned != artifact.manifest_digest
    {
        return Err(Error::DigestMismatch(format!(
            "{reference} pins {pinned}, but this component's manifest is {}",
            artifact.manifest_digest
        )));
    }
    let registry = Registry::connect(reference, auth).await?;
    registry.push_blob(&artifact.layer).await?;
    registry.push_blob(&artifact.config).await?;
    let target = match reference.tag() {
        Some(tag) => reference.with_tag(tag)?,
        None => reference.clone(),
    };
    registry.push_manifest(&target, artifact.manifest).await
}

/// Sign the artifact `reference` names (a tag is resolved to its digest first) with a cosign
/// encrypted private key. Returns the signature tag (`sha256-<hex>.sig`).
pub async fn sign(
    reference: &Reference,
    encrypted_private_pem: &str,
    password: &[u8],
    auth: &Auth,
) -> Result<String> {
    let registry = Registry::connect(reference, auth).await?;
    let (_, digest) = registry.fetch_manifest(reference).await?;
    signature::sign(
        &registry,
        reference,
        &digest,
        encrypted_private_pem.as_bytes(),
        password,
    )
    .await
}

/// Check that the artifact `reference` names is signed by one of `public_keys`.
/// Returns the manifest digest that was verified.
pub async fn verify<K: AsRef<[u8]>>(
    reference: &Reference,
    public_keys: &[K],
    auth: &Auth,
) -> Result<String> {
    let keys = signature::parse_public_keys(public_keys)?;
    let registry = Registry::connect(reference, auth).await?;
    let (_, digest) = registry.fetch_manifest(reference).await?;
    signature::verify(&registry, reference, &digest, &keys).await?;
    Ok(digest)
}

/// Fetch a component without checking signatures: `(manifest digest, bytes)`.
/// The bytes are still checked against the manifest's layer digest and size.
pub async fn pull(reference: &Reference, auth: &Auth) -> Result<(String, Vec<u8>)> {
    let verified = pull_verified(reference, &Policy::AllowUnsigned, auth).await?;
    Ok((verified.digest, verified.bytes))
}

/// Fetch a component and apply `policy` before returning a byte of it.
///
/// The manifest is fetched once; its digest is computed from the bytes received, that digest
/// is what the signature must cover, and the layer is taken from those same manifest bytes.
/// A tag moved to another digest after signing therefore fails unless the new digest is signed.
pub async fn pull_verified(
    reference: &Reference,
    policy: &Policy,
    auth: &Auth,
) -> Result<Verified> {
    let keys = match policy {
        Policy::Verify { public_keys } => Some(signature::parse_public_keys(public_keys)?),
        Policy::AllowUnsigned => None,
    };
    let registry = Registry::connect(reference, auth).await?;
    let (manifest, digest) = registry.fetch_manifest(reference).await?;
    if let Some(keys) = &keys {
        signature::verify(&registry, reference, &digest, keys).await?;
    }
    let (_, layer) = artifact::wasm_layer(&manifest)?;
    let bytes = registry.fetch_blob(&layer, MAX_COMPONENT_BYTES).await?;
    Ok(Verified { digest, bytes })
}

/// A disk image pushed as a one-layer OCI artifact (by banlieue's image-build exporter).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DiskArtifact {
    /// The reference pinned to the manifest digest.
    pub pinned: Reference,
    /// The layer's digest (`sha256:…`): the disk's checksum.
    pub digest: String,
    pub size: u64,
    pub media_type: String,
    /// Where the registry serves the layer (`GET /v2/<repository>/blobs/<digest>`); plain
    /// http for loopback registries, as [`Registry::connect`] talks to them.
    pub blob_url: String,
}

/// Resolve `reference` to its manifest and the one layer that holds the disk.
pub async fn resolve_disk(reference: &Reference, auth: &Auth) -> Result<DiskArtifact> {
    let registry = Registry::connect(reference, auth).await?;
    let (bytes, digest) = registry.fetch_manifest(reference).await?;
    let manifest: OciImageManifest = serde_json::from_slice(&bytes)
        .map_err(|e| Error::InvalidArtifact(format!("manifest of {reference}: {e}")))?;
    let [layer] = manifest.layers.as_slice() else {
        return Err(Error::InvalidArtifact(format!(
            "{reference} has {} layers; a disk artifact has exactly one",
            manifest.layers.len()
        )));
    };
    let scheme = if registry::is_loopback(reference.registry()) { "http" } else { "https" };
    Ok(DiskArtifact {
        pinned: reference.with_digest(&digest)?,
        digest: layer.digest.clone(),
        size: layer.size.max(0) as u64,
        media_type: layer.media_type.clone(),
        blob_url: format!("{scheme}://{}/v2/{}/blobs/{}", reference.registry(), reference.repository(), layer.digest),
    })
}

/// Describe an artifact: digest, manifest, layer, config and how many signatures it has.
pub async fn inspect(reference: &Reference, auth: &Auth) -> Result<Inspection> {
    let registry = Registry::connect(reference, auth).await?;
    let (manifest_bytes, digest) = registry.fetch_manifest(reference).await?;
    let (manifest, layer) = artifact::wasm_layer(&manifest_bytes)?;
    let config = match registry
        .fetch_blob(&manifest.config, artifact::MAX_METADATA_BYTES)
        .await
    {
        Ok(bytes) => serde_json::from_slice(&bytes).ok(),
        Err(Error::NotFound(_)) => None,
        Err(e) => return Err(e),
    };
    let signatures = signature::count(&registry, reference, &digest).await?;
    Ok(Inspection {
        pinned: reference.with_digest(&digest)?,
        digest,
        manifest,
        layer,
        config,
        signatures,
    })
}
