//! An OTLP/HTTP trace receiver on 127.0.0.1 for tests and benchmarks: what banlieue's
//! exporter sends, decoded with OpenTelemetry's own protobuf definitions
//! (`opentelemetry-proto`), kept in memory; stopped on drop.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

/// An OTLP/HTTP receiver on 127.0.0.1: `POST /v1/traces` with a protobuf
/// `ExportTraceServiceRequest`, answered `200`; every span kept.
pub struct Receiver {
    pub url: String,
    spans: Arc<Mutex<Vec<Span>>>,
    task: tokio::task::JoinHandle<()>,
}

#[derive(Clone, Debug)]
pub struct Span {
    pub trace: Vec<u8>,
    pub id: Vec<u8>,
    pub parent: Vec<u8>,
    pub name: String,
    pub attributes: BTreeMap<String, String>,
}

impl Receiver {
    pub async fn start() -> anyhow::Result<Receiver> {
        use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
        use prost::Message;
        use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt};
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let url = format!("http://{}", listener.local_addr()?);
        let spans: Arc<Mutex<Vec<Span>>> = Arc::default();
        let kept = spans.clone();
        let task = tokio::spawn(async move {
            // The connections end with the receiver (this task aborted drops the set).
            let mut connections = tokio::task::JoinSet::new();
            while let Ok((stream, _)) = listener.accept().await {
                let kept = kept.clone();
                connections.spawn(async move {
                    let mut stream = tokio::io::BufReader::new(stream);
                    // Requests one after another on a kept-alive connection.
                    loop {
                        let mut length = 0usize;
                        let mut line = String::new();
                        loop {
                            line.clear();
                            if stream.read_line(&mut line).await.unwrap_or(0) == 0 {
                                return;
                            }
                            if line == "\r\n" {
                                break;
                            }
                            if let Some(v) = line.to_ascii_lowercase().strip_prefix("content-length:") {
                                length = v.trim().parse().unwrap_or(0);
                            }
                        }
                        let mut body = vec![0; length];
                        if stream.read_exact(&mut body).await.is_err() {
                            return;
                        }
                        if let Ok(req) = ExportTraceServiceRequest::decode(body.as_slice()) {
                            let mut kept = kept.lock().unwrap();
                            for span in req.resource_spans.iter().flat_map(|r| &r.scope_spans).flat_map(|s| &s.spans) {
                                let attributes = span
                                    .attributes
                                    .iter()
                                    .map(|kv| (kv.key.clone(), kv.value.as_ref().and_then(|v| v.value.as_ref()).map(any_value).unwrap_or_default()))
                                    .collect();
                                kept.push(Span { trace: span.trace_id.clone(), id: span.span_id.clone(), parent: span.parent_span_id.clone(), name: span.name.clone(), attributes });
                            }
                        }
                        let answer = "HTTP/1.1 200 OK\r\nContent-Type: application/x-protobuf\r\nContent-Length: 0\r\n\r\n";
                        if stream.get_mut().write_all(answer.as_bytes()).await.is_err() {
                            return;
                        }
                    }
                });
            }
        });
        Ok(Receiver { url, spans, task })
    }

    /// Every span received so far.
    pub fn spans(&self) -> Vec<Span> {
        self.spans.lock().unwrap().clone()
    }
}

impl Drop for Receiver {
    fn drop(&mut self) {
        self.task.abort();
    }
}

fn any_value(v: &opentelemetry_proto::tonic::common::v1::any_value::Value) -> String {
    use opentelemetry_proto::tonic::common::v1::any_value::Value as V;
    match v {
        V::StringValue(s) => s.clone(),
        V::IntValue(i) => i.to_string(),
        V::BoolValue(b) => b.to_string(),
        V::DoubleValue(d) => d.to_string(),
        other => format!("{other:?}"),
    }
}

