//! Long-lived connections, one per URI, each driven from async code on tokio's blocking pool.
//!
//! libvirt calls block (a remote URI does network round trips), so none of them runs on the async
//! executor: each call runs on `spawn_blocking`, bounded by a timeout. A libvirt connection is
//! thread-safe and its RPC carries concurrent calls, so calls on one URI run side by side (ten
//! domain starts need not queue behind each other); libvirt keeps the last error per thread, so
//! each call reads its own. A call that times out keeps its blocking thread until libvirt returns.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, Once};
use std::time::Duration;

use virt::connect::Connect;
use virt::error::Error as VirtError;

use crate::error::{LibvirtError, Result, connection_lost};

/// How long one call (including opening the connection) may take by default.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(30);

/// The connections of this host, one per libvirt URI, opened on first use.
pub struct Connections {
    by_uri: Mutex<HashMap<String, Libvirt>>,
    timeout: Duration,
}

impl Default for Connections {
    fn default() -> Self {
        Self::new()
    }
}

impl Connections {
    /// Connections whose calls are bounded by [`DEFAULT_TIMEOUT`].
    pub fn new() -> Self {
        Self::with_timeout(DEFAULT_TIMEOUT)
    }

    /// Connections whose calls (and opens) are bounded by `timeout`.
    pub fn with_timeout(timeout: Duration) -> Self {
        // libvirt's default error handler prints every error to stderr; we return them instead.
        static QUIET: Once = Once::new();
        QUIET.call_once(virt::error::clear_error_callback);
        Connections {
            by_uri: Mutex::new(HashMap::new()),
            timeout,
        }
    }

    /// The connection to `uri`, opened now if this is the first time it is asked for.
    ///
    /// A URI that cannot be opened (unknown driver, refused, no answer within the timeout) is
    /// `Unavailable` and is not kept, so the next `get` tries again. Once open, a connection that
    /// dies is reopened by the next call made on it.
    pub async fn get(&self, uri: &str) -> Result<Libvirt> {
        check_c_string("uri", uri)?;
        let libvirt = {
            let mut by_uri = self.by_uri.lock().unwrap_or_else(|e| e.into_inner());
            if let Some(libvirt) = by_uri.get(uri) {
                return Ok(libvirt.clone());
            }
            let libvirt = Libvirt::new(uri, self.timeout);
            by_uri.insert(uri.to_string(), libvirt.clone());
            libvirt
        };
        match libvirt.run("open", |_| Ok(())).await {
            Ok(()) => Ok(libvirt),
            Err(err) => {
                let mut by_uri = self.by_uri.lock().unwrap_or_else(|e| e.into_inner());
                if by_uri
                    .get(uri)
                    .is_some_and(|kept| Arc::ptr_eq(&kept.inner, &libvirt.inner))
                {
                    by_uri.remove(uri);
                }
                Err(match err {
                    LibvirtError::Unavailable(m) => LibvirtError::Unavailable(m),
                    other => LibvirtError::Unavailable(other.to_string()),
                })
            }
        }
    }
}

/// One libvirt connection, shared by clones; reopened on the next call after it dies.
#[derive(Clone)]
pub struct Libvirt {
    inner: Arc<Inner>,
}

struct Inner {
    uri: String,
    timeout: Duration,
    /// `None` until opened, and again after the connection was lost.
    conn: Arc<Mutex<Option<Arc<Conn>>>>,
}

impl std::fmt::Debug for Libvirt {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Libvirt")
            .field("uri", &self.inner.uri)
            .finish_non_exhaustive()
    }
}

impl Libvirt {
    fn new(uri: &str, timeout: Duration) -> Self {
        Libvirt {
            inner: Arc::new(Inner {
                uri: uri.to_string(),
                timeout,
                conn: Arc::new(Mutex::new(None)),
            }),
        }
    }

    /// The URI this connection was opened with.
    pub fn uri(&self) -> &str {
        &self.inner.uri
    }

    /// How long one call may take.
    pub fn timeout(&self) -> Duration {
        self.inner.timeout
    }

    /// Run `call` on the blocking pool with the open connection, within the timeout.
    pub(crate) async fn run<T, F>(&self, op: &'static str, call: F) -> Result<T>
    where
        T: Send + 'static,
        F: FnOnce(&Connect) -> std::result::Result<T, VirtError> + Send + 'static,
    {
        self.run_within(op, self.inner.timeout, call).await
    }

    /// [`run`](Self::run) with its own time limit (long transfers).
    pub(crate) async fn run_within<T, F>(&self, op: &'static str, timeout: std::time::Duration, call: F) -> Result<T>
    where
        T: Send + 'static,
        F: FnOnce(&Connect) -> std::result::Result<T, VirtError> + Send + 'static,
    {
        let uri = self.inner.uri.clone();
        let slot = self.inner.conn.clone();
        let current = slot.lock().unwrap_or_else(|e| e.into_inner()).clone();
        let work = async move {
            tokio::task::spawn_blocking(move || {
                // (Re)open here, on the blocking thread: a dead or missing connection is replaced,
                // and the replacement kept unless another call already put a newer one in place.
                let conn = match current.filter(|c| c.0.is_alive().unwrap_or(false)) {
                    Some(c) => c,
                    None => {
                        let opened = Connect::open(Some(&uri)).map_err(|e| {
                            LibvirtError::Unavailable(format!("cannot open {uri}: {}", e.message()))
                        })?;
                        let fresh = Arc::new(Conn(opened));
                        let mut kept = slot.lock().unwrap_or_else(|e| e.into_inner());
                        match kept.as_ref().filter(|c| c.0.is_alive().unwrap_or(false)) {
                            Some(newer) => newer.clone(),
                            None => {
                                *kept = Some(fresh.clone());
                                fresh
                            }
                        }
                    }
                };
                call(&conn.0).map_err(|e| {
                    if connection_lost(&e) {
                        let mut kept = slot.lock().unwrap_or_else(|e| e.into_inner());
                        if kept.as_ref().is_some_and(|c| Arc::ptr_eq(c, &conn)) {
                            *kept = None;
                        }
                    }
                    LibvirtError::from_virt(&uri, &e)
                })
            })
            .await
            .map_err(|e| LibvirtError::Internal(format!("libvirt {op} failed: {e}")))?
        };
        // One span per libvirt call: a trace of a driver call shows each one it made.
        use tracing::Instrument;
        let span = tracing::info_span!("libvirt", otel.name = %format!("libvirt {op}"), otel.kind = "client", libvirt.operation = op, libvirt.uri = %self.inner.uri);
        tokio::time::timeout(timeout, work).instrument(span).await.map_err(|_| {
            LibvirtError::Unavailable(format!(
                "libvirt {op} on {} did not finish within {timeout:?}",
                self.inner.uri
            ))
        })?
    }
}

/// An open `virConnectPtr`, closed when dropped (virt's `Connect` does not close itself).
pub(crate) struct Conn(pub(crate) Connect);

impl Libvirt {
    /// Run `call` on a connection of its own to the same URI (opened for it, handed back with
    /// the result and closed when dropped): for a console's stream, whose blocking reads
    /// must never hold up the calls every reconcile makes on the shared connection.
    pub(crate) async fn run_alone<T, F>(&self, op: &'static str, call: F) -> Result<(T, Arc<Conn>)>
    where
        T: Send + 'static,
        F: FnOnce(&Connect) -> std::result::Result<T, VirtError> + Send + 'static,
    {
        let uri = self.inner.uri.clone();
        let timeout = self.inner.timeout;
        let work = tokio::task::spawn_blocking(move || {
            let conn = Arc::new(Conn(Connect::open(Some(&uri)).map_err(|e| LibvirtError::Unavailable(format!("cannot open {uri}: {}", e.message())))?));
            let value = call(&conn.0).map_err(|e| LibvirtError::from_virt(&uri, &e))?;
            Ok((value, conn))
        });
        match tokio::time::timeout(timeout, work).await {
            Ok(done) => done.map_err(|e| LibvirtError::Internal(format!("libvirt {op} failed: {e}")))?,
            Err(_) => Err(LibvirtError::Unavailable(format!("libvirt {op} on {} did not finish within {timeout:?}", self.inner.uri))),
        }
    }
}

impl Drop for Conn {
    fn drop(&mut self) {
        if let Err(e) = self.0.close() {
            tracing::debug!(error = %e.message(), "closing libvirt connection");
        }
    }
}

/// libvirt takes C strings: an interior NUL would make the bindings panic, so refuse it here.
pub(crate) fn check_c_string(what: &str, value: &str) -> Result<()> {
    if value.contains('\0') {
        return Err(LibvirtError::Invalid(format!("{what} contains a NUL byte")));
    }
    Ok(())
}
