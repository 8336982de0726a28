//! The CNCF "Wasm OCI artifact" layout: an OCI image manifest with a
//! `application/vnd.wasm.config.v0+json` config and exactly one `application/wasm` layer.

use std::collections::BTreeMap;

use oci_client::manifest::{OCI_IMAGE_MEDIA_TYPE, OciDescriptor, OciImageManifest};
use serde::{Deserialize, Serialize};
use sha2::{Digest as _, Sha256};

use crate::error::{Error, Result};

/// Config media type of a Wasm artifact (CNCF TAG Runtime Wasm OCI artifact spec).
pub const WASM_CONFIG_MEDIA_TYPE: &str = "application/vnd.wasm.config.v0+json";
/// Layer media type of a Wasm component.
pub const WASM_LAYER_MEDIA_TYPE: &str = "application/wasm";
/// Older layer media type (wasm-to-oci, oci-client's `WASM_LAYER_MEDIA_TYPE`); accepted on pull.
const LEGACY_WASM_LAYER_MEDIA_TYPE: &str = "application/vnd.wasm.content.layer.v1+wasm";

/// Largest component this crate pulls (and pushes).
pub const MAX_COMPONENT_BYTES: u64 = 64 * 1024 * 1024;
/// Largest manifest, config or signature payload this crate reads.
pub const MAX_METADATA_BYTES: u64 = 4 * 1024 * 1024;

/// The artifact's config blob.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct WasmConfig {
    pub architecture: String,
    pub os: String,
    pub layer_digests: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub component: Option<ComponentInfo>,
}

/// Component metadata carried in the config. Only what is cheap to know without parsing
/// the component; the runtime checks the WIT world when it loads it.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq, Default)]
pub struct ComponentInfo {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub target: Option<String>,
}

/// A blob ready to upload: bytes plus their descriptor.
pub(crate) struct Blob {
    pub data: Vec<u8>,
    pub descriptor: OciDescriptor,
}

impl Blob {
    pub fn new(media_type: &str, data: Vec<u8>) -> Blob {
        let descriptor = OciDescriptor {
            media_type: media_type.to_string(),
            digest: sha256_digest(&data),
            size: data.len() as i64,
            ..Default::default()
        };
        Blob { data, descriptor }
    }
}

/// Everything `push` uploads: layer, config, and the exact manifest bytes (so the digest we
/// report is the digest of what we sent).
pub(crate) struct Artifact {
    pub layer: Blob,
    pub config: Blob,
    pub manifest: Vec<u8>,
    pub manifest_digest: String,
}

/// Lay out `wasm` as a Wasm OCI artifact. Refuses bytes that are not a Wasm component.
pub(crate) fn build(wasm: Vec<u8>) -> Result<Artifact> {
    check_component(&wasm)?;
    if wasm.len() as u64 > MAX_COMPONENT_BYTES {
        return Err(Error::TooLarge {
            what: "component".into(),
            size: wasm.len() as u64,
            limit: MAX_COMPONENT_BYTES,
        });
    }
    let layer = Blob::new(WASM_LAYER_MEDIA_TYPE, wasm);
    let config = WasmConfig {
        architecture: "wasm".into(),
        os: "wasip2".into(),
        layer_digests: vec![layer.descriptor.digest.clone()],
        component: None,
    };
    let config = Blob::new(
        WASM_CONFIG_MEDIA_TYPE,
        serde_json::to_vec(&config).expect("config serializes"),
    );
    let manifest = OciImageManifest {
        schema_version: 2,
        media_type: Some(OCI_IMAGE_MEDIA_TYPE.to_string()),
        artifact_type: Some(WASM_CONFIG_MEDIA_TYPE.to_string()),
        config: config.descriptor.clone(),
        layers: vec![layer.descriptor.clone()],
        subject: None,
        annotations: None::<BTreeMap<String, String>>,
    };
    let manifest = serde_json::to_vec(&manifest).expect("manifest serializes");
    let manifest_digest = sha256_digest(&manifest);
    Ok(Artifact {
        layer,
        config,
        manifest,
        manifest_digest,
    })
}

/// Parse pulled manifest bytes and return the one Wasm layer's descriptor.
pub(crate) fn wasm_layer(manifest: &[u8]) -> Result<(OciImageManifest, OciDescriptor)> {
    let parsed: OciImageManifest = serde_json::from_slice(manifest).map_err(|e| {
        Error::InvalidArtifact(format!("manifest is not an OCI image manifest: {e}"))
    })?;
    if let Some(mt) = &parsed.media_type
        && mt != OCI_IMAGE_MEDIA_TYPE
    {
        return Err(Error::InvalidArtifact(format!(
            "manifest media type {mt}, expected {OCI_IMAGE_MEDIA_TYPE}"
        )));
    }
    let mut wasm_layers = parsed.layers.iter().filter(|l| {
        l.media_type == WASM_LAYER_MEDIA_TYPE || l.media_type == LEGACY_WASM_LAYER_MEDIA_TYPE
    });
    let layer = match (wasm_layers.next(), wasm_layers.next()) {
        (Some(layer), None) if parsed.layers.len() == 1 => layer.clone(),
        _ => {
            let types: Vec<&str> = parsed
                .layers
                .iter()
                .map(|l| l.media_type.as_str())
                .collect();
            return Err(Error::InvalidArtifact(format!(
                "expected exactly one {WASM_LAYER_MEDIA_TYPE} layer, found layers {types:?}"
            )));
        }
    };
    crate::reference::validate_digest(&layer.digest).map_err(Error::InvalidArtifact)?;
    if layer.size < 0 {
        return Err(Error::InvalidArtifact(format!(
            "layer size {} is negative",
            layer.size
        )));
    }
    if layer.size as u64 > MAX_COMPONENT_BYTES {
        return Err(Error::TooLarge {
            what: format!("layer {}", layer.digest),
            size: layer.size as u64,
            limit: MAX_COMPONENT_BYTES,
        });
    }
    Ok((parsed, layer))
}

/// A component starts with `\0asm`, version 0x0d, layer 1 (a core module has layer 0).
fn check_component(wasm: &[u8]) -> Result<()> {
    match wasm.get(..8) {
        Some([0x00, 0x61, 0x73, 0x6d, _, _, 0x01, 0x00]) => Ok(()),
        Some([0x00, 0x61, 0x73, 0x6d, 0x01, 0x00, 0x00, 0x00]) => Err(Error::InvalidArtifact(
            "this is a core Wasm module, not a component".into(),
        )),
        _ => Err(Error::InvalidArtifact(
            "not a Wasm binary (missing \\0asm header)".into(),
        )),
    }
}

/// `sha256:<hex>` of `data`.
pub fn sha256_digest(data: &[u8]) -> String {
    format!("sha256:{}", hex::encode(Sha256::digest(data)))
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// Smallest valid component: the preamble alone.
    pub(crate) const EMPTY_COMPONENT: &[u8] = &[0x00, 0x61, 0x73, 0x6d, 0x0d, 0x00, 0x01, 0x00];

    #[test]
    fn builds_cncf_layout() {
        let a = build(EMPTY_COMPONENT.to_vec()).unwrap();
        let m: serde_json::Value = serde_json::from_slice(&a.manifest).unwrap();
        assert_eq!(m["mediaType"], OCI_IMAGE_MEDIA_TYPE);
        assert_eq!(m["artifactType"], WASM_CONFIG_MEDIA_TYPE);
        assert_eq!(m["config"]["mediaType"], WASM_CONFIG_MEDIA_TYPE);
        assert_eq!(m["layers"][0]["mediaType"], WASM_LAYER_MEDIA_TYPE);
        assert_eq!(m["layers"][0]["size"], 8);
        let c: serde_json::Value = serde_json::from_slice(&a.config.data).unwrap();
        assert_eq!(c["architecture"], "wasm");
        assert_eq!(c["os"], "wasip2");
        assert_eq!(c["layerDigests"][0], a.layer.descriptor.digest);
        assert_eq!(a.manifest_digest, sha256_digest(&a.manifest));
        let (_, layer) = wasm_layer(&a.manifest).unwrap();
        assert_eq!(layer.digest, a.layer.descriptor.digest);
    }

    #[test]
    fn refuses_non_components() {
        assert!(
            matches!(build(b"\0asm\x01\0\0\0".to_vec()), Err(Error::InvalidArtifact(m)) if m.contains("core"))
        );
        assert!(matches!(
            build(b"#!/bin/sh".to_vec()),
            Err(Error::InvalidArtifact(_))
        ));
    }
}
