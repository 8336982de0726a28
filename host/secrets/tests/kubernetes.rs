//! `KubernetesSecret` through the project's embedded API server.

use std::collections::BTreeMap;

use banlieue_secrets::{KubernetesSecret, SecretError, SecretSource, SecretValue};
use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::Secret;
use kube::api::{ObjectMeta, PostParams};

const PASSWORD: &str = "pw-2b8d41c6-never-print-me";

async fn connect(kubeconfig: &str) -> anyhow::Result<kube::Client> {
    let kubeconfig = kube::config::Kubeconfig::from_yaml(kubeconfig)?;
    let config = kube::Config::from_custom_kubeconfig(
        kubeconfig,
        &kube::config::KubeConfigOptions::default(),
    )
    .await?;
    Ok(kube::Client::try_from(config)?)
}

fn check_error(result: Result<SecretValue, SecretError>) -> SecretError {
    let err = result.expect_err("expected an error");
    for text in [err.to_string(), format!("{err:?}")] {
        assert!(!text.contains(PASSWORD), "error leaks the secret: {text}");
    }
    err
}

#[tokio::test]
async fn reads_a_secret_key_each_call() -> anyhow::Result<()> {
    let server =
        banlieue_apiserver::ApiServer::start(banlieue_apiserver::Config::default()).await?;
    let client = connect(&server.kubeconfig).await?;
    let secrets: kube::Api<Secret> = kube::Api::namespaced(client.clone(), "default");
    let data = |password: &str| {
        BTreeMap::from([
            (
                "password".to_string(),
                ByteString(password.as_bytes().to_vec()),
            ),
            ("binary".to_string(), ByteString(vec![0xff, 0xfe, 0x00])),
        ])
    };
    secrets
        .create(
            &PostParams::default(),
            &Secret {
                metadata: ObjectMeta {
                    name: Some("vsphere".into()),
                    ..Default::default()
                },
                data: Some(data(PASSWORD)),
                ..Default::default()
            },
        )
        .await?;

    let source = KubernetesSecret::new(client.clone(), "default", "vsphere");
    assert_eq!(source.describe(), "Secret default/vsphere");
    let value = source.get("password").await.unwrap();
    assert_eq!(value.expose(), PASSWORD);
    assert_eq!(format!("{value:?}"), "<redacted>");

    let err = check_error(source.get("missing").await);
    assert!(
        matches!(err, SecretError::NotFound(ref m) if m.contains("missing")),
        "{err:?}"
    );
    let err = check_error(source.get("binary").await);
    assert!(matches!(err, SecretError::Invalid(_)), "{err:?}");

    let absent = KubernetesSecret::new(client.clone(), "default", "nothing-here");
    let err = check_error(absent.get("password").await);
    assert!(matches!(err, SecretError::NotFound(_)), "{err:?}");

    // Nothing is cached: a rotated value is read on the next call.
    let rotated = format!("{PASSWORD}-rotated");
    let mut secret = secrets.get("vsphere").await?;
    secret.data = Some(data(&rotated));
    secrets
        .replace("vsphere", &PostParams::default(), &secret)
        .await?;
    assert_eq!(source.get("password").await.unwrap().expose(), rotated);

    // A client the API server does not accept is refused, not "not found".
    let bad_token = server
        .kubeconfig
        .replace(&server.token, "not-a-valid-token");
    let refused = KubernetesSecret::new(connect(&bad_token).await?, "default", "vsphere");
    let err = check_error(refused.get("password").await);
    assert!(matches!(err, SecretError::Denied(_)), "{err:?}");
    Ok(())
}
