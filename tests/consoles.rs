//! Who may open a VM's console is decided by the cluster: the caller's token reviewed
//! (`TokenReview`) and its permission checked (`SubjectAccessReview`) for `get` on
//! `virtualmachines/console` or `virtualmachines/vnc` — here for two ServiceAccounts with
//! different Roles, their tokens issued by the API server (`TokenRequest`), on the embedded
//! server and on a real kube-apiserver alike.

use banlieue_controller::console::access::{authorize, Console, Refused};
use banlieue_tests::TestEnv;
use k8s_openapi::api::authentication::v1::TokenRequest;
use k8s_openapi::api::core::v1::ServiceAccount;
use kube::api::{Api, PostParams};
use serde_json::json;

/// A ServiceAccount bound to a Role of `rules` in the test's namespace; a token for it.
async fn account(env: &TestEnv, name: &str, rules: serde_json::Value) -> anyhow::Result<String> {
    let ns = &env.ns;
    for object in [
        json!({"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": name, "namespace": ns}}),
        json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role", "metadata": {"name": name, "namespace": ns}, "rules": rules}),
        json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding", "metadata": {"name": name, "namespace": ns},
               "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": name},
               "subjects": [{"kind": "ServiceAccount", "name": name, "namespace": ns}]}),
    ] {
        env.apply(object).await?;
    }
    let accounts: Api<ServiceAccount> = Api::namespaced(env.client.clone(), ns);
    let request: TokenRequest = serde_json::from_value(json!({"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "spec": {"audiences": [], "expirationSeconds": 600}}))?;
    let issued = accounts.create_token_request(name, &PostParams::default(), &request).await?;
    Ok(issued.status.map(|s| s.token).unwrap_or_default())
}

/// A client of the test's API server that authenticates with `token`.
async fn client_with(env: &TestEnv, token: &str) -> anyhow::Result<kube::Client> {
    let kc = kube::config::Kubeconfig::read_from(&env.kubeconfig)?;
    let mut cfg = kube::Config::from_custom_kubeconfig(kc, &Default::default()).await?;
    cfg.auth_info = kube::config::AuthInfo { token: Some(token.to_string().into()), ..Default::default() };
    Ok(kube::Client::try_from(cfg)?)
}

#[tokio::test]
async fn the_cluster_decides_who_opens_a_vms_console() -> anyhow::Result<()> {
    let env = TestEnv::start("console-rbac").await?;
    env.install_crds().await?;
    let viewer = account(&env, "viewer", json!([{"apiGroups": ["banlieue.io"], "resources": ["virtualmachines"], "verbs": ["get", "list"]}])).await?;
    let operator = account(
        &env,
        "operator",
        json!([{"apiGroups": ["banlieue.io"], "resources": ["virtualmachines", "virtualmachines/console"], "verbs": ["get"]}]),
    )
    .await?;
    let ns = env.ns.as_str();

    // The operator may open the serial console, as who the API server says it is.
    let caller = authorize(&env.client, &operator, ns, "web", Console::Serial).await.map_err(|r| anyhow::anyhow!("{r:?}"))?;
    assert_eq!(caller.user, format!("system:serviceaccount:{ns}:operator"));
    assert!(caller.groups.iter().any(|g| g == &format!("system:serviceaccounts:{ns}")), "{:?}", caller.groups);

    // Not the graphical one: its Role names only `virtualmachines/console`.
    let refused = authorize(&env.client, &operator, ns, "web", Console::Vnc).await.unwrap_err();
    assert_eq!(refused.status(), 403);
    assert!(refused.message().contains("cannot get resource \"virtualmachines/vnc\""), "{refused:?}");

    // The viewer reads VMs but opens no console; the message names the verb and subresource.
    let refused = authorize(&env.client, &viewer, ns, "web", Console::Serial).await.unwrap_err();
    assert_eq!(refused.status(), 403);
    let message = refused.message();
    assert!(message.contains(&format!("User \"system:serviceaccount:{ns}:viewer\" cannot get resource \"virtualmachines/console\"")), "{message}");
    // (Its token is a real one: the API server itself lets it list VMs, and no more.)
    let as_viewer: Api<banlieue_api::VirtualMachine> = Api::namespaced(client_with(&env, &viewer).await?, ns);
    as_viewer.list(&Default::default()).await?;
    let denied = as_viewer.delete("web", &Default::default()).await.unwrap_err();
    assert!(matches!(&denied, kube::Error::Api(e) if e.code == 403), "{denied:?}");

    // In another namespace the operator's Role does not reach.
    let refused = authorize(&env.client, &operator, "default", "web", Console::Serial).await.unwrap_err();
    assert_eq!(refused.status(), 403, "{refused:?}");

    // `edit` opens consoles: deploy/base/users.yaml's ClusterRole is aggregated into it — by
    // kube-controller-manager on a real cluster (the embedded server has no default roles
    // and aggregates none: that part is for real clusters only).
    if env.embedded().is_none() {
        let users = std::fs::read_to_string(banlieue_tests::control::repo_root().join("deploy/base/users.yaml"))?;
        env.kubectl_raw(&["apply", "-f", "-"], Some(&users), &[]).await?;
        let editor = account(&env, "editor", json!([])).await?;
        env.apply(json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding", "metadata": {"name": "editor-edit", "namespace": ns},
                         "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "edit"},
                         "subjects": [{"kind": "ServiceAccount", "name": "editor", "namespace": ns}]}))
            .await?;
        let roles: Api<k8s_openapi::api::rbac::v1::ClusterRole> = Api::all(env.client.clone());
        let aggregated = |r: Option<&k8s_openapi::api::rbac::v1::ClusterRole>| {
            r.and_then(|r| r.rules.as_ref()).is_some_and(|rules| rules.iter().any(|rule| rule.resources.iter().flatten().any(|res| res == "virtualmachines/console")))
        };
        banlieue_tests::within(60, kube::runtime::wait::await_condition(roles, "edit", aggregated)).await??;
        let caller = authorize(&env.client, &editor, ns, "web", Console::Vnc).await.map_err(|r| anyhow::anyhow!("an editor: {r:?}"))?;
        assert_eq!(caller.user, format!("system:serviceaccount:{ns}:editor"));
    }

    // A token the API server does not know, and none at all.
    for token in ["not-a-token", ""] {
        let refused = authorize(&env.client, token, ns, "web", Console::Serial).await.unwrap_err();
        assert!(matches!(refused, Refused::Unauthenticated(_)), "{token:?}: {refused:?}");
        assert_eq!(refused.status(), 401);
    }
    Ok(())
}
