//! Secret values from one Kubernetes Secret, read on every call.

use k8s_openapi::api::core::v1::Secret;
use kube::Api;

use crate::{SecretError, SecretSource, SecretValue};

/// The keys of one Kubernetes Secret (`data[key]`, base64-decoded, UTF-8).
#[derive(Clone)]
pub struct KubernetesSecret {
    client: kube::Client,
    namespace: String,
    name: String,
}

impl std::fmt::Debug for KubernetesSecret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KubernetesSecret")
            .field("namespace", &self.namespace)
            .field("name", &self.name)
            .finish_non_exhaustive()
    }
}

impl KubernetesSecret {
    /// The Secret `namespace/name`, read with `client`'s credentials.
    pub fn new(
        client: kube::Client,
        namespace: impl Into<String>,
        name: impl Into<String>,
    ) -> Self {
        KubernetesSecret {
            client,
            namespace: namespace.into(),
            name: name.into(),
        }
    }

    fn api_error(&self, err: kube::Error) -> SecretError {
        let what = self.describe();
        match err {
            kube::Error::Api(status) if status.is_not_found() => SecretError::NotFound(what),
            kube::Error::Api(status) if status.is_forbidden() || status.code == 401 => {
                SecretError::Denied(format!("{what}: {}", status.message))
            }
            kube::Error::Api(status) if (400..500).contains(&status.code) => {
                SecretError::Invalid(format!("{what}: {} ({})", status.message, status.code))
            }
            kube::Error::Api(status) => {
                SecretError::Unavailable(format!("{what}: {} ({})", status.message, status.code))
            }
            // A decoding error can quote the payload, i.e. the secret: say only that it failed.
            kube::Error::SerdeError(_) | kube::Error::FromUtf8(_) => SecretError::Invalid(format!(
                "{what}: the API server's answer could not be decoded"
            )),
            other => SecretError::Unavailable(format!("{what}: {other}")),
        }
    }
}

#[async_trait::async_trait]
impl SecretSource for KubernetesSecret {
    async fn get(&self, key: &str) -> Result<SecretValue, SecretError> {
        if key.is_empty() {
            return Err(SecretError::Invalid(format!(
                "{}: empty key",
                self.describe()
            )));
        }
        let api: Api<Secret> = Api::namespaced(self.client.clone(), &self.namespace);
        let mut secret = api.get(&self.name).await.map_err(|e| self.api_error(e))?;
        let bytes = secret
            .data
            .as_mut()
            .and_then(|data| data.remove(key))
            .ok_or_else(|| SecretError::NotFound(format!("key {key:?} in {}", self.describe())))?;
        // The error would carry the bytes; drop it and name the key only.
        String::from_utf8(bytes.0)
            .map(SecretValue::new)
            .map_err(|_| {
                SecretError::Invalid(format!("key {key:?} in {} is not UTF-8", self.describe()))
            })
    }

    fn describe(&self) -> String {
        format!("Secret {}/{}", self.namespace, self.name)
    }
}
