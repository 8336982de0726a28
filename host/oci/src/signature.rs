//! cosign-compatible keyed signatures ("simple signing" payloads stored at the
//! `sha256-<hex>.sig` tag), using the `sigstore` crate for keys and ECDSA.
//!
//! What a signature binds: the manifest digest and the repository (`REGISTRY/REPO`).
//! A tag is never trusted: it is resolved to a digest first, and that digest must be signed.

use std::collections::BTreeMap;

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use oci_client::manifest::{
    IMAGE_CONFIG_MEDIA_TYPE, OCI_IMAGE_MEDIA_TYPE, OciDescriptor, OciImageManifest,
};
use serde::{Deserialize, Serialize};
use sigstore::crypto::signing_key::SigStoreKeyPair;
use sigstore::crypto::{CosignVerificationKey, Signature, SigningScheme};

use crate::artifact::Blob;
use crate::error::{Error, Result};
use crate::reference::Reference;
use crate::registry::Registry;

/// Layer media type of a cosign simple-signing payload.
pub const SIMPLESIGNING_MEDIA_TYPE: &str = "application/vnd.dev.cosign.simplesigning.v1+json";
/// Layer annotation holding the base64 signature over the payload.
pub const SIGNATURE_ANNOTATION: &str = "dev.cosignproject.cosign/signature";
const SIGNATURE_TYPE: &str = "cosign container image signature";
const SCHEME: SigningScheme = SigningScheme::ECDSA_P256_SHA256_ASN1;
/// Signature payloads are a few hundred bytes; refuse anything silly.
const MAX_PAYLOAD_BYTES: u64 = 64 * 1024;

/// The tag cosign stores signatures of `sha256:<hex>` under: `sha256-<hex>.sig`.
pub fn signature_tag(digest: &str) -> String {
    format!("{}.sig", digest.replacen(':', "-", 1))
}

/// The simple-signing payload (field order as cosign writes it).
#[derive(Debug, Serialize, Deserialize)]
struct SimpleSigning {
    critical: Critical,
    optional: Option<BTreeMap<String, serde_json::Value>>,
}

#[derive(Debug, Serialize, Deserialize)]
struct Critical {
    identity: Identity,
    image: Image,
    #[serde(rename = "type")]
    kind: String,
}

#[derive(Debug, Serialize, Deserialize)]
struct Identity {
    #[serde(rename = "docker-reference")]
    docker_reference: String,
}

#[derive(Debug, Serialize, Deserialize)]
struct Image {
    #[serde(rename = "docker-manifest-digest")]
    docker_manifest_digest: String,
}

fn payload(repository_name: &str, digest: &str) -> Vec<u8> {
    let payload = SimpleSigning {
        critical: Critical {
            identity: Identity {
                docker_reference: repository_name.to_string(),
            },
            image: Image {
                docker_manifest_digest: digest.to_string(),
            },
            kind: SIGNATURE_TYPE.to_string(),
        },
        optional: None,
    };
    serde_json::to_vec(&payload).expect("payload serializes")
}

/// A new ECDSA P-256 key pair: cosign's encrypted private key PEM
/// (`ENCRYPTED SIGSTORE PRIVATE KEY`, scrypt + NaCl secretbox) and the public key PEM.
pub fn keygen(password: &[u8]) -> Result<(String, String)> {
    let keys = SCHEME
        .create_signer()
        .and_then(|signer| signer.to_sigstore_keypair())
        .map_err(|e| Error::Key(format!("generating key: {e}")))?;
    let private = keys
        .private_key_to_encrypted_pem(password)
        .map_err(|e| Error::Key(format!("encrypting private key: {e}")))?;
    let public = keys
        .public_key_to_pem()
        .map_err(|e| Error::Key(format!("encoding public key: {e}")))?;
    Ok((private.to_string(), public))
}

/// Parse trusted public keys (PEM, ECDSA P-256).
pub fn parse_public_keys<K: AsRef<[u8]>>(pems: &[K]) -> Result<Vec<CosignVerificationKey>> {
    if pems.is_empty() {
        return Err(Error::Key("no public keys given to verify with".into()));
    }
    pems.iter()
        .enumerate()
        .map(|(i, pem)| {
            CosignVerificationKey::from_pem(pem.as_ref(), &SCHEME).map_err(|e| {
                Error::Key(format!(
                    "public key #{}: not an ECDSA P-256 PEM public key: {e}",
                    i + 1
                ))
            })
        })
        .collect()
}

/// Sign `digest` of `reference`'s repository and store the signature at its `.sig` tag,
/// keeping signatures already there (as cosign does). Returns the signature tag.
pub(crate) async fn sign(
    registry: &Registry,
    reference: &Reference,
    digest: &str,
    encrypted_private_pem: &[u8],
    password: &[u8],
) -> Result<String> {
    let keys =
        SigStoreKeyPair::from_encrypted_pem(encrypted_private_pem, password).map_err(|e| {
            Error::Key(format!(
                "cannot decrypt the private key (wrong password?): {e}"
            ))
        })?;
    let signer = keys
        .to_sigstore_signer(&SCHEME)
        .map_err(|e| Error::Key(format!("the private key is not ECDSA P-256: {e}")))?;

    let payload = Blob::new(
        SIMPLESIGNING_MEDIA_TYPE,
        payload(&reference.repository_name(), digest),
    );
    let signature = signer
        .sign(&payload.data)
        .map_err(|e| Error::Key(format!("signing: {e}")))?;
    let mut layer = payload.descriptor.clone();
    layer.annotations = Some(BTreeMap::from([(
        SIGNATURE_ANNOTATION.to_string(),
        STANDARD.encode(signature),
    )]));

    let tag = signature_tag(digest);
    let sig_ref = reference.with_tag(&tag)?;
    let mut layers: Vec<OciDescriptor> = match registry.fetch_manifest_if_exists(&sig_ref).await? {
        Some((bytes, _)) => serde_json::from_slice::<OciImageManifest>(&bytes)
            .map(|m| m.layers)
            .map_err(|e| {
                Error::Registry(format!("existing {tag} is not an image manifest: {e}"))
            })?,
        None => Vec::new(),
    };
    // ECDSA signatures are randomized, so a re-sign adds a layer; one per payload+key would need
    // key ids, which cosign does not record either.
    layers.push(layer);

    // Same shape as cosign's signature image config: an OCI config listing the layers.
    let config = serde_json::json!({
        "architecture": "",
        "os": "",
        "config": {},
        "rootfs": { "type": "layers", "diff_ids": layers.iter().map(|l| l.digest.clone()).collect::<Vec<_>>() },
    });
    let config = Blob::new(
        IMAGE_CONFIG_MEDIA_TYPE,
        serde_json::to_vec(&config).expect("config serializes"),
    );
    let manifest = OciImageManifest {
        schema_version: 2,
        media_type: Some(OCI_IMAGE_MEDIA_TYPE.to_string()),
        config: config.descriptor.clone(),
        layers,
        subject: None,
        artifact_type: None,
        annotations: None,
    };

    registry.push_blob(&payload).await?;
    registry.push_blob(&config).await?;
    registry
        .push_manifest(
            &sig_ref,
            serde_json::to_vec(&manifest).expect("manifest serializes"),
        )
        .await?;
    Ok(tag)
}

/// Succeeds when some signature stored for `digest` verifies with one of `keys` and its
/// payload names exactly this digest and this repository.
pub(crate) async fn verify(
    registry: &Registry,
    reference: &Reference,
    digest: &str,
    keys: &[CosignVerificationKey],
) -> Result<()> {
    let unsigned = || Error::Unsigned {
        repository: reference.repository_name(),
        digest: digest.to_string(),
    };
    let sig_ref = reference.with_tag(&signature_tag(digest))?;
    let Some((bytes, _)) = registry.fetch_manifest_if_exists(&sig_ref).await? else {
        return Err(unsigned());
    };
    let manifest: OciImageManifest = serde_json::from_slice(&bytes)
        .map_err(|e| Error::Registry(format!("{sig_ref} is not an image manifest: {e}")))?;

    let candidates: Vec<(&OciDescriptor, &str)> = manifest
        .layers
        .iter()
        .filter(|l| l.media_type == SIMPLESIGNING_MEDIA_TYPE)
        .filter_map(|l| {
            Some((
                l,
                l.annotations.as_ref()?.get(SIGNATURE_ANNOTATION)?.as_str(),
            ))
        })
        .collect();
    if candidates.is_empty() {
        return Err(unsigned());
    }

    let mut claim_mismatch = None;
    for (layer, signature) in &candidates {
        let payload = registry.fetch_blob(layer, MAX_PAYLOAD_BYTES).await?;
        let trusted = keys.iter().any(|key| {
            key.verify_signature(Signature::Base64Encoded(signature.as_bytes()), &payload)
                .is_ok()
        });
        if !trusted {
            continue;
        }
        // The signature is genuine; now it must be about this artifact.
        match check_claims(&payload, &reference.repository_name(), digest) {
            Ok(()) => return Ok(()),
            Err(e) => claim_mismatch = Some(e),
        }
    }
    Err(claim_mismatch.unwrap_or(Error::SignatureMismatch {
        digest: digest.to_string(),
        checked: candidates.len(),
    }))
}

fn check_claims(payload: &[u8], repository_name: &str, digest: &str) -> Result<()> {
    let payload: SimpleSigning = serde_json::from_slice(payload).map_err(|e| {
        Error::DigestMismatch(format!(
            "signed payload is not a simple-signing document: {e}"
        ))
    })?;
    let critical = payload.critical;
    if critical.kind != SIGNATURE_TYPE {
        return Err(Error::DigestMismatch(format!(
            "signed payload has type {:?}",
            critical.kind
        )));
    }
    if critical.image.docker_manifest_digest != digest {
        return Err(Error::DigestMismatch(format!(
            "signature is for {}, not {digest}",
            critical.image.docker_manifest_digest
        )));
    }
    if critical.identity.docker_reference != repository_name {
        return Err(Error::DigestMismatch(format!(
            "signature is for repository {}, not {repository_name}",
            critical.identity.docker_reference
        )));
    }
    Ok(())
}

/// Count of signature layers at the `.sig` tag (not verified; for `inspect`).
pub(crate) async fn count(
    registry: &Registry,
    reference: &Reference,
    digest: &str,
) -> Result<usize> {
    let sig_ref = reference.with_tag(&signature_tag(digest))?;
    Ok(match registry.fetch_manifest_if_exists(&sig_ref).await? {
        Some((bytes, _)) => serde_json::from_slice::<OciImageManifest>(&bytes)
            .map(|m| {
                m.layers
                    .iter()
                    .filter(|l| l.media_type == SIMPLESIGNING_MEDIA_TYPE)
                    .count()
            })
            .unwrap_or(0),
        None => 0,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const D: &str = "sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";

    #[test]
    fn payload_is_cosign_simple_signing() {
        let p = String::from_utf8(payload("127.0.0.1:5000/team/p", D)).unwrap();
        assert_eq!(
            p,
            format!(
                r#"{{"critical":{{"identity":{{"docker-reference":"127.0.0.1:5000/team/p"}},"image":{{"docker-manifest-digest":"{D}"}},"type":"cosign container image signature"}},"optional":null}}"#
            )
        );
        assert_eq!(signature_tag(D), format!("sha256-{}.sig", &D[7..]));
        check_claims(p.as_bytes(), "127.0.0.1:5000/team/p", D).unwrap();
        assert!(matches!(
            check_claims(p.as_bytes(), "127.0.0.1:5000/team/q", D),
            Err(Error::DigestMismatch(_))
        ));
        let other = D.replace("0123", "4567");
        assert!(matches!(
            check_claims(p.as_bytes(), "127.0.0.1:5000/team/p", &other),
            Err(Error::DigestMismatch(_))
        ));
    }

    #[test]
    fn keygen_roundtrips_in_cosign_format() {
        let (private, public) = keygen(b"pw").unwrap();
        assert!(
            private.starts_with("-----BEGIN ENCRYPTED SIGSTORE PRIVATE KEY-----"),
            "{private}"
        );
        assert!(public.starts_with("-----BEGIN PUBLIC KEY-----"), "{public}");
        // The encrypted body is cosign's JSON envelope.
        let pem = sigstore_pem_body(&private);
        assert_eq!(pem["kdf"]["name"], "scrypt");
        assert_eq!(pem["cipher"]["name"], "nacl/secretbox");

        let keys = SigStoreKeyPair::from_encrypted_pem(private.as_bytes(), b"pw").unwrap();
        let sig = keys
            .to_sigstore_signer(&SCHEME)
            .unwrap()
            .sign(b"hello")
            .unwrap();
        let verifier = &parse_public_keys(&[public.as_bytes()]).unwrap()[0];
        verifier
            .verify_signature(Signature::Raw(&sig), b"hello")
            .unwrap();
        assert!(
            verifier
                .verify_signature(Signature::Raw(&sig), b"hellO")
                .is_err()
        );
        assert!(SigStoreKeyPair::from_encrypted_pem(private.as_bytes(), b"wrong").is_err());
        assert!(matches!(
            parse_public_keys::<&[u8]>(&[]),
            Err(Error::Key(_))
        ));
        assert!(matches!(
            parse_public_keys(&["not a key"]),
            Err(Error::Key(_))
        ));
    }

    fn sigstore_pem_body(pem: &str) -> serde_json::Value {
        let b64: String = pem.lines().filter(|l| !l.starts_with("-----")).collect();
        serde_json::from_slice(&STANDARD.decode(b64).unwrap()).unwrap()
    }
}
