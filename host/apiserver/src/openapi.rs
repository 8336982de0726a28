//! Placeholder until the OpenAPI generator lands.
use std::sync::Arc;
use serde_json::{json, Value};
use crate::registry::ResourceType;
pub fn index(_r: &[Arc<ResourceType>]) -> Value { json!({"paths": {}}) }
pub fn group_version_doc(_r: &[Arc<ResourceType>], _p: &str) -> Option<Value> { None }
