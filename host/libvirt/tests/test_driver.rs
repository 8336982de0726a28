//! Against libvirt's `test:///default` driver, whose state lives as long as the connection: one
//! domain `test` (running), pool `default-pool`, network `default`, a 16-CPU i686 node.

use std::net::TcpListener;
use std::sync::mpsc;
use std::time::{Duration, Instant};

use banlieue_libvirt::{Connections, DomainState, Libvirt, LibvirtError};

const URI: &str = "test:///default";

fn domain_xml(name: &str) -> String {
    format!(
        "<domain type='test'><name>{name}</name><memory unit='KiB'>65536</memory>\
         <vcpu>2</vcpu><os><type>hvm</type></os></domain>"
    )
}

async fn libvirt() -> Libvirt {
    Connections::new()
        .get(URI)
        .await
        .expect("open test:///default")
}

#[tokio::test]
async fn domain_lifecycle() {
    let connections = Connections::new();
    let libvirt = connections.get(URI).await.unwrap();
    assert_eq!(libvirt.uri(), URI);

    let defined = libvirt.domain_define(domain_xml("vm-a")).await.unwrap();
    assert_eq!(defined.name, "vm-a");
    assert_eq!(defined.state, DomainState::Shutoff);
    assert_eq!((defined.vcpus, defined.memory_kib), (2, 65536));
    assert_eq!(defined.uuid.len(), 36);

    // The same URI gives the same connection, so the definition is still there.
    let again = connections.get(URI).await.unwrap();
    let names: Vec<_> = again
        .domain_list()
        .await
        .unwrap()
        .into_iter()
        .map(|d| d.name)
        .collect();
    assert!(
        names.contains(&"vm-a".to_string()) && names.contains(&"test".to_string()),
        "{names:?}"
    );

    libvirt.domain_start("vm-a").await.unwrap();
    assert_eq!(
        libvirt.domain_state("vm-a").await.unwrap(),
        DomainState::Running
    );
    assert!(
        libvirt
            .domain_xml("vm-a")
            .await
            .unwrap()
            .contains("<name>vm-a</name>")
    );

    libvirt.domain_shutdown("vm-a").await.unwrap();
    assert_eq!(
        libvirt.domain_state("vm-a").await.unwrap(),
        DomainState::Shutoff
    );

    libvirt.domain_start("vm-a").await.unwrap();
    libvirt.domain_destroy("vm-a").await.unwrap();
    assert_eq!(
        libvirt.domain_state("vm-a").await.unwrap(),
        DomainState::Shutoff
    );

    libvirt.domain_undefine("vm-a").await.unwrap();
    assert!(matches!(
        libvirt.domain_state("vm-a").await,
        Err(LibvirtError::NotFound(_))
    ));
}

#[tokio::test]
async fn domain_errors() {
    let libvirt = libvirt().await;
    for result in [
        libvirt.domain_state("missing").await.map(drop),
        libvirt.domain_start("missing").await,
        libvirt.domain_xml("missing").await.map(drop),
        libvirt.domain_undefine("missing").await,
    ] {
        assert!(
            matches!(result, Err(LibvirtError::NotFound(_))),
            "{result:?}"
        );
    }
    let bad = libvirt
        .domain_define("<domain type='test'><name>x".into())
        .await;
    assert!(matches!(bad, Err(LibvirtError::Invalid(_))), "{bad:?}");
    let nul = libvirt.domain_state("a\0b").await;
    assert!(matches!(nul, Err(LibvirtError::Invalid(_))), "{nul:?}");

    libvirt.domain_define(domain_xml("vm-off")).await.unwrap();
    let not_running = libvirt.domain_destroy("vm-off").await;
    assert!(
        matches!(not_running, Err(LibvirtError::Invalid(_))),
        "{not_running:?}"
    );
}

#[tokio::test]
async fn volumes_in_the_default_pool() {
    let libvirt = libvirt().await;
    let pools = libvirt.pool_list().await.unwrap();
    let pool = pools
        .iter()
        .find(|p| p.name == "default-pool")
        .expect("default-pool");
    assert!(
        pool.active && pool.capacity_bytes > 0 && pool.available_bytes > 0,
        "{pool:?}"
    );

    let xml = "<volume><name>disk-a.img</name><capacity unit='bytes'>1048576</capacity></volume>";
    let created = libvirt
        .volume_create("default-pool", xml.into())
        .await
        .unwrap();
    assert_eq!(created.name, "disk-a.img");
    assert_eq!(created.capacity_bytes, 1048576);
    assert!(
        created.path.ends_with("disk-a.img") && !created.key.is_empty(),
        "{created:?}"
    );

    let listed = libvirt.volume_list("default-pool").await.unwrap();
    assert_eq!(listed, vec![created.clone()]);

    // The test driver has no virStorageVolUpload: that is a permanent refusal, not "not found".
    let upload = libvirt
        .volume_upload("default-pool", "disk-a.img", vec![7; 4096])
        .await;
    assert!(
        matches!(&upload, Err(LibvirtError::Invalid(m)) if m.contains("not supported")),
        "{upload:?}"
    );
    let missing = libvirt
        .volume_upload("default-pool", "nope.img", vec![1])
        .await;
    assert!(
        matches!(missing, Err(LibvirtError::NotFound(_))),
        "{missing:?}"
    );

    libvirt
        .volume_delete("default-pool", "disk-a.img")
        .await
        .unwrap();
    assert!(
        libvirt
            .volume_list("default-pool")
            .await
            .unwrap()
            .is_empty()
    );
    let gone = libvirt.volume_delete("default-pool", "disk-a.img").await;
    assert!(matches!(gone, Err(LibvirtError::NotFound(_))), "{gone:?}");
    let no_pool = libvirt.volume_list("no-such-pool").await;
    assert!(
        matches!(no_pool, Err(LibvirtError::NotFound(_))),
        "{no_pool:?}"
    );
    let bad = libvirt
        .volume_create("default-pool", "<volume>".into())
        .await;
    assert!(matches!(bad, Err(LibvirtError::Invalid(_))), "{bad:?}");
}

#[tokio::test]
async fn networks_and_node() {
    let libvirt = libvirt().await;
    let networks = libvirt.network_list().await.unwrap();
    let default = networks
        .iter()
        .find(|n| n.name == "default")
        .expect("default network");
    assert!(default.active);
    assert_eq!(default.bridge.as_deref(), Some("virbr0"));

    let node = libvirt.node_info().await.unwrap();
    assert_eq!(
        (node.cpus, node.memory_kib, node.model.as_str()),
        (16, 3145728, "i686")
    );
    assert!(!node.hostname.is_empty());
}

/// One thread runs the executor: if a call blocked it, the interval would stop ticking.
#[tokio::test(flavor = "current_thread")]
async fn many_calls_leave_the_executor_free() {
    let libvirt = libvirt().await;
    let mut interval = tokio::time::interval(Duration::from_millis(2));
    let mut calls = tokio::task::JoinSet::new();
    for i in 0..50 {
        let libvirt = libvirt.clone();
        calls.spawn(async move {
            match i % 3 {
                0 => libvirt.domain_list().await.map(|l| assert!(!l.is_empty())),
                1 => libvirt.node_info().await.map(drop),
                _ => libvirt
                    .domain_state("test")
                    .await
                    .map(|s| assert_eq!(s, DomainState::Running)),
            }
        });
    }
    let mut ticks = 0;
    let mut done = 0;
    while done < 50 {
        tokio::select! {
            _ = interval.tick() => ticks += 1,
            Some(result) = calls.join_next() => {
                result.unwrap().unwrap();
                done += 1;
            }
        }
    }
    assert!(ticks >= 1, "the interval never ticked");
}

/// A peer that accepts connections and never answers, like a wedged libvirtd.
struct SilentPeer {
    port: u16,
    stop: mpsc::Sender<()>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl SilentPeer {
    fn start() -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        listener.set_nonblocking(true).unwrap();
        let port = listener.local_addr().unwrap().port();
        let (stop, stopped) = mpsc::channel();
        let thread = std::thread::spawn(move || {
            let mut held = Vec::new();
            while stopped.recv_timeout(Duration::from_millis(10)).is_err() {
                if let Ok((stream, _)) = listener.accept() {
                    held.push(stream);
                }
            }
            // Dropping the sockets lets the blocked libvirt call see EOF and return.
        });
        SilentPeer {
            port,
            stop,
            thread: Some(thread),
        }
    }
}

impl Drop for SilentPeer {
    fn drop(&mut self) {
        let _ = self.stop.send(());
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

#[tokio::test(flavor = "current_thread")]
async fn a_silent_hypervisor_times_out_without_stalling_the_executor() {
    let peer = SilentPeer::start();
    let connections = Connections::with_timeout(Duration::from_millis(800));
    let uri = format!("test+tcp://127.0.0.1:{}/default", peer.port);

    let started = Instant::now();
    let ticker = tokio::spawn(async {
        let mut interval = tokio::time::interval(Duration::from_millis(10));
        let mut ticks = 0u32;
        loop {
            interval.tick().await;
            ticks += 1;
            if ticks == 40 {
                return;
            }
        }
    });
    let result = connections.get(&uri).await;
    let elapsed = started.elapsed();
    assert!(
        matches!(&result, Err(LibvirtError::Unavailable(m)) if m.contains("within")),
        "{result:?}"
    );
    assert!(elapsed < Duration::from_secs(3), "took {elapsed:?}");
    // 40 ticks of 10 ms fit in the 800 ms the call was stuck.
    assert!(
        ticker.is_finished(),
        "the executor stalled while libvirt was blocked"
    );
    drop(peer);
}

#[tokio::test]
async fn unreachable_uris_are_unavailable_quickly() {
    let connections = Connections::new();
    let closed_port = {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        listener.local_addr().unwrap().port()
    };
    for uri in [
        "bogus:///nothing".to_string(),
        format!("test+tcp://127.0.0.1:{closed_port}/default"),
    ] {
        let started = Instant::now();
        let result = connections.get(&uri).await;
        assert!(
            matches!(result, Err(LibvirtError::Unavailable(_))),
            "{uri}: {result:?}"
        );
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "{uri} took {:?}",
            started.elapsed()
        );
    }
}

#[tokio::test]
async fn a_metadata_mark_is_set_on_a_running_domain_kept_across_a_restart_and_removed() {
    let libvirt = libvirt().await;
    let uri = "https://banlieue.io/test/mark/v1";
    libvirt.domain_define(domain_xml("vm-mark")).await.unwrap();
    libvirt.domain_start("vm-mark").await.unwrap();
    let mark = "<mark owner='ns/web'/>".to_string();
    libvirt.domain_set_metadata("vm-mark", uri, "m", Some(mark)).await.unwrap();
    let live = libvirt.domain_xml("vm-mark").await.unwrap();
    assert!(live.contains("<m:mark xmlns:m=\"https://banlieue.io/test/mark/v1\" owner=\"ns/web\"/>"), "the running domain shows it: {live}");
    // The persistent definition has it too: still there once the domain is off.
    libvirt.domain_destroy("vm-mark").await.unwrap();
    assert!(libvirt.domain_xml("vm-mark").await.unwrap().contains("owner=\"ns/web\""));
    libvirt.domain_set_metadata("vm-mark", uri, "m", None).await.unwrap();
    assert!(!libvirt.domain_xml("vm-mark").await.unwrap().contains("owner="));
    assert!(matches!(libvirt.domain_set_metadata("no-such-vm", uri, "m", None).await, Err(LibvirtError::NotFound(_))));
    libvirt.domain_undefine("vm-mark").await.unwrap();
}
