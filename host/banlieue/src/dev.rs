//! `banlieue dev`: the embedded API server, the CRDs, every role, the built-in
//! ProviderClasses (`libvirt`, `vsphere`, `proxmox`) and a dev Provider on
//! libvirt's `test:///default` driver — so `kubectl apply -f examples/quickstart/`
//! gives a Ready VM without a cluster or a hypervisor. With `--backends
//! vsphere,proxmox,libvirt` it also starts the backends the tests use (vcsim,
//! fakepve on loopback; libvirtd with qemu), with a Provider (and credentials
//! Secret) for each.

use std::net::SocketAddr;
use std::path::PathBuf;

use anyhow::Context as _;
use banlieue_controller::{Context, Roles};
use kube::api::{Api, DynamicObject, Patch, PatchParams};
use kube::discovery::ApiResource;

#[derive(clap::Args)]
pub struct DevArgs {
    /// Address of the embedded API server.
    #[arg(long, default_value = "127.0.0.1:6443")]
    listen: SocketAddr,
    /// Where objects, credentials and the kubeconfig are kept.
    #[arg(long, default_value = ".dev")]
    data_dir: PathBuf,
    /// Keep everything in memory (objects are gone when it stops).
    #[arg(long)]
    in_memory: bool,
    /// libvirt URI of the dev Provider.
    #[arg(long, default_value = "test:///default")]
    libvirt_uri: String,
    /// Backends to start, each with a Provider (`vcsim`, `fakepve`, `kvm`) in namespace `default`.
    #[arg(long, value_delimiter = ',')]
    backends: Vec<Backend>,
    #[command(flatten)]
    roles: crate::roles::RoleArgs,
}

pub async fn run(args: DevArgs) -> anyhow::Result<()> {
    let config = banlieue_apiserver::Config {
        addr: args.listen,
        data_dir: (!args.in_memory).then(|| args.data_dir.clone()),
        ..Default::default()
    };
    let server = banlieue_apiserver::ApiServer::start(config)
        .await
        .with_context(|| format!("starting the embedded API server on {} (is another `banlieue dev` running? use --listen)", args.listen))?;
    std::fs::create_dir_all(&args.data_dir)?;
    let kubeconfig_path = std::path::absolute(args.data_dir.join("kubeconfig"))?;
    server.write_kubeconfig(&kubeconfig_path)?;

    let kubeconfig = kube::config::Kubeconfig::from_yaml(&server.kubeconfig)?;
    let client_config = kube::Config::from_custom_kubeconfig(kubeconfig, &Default::default()).await?;
    let client = kube::Client::try_from(client_config)?;
    crate::crds::install(&client).await?;
    let mut objects = dev_objects(&args.libvirt_uri);
    // Held until dev stops: dropping one stops its simulator.
    let mut simulators = Simulators::default();
    for backend in &args.backends {
        objects.extend(simulators.start(*backend).await?);
    }
    for object in objects {
        apply(&client, object).await?;
    }

    let mut options = args.roles.one_process_options(&args.data_dir)?;
    // Plain http allowed for images (local test servers).
    if let Some(images) = &mut options.image_cache {
        if !images.schemes.iter().any(|s| s == "http") {
            images.schemes.push("http".into());
        }
    }
    // Consoles on a free local port (Providers publish it), with the browser page once built.
    if options.consoles.is_none() {
        options.consoles = Some(banlieue_controller::ConsoleOptions {
            listen: "127.0.0.1:0".parse()?,
            url: None,
            tls: None,
            limits: banlieue_controller::SessionLimits::default(),
            page_dir: Some(std::path::PathBuf::from("target/console-page")).filter(|d| d.join("index.html").exists()),
        });
    }
    let ctx = Context::new(client, options)?;
    if let Some(consoles) = &ctx.consoles {
        println!("consoles at {}/console/ (kubectl vm console NAME)", consoles.endpoint().url);
    }
    let roles = tokio::spawn(banlieue_controller::run(ctx, Roles::ALL, crate::roles::shutdown_signal()));

    println!("banlieue dev is running at {}", server.url);
    println!("export KUBECONFIG={}", kubeconfig_path.display());
    println!("then: kubectl apply -f examples/quickstart/ && kubectl get vm -w");
    for (backend, url) in simulators.urls() {
        println!("{backend} at {url}");
    }

    let result = roles.await;
    drop(simulators);
    tracing::info!("shutting down");
    server.shutdown().await;
    result?
}

/// A backend `banlieue dev` can start.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Backend {
    /// vcsim, govmomi's vCenter simulator (built by tests/backends/vcsim/build.sh).
    Vsphere,
    /// fakepve, a Proxmox VE API simulator (PyPI fakepve).
    Proxmox,
    /// libvirtd with qemu (TCG) on this machine, as the tests run it (tests/backends/libvirtd;
    /// needs root), with the test guest as VMImage `tiny-guest`. It keeps running after dev
    /// stops: `tests/backends/libvirtd/stop.sh` stops it.
    Libvirt,
}

/// The simulators dev started; each stops when dropped.
#[derive(Default)]
struct Simulators {
    vcsim: Option<banlieue_test_backends::vcsim::Vcsim>,
    fakepve: Option<banlieue_test_backends::fakepve::FakePve>,
    libvirtd: Option<&'static banlieue_test_backends::libvirtd::Libvirtd>,
}

impl Simulators {
    /// Start `backend` and return its credentials Secret and Provider.
    async fn start(&mut self, backend: Backend) -> anyhow::Result<Vec<serde_json::Value>> {
        use serde_json::json;
        let (name, class, endpoint, username, password, ca, storage, network) = match backend {
            Backend::Libvirt => {
                let lv = tokio::task::spawn_blocking(banlieue_test_backends::libvirtd::Libvirtd::shared)
                    .await?
                    .context("starting libvirtd (--backends libvirt; needs root)")?;
                self.libvirtd = Some(lv);
                return Ok(vec![
                    json!({"apiVersion": "banlieue.io/v1alpha1", "kind": "Provider", "metadata": {"name": "kvm", "namespace": "default"},
                           "spec": {"providerClassRef": {"name": "libvirt"}, "connection": {"endpoint": lv.uri},
                                    "capabilities": {"storageClasses": {"standard": lv.pool}, "networkClasses": {"default": lv.network}}}}),
                    // The test guest: boots in seconds under TCG, prints its user-data's
                    // `#banlieue-marker:` lines on the serial console, gets a DHCP lease.
                    json!({"apiVersion": "banlieue.io/v1alpha1", "kind": "VMImage", "metadata": {"name": "tiny-guest"},
                           "spec": {"sources": [{"providerClass": "libvirt", "backingFile": lv.guest_disk()},
                                                {"providerClass": "vsphere", "template": banlieue_test_backends::vcsim::TEMPLATE},
                                                {"providerClass": "proxmox", "template": banlieue_test_backends::fakepve::TEMPLATE_VMID.to_string()}]}}),
                ]);
            }
            Backend::Vsphere => {
                let v = banlieue_test_backends::vcsim::Vcsim::start().await.context("starting vcsim (--backends vsphere)")?;
                let url = v.url.clone();
                self.vcsim = Some(v);
                use banlieue_test_backends::vcsim::{PASSWORD, USERNAME};
                ("vcsim", "vsphere", url, USERNAME.to_string(), PASSWORD.to_string(), None, "LocalDS_0", "VM Network")
            }
            Backend::Proxmox => {
                let p = banlieue_test_backends::fakepve::FakePve::start().await.context("starting fakepve (--backends proxmox)")?;
                let fields = (p.url.clone(), p.username.clone(), p.password.clone(), Some(p.ca_pem.clone()));
                self.fakepve = Some(p);
                // shared-dir is on every node, so a clone may land on any of them.
                ("fakepve", "proxmox", fields.0, fields.1, fields.2, fields.3, "shared-dir", "vmbr0")
            }
        };
        let secret = format!("{name}-credentials");
        let mut connection = json!({"endpoint": endpoint,
                                    "credentialsRef": {"kind": "Secret", "name": secret, "keys": ["username", "password"]}});
        if let Some(ca) = ca {
            connection["caBundle"] = json!(ca);
        }
        Ok(vec![
            json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": secret, "namespace": "default"},
                   "stringData": {"username": username, "password": password}}),
            json!({"apiVersion": "banlieue.io/v1alpha1", "kind": "Provider", "metadata": {"name": name, "namespace": "default"},
                   "spec": {"providerClassRef": {"name": class},
                            "connection": connection,
                            "capabilities": {"storageClasses": {"standard": storage}, "networkClasses": {"default": network}}}}),
        ])
    }

    fn urls(&self) -> Vec<(&'static str, String)> {
        let mut v = Vec::new();
        if let Some(s) = &self.vcsim {
            v.push(("vSphere (vcsim)", s.url.clone()));
        }
        if let Some(s) = &self.fakepve {
            v.push(("Proxmox VE (fakepve)", s.url.clone()));
        }
        if let Some(s) = self.libvirtd {
            v.push(("libvirtd + qemu", s.uri.clone()));
        }
        v
    }
}

/// The built-in classes, the placement policies and the dev Provider.
fn dev_objects(libvirt_uri: &str) -> Vec<serde_json::Value> {
    use serde_json::json;
    vec![
        json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": banlieue_controller::SYSTEM_NAMESPACE}}),
        json!({"apiVersion": "banlieue.io/v1alpha1", "kind": "ProviderClass", "metadata": {"name": "libvirt"},
               "spec": {"component": {"source": "builtin:provider-libvirt"}, "infrastructureKind": "Libvirt",
                        "capabilities": {"libvirt": true}}}),
        json!({"apiVersion": "banlieue.io/v1alpha1", "kind": "ProviderClass", "metadata": {"name": "vsphere"},
               "spec": {"component": {"source": "builtin:provider-vsphere"}, "infrastructureKind": "VSphere", "imageFormat": "vmdk",
                        "capabilities": {"http": true, "secrets": true}}}),
        json!({"apiVersion": "banlieue.io/v1alpha1", "kind": "ProviderClass", "metadata": {"name": "proxmox"},
               "spec": {"component": {"source": "builtin:provider-proxmox"}, "infrastructureKind": "Proxmox", "imageFormat": "source",
                        "capabilities": {"http": true, "secrets": true}}}),
        json!({"apiVersion": "banlieue.io/v1alpha1", "kind": "PlacementPolicy", "metadata": {"name": "spread"},
               "spec": {"component": {"source": "builtin:placement-spread"}}}),
        json!({"apiVersion": "banlieue.io/v1alpha1", "kind": "PlacementPolicy", "metadata": {"name": "binpack"},
               "spec": {"component": {"source": "builtin:placement-binpack"}}}),
        json!({"apiVersion": "banlieue.io/v1alpha1", "kind": "Provider", "metadata": {"name": "dev", "namespace": "default"},
               "spec": {"providerClassRef": {"name": "libvirt"}, "connection": {"endpoint": libvirt_uri},
                        "capabilities": {"storageClasses": {"standard": "default-pool"}, "networkClasses": {"default": "default"}}}}),
    ]
}

/// Server-side apply one object (any kind banlieue or Kubernetes serves).
pub(crate) async fn apply(client: &kube::Client, object: serde_json::Value) -> anyhow::Result<()> {
    let (group, version) = match object["apiVersion"].as_str().unwrap_or_default().split_once('/') {
        Some((g, v)) => (g.to_string(), v.to_string()),
        None => (String::new(), object["apiVersion"].as_str().unwrap_or_default().to_string()),
    };
    let kind = object["kind"].as_str().unwrap_or_default().to_string();
    // The plurals of every kind banlieue and the config files use.
    let lower = kind.to_ascii_lowercase();
    let plural = if lower.ends_with('s') {
        format!("{lower}es")
    } else if let Some(stem) = lower.strip_suffix('y') {
        format!("{stem}ies")
    } else {
        format!("{lower}s")
    };
    let resource = ApiResource::from_gvk_with_plural(&kube::api::GroupVersionKind::gvk(&group, &version, &kind), &plural);
    let name = object["metadata"]["name"].as_str().unwrap_or_default().to_string();
    let api: Api<DynamicObject> = match object["metadata"]["namespace"].as_str() {
        Some(ns) => Api::namespaced_with(client.clone(), ns, &resource),
        None => Api::all_with(client.clone(), &resource),
    };
    api.patch(&name, &PatchParams::apply(crate::crds::FIELD_MANAGER).force(), &Patch::Apply(&object))
        .await
        .with_context(|| format!("applying {kind} {name}"))?;
    Ok(())
}
