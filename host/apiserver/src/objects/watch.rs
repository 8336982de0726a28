//! Watches: a stream of `{"type", "object"}` lines from a resourceVersion, with
//! selector transitions, bookmarks, initial events, and `410 Gone` for a
//! resourceVersion older than the history.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, StreamBody};
use hyper::body::Frame;
use hyper::Response;
use serde_json::{json, Value};
use tokio::sync::{broadcast, mpsc};

use crate::objects::{served, served_json, Filter, Request};
use crate::schema::registry::ResourceType;
use crate::response::{error_response, Body};
use crate::status::ApiError;
use crate::storage::object::Object;
use crate::storage::store::{Event, EventType};

struct Watch {
    rt: Arc<ResourceType>,
    namespace: Option<String>,
    filter: Filter,
    table: bool,
    include_object: Option<String>,
    bookmarks: bool,
    last_rv: u64,
    tx: mpsc::Sender<Bytes>,
}

pub fn serve(req: Request) -> Response<Body> {
    match start(req) {
        Ok(r) => r,
        Err(e) => error_response(&e),
    }
}

fn start(req: Request) -> Result<Response<Body>, ApiError> {
    let q = |k: &str| req.query.get(k).map(String::as_str).filter(|s| !s.is_empty());
    let filter = Filter::from_request(&req)?;
    let from: Option<u64> = match q("resourceVersion") {
        None | Some("0") => None,
        Some(s) => Some(s.parse().map_err(|_| ApiError::bad_request(format!("invalid resourceVersion {s:?}")))?),
    };
    let send_initial = q("sendInitialEvents") == Some("true");
    if send_initial && q("resourceVersionMatch") != Some("NotOlderThan") {
        return Err(ApiError::invalid("WatchOptions", "", vec![("resourceVersionMatch".into(), "FieldValueForbidden".into(),
            "resourceVersionMatch: Forbidden: sendInitialEvents requires setting resourceVersionMatch to NotOlderThan".into())]));
    }
    let timeout = q("timeoutSeconds").and_then(|s| s.parse::<u64>().ok()).unwrap_or(1800).min(3600);
    let table = req.headers.get_all(hyper::header::ACCEPT).iter().any(|v| v.to_str().is_ok_and(|s| s.contains("as=Table")));
    let (tx, rx) = mpsc::channel::<Bytes>(256);
    let mut w = Watch {
        rt: req.rt.clone(),
        namespace: req.namespace.clone(),
        filter,
        table,
        include_object: q("includeObject").map(String::from),
        bookmarks: q("allowWatchBookmarks") == Some("true"),
        last_rv: 0,
        tx,
    };
    let store = &req.state.store;
    let key = req.rt.storage_key();
    // The starting point: current objects as ADDED (no or "0" resourceVersion, or
    // sendInitialEvents), otherwise the history after the given resourceVersion.
    let (initial, start_rv) = if from.is_none() || send_initial {
        let (items, rv) = store.list(&key, req.namespace.as_deref());
        (Some(items), rv)
    } else {
        (None, from.unwrap_or(0))
    };
    // A resource's history starts when it began to be served (a CRD's resources: when
    // the CRD was created), as kube-apiserver's watch cache of it does.
    let served_since = req.state.registry.read().unwrap().served_since(&key);
    let subscription = if initial.is_none() && start_rv < served_since { Err(served_since) } else { store.watch_from(start_rv) };
    let interval = req.state.config.bookmark_interval;
    let mut expired = store.expiries();
    expired.mark_unchanged();
    tracing::debug!(resource = %req.rt.kind, namespace = ?req.namespace, from = start_rv, ok = subscription.is_ok(), "watch");
    tokio::spawn(async move {
        let (past, live) = match subscription {
            Ok(s) => s,
            Err(oldest) => {
                let status = ApiError::gone(format!("too old resource version: {start_rv} ({oldest})")).to_status();
                let _ = w.tx.send(line("ERROR", &status)).await;
                return;
            }
        };
        w.last_rv = start_rv;
        if let Some(items) = initial {
            for obj in items {
                if w.filter.matches(&obj) && !w.emit("ADDED", &obj).await {
                    return;
                }
            }
            if send_initial {
                let mut b = w.bookmark();
                b["metadata"]["annotations"] = json!({"k8s.io/initial-events-end": "true"});
                if w.tx.send(line("BOOKMARK", &b)).await.is_err() {
                    return;
                }
            }
        }
        for ev in past {
            if !w.deliver(&ev).await {
                return;
            }
        }
        w.run(live, expired, interval, Duration::from_secs(timeout)).await;
    });
    let stream = futures::stream::unfold(rx, |mut rx| async move {
        rx.recv().await.map(|b| (Ok::<_, std::convert::Infallible>(Frame::data(b)), rx))
    });
    Ok(Response::builder()
        .status(200)
        .header("content-type", "application/json")
        .body(StreamBody::new(stream).boxed_unsync())
        .expect("valid response"))
}

fn line(etype: &str, obj: &Value) -> Bytes {
    let mut v = serde_json::to_vec(&json!({"type": etype, "object": obj})).unwrap_or_default();
    v.push(b'\n');
    Bytes::from(v)
}

/// An event line around an object's JSON text (`etype` needs no escaping).
fn object_line(etype: &str, json: &[u8]) -> Bytes {
    let mut v = Vec::with_capacity(json.len() + etype.len() + 24);
    v.extend_from_slice(b"{\"type\":\"");
    v.extend_from_slice(etype.as_bytes());
    v.extend_from_slice(b"\",\"object\":");
    v.extend_from_slice(json);
    v.extend_from_slice(b"}\n");
    Bytes::from(v)
}

impl Watch {
    async fn run(&mut self, mut live: broadcast::Receiver<Arc<Event>>, mut expired: tokio::sync::watch::Receiver<u64>, interval: Duration, timeout: Duration) {
        let deadline = tokio::time::sleep(timeout);
        tokio::pin!(deadline);
        let mut tick = tokio::time::interval(interval);
        tick.tick().await;
        loop {
            tokio::select! {
                ev = live.recv() => match ev {
                    Ok(ev) => if !self.deliver(&ev).await { return },
                    // Missed events: end the watch; the client resumes from its last resourceVersion.
                    Err(_) => return,
                },
                _ = tick.tick(), if self.bookmarks => {
                    let b = self.bookmark();
                    if self.tx.send(line("BOOKMARK", &b)).await.is_err() { return }
                }
                _ = &mut deadline => return,
                _ = self.tx.closed() => return,
                // The history was compacted past this watch: the client lists again.
                Ok(()) = expired.changed() => {
                    let status = ApiError::gone(format!("too old resource version: {} (compacted)", self.last_rv)).to_status();
                    let _ = self.tx.send(line("ERROR", &status)).await;
                    return;
                }
            }
        }
    }

    fn bookmark(&self) -> Value {
        json!({"kind": self.rt.kind, "apiVersion": self.rt.api_version(), "metadata": {"resourceVersion": self.last_rv.to_string()}})
    }

    /// Send one store event if it concerns this watch; false when the client is gone.
    async fn deliver(&mut self, ev: &Event) -> bool {
        if ev.key != self.rt.storage_key() || ev.rv <= self.last_rv {
            return true;
        }
        self.last_rv = ev.rv;
        if self.namespace.as_deref().is_some_and(|ns| ns != ev.object.namespace()) {
            return true;
        }
        let now = self.filter.matches(&ev.object);
        let before = ev.old.as_ref().is_some_and(|o| self.filter.matches(o));
        let etype = match (ev.etype, before, now) {
            (EventType::Added, _, true) => "ADDED",
            (EventType::Modified, true, true) => "MODIFIED",
            (EventType::Modified, false, true) => "ADDED",
            (EventType::Modified, true, false) => "DELETED",
            (EventType::Deleted, _, true) => "DELETED",
            _ => return true,
        };
        self.emit(etype, &ev.object).await
    }

    async fn emit(&self, etype: &str, obj: &Object) -> bool {
        let line = if self.table {
            let rv = obj.rv().to_string();
            let table = crate::schema::table::table(&self.rt, &[served(&self.rt, &obj.value())], json!({"resourceVersion": rv}), self.include_object.as_deref());
            line(etype, &table)
        } else {
            object_line(etype, &served_json(&self.rt, obj))
        };
        self.tx.send(line).await.is_ok()
    }
}
