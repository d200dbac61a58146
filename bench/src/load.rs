//! The load generator: M clients drive N sandboxes through the REST API with a mix of
//! operations for a fixed time, and every call is recorded (when it started, which
//! operation, how long it took, whether it worked), so a run yields throughput,
//! latency percentiles, errors and latency over time.
//!
//! Sandboxes are split among the clients (client `i` uses sandboxes `i`, `i + M`, ...,
//! in turn; with more clients than sandboxes several clients share one), so every
//! sandbox is used and a session opened for the `session` operation is one per
//! (client, sandbox). Operations come from the mix in a fixed, interleaved order that
//! starts at a different place for each client: two runs of one mix do the same work.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::{json, Value};

/// One kind of call.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Op {
    /// Compatible `POST /sandboxes/{id}/exec` of `true` with `wait: true`.
    Exec,
    /// `POST /v1/sandboxes/{id}/exec` of `["true"]`.
    V1Exec,
    /// `PUT /v1/sandboxes/{id}/files?path=` of a small file.
    FilePut,
    /// `GET /v1/sandboxes/{id}/files?path=` of the file just written.
    FileGet,
    /// `POST /v1/sandboxes/{id}/sessions/{sid}/run` of `true` in a shell session.
    Session,
}

impl Op {
    /// Every operation, in table order.
    pub const ALL: [Op; 5] = [Op::Exec, Op::V1Exec, Op::FilePut, Op::FileGet, Op::Session];

    /// The short name used in mixes, tables and files.
    pub fn key(self) -> &'static str {
        match self {
            Op::Exec => "exec",
            Op::V1Exec => "v1_exec",
            Op::FilePut => "file_put",
            Op::FileGet => "file_get",
            Op::Session => "session",
        }
    }
}

/// Weights of the operations: `exec=8,file=1,session=1` (`file` is a put and a get of
/// the same file, two calls).
#[derive(Debug, Clone, PartialEq)]
pub struct Mix(Vec<(Op, u32)>);

impl std::str::FromStr for Mix {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        let mut parts = Vec::new();
        for item in s.split(',').map(str::trim).filter(|i| !i.is_empty()) {
            let (name, weight) = item.split_once('=').unwrap_or((item, "1"));
            let weight: u32 = weight
                .parse()
                .map_err(|_| format!("{item:?}: the weight must be a whole number"))?;
            let op = match name {
                "exec" => Op::Exec,
                "v1" | "v1_exec" => Op::V1Exec,
                "file" => Op::FilePut,
                "session" => Op::Session,
                _ => {
                    return Err(format!(
                        "{name:?}: not an operation (exec, v1, file, session)"
                    ))
                }
            };
            if weight > 0 {
                parts.push((op, weight));
            }
        }
        if parts.is_empty() {
            return Err("the mix names no operation with a weight above 0".into());
        }
        Ok(Mix(parts))
    }
}

impl Mix {
    /// The operations in one round, interleaved (`exec=2,file=1` gives exec, file,
    /// exec), so that a short run sees every kind.
    pub fn round(&self) -> Vec<Op> {
        let total: u32 = self.0.iter().map(|(_, w)| w).sum();
        let mut credit: Vec<i64> = vec![0; self.0.len()];
        let mut out = Vec::with_capacity(total as usize);
        // Smooth weighted round robin (as nginx balances upstreams).
        for _ in 0..total {
            let mut best = 0;
            for (i, (_, w)) in self.0.iter().enumerate() {
                credit[i] += i64::from(*w);
                if credit[i] > credit[best] {
                    best = i;
                }
            }
            credit[best] -= i64::from(total);
            out.push(self.0[best].0);
        }
        out
    }
}

/// A client of the REST API.
#[derive(Clone)]
pub struct Api {
    http: reqwest::Client,
    base: String,
    key: String,
}

/// What a call returned when it failed.
pub type CallError = String;

impl Api {
    /// A client of the server at `base` (`http://host:port`) with API key `key`.
    pub fn new(base: &str, key: &str) -> anyhow::Result<Api> {
        let http = reqwest::Client::builder()
            .pool_max_idle_per_host(4096)
            .tcp_nodelay(true)
            .timeout(Duration::from_secs(300))
            .build()?;
        Ok(Api {
            http,
            base: base.trim_end_matches('/').to_string(),
            key: key.to_string(),
        })
    }

    /// The server's base URL.
    pub fn base(&self) -> &str {
        &self.base
    }

    async fn send(&self, req: reqwest::RequestBuilder) -> Result<bytes::Bytes, CallError> {
        let resp = req
            .header("X-API-Key", &self.key)
            .send()
            .await
            .map_err(|e| format!("transport: {e}"))?;
        let status = resp.status();
        let body = resp
            .bytes()
            .await
            .map_err(|e| format!("reading the body: {e}"))?;
        if !status.is_success() {
            let text = String::from_utf8_lossy(&body);
            return Err(format!("{}: {}", status.as_u16(), text.trim()));
        }
        Ok(body)
    }

    async fn json(&self, req: reqwest::RequestBuilder) -> Result<Value, CallError> {
        let body = self.send(req).await?;
        serde_json::from_slice(&body).map_err(|e| format!("not JSON: {e}"))
    }

    /// `POST path` with a JSON body, answering its JSON.
    pub async fn post(&self, path: &str, body: &Value) -> Result<Value, CallError> {
        let url = format!("{}{path}", self.base);
        self.json(
            self.http
                .post(url)
                .header("content-type", "application/json")
                .body(body.to_string()),
        )
        .await
    }

    /// `GET path`, answering its JSON.
    pub async fn get(&self, path: &str) -> Result<Value, CallError> {
        self.json(self.http.get(format!("{}{path}", self.base)))
            .await
    }

    /// `DELETE path`.
    pub async fn delete(&self, path: &str) -> Result<(), CallError> {
        self.send(self.http.delete(format!("{}{path}", self.base)))
            .await
            .map(|_| ())
    }

    /// Creates a sandbox of `image` through `/v1` and waits until it is ready; answers
    /// its id.
    pub async fn create_ready(&self, image: &str) -> Result<String, CallError> {
        let v = self
            .post("/v1/sandboxes", &json!({ "image": image, "ttl_s": 0 }))
            .await?;
        let id = v["id"]
            .as_str()
            .ok_or_else(|| format!("no id in {v}"))?
            .to_string();
        let w = self.get(&format!("/v1/sandboxes/{id}/wait")).await?;
        if w["ready"] == true {
            Ok(id)
        } else {
            Err(format!("{id} did not become ready: {w}"))
        }
    }

    /// One call of `op` on sandbox `id`; `session` is the client's session there, if
    /// it opened one.
    async fn call(
        &self,
        op: Op,
        id: &str,
        file: &str,
        body: &bytes::Bytes,
        session: &str,
    ) -> Result<(), CallError> {
        match op {
            Op::Exec => {
                let v = self
                    .post(
                        &format!("/sandboxes/{id}/exec"),
                        &json!({"command": "true", "wait": true}),
                    )
                    .await?;
                check(v["status"] == "succeeded", &v)
            }
            Op::V1Exec => {
                let v = self
                    .post(
                        &format!("/v1/sandboxes/{id}/exec"),
                        &json!({"command": ["true"]}),
                    )
                    .await?;
                check(v["exit_code"] == 0, &v)
            }
            Op::FilePut => {
                let url = format!("{}/v1/sandboxes/{id}/files?path={file}", self.base);
                self.send(
                    self.http
                        .put(url)
                        .header("content-type", "application/octet-stream")
                        .body(body.clone()),
                )
                .await
                .map(|_| ())
            }
            Op::FileGet => {
                let url = format!("{}/v1/sandboxes/{id}/files?path={file}", self.base);
                let got = self.send(self.http.get(url)).await?;
                if got == *body {
                    Ok(())
                } else {
                    Err(format!(
                        "read back {} bytes, not the {} written",
                        got.len(),
                        body.len()
                    ))
                }
            }
            Op::Session => {
                let v = self
                    .post(
                        &format!("/v1/sandboxes/{id}/sessions/{session}/run"),
                        &json!({"command": "true"}),
                    )
                    .await?;
                check(v["exit_code"] == 0, &v)
            }
        }
    }

    async fn open_session(&self, id: &str) -> Result<String, CallError> {
        let v = self
            .post(&format!("/v1/sandboxes/{id}/sessions"), &json!({}))
            .await?;
        v["id"]
            .as_str()
            .map(str::to_string)
            .ok_or_else(|| format!("no session id in {v}"))
    }
}

fn check(ok: bool, v: &Value) -> Result<(), CallError> {
    if ok {
        Ok(())
    } else {
        Err(format!("`true` did not succeed: {v}"))
    }
}

/// One recorded call.
#[derive(Debug, Clone, Copy)]
pub struct Sample {
    /// When it started, in seconds from the start of the run.
    pub at_s: f64,
    /// What it was.
    pub op: Op,
    /// How long it took, in microseconds.
    pub us: f64,
    /// Whether it worked.
    pub ok: bool,
}

/// What to run.
#[derive(Debug, Clone)]
pub struct LoadConfig {
    /// Concurrent clients.
    pub clients: usize,
    /// How long they call.
    pub duration: Duration,
    /// What they call.
    pub mix: Mix,
    /// Bytes of the file the `file` operation writes and reads.
    pub file_bytes: usize,
}

/// What a run did.
#[derive(Debug, Default)]
pub struct LoadReport {
    /// Every call.
    pub samples: Vec<Sample>,
    /// Wall time of the run, seconds.
    pub secs: f64,
    /// Errors by message (the first few hundred characters), with counts.
    pub errors: BTreeMap<String, u64>,
}

impl LoadReport {
    /// Adds the calls, time and errors of `other` (a later run of the same series);
    /// its samples' times are shifted to follow this report's.
    pub fn absorb(&mut self, other: LoadReport) {
        let offset = self.secs;
        self.samples.extend(other.samples.into_iter().map(|mut s| {
            s.at_s += offset;
            s
        }));
        self.secs += other.secs;
        for (k, v) in other.errors {
            *self.errors.entry(k).or_default() += v;
        }
    }

    /// Calls of `op` (all when `None`) per second over the run.
    pub fn per_s(&self, op: Option<Op>) -> f64 {
        let n = self
            .samples
            .iter()
            .filter(|s| s.ok && op.is_none_or(|o| s.op == o))
            .count();
        if self.secs > 0.0 {
            n as f64 / self.secs
        } else {
            0.0
        }
    }

    /// Latencies (µs) of successful calls of `op` (all when `None`).
    pub fn latencies(&self, op: Option<Op>) -> Vec<f64> {
        self.samples
            .iter()
            .filter(|s| s.ok && op.is_none_or(|o| s.op == o))
            .map(|s| s.us)
            .collect()
    }

    /// Failed calls.
    pub fn error_count(&self) -> u64 {
        self.errors.values().sum()
    }

    /// A Markdown table: per operation (and all together) calls, calls per second,
    /// p50/p90/p99/max latency and errors; then the distinct errors.
    pub fn table(&self) -> String {
        use std::fmt::Write as _;
        let mut md = String::from(
            "| operation | calls | calls/s | p50 ms | p90 ms | p99 ms | max ms | errors |\n|---|---|---|---|---|---|---|---|\n",
        );
        let ops: Vec<Option<Op>> = Op::ALL
            .iter()
            .filter(|o| self.samples.iter().any(|s| s.op == **o))
            .map(|o| Some(*o))
            .chain([None])
            .collect();
        for op in ops {
            let p = crate::stats::Pcts::of(&self.latencies(op));
            let errors = self
                .samples
                .iter()
                .filter(|s| !s.ok && op.is_none_or(|o| s.op == o))
                .count();
            let _ = writeln!(
                md,
                "| {} | {} | {:.0} | {:.2} | {:.2} | {:.2} | {:.2} | {} |",
                op.map_or("all", Op::key),
                p.n,
                self.per_s(op),
                p.p50 / 1000.0,
                p.p90 / 1000.0,
                p.p99 / 1000.0,
                p.max / 1000.0,
                errors
            );
        }
        if !self.errors.is_empty() {
            md += "\nErrors:\n\n";
            for (e, n) in &self.errors {
                let _ = writeln!(md, "- {n} x `{}`", e.replace('`', "'"));
            }
        }
        md
    }
}

/// Runs `cfg` against `sandboxes` (at least one) through `api`.
pub async fn run(api: &Api, sandboxes: &[String], cfg: &LoadConfig) -> LoadReport {
    let sandboxes: Arc<Vec<String>> = Arc::new(sandboxes.to_vec());
    let round = Arc::new(cfg.mix.round());
    let body = bytes::Bytes::from(vec![b'x'; cfg.file_bytes]);
    let started = Instant::now();
    let deadline = started + cfg.duration;
    let clients = cfg.clients.max(1);
    let tasks: Vec<_> = (0..clients)
        .map(|c| {
            let (api, sandboxes, round, body) =
                (api.clone(), sandboxes.clone(), round.clone(), body.clone());
            tokio::spawn(async move {
                client(
                    c, clients, &api, &sandboxes, &round, &body, started, deadline,
                )
                .await
            })
        })
        .collect();
    let mut report = LoadReport::default();
    for task in tasks {
        match task.await {
            Ok((samples, errors)) => {
                report.samples.extend(samples);
                for (k, v) in errors {
                    *report.errors.entry(k).or_default() += v;
                }
            }
            Err(e) => {
                *report
                    .errors
                    .entry(format!("client task: {e}"))
                    .or_default() += 1
            }
        }
    }
    report.secs = started.elapsed().as_secs_f64();
    report.samples.sort_by(|a, b| a.at_s.total_cmp(&b.at_s));
    report
}

type ClientResult = (Vec<Sample>, BTreeMap<String, u64>);

#[allow(clippy::too_many_arguments)]
async fn client(
    c: usize,
    clients: usize,
    api: &Api,
    sandboxes: &[String],
    round: &[Op],
    body: &bytes::Bytes,
    started: Instant,
    deadline: Instant,
) -> ClientResult {
    let mine: Vec<&String> = if clients <= sandboxes.len() {
        sandboxes.iter().skip(c).step_by(clients).collect()
    } else {
        vec![&sandboxes[c % sandboxes.len()]]
    };
    let file = format!("/tmp/orchard-load-{c}.bin");
    let mut sessions: HashMap<&str, String> = HashMap::new();
    let mut samples = Vec::new();
    let mut errors: BTreeMap<String, u64> = BTreeMap::new();
    let mut note = |e: CallError| {
        let e: String = e.chars().take(300).collect();
        *errors.entry(e).or_default() += 1;
    };
    let mut k = c;
    while Instant::now() < deadline {
        // Every sandbox in turn; the operation moves on after each sweep, so each
        // sandbox sees every operation whatever the two counts are.
        let id = mine[k % mine.len()].as_str();
        let op = round[(k / mine.len()) % round.len()];
        k += 1;
        let session = if op == Op::Session {
            match sessions.get(id) {
                Some(s) => s.clone(),
                None => match api.open_session(id).await {
                    Ok(s) => {
                        sessions.insert(id, s.clone());
                        s
                    }
                    Err(e) => {
                        note(format!("opening a session: {e}"));
                        continue;
                    }
                },
            }
        } else {
            String::new()
        };
        // A file operation is a put then a get of the same file: two samples.
        let (pair, one) = ([Op::FilePut, Op::FileGet], [op]);
        let ops: &[Op] = if op == Op::FilePut { &pair } else { &one };
        for &op in ops {
            let t = Instant::now();
            let r = api.call(op, id, &file, body, &session).await;
            samples.push(Sample {
                at_s: t.duration_since(started).as_secs_f64(),
                op,
                us: t.elapsed().as_secs_f64() * 1e6,
                ok: r.is_ok(),
            });
            if let Err(e) = r {
                note(format!("{}: {e}", op.key()));
            }
        }
    }
    for (id, s) in sessions {
        let _ = api
            .delete(&format!("/v1/sandboxes/{id}/sessions/{s}"))
            .await;
    }
    (samples, errors)
}

/// `k` calls of `op` (an exec or a session command) on sandbox `id`, one after
/// another; their latencies in microseconds, or the first error.
pub async fn run_calls(api: &Api, id: &str, op: Op, k: usize) -> Result<Vec<f64>, CallError> {
    let session = if op == Op::Session {
        api.open_session(id).await?
    } else {
        String::new()
    };
    let empty = bytes::Bytes::new();
    let mut out = Vec::with_capacity(k);
    for _ in 0..k {
        let t = Instant::now();
        api.call(op, id, "/tmp/orchard-load-calls.bin", &empty, &session)
            .await?;
        out.push(t.elapsed().as_secs_f64() * 1e6);
    }
    Ok(out)
}

/// Runs every future at once on the runtime; answers their outputs in order.
pub async fn spawn_all<F>(futs: impl IntoIterator<Item = F>) -> Vec<F::Output>
where
    F: std::future::Future + Send + 'static,
    F::Output: Send + 'static,
{
    let tasks: Vec<_> = futs.into_iter().map(tokio::spawn).collect();
    let mut out = Vec::with_capacity(tasks.len());
    for t in tasks {
        match t.await {
            Ok(v) => out.push(v),
            Err(e) => std::panic::resume_unwind(e.into_panic()),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mixes_parse_and_interleave() {
        let m: Mix = "exec=2,file=1".parse().unwrap();
        assert_eq!(m.round(), vec![Op::Exec, Op::FilePut, Op::Exec]);
        let m: Mix = "session".parse().unwrap();
        assert_eq!(m.round(), vec![Op::Session]);
        assert!("exec=0".parse::<Mix>().is_err());
        assert!("bogus=1".parse::<Mix>().is_err());
        assert!("exec=x".parse::<Mix>().is_err());
    }
}
