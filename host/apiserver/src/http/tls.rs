//! The server's self-signed CA, serving certificate and bearer token, kept in the
//! data directory so a restarted server keeps working with the same kubeconfig.

use std::path::Path;
use std::sync::Arc;

use anyhow::Context;
use rand::Rng;
use rcgen::{BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair, KeyUsagePurpose};
use rustls::pki_types::{pem::PemObject, CertificateDer, PrivateKeyDer};

/// PEM material and the token clients authenticate with.
pub struct Credentials {
    pub ca_pem: String,
    pub cert_pem: String,
    pub key_pem: String,
    pub token: String,
}

impl Credentials {
    /// Fresh credentials (in-memory servers).
    pub fn generate() -> anyhow::Result<Self> {
        let ca_key = KeyPair::generate()?;
        let mut ca_params = CertificateParams::new(Vec::<String>::new())?;
        ca_params.distinguished_name.push(DnType::CommonName, "banlieue-dev-ca");
        ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        ca_params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign, KeyUsagePurpose::DigitalSignature];
        ca_params.not_after = rcgen::date_time_ymd(2099, 1, 1);
        let ca_cert = ca_params.self_signed(&ca_key)?;
        let issuer = Issuer::new(ca_params, ca_key);

        let key = KeyPair::generate()?;
        let mut params = CertificateParams::new(vec!["localhost".to_string(), "127.0.0.1".to_string(), "::1".to_string()])?;
        params.distinguished_name.push(DnType::CommonName, "banlieue-apiserver");
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        params.not_after = rcgen::date_time_ymd(2099, 1, 1);
        let cert = params.signed_by(&key, &issuer)?;

        let token: String = rand::rng().sample_iter(&rand::distr::Alphanumeric).take(40).map(char::from).collect();
        Ok(Credentials { ca_pem: ca_cert.pem(), cert_pem: cert.pem(), key_pem: key.serialize_pem(), token })
    }

    /// Load the credentials of a data directory, creating them on first use.
    pub fn load_or_create(dir: &Path) -> anyhow::Result<Self> {
        let files = ["ca.crt", "server.crt", "server.key", "token"];
        if files.iter().all(|f| dir.join(f).exists()) {
            let read = |f: &str| std::fs::read_to_string(dir.join(f)).with_context(|| format!("reading {f}"));
            return Ok(Credentials {
                ca_pem: read("ca.crt")?,
                cert_pem: read("server.crt")?,
                key_pem: read("server.key")?,
                token: read("token")?.trim().to_string(),
            });
        }
        let c = Self::generate()?;
        std::fs::create_dir_all(dir)?;
        for (f, content) in [("ca.crt", &c.ca_pem), ("server.crt", &c.cert_pem), ("server.key", &c.key_pem), ("token", &c.token)] {
            write_private(&dir.join(f), content)?;
        }
        Ok(c)
    }

    /// A rustls server config offering HTTP/2 and HTTP/1.1.
    pub fn server_config(&self) -> anyhow::Result<Arc<rustls::ServerConfig>> {
        let certs: Vec<CertificateDer<'static>> =
            CertificateDer::pem_slice_iter(self.cert_pem.as_bytes()).collect::<Result<_, _>>()?;
        let key = PrivateKeyDer::from_pem_slice(self.key_pem.as_bytes())?;
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let mut cfg = rustls::ServerConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()?
            .with_no_client_auth()
            .with_single_cert(certs, key)?;
        cfg.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
        Ok(Arc::new(cfg))
    }
}

/// Write a file readable only by its owner (keys and tokens).
pub fn write_private(path: &Path, content: &str) -> anyhow::Result<()> {
    use std::io::Write;
    #[cfg(unix)]
    use std::os::unix::fs::OpenOptionsExt;
    let mut opts = std::fs::OpenOptions::new();
    opts.write(true).create(true).truncate(true);
    #[cfg(unix)]
    opts.mode(0o600);
    let mut f = opts.open(path).with_context(|| format!("writing {}", path.display()))?;
    f.write_all(content.as_bytes())?;
    Ok(())
}

/// A kubeconfig for the server at `server_url`.
pub fn kubeconfig(server_url: &str, creds: &Credentials) -> String {
    use base64::Engine;
    let ca = base64::engine::general_purpose::STANDARD.encode(creds.ca_pem.as_bytes());
    format!(
        "apiVersion: v1\nkind: Config\nclusters:\n- name: banlieue-dev\n  cluster:\n    server: {server_url}\n    certificate-authority-data: {ca}\nusers:\n- name: banlieue-dev\n  user:\n    token: {token}\ncontexts:\n- name: banlieue-dev\n  context:\n    cluster: banlieue-dev\n    user: banlieue-dev\n    namespace: default\ncurrent-context: banlieue-dev\n",
        token = creds.token
    )
}
