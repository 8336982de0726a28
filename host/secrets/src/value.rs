//! A secret value that does not show itself.

use zeroize::Zeroizing;

/// A secret string: `Debug` prints `<redacted>`, there is no `Display`, and the memory is
/// zeroed when dropped. Read it with [`SecretValue::expose`] at the last moment.
#[derive(Clone, Default)]
pub struct SecretValue(Zeroizing<String>);

impl SecretValue {
    /// Wrap a value.
    pub fn new(value: impl Into<String>) -> Self {
        SecretValue(Zeroizing::new(value.into()))
    }

    /// The value itself; don't log it.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl From<String> for SecretValue {
    fn from(value: String) -> Self {
        SecretValue::new(value)
    }
}

impl std::fmt::Debug for SecretValue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("<redacted>")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn debug_is_redacted() {
        let value = SecretValue::new("hunter2");
        assert_eq!(format!("{value:?}"), "<redacted>");
        assert_eq!(format!("{:?}", Some(value.clone())), "Some(<redacted>)");
        assert_eq!(value.expose(), "hunter2");
    }
}
