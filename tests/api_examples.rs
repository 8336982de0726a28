//! The example objects under `examples/api/`: the good ones are accepted, the bad
//! ones refused with 422 naming the offending field.

use banlieue_tests::TestEnv;
use kube::api::{Api, PostParams};
use kube::core::{DynamicObject, GroupVersionKind};
use kube::discovery::ApiResource;

fn examples(kind: &str) -> Vec<(String, serde_json::Value)> {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/api").join(kind);
    let mut out = Vec::new();
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        let text = std::fs::read_to_string(&path).unwrap();
        out.push((path.file_name().unwrap().to_string_lossy().into_owned(), serde_yaml::from_str(&text).unwrap()));
    }
    out.sort_by(|a, b| a.0.cmp(&b.0));
    out
}

async fn create(env: &TestEnv, obj: &serde_json::Value) -> Result<DynamicObject, kube::Error> {
    let (group, version) = obj["apiVersion"].as_str().unwrap().split_once('/').unwrap();
    let gvk = GroupVersionKind::gvk(group, version, obj["kind"].as_str().unwrap());
    let (ar, caps) = kube::discovery::pinned_kind(&env.client, &gvk).await?;
    let api: Api<DynamicObject> = match caps.scope {
        kube::discovery::Scope::Namespaced => Api::namespaced_with(env.client.clone(), &env.ns, &ar),
        kube::discovery::Scope::Cluster => Api::all_with(env.client.clone(), &ApiResource { ..ar }),
    };
    let mut o: DynamicObject = serde_json::from_value(obj.clone()).unwrap();
    if caps.scope == kube::discovery::Scope::Cluster {
        // Cluster-scoped names are shared on a real cluster: make them this test's own.
        o.metadata.name = Some(format!("{}-{}", o.metadata.name.unwrap(), env.ns));
    }
    api.create(&PostParams::default(), &o).await
}

#[tokio::test]
async fn good_examples_are_accepted() -> anyhow::Result<()> {
    let env = TestEnv::start("examples-good").await?;
    env.install_crds().await?;
    let good = examples("good");
    assert!(good.len() >= 5);
    for (file, obj) in good {
        create(&env, &obj).await.map_err(|e| anyhow::anyhow!("{file}: {e}"))?;
    }
    Ok(())
}

#[tokio::test]
async fn bad_examples_are_refused_with_the_field() -> anyhow::Result<()> {
    let env = TestEnv::start("examples-bad").await?;
    env.install_crds().await?;
    let bad = examples("bad");
    assert!(bad.len() >= 6);
    for (file, obj) in bad {
        // The first comment line of each file names what is wrong; the error must name a field in spec.
        match create(&env, &obj).await {
            Ok(_) => panic!("{file} was accepted"),
            Err(kube::Error::Api(s)) => {
                assert_eq!(s.code, 422, "{file}: {}", s.message);
                assert!(s.message.contains("spec."), "{file}: {}", s.message);
            }
            Err(e) => panic!("{file}: {e}"),
        }
    }
    Ok(())
}
