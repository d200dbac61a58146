//! `orchard sandbox create|ls|exec|rm` (`shell` is in `shell.rs`).
//!
//! `exec` streams: `POST /v1/sandboxes/{id}/exec/stream` answers NDJSON
//! [`ExecEvent`] frames, whose stdout/stderr chunks are written to ours as they arrive;
//! the process exits with the command's exit code, or 128 + the signal that killed it
//! (the shell convention, so `$?` reads the same as for a local command).

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use base64::Engine as _;
use orchard_protocol::exec::ExitInfo;
use orchard_protocol::{Command, ExecEvent, ExecRequest};
use reqwest::Method;
use serde::Serialize;
use serde_json::Value;

use super::client::{segment, Client};
use super::CliError;

/// Body of `POST /v1/sandboxes` (docs/api.md). A local struct, so the CLI only sends
/// the fields the server documents (it refuses unknown ones).
#[derive(Debug, Clone, Serialize)]
pub struct CreateBody {
    pub image: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cpu: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub memory: Option<String>,
    pub block_network: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ready_timeout_s: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ttl_s: Option<u64>,
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub env: BTreeMap<String, String>,
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub labels: BTreeMap<String, String>,
    pub wait: bool,
}

/// `sandbox create`: prints the id (or the whole object with `--json`).
pub async fn create(client: &Client, body: &CreateBody, json: bool) -> Result<i32, CliError> {
    let request = client.request(Method::POST, "/v1/sandboxes").json(body);
    let sandbox: Value = client.json(request, "the created sandbox").await?;
    if json {
        print_json(&sandbox)?;
    } else {
        let id = sandbox["id"]
            .as_str()
            .ok_or_else(|| CliError::protocol("the created sandbox", "it has no \"id\""))?;
        print_out(&format!("{id}\n"))?;
    }
    Ok(0)
}

/// `sandbox ls`: a table of id, image, status and age (or JSON).
pub async fn list(client: &Client, json: bool) -> Result<i32, CliError> {
    let answer: Value = client
        .json(
            client.request(Method::GET, "/v1/sandboxes"),
            "the sandbox list",
        )
        .await?;
    let sandboxes = answer["sandboxes"]
        .as_array()
        .ok_or_else(|| CliError::protocol("the sandbox list", "it has no \"sandboxes\" array"))?;
    if json {
        print_json(&Value::Array(sandboxes.clone()))?;
        return Ok(0);
    }
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default()
        .as_secs();
    let rows: Vec<Vec<String>> = sandboxes
        .iter()
        .map(|s| {
            let text = |key: &str| s[key].as_str().unwrap_or("-").to_string();
            let age = s["created_at"]
                .as_str()
                .and_then(parse_utc)
                .map_or_else(|| "-".to_string(), |t| format_age(now.saturating_sub(t)));
            vec![text("id"), text("image"), text("status"), age]
        })
        .collect();
    print_out(&table(&["ID", "IMAGE", "STATUS", "AGE"], &rows))?;
    Ok(0)
}

/// `sandbox rm`: deletes each; prints the ids deleted. A sandbox the server refuses
/// (unknown, not yours) is reported and the rest still go; the exit code is 1 if any
/// failed. Not reaching the server at all ends at once.
pub async fn remove(client: &Client, ids: &[String]) -> Result<i32, CliError> {
    let mut failed = false;
    for id in ids {
        let path = format!("/v1/sandboxes/{}", segment(id));
        match client.send(client.request(Method::DELETE, &path)).await {
            Ok(_) => print_out(&format!("{id}\n"))?,
            Err(err @ CliError::Api { .. }) => {
                failed = true;
                eprintln!("orchard: {id}: {err}");
            }
            Err(err) => return Err(err),
        }
    }
    Ok(i32::from(failed))
}

/// Options of `sandbox exec`.
#[derive(Debug, Default)]
pub struct ExecOptions {
    pub cwd: Option<String>,
    pub env: BTreeMap<String, String>,
    pub timeout: Option<Duration>,
    /// Run the words as one shell string.
    pub shell: bool,
    /// Send all of our stdin as the command's.
    pub stdin: bool,
}

/// The request `sandbox exec` sends.
fn exec_request(command: Vec<String>, opts: ExecOptions, stdin: Option<Vec<u8>>) -> ExecRequest {
    let command = if opts.shell {
        Command::Shell(command.join(" "))
    } else {
        Command::Argv(command)
    };
    ExecRequest {
        command,
        cwd: opts.cwd,
        env: opts.env,
        stdin_b64: stdin.map(|b| base64::engine::general_purpose::STANDARD.encode(b)),
        timeout_ms: opts
            .timeout
            .map(|t| u64::try_from(t.as_millis()).unwrap_or(u64::MAX).max(1)),
        // Ctrl-C on `orchard sandbox exec` should stop the remote command too, as it
        // would a local one.
        kill_on_disconnect: true,
        ..Default::default()
    }
}

/// `sandbox exec`: streams the command's output; answers its exit code.
fn read_stdin(wanted: bool) -> Result<Option<Vec<u8>>, CliError> {
    if !wanted {
        return Ok(None);
    }
    let mut buf = Vec::new();
    std::io::stdin()
        .read_to_end(&mut buf)
        .map_err(|e| CliError::io("reading standard input", e))?;
    Ok(Some(buf))
}

/// Prints one frame of a command's output; its exit status once it ends.
fn print_event(event: ExecEvent) -> Result<Option<i32>, CliError> {
    match event {
        ExecEvent::Start { .. } | ExecEvent::Keepalive => Ok(None),
        ExecEvent::Stdout { data } => {
            write_chunk(&mut std::io::stdout(), &data, "stdout").map(|_| None)
        }
        ExecEvent::Stderr { data } => {
            write_chunk(&mut std::io::stderr(), &data, "stderr").map(|_| None)
        }
        ExecEvent::Exit { exit, .. } => {
            if exit.timed_out {
                eprintln!("orchard: the command ran out of time and was killed");
            }
            Ok(Some(exit_status(&exit)))
        }
        ExecEvent::Error { code, message } => Err(CliError::Remote {
            what: "the command".into(),
            message: format!("{message} ({})", code.as_str()),
        }),
    }
}

/// `sandbox exec --direct`: asks the server for the sandbox's agent endpoint and token,
/// then streams the command from the agent itself (a pod IP on Kubernetes).
pub async fn exec_direct(
    client: &Client,
    id: &str,
    command: Vec<String>,
    opts: ExecOptions,
) -> Result<i32, CliError> {
    let stdin = read_stdin(opts.stdin)?;
    let path = format!("/v1/sandboxes/{}", segment(id));
    let sb: orchard_protocol::sandbox::Sandbox = client
        .json(client.request(Method::GET, &path), "the sandbox")
        .await?;
    let agent = sb.agent.ok_or_else(|| CliError::Remote {
        what: format!("sandbox {id}"),
        message: format!("it is not ready ({})", sb.status),
    })?;
    let endpoint = match (&agent.url, &agent.socket) {
        (Some(url), _) => orchard_client::Endpoint::parse_http_url(url)
            .ok_or_else(|| CliError::protocol("the agent URL", url))?,
        (None, Some(socket)) => orchard_client::Endpoint::Unix(socket.into()),
        (None, None) => {
            return Err(CliError::protocol(
                "the sandbox",
                "it names no agent endpoint",
            ))
        }
    };
    let direct = orchard_client::AgentClient::new(endpoint.clone(), agent.token);
    let what = format!("the agent at {endpoint}");
    let mut stream = direct
        .exec_stream(&exec_request(command, opts, stdin))
        .await
        .map_err(|e| CliError::Remote {
            what: what.clone(),
            message: e.to_string(),
        })?;
    loop {
        match stream.next().await {
            Ok(Some(event)) => {
                if let Some(code) = print_event(event)? {
                    return Ok(code);
                }
            }
            Ok(None) => break,
            Err(e) => {
                return Err(CliError::Remote {
                    what,
                    message: e.to_string(),
                })
            }
        }
    }
    Err(CliError::protocol(
        "the exec stream",
        "it ended without an exit frame (the connection was cut?)",
    ))
}

pub async fn exec(
    client: &Client,
    id: &str,
    command: Vec<String>,
    opts: ExecOptions,
) -> Result<i32, CliError> {
    let stdin = read_stdin(opts.stdin)?;
    let request = exec_request(command, opts, stdin);
    let path = format!("/v1/sandboxes/{}/exec/stream", segment(id));
    let response = client
        .send(client.request(Method::POST, &path).json(&request))
        .await?;
    let mut lines = client.lines(response);
    while let Some(line) = lines.next().await? {
        let Some(event) = parse_event(&line)? else {
            continue;
        };
        if let Some(code) = print_event(event)? {
            return Ok(code);
        }
    }
    Err(CliError::protocol(
        "the exec stream",
        "it ended without an exit frame (the connection was cut?)",
    ))
}

/// One exec frame; `None` for a frame type this client does not know (newer servers
/// may add some), an error for a line that is not a frame at all.
fn parse_event(line: &[u8]) -> Result<Option<ExecEvent>, CliError> {
    match serde_json::from_slice::<ExecEvent>(line) {
        Ok(event) => Ok(Some(event)),
        Err(err) => match serde_json::from_slice::<Value>(line) {
            Ok(v)
                if v["type"].is_string()
                    && !KNOWN_EVENTS.contains(&v["type"].as_str().unwrap_or("")) =>
            {
                Ok(None)
            }
            _ => Err(CliError::protocol("an exec frame", err)),
        },
    }
}

const KNOWN_EVENTS: &[&str] = &["start", "stdout", "stderr", "keepalive", "exit", "error"];

/// The shell's `$?` for how a process ended: its code, or 128 + the signal.
pub fn exit_status(exit: &ExitInfo) -> i32 {
    match (exit.exit_code, exit.signal) {
        (Some(code), _) => code,
        (None, Some(signal)) => 128 + signal,
        // Neither is reported only when the agent lost track of the process.
        (None, None) => 1,
    }
}

fn write_chunk(out: &mut impl Write, data: &str, which: &str) -> Result<(), CliError> {
    let bytes = base64::engine::general_purpose::STANDARD
        .decode(data)
        .map_err(|e| CliError::protocol(format!("a {which} frame"), e))?;
    // Flushed per chunk: the point of streaming is to show output as it comes.
    out.write_all(&bytes)
        .and_then(|()| out.flush())
        .map_err(|e| CliError::io(format!("writing {which}"), e))
}

/// Writes `text` to stdout; an error (a closed pipe) is reported rather than a panic as
/// `print!` would.
pub fn print_out(text: &str) -> Result<(), CliError> {
    let mut out = std::io::stdout().lock();
    out.write_all(text.as_bytes())
        .and_then(|()| out.flush())
        .map_err(|e| CliError::io("writing stdout", e))
}

/// Pretty JSON on stdout.
pub fn print_json(value: &Value) -> Result<(), CliError> {
    let text = serde_json::to_string_pretty(value).unwrap_or_else(|_| value.to_string());
    print_out(&format!("{text}\n"))
}

/// Left-aligned columns, three spaces apart, no trailing blanks.
pub fn table(headers: &[&str], rows: &[Vec<String>]) -> String {
    let mut widths: Vec<usize> = headers.iter().map(|h| h.chars().count()).collect();
    for row in rows {
        for (i, cell) in row.iter().enumerate() {
            if let Some(w) = widths.get_mut(i) {
                *w = (*w).max(cell.chars().count());
            }
        }
    }
    let mut out = String::new();
    let header: Vec<String> = headers.iter().map(|h| h.to_string()).collect();
    for row in std::iter::once(&header).chain(rows) {
        let mut line = String::new();
        for (i, cell) in row.iter().enumerate() {
            line.push_str(cell);
            if i + 1 < row.len() {
                let pad = widths
                    .get(i)
                    .copied()
                    .unwrap_or(0)
                    .saturating_sub(cell.chars().count());
                line.push_str(&" ".repeat(pad + 3));
            }
        }
        out.push_str(line.trim_end());
        out.push('\n');
    }
    out
}

/// `5s`, `3m`, `2h`, `4d`.
pub fn format_age(secs: u64) -> String {
    match secs {
        s if s < 60 => format!("{s}s"),
        s if s < 3600 => format!("{}m", s / 60),
        s if s < 86_400 => format!("{}h", s / 3600),
        s => format!("{}d", s / 86_400),
    }
}

/// Seconds since the epoch of an ISO-8601 / RFC 3339 time (`2026-12-02T16:45:51.123Z`,
/// or with an offset like `+02:00`). Fractions are dropped.
pub fn parse_utc(s: &str) -> Option<u64> {
    let b = s.as_bytes();
    if b.len() < 19 || b[4] != b'-' || b[7] != b'-' || !matches!(b[10], b'T' | b't' | b' ') {
        return None;
    }
    let num = |range: std::ops::Range<usize>| -> Option<i64> {
        let part = s.get(range)?;
        part.bytes()
            .all(|c| c.is_ascii_digit())
            .then(|| part.parse().ok())
            .flatten()
    };
    let (year, month, day) = (num(0..4)?, num(5..7)?, num(8..10)?);
    let (hour, minute, second) = (num(11..13)?, num(14..16)?, num(17..19)?);
    if b[13] != b':' || b[16] != b':' || !(1..=12).contains(&month) || !(1..=31).contains(&day) {
        return None;
    }
    if hour > 23 || minute > 59 || second > 60 {
        return None;
    }
    let mut rest = &s[19..];
    if let Some(frac) = rest.strip_prefix('.') {
        let digits = frac.bytes().take_while(u8::is_ascii_digit).count();
        if digits == 0 {
            return None;
        }
        rest = &frac[digits..];
    }
    let offset = match rest {
        "Z" | "z" | "" => 0,
        _ => {
            let sign = match rest.as_bytes()[0] {
                b'+' => 1,
                b'-' => -1,
                _ => return None,
            };
            let hm = &rest[1..];
            if hm.len() != 5 || hm.as_bytes()[2] != b':' {
                return None;
            }
            let h: i64 = hm[..2].parse().ok()?;
            let m: i64 = hm[3..].parse().ok()?;
            sign * (h * 3600 + m * 60)
        }
    };
    let days = days_from_civil(year, month, day);
    let t = days * 86_400 + hour * 3600 + minute * 60 + second - offset;
    u64::try_from(t).ok()
}

/// Days since 1970-01-01 of a proleptic Gregorian date (Howard Hinnant's algorithm).
fn days_from_civil(y: i64, m: i64, d: i64) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (m + 9) % 12;
    let doy = (153 * mp + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn times_parse_as_utc() {
        assert_eq!(parse_utc("1970-01-01T00:00:00Z"), Some(0));
        assert_eq!(parse_utc("2026-12-02T16:45:51.123Z"), Some(1_796_229_951));
        assert_eq!(parse_utc("2026-12-02T18:45:51+02:00"), Some(1_796_229_951));
        assert_eq!(parse_utc("2000-02-29T00:00:00.5z"), Some(951_782_400));
        for bad in [
            "",
            "yesterday",
            "2026-13-01T00:00:00Z",
            "2026-12-02T16:45:51.Z",
            "2026-12-02T16:45:51+0200",
            "2026-12-02",
        ] {
            assert_eq!(parse_utc(bad), None, "{bad}");
        }
    }

    #[test]
    fn ages_use_the_largest_whole_unit() {
        assert_eq!(format_age(0), "0s");
        assert_eq!(format_age(59), "59s");
        assert_eq!(format_age(60), "1m");
        assert_eq!(format_age(7199), "1h");
        assert_eq!(format_age(3 * 86_400 + 5), "3d");
    }

    #[test]
    fn tables_align_columns() {
        let rows = vec![
            vec![
                "sb-1".to_string(),
                "busybox:latest".into(),
                "running".into(),
                "5s".into(),
            ],
            vec![
                "sandbox-two".to_string(),
                "x".into(),
                "pending".into(),
                "-".into(),
            ],
        ];
        assert_eq!(
            table(&["ID", "IMAGE", "STATUS", "AGE"], &rows),
            "ID            IMAGE            STATUS    AGE\n\
             sb-1          busybox:latest   running   5s\n\
             sandbox-two   x                pending   -\n"
        );
        assert_eq!(table(&["A", "B"], &[]), "A   B\n");
    }

    #[test]
    fn exit_status_is_the_code_or_128_plus_the_signal() {
        let info = |exit_code, signal| ExitInfo {
            exit_code,
            signal,
            timed_out: false,
            duration_ms: 1.0,
        };
        assert_eq!(exit_status(&info(Some(3), None)), 3);
        assert_eq!(exit_status(&info(None, Some(9))), 137);
        assert_eq!(exit_status(&info(None, None)), 1);
    }

    #[test]
    fn exec_requests_carry_argv_or_a_shell_string() {
        let opts = ExecOptions {
            cwd: Some("/tmp".into()),
            timeout: Some(Duration::from_millis(1500)),
            ..Default::default()
        };
        let r = exec_request(vec!["ls".into(), "-l".into()], opts, Some(b"hi".to_vec()));
        let v = serde_json::to_value(&r).unwrap();
        assert_eq!(
            v,
            serde_json::json!({"command": ["ls", "-l"], "cwd": "/tmp", "stdin_b64": "aGk=",
                "timeout_ms": 1500, "kill_on_disconnect": true})
        );
        let opts = ExecOptions {
            shell: true,
            ..Default::default()
        };
        let r = exec_request(vec!["echo".into(), "$HOME".into()], opts, None);
        assert_eq!(r.command, Command::Shell("echo $HOME".into()));
    }

    #[test]
    fn exec_frames_parse_and_unknown_types_are_skipped() {
        assert_eq!(
            parse_event(br#"{"type":"stdout","data":"aGk="}"#).unwrap(),
            Some(ExecEvent::Stdout {
                data: "aGk=".into()
            })
        );
        assert_eq!(parse_event(br#"{"type":"progress","x":1}"#).unwrap(), None);
        assert!(parse_event(br#"{"type":"stdout"}"#).is_err());
        assert!(parse_event(b"not json").is_err());
    }

    #[test]
    fn create_bodies_send_only_what_was_given() {
        let body = CreateBody {
            image: "busybox".into(),
            id: None,
            cpu: Some("500m".into()),
            memory: None,
            block_network: true,
            ready_timeout_s: None,
            ttl_s: Some(60),
            env: BTreeMap::new(),
            labels: [("team".to_string(), "rl".to_string())].into(),
            wait: true,
        };
        assert_eq!(
            serde_json::to_value(&body).unwrap(),
            serde_json::json!({"image": "busybox", "cpu": "500m", "block_network": true,
                "ttl_s": 60, "labels": {"team": "rl"}, "wait": true})
        );
    }
}
