//! The console server's certificate: the operator's (`--console-tls-cert`/`-key`), or one
//! made at start for the addresses it is reached at, under a CA made with it. Either way
//! the CA bundle clients check it against is published on each Provider it serves.

use std::sync::Arc;

use rcgen::{BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair, KeyUsagePurpose};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};

/// A serving certificate, its key, and the bundle clients trust it by.
pub struct ServingCert {
    pub cert_pem: String,
    pub key_pem: String,
    pub ca_pem: String,
}

impl ServingCert {
    /// A certificate for `names` (DNS names or IP addresses) under a CA made for it alone.
    pub fn generate(names: &[String]) -> anyhow::Result<ServingCert> {
        let ca_key = KeyPair::generate()?;
        let mut ca = CertificateParams::new(Vec::<String>::new())?;
        ca.distinguished_name.push(DnType::CommonName, "banlieue-console-ca");
        ca.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
        ca.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::DigitalSignature];
        let ca_cert = ca.self_signed(&ca_key)?;
        let issuer = Issuer::new(ca, ca_key);
        let key = KeyPair::generate()?;
        let mut leaf = CertificateParams::new(names.to_vec())?;
        leaf.distinguished_name.push(DnType::CommonName, "banlieue-console");
        leaf.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        let cert = leaf.signed_by(&key, &issuer)?;
        Ok(ServingCert { cert_pem: cert.pem(), key_pem: key.serialize_pem(), ca_pem: ca_cert.pem() })
    }

    /// A rustls server configuration serving HTTP/1.1 (a websocket upgrades an HTTP/1.1
    /// connection).
    pub fn server_config(&self) -> anyhow::Result<Arc<rustls::ServerConfig>> {
        let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(self.cert_pem.as_bytes()).collect::<Result<_, _>>()?;
        let key = PrivateKeyDer::from_pem_slice(self.key_pem.as_bytes())?;
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let mut config = rustls::ServerConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()?
            .with_no_client_auth()
            .with_single_cert(certs, key)?;
        config.alpn_protocols = vec![b"http/1.1".to_vec()];
        Ok(Arc::new(config))
    }
}
