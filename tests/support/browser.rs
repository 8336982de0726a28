//! A real browser for tests of banlieue's web pages: headless Chromium, driven through the
//! Chrome DevTools Protocol over its websocket — navigate, evaluate JavaScript, type,
//! wait (bounded, by polling) and take screenshots. Chromium (and every process it started)
//! is killed when the [`Browser`] is dropped.

use std::collections::HashMap;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use base64::Engine;
use futures::stream::SplitSink;
use futures::{SinkExt, StreamExt};
use serde_json::{json, Value};
use tokio::net::TcpStream;
use tokio::sync::oneshot;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::WebSocketStream;

/// How long one DevTools command may take.
const CALL_SECS: u64 = 30;
/// How long Chromium may take to start listening.
const START_SECS: u64 = 30;

type Replies = Arc<Mutex<HashMap<u64, oneshot::Sender<Value>>>>;

/// A headless Chromium with one page, and a DevTools session on that page.
pub struct Browser {
    chromium: Chromium,
    sink: tokio::sync::Mutex<SplitSink<WebSocketStream<TcpStream>, Message>>,
    replies: Replies,
    next_id: AtomicU64,
    session: String,
    log: Arc<Mutex<Vec<String>>>,
    reader: tokio::task::JoinHandle<()>,
}

impl Browser {
    /// Start `chromium` (from `PATH`; `BANLIEUE_TEST_CHROMIUM` names another binary) with a
    /// profile of its own, certificate errors ignored (test servers' certificates are
    /// their own), and attach to its page.
    pub async fn start() -> anyhow::Result<Browser> {
        let binary = std::env::var("BANLIEUE_TEST_CHROMIUM").unwrap_or_else(|_| "chromium".into());
        let dir = tempfile::tempdir()?;
        let stderr = std::fs::File::create(dir.path().join("chromium.log"))?;
        let mut command = Command::new(&binary);
        command
            .args(["--headless=new", "--no-sandbox", "--remote-debugging-port=0", "--ignore-certificate-errors"])
            .args(["--no-first-run", "--no-default-browser-check", "--disable-gpu", "--window-size=1280,960"])
            .arg(format!("--user-data-dir={}", dir.path().join("profile").display()))
            .arg("about:blank")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(stderr);
        // A process group of its own: its renderers and helpers are killed with it.
        std::os::unix::process::CommandExt::process_group(&mut command, 0);
        let child = command.spawn().with_context(|| format!("starting {binary} (scripts/install-deps.sh installs Debian's chromium)"))?;
        let mut chromium = Chromium { child, dir };

        // Chromium writes the port it listens on, and the browser's path, to DevToolsActivePort.
        let port_file = chromium.dir.path().join("profile/DevToolsActivePort");
        let deadline = Instant::now() + Duration::from_secs(START_SECS);
        let (port, path) = loop {
            if let Ok(text) = std::fs::read_to_string(&port_file) {
                let mut lines = text.lines();
                if let (Some(port), Some(path)) = (lines.next(), lines.next()) {
                    break (port.trim().parse::<u16>().context("DevToolsActivePort")?, path.trim().to_string());
                }
            }
            if let Some(status) = chromium.child.try_wait()? {
                bail!("{binary} exited ({status}) before listening: {}", chromium.log());
            }
            if Instant::now() > deadline {
                bail!("{binary} did not listen for DevTools within {START_SECS}s: {}", chromium.log());
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        };

        let url = format!("ws://127.0.0.1:{port}{path}");
        let tcp = crate::within(CALL_SECS, TcpStream::connect(("127.0.0.1", port))).await??;
        let (socket, _) = crate::within(CALL_SECS, tokio_tungstenite::client_async(url.as_str(), tcp)).await?.with_context(|| format!("DevTools at {url}"))?;
        let (sink, mut stream) = socket.split();
        let replies: Replies = Arc::default();
        let log: Arc<Mutex<Vec<String>>> = Arc::default();
        let (replies_, log_) = (replies.clone(), log.clone());
        let reader = tokio::spawn(async move {
            while let Some(Ok(message)) = stream.next().await {
                let Message::Text(text) = message else { continue };
                let Ok(value) = serde_json::from_str::<Value>(text.as_str()) else { continue };
                if let Some(id) = value.get("id").and_then(Value::as_u64) {
                    if let Some(reply) = replies_.lock().unwrap_or_else(|e| e.into_inner()).remove(&id) {
                        let _ = reply.send(value);
                    }
                } else if let Some(line) = log_line(&value) {
                    log_.lock().unwrap_or_else(|e| e.into_inner()).push(line);
                }
            }
            // The browser is gone: every call waiting is answered with an error.
            replies_.lock().unwrap_or_else(|e| e.into_inner()).clear();
        });
        let mut browser = Browser {
            chromium,
            sink: tokio::sync::Mutex::new(sink),
            replies,
            next_id: AtomicU64::new(1),
            session: String::new(),
            log,
            reader,
        };

        // Attach to the page (a flat session on the browser's connection).
        let targets = browser.call("Target.getTargets", json!({})).await?;
        let page = targets["targetInfos"]
            .as_array()
            .and_then(|t| t.iter().find(|t| t["type"] == "page"))
            .and_then(|t| t["targetId"].as_str())
            .map(String::from)
            .with_context(|| format!("no page among the browser's targets: {targets}"))?;
        let attached = browser.call("Target.attachToTarget", json!({"targetId": page, "flatten": true})).await?;
        browser.session = attached["sessionId"].as_str().context("Target.attachToTarget: no sessionId")?.to_string();
        for domain in ["Page.enable", "Runtime.enable", "Log.enable"] {
            browser.call(domain, json!({})).await?;
        }
        Ok(browser)
    }

    /// One DevTools command on the page (bounded); its result.
    pub async fn call(&self, method: &str, params: Value) -> anyhow::Result<Value> {
        if self.reader.is_finished() {
            bail!("{method}: the browser closed its connection: {}", self.chromium.log());
        }
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let (tx, rx) = oneshot::channel();
        self.replies.lock().unwrap_or_else(|e| e.into_inner()).insert(id, tx);
        let mut message = json!({"id": id, "method": method, "params": params});
        if !self.session.is_empty() {
            message["sessionId"] = Value::String(self.session.clone());
        }
        let sent = crate::within(CALL_SECS, async { self.sink.lock().await.send(Message::text(message.to_string())).await }).await;
        if !matches!(sent, Ok(Ok(()))) {
            self.replies.lock().unwrap_or_else(|e| e.into_inner()).remove(&id);
            bail!("{method}: the browser's connection is gone ({sent:?}): {}", self.chromium.log());
        }
        let reply = match tokio::time::timeout(Duration::from_secs(CALL_SECS), rx).await {
            Ok(Ok(reply)) => reply,
            Ok(Err(_)) => bail!("{method}: the browser closed its connection: {}", self.chromium.log()),
            Err(_) => {
                self.replies.lock().unwrap_or_else(|e| e.into_inner()).remove(&id);
                bail!("{method}: no answer within {CALL_SECS}s: {}", self.chromium.log());
            }
        };
        if let Some(error) = reply.get("error") {
            bail!("{method}: {error}");
        }
        Ok(reply["result"].clone())
    }

    /// Go to `url` and wait until its document has loaded.
    pub async fn navigate(&self, url: &str) -> anyhow::Result<()> {
        let result = self.call("Page.navigate", json!({"url": url})).await?;
        if let Some(error) = result["errorText"].as_str().filter(|e| !e.is_empty()) {
            bail!("navigating to {url}: {error}");
        }
        self.wait_until(&format!("document.readyState === 'complete' && location.href === new URL({}).href", json!(url)), CALL_SECS).await?;
        Ok(())
    }

    /// Navigate to `url` until `ready` (a JavaScript condition) holds, within `secs`: a load
    /// Chromium cut off (`ERR_NETWORK_CHANGED` when the machine's network interfaces change,
    /// as libvirt adds and removes guests' tap devices) is tried again.
    pub async fn navigate_until(&self, url: &str, ready: &str, secs: u64) -> anyhow::Result<()> {
        let deadline = Instant::now() + Duration::from_secs(secs);
        loop {
            self.navigate(url).await?;
            let left = deadline.saturating_duration_since(Instant::now()).as_secs();
            match self.wait_until(ready, left.clamp(1, 10)).await {
                Ok(_) => return Ok(()),
                Err(e) if Instant::now() >= deadline => return Err(e),
                Err(_) => {}
            }
        }
    }

    /// The value of the JavaScript expression `js` in the page (a promise is awaited), as JSON;
    /// an exception it throws is an error.
    pub async fn evaluate(&self, js: &str) -> anyhow::Result<Value> {
        let result = self.call("Runtime.evaluate", json!({"expression": js, "awaitPromise": true, "returnByValue": true})).await?;
        if let Some(exception) = result.get("exceptionDetails") {
            let what = exception["exception"]["description"].as_str().or(exception["text"].as_str()).unwrap_or("an exception");
            bail!("evaluating {}: {what}", short(js));
        }
        Ok(result["result"].get("value").cloned().unwrap_or(Value::Null))
    }

    /// Poll `js` until its value is truthy, for at most `secs` seconds; that value.
    pub async fn wait_until(&self, js: &str, secs: u64) -> anyhow::Result<Value> {
        let deadline = Instant::now() + Duration::from_secs(secs);
        loop {
            let last = self.evaluate(js).await;
            match &last {
                Ok(v) if truthy(v) => return Ok(v.clone()),
                // (An exception while the page is still loading is not the end.)
                _ if Instant::now() < deadline => tokio::time::sleep(Duration::from_millis(200)).await,
                _ => {
                    let log = self.console_log();
                    bail!("{} did not hold within {secs}s (last: {last:?}); the page's log:\n{}", short(js), log[log.len().saturating_sub(30)..].join("\n"))
                }
            }
        }
    }

    /// Type `text` into the focused element: its lines as text input, each `\n` as the Enter key.
    pub async fn type_text(&self, text: &str) -> anyhow::Result<()> {
        for (i, line) in text.split('\n').enumerate() {
            if i > 0 {
                for kind in ["keyDown", "keyUp"] {
                    let mut key = json!({"type": kind, "key": "Enter", "code": "Enter", "windowsVirtualKeyCode": 13, "nativeVirtualKeyCode": 13});
                    if kind == "keyDown" {
                        key["text"] = json!("\r");
                    }
                    self.call("Input.dispatchKeyEvent", key).await?;
                }
            }
            if !line.is_empty() {
                self.call("Input.insertText", json!({"text": line})).await?;
            }
        }
        Ok(())
    }

    /// A PNG of what the element `selector` (CSS) shows.
    pub async fn screenshot(&self, selector: &str) -> anyhow::Result<Vec<u8>> {
        let rect = self
            .evaluate(&format!(
                "(() => {{ const e = document.querySelector({}); if (!e) return null; const r = e.getBoundingClientRect(); \
                 return {{x: r.x + scrollX, y: r.y + scrollY, width: r.width, height: r.height}}; }})()",
                json!(selector)
            ))
            .await?;
        if rect.is_null() || rect["width"].as_f64().unwrap_or(0.0) < 1.0 || rect["height"].as_f64().unwrap_or(0.0) < 1.0 {
            bail!("no element {selector} to take a picture of (its box: {rect})");
        }
        let clip = json!({"x": rect["x"], "y": rect["y"], "width": rect["width"], "height": rect["height"], "scale": 1});
        let shot = self.call("Page.captureScreenshot", json!({"format": "png", "clip": clip, "captureBeyondViewport": true})).await?;
        let data = shot["data"].as_str().context("Page.captureScreenshot: no data")?;
        Ok(base64::engine::general_purpose::STANDARD.decode(data)?)
    }

    /// How many distinct colours a PNG has (at most 1000 counted), decoded by the browser in
    /// the page (whose Content-Security-Policy must allow `data:` images): 1 is a blank picture.
    pub async fn distinct_colors(&self, png: &[u8]) -> anyhow::Result<u64> {
        let data = base64::engine::general_purpose::STANDARD.encode(png);
        let count = self
            .evaluate(&format!(
                "(async () => {{ const img = new Image(); img.src = 'data:image/png;base64,{data}'; await img.decode(); \
                 const c = document.createElement('canvas'); c.width = img.naturalWidth; c.height = img.naturalHeight; \
                 const g = c.getContext('2d'); g.drawImage(img, 0, 0); const d = g.getImageData(0, 0, c.width, c.height).data; \
                 const seen = new Set(); for (let i = 0; i < d.length && seen.size < 1000; i += 4) seen.add((d[i] << 16) | (d[i + 1] << 8) | d[i + 2]); \
                 return seen.size; }})()"
            ))
            .await?;
        count.as_u64().with_context(|| format!("counting colours: {count}"))
    }

    /// What the page logged so far (console messages, exceptions, the browser's own notes
    /// such as Content-Security-Policy refusals), one line each.
    pub fn console_log(&self) -> Vec<String> {
        self.log.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// The end of what Chromium printed (for failure messages).
    pub fn chromium_log(&self) -> String {
        self.chromium.log()
    }
}

impl Drop for Browser {
    fn drop(&mut self) {
        self.reader.abort();
    }
}

/// The Chromium process and its profile directory: killed, with every process it started,
/// when dropped.
struct Chromium {
    child: Child,
    dir: tempfile::TempDir,
}

impl Chromium {
    /// The last lines Chromium printed.
    fn log(&self) -> String {
        let text = std::fs::read_to_string(self.dir.path().join("chromium.log")).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(20)..].join("\n")
    }
}

impl Drop for Chromium {
    fn drop(&mut self) {
        // Its process group, whose id is Chromium's PID (renderers, GPU and network
        // processes), then Chromium itself, reaped.
        let _ = Command::new("kill").args(["-KILL", "--", &format!("-{}", self.child.id())]).stderr(Stdio::null()).status();
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The start of a (long) script, for messages.
fn short(js: &str) -> String {
    match js.char_indices().nth(300) {
        Some((end, _)) => format!("{}…", &js[..end]),
        None => js.to_string(),
    }
}

/// JavaScript's truthiness of a JSON value.
fn truthy(v: &Value) -> bool {
    match v {
        Value::Null => false,
        Value::Bool(b) => *b,
        Value::Number(n) => n.as_f64().is_some_and(|f| f != 0.0),
        Value::String(s) => !s.is_empty(),
        Value::Array(_) | Value::Object(_) => true,
    }
}

/// A line for the page's log, from a DevTools event that is one.
fn log_line(event: &Value) -> Option<String> {
    let params = &event["params"];
    match event["method"].as_str()? {
        "Runtime.consoleAPICalled" => {
            let args: Vec<String> = params["args"]
                .as_array()
                .into_iter()
                .flatten()
                .map(|a| a["value"].as_str().map(String::from).or_else(|| a["description"].as_str().map(String::from)).unwrap_or_else(|| a["value"].to_string()))
                .collect();
            Some(format!("console.{}: {}", params["type"].as_str().unwrap_or("log"), args.join(" ")))
        }
        "Runtime.exceptionThrown" => {
            let details = &params["exceptionDetails"];
            Some(format!("exception: {}", details["exception"]["description"].as_str().or(details["text"].as_str()).unwrap_or("?")))
        }
        "Log.entryAdded" => {
            let entry = &params["entry"];
            Some(format!("{} ({}): {}", entry["level"].as_str().unwrap_or("?"), entry["source"].as_str().unwrap_or("?"), entry["text"].as_str().unwrap_or("")))
        }
        _ => None,
    }
}
