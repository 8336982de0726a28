//! Fixed values held in memory: for tests and tools that have the credentials at hand.

use std::collections::HashMap;

use crate::{SecretError, SecretSource, SecretValue};

/// Secret values from a map; a key it lacks is `NotFound`.
pub struct StaticSecrets(HashMap<String, SecretValue>);

impl StaticSecrets {
    pub fn new<K: Into<String>, V: Into<String>>(values: impl IntoIterator<Item = (K, V)>) -> StaticSecrets {
        StaticSecrets(values.into_iter().map(|(k, v)| (k.into(), SecretValue::new(v.into()))).collect())
    }
}

#[async_trait::async_trait]
impl SecretSource for StaticSecrets {
    async fn get(&self, key: &str) -> Result<SecretValue, SecretError> {
        self.0.get(key).cloned().ok_or_else(|| SecretError::NotFound(format!("no key {key:?}")))
    }

    fn describe(&self) -> String {
        "static values".into()
    }
}
