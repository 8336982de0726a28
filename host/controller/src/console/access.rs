//! Who may open a VM's console: the caller's bearer token is reviewed by the cluster's API
//! server (`TokenReview`), then the user it names is checked (`SubjectAccessReview`) for the
//! RBAC verb `get` on the subresource `virtualmachines/console` (serial) or
//! `virtualmachines/vnc` (graphical) of that VM — as kube-apiserver decides `pods/exec`. The
//! cluster decides, nothing else: banlieue keeps no users, and no role of its own grants a
//! console.

use k8s_openapi::api::authentication::v1::{TokenReview, TokenReviewSpec};
use k8s_openapi::api::authorization::v1::{ResourceAttributes, SubjectAccessReview, SubjectAccessReviewSpec};
use kube::api::{Api, PostParams};

/// Which console of a VM.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Console {
    /// The serial console: `virtualmachines/console`.
    Serial,
    /// The graphical display: `virtualmachines/vnc`.
    Vnc,
}

impl Console {
    /// The subresource of `virtualmachines` RBAC grants it by.
    pub fn subresource(self) -> &'static str {
        match self {
            Console::Serial => "console",
            Console::Vnc => "vnc",
        }
    }
}

/// Who opened a console, as the API server authenticated them (for the audit).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Caller {
    pub user: String,
    pub groups: Vec<String>,
}

/// Why a console was not opened, with the HTTP status the caller gets.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Refused {
    /// No token, or one the API server does not accept (401).
    Unauthenticated(String),
    /// The user may not open this console (403), in kube-apiserver's words.
    Forbidden(String),
    /// The API server could not be asked (503): nothing is opened while it cannot decide.
    Unavailable(String),
}

impl Refused {
    pub fn status(&self) -> u16 {
        match self {
            Refused::Unauthenticated(_) => 401,
            Refused::Forbidden(_) => 403,
            Refused::Unavailable(_) => 503,
        }
    }

    pub fn message(&self) -> &str {
        match self {
            Refused::Unauthenticated(m) | Refused::Forbidden(m) | Refused::Unavailable(m) => m,
        }
    }
}

/// Whether the holder of `token` may open `console` of VM `namespace/vm`, asked of the API
/// server `client` reaches (with banlieue's own identity: `create tokenreviews` and
/// `create subjectaccessreviews`).
pub async fn authorize(client: &kube::Client, token: &str, namespace: &str, vm: &str, console: Console) -> Result<Caller, Refused> {
    let caller = authenticate(client, token).await?;
    let attributes = ResourceAttributes {
        verb: Some("get".into()),
        group: Some(banlieue_api::GROUP.into()),
        resource: Some("virtualmachines".into()),
        subresource: Some(console.subresource().into()),
        namespace: Some(namespace.into()),
        name: Some(vm.into()),
        ..Default::default()
    };
    let review = SubjectAccessReview {
        spec: SubjectAccessReviewSpec {
            user: Some(caller.user.clone()),
            groups: Some(caller.groups.clone()),
            resource_attributes: Some(attributes),
            ..Default::default()
        },
        ..Default::default()
    };
    let answer = Api::<SubjectAccessReview>::all(client.clone())
        .create(&PostParams::default(), &review)
        .await
        .map_err(|e| Refused::Unavailable(format!("asking the API server whether {} may open the console: {e}", caller.user)))?;
    match answer.status {
        Some(s) if s.allowed => Ok(caller),
        _ => Err(Refused::Forbidden(format!(
            "virtualmachines.{} \"{vm}\" is forbidden: User \"{}\" cannot get resource \"virtualmachines/{}\" in API group \"{}\" in the namespace \"{namespace}\"",
            banlieue_api::GROUP,
            caller.user,
            console.subresource(),
            banlieue_api::GROUP
        ))),
    }
}

/// The user `token` is, as a `TokenReview` says.
async fn authenticate(client: &kube::Client, token: &str) -> Result<Caller, Refused> {
    if token.trim().is_empty() {
        return Err(Refused::Unauthenticated("no bearer token: a console is opened with a Kubernetes token (kubectl's, or `kubectl create token`)".into()));
    }
    let review = TokenReview { spec: TokenReviewSpec { token: Some(token.trim().into()), ..Default::default() }, ..Default::default() };
    let answer = Api::<TokenReview>::all(client.clone())
        .create(&PostParams::default(), &review)
        .await
        .map_err(|e| Refused::Unavailable(format!("asking the API server who the token is: {e}")))?;
    let status = answer.status.unwrap_or_default();
    match (status.authenticated, status.user) {
        (Some(true), Some(user)) if user.username.as_deref().is_some_and(|u| !u.is_empty()) => {
            Ok(Caller { user: user.username.unwrap_or_default(), groups: user.groups.unwrap_or_default() })
        }
        _ => Err(Refused::Unauthenticated(format!(
            "the API server does not accept the token{}",
            status.error.filter(|e| !e.is_empty()).map(|e| format!(": {e}")).unwrap_or_default()
        ))),
    }
}
