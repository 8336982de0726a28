//! The embedded API server as a process of its own, for tests that SIGKILL and restart it:
//! `banlieue-test-apiserver DATA_DIR ADDR`. Objects and credentials are kept in DATA_DIR (so a
//! restart on the same address serves the same kubeconfig), the kubeconfig is written to
//! DATA_DIR/kubeconfig and `listening` is printed once it serves. SIGUSR1 ends every open
//! watch with `410 Gone` and compacts the history (a watch-expiry storm). Runs until killed.

fn main() -> anyhow::Result<()> {
    let mut args = std::env::args().skip(1);
    let (Some(dir), Some(addr)) = (args.next(), args.next()) else {
        anyhow::bail!("usage: banlieue-test-apiserver DATA_DIR ADDR");
    };
    let dir = std::path::PathBuf::from(dir);
    // Logs on stderr (the test keeps them next to the data) when RUST_LOG asks.
    if std::env::var_os("RUST_LOG").is_some() {
        let _ = tracing_subscriber::fmt().with_env_filter(tracing_subscriber::EnvFilter::from_default_env()).with_writer(std::io::stderr).try_init();
    }
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build()?;
    rt.block_on(async {
        let server = banlieue_apiserver::ApiServer::start(banlieue_apiserver::Config {
            addr: addr.parse()?,
            data_dir: Some(dir.join("store")),
            watch_history: banlieue_tests::TEST_WATCH_HISTORY,
            bookmark_interval: std::time::Duration::from_millis(500),
            ..Default::default()
        })
        .await?;
        server.write_kubeconfig(&dir.join("kubeconfig"))?;
        println!("listening");
        let mut expire = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::user_defined1())?;
        while expire.recv().await.is_some() {
            server.expire_watches();
        }
        Ok(())
    })
}
