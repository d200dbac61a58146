//! `orchard sandbox pause|resume|snapshot` and `orchard snapshot ls|get|rm|fork`: the
//! stateful-sandbox routes of `/v1` (`docs/api.md`), printed for people (ids and
//! tables) or as JSON with `--json`.

use std::collections::BTreeMap;

use reqwest::Method;
use serde_json::{json, Value};

use super::client::{segment, Client};
use super::sandbox::{print_json, print_out, table};
use super::CliError;

/// `sandbox pause` / `sandbox resume`: prints the id and its new status.
pub async fn pause_or_resume(client: &Client, id: &str, pause: bool) -> Result<i32, CliError> {
    let verb = if pause { "pause" } else { "resume" };
    let path = format!("/v1/sandboxes/{}/{verb}", segment(id));
    let sandbox: Value = client
        .json(client.request(Method::POST, &path), "the sandbox")
        .await?;
    let status = sandbox["status"].as_str().unwrap_or("-");
    print_out(&format!("{id} {status}\n"))?;
    Ok(0)
}

/// `sandbox snapshot`: prints the snapshot id (or the whole snapshot).
pub async fn take(
    client: &Client,
    id: &str,
    labels: BTreeMap<String, String>,
    json_out: bool,
) -> Result<i32, CliError> {
    let path = format!("/v1/sandboxes/{}/snapshots", segment(id));
    let request = client
        .request(Method::POST, &path)
        .json(&json!({ "labels": labels }));
    let snapshot: Value = client.json(request, "the snapshot").await?;
    print_one(&snapshot, json_out)
}

fn print_one(snapshot: &Value, json_out: bool) -> Result<i32, CliError> {
    if json_out {
        print_json(snapshot)?;
    } else {
        let id = snapshot["snapshot_id"]
            .as_str()
            .ok_or_else(|| CliError::protocol("the snapshot", "it has no \"snapshot_id\""))?;
        print_out(&format!("{id}\n"))?;
    }
    Ok(0)
}

/// `snapshot ls`: id, sandbox, size, forks, created.
pub async fn list(client: &Client, json_out: bool) -> Result<i32, CliError> {
    let answer: Value = client
        .json(
            client.request(Method::GET, "/v1/snapshots"),
            "the snapshot list",
        )
        .await?;
    let list = answer["snapshots"]
        .as_array()
        .ok_or_else(|| CliError::protocol("the snapshot list", "it has no \"snapshots\" array"))?;
    if json_out {
        print_json(&Value::Array(list.clone()))?;
        return Ok(0);
    }
    let rows: Vec<Vec<String>> = list
        .iter()
        .map(|s| {
            let text = |k: &str| s[k].as_str().unwrap_or("-").to_string();
            vec![
                text("snapshot_id"),
                text("sandbox_id"),
                human_bytes(s["size_bytes"].as_u64().unwrap_or(0)),
                s["forks"].as_array().map_or(0, Vec::len).to_string(),
                text("created_at"),
            ]
        })
        .collect();
    print_out(&table(
        &["SNAPSHOT", "SANDBOX", "SIZE", "FORKS", "CREATED"],
        &rows,
    ))?;
    Ok(0)
}

/// `snapshot get`: the whole snapshot as JSON.
pub async fn get(client: &Client, sid: &str) -> Result<i32, CliError> {
    let path = format!("/v1/snapshots/{}", segment(sid));
    let snapshot: Value = client
        .json(client.request(Method::GET, &path), "the snapshot")
        .await?;
    print_json(&snapshot)?;
    Ok(0)
}

/// `snapshot rm`: deletes each; exit 1 if any was refused (in use, unknown).
pub async fn remove(client: &Client, ids: &[String]) -> Result<i32, CliError> {
    let mut failed = false;
    for sid in ids {
        let path = format!("/v1/snapshots/{}", segment(sid));
        match client.send(client.request(Method::DELETE, &path)).await {
            Ok(_) => print_out(&format!("{sid}\n"))?,
            Err(err @ CliError::Api { .. }) => {
                failed = true;
                eprintln!("orchard: {sid}: {err}");
            }
            Err(err) => return Err(err),
        }
    }
    Ok(i32::from(failed))
}

/// `snapshot fork`: starts COUNT sandboxes; prints their ids, one per line.
pub async fn fork(
    client: &Client,
    sid: &str,
    count: u32,
    labels: BTreeMap<String, String>,
    ttl_s: Option<u64>,
    json_out: bool,
) -> Result<i32, CliError> {
    let path = format!("/v1/snapshots/{}/fork", segment(sid));
    let request = client
        .request(Method::POST, &path)
        .json(&json!({ "count": count, "labels": labels, "ttl_s": ttl_s }));
    let answer: Value = client.json(request, "the forks").await?;
    let sandboxes = answer["sandboxes"]
        .as_array()
        .ok_or_else(|| CliError::protocol("the forks", "it has no \"sandboxes\" array"))?;
    if json_out {
        print_json(&Value::Array(sandboxes.clone()))?;
        return Ok(0);
    }
    let mut out = String::new();
    for s in sandboxes {
        out.push_str(s["id"].as_str().unwrap_or("-"));
        out.push('\n');
    }
    print_out(&out)?;
    Ok(0)
}

/// `1536` → `1.5 KiB`.
fn human_bytes(n: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = n as f64;
    let mut unit = 0;
    while v >= 1024.0 && unit + 1 < UNITS.len() {
        v /= 1024.0;
        unit += 1;
    }
    if unit == 0 {
        format!("{n} B")
    } else {
        format!("{v:.1} {}", UNITS[unit])
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn sizes_read_as_people_write_them() {
        assert_eq!(super::human_bytes(0), "0 B");
        assert_eq!(super::human_bytes(1536), "1.5 KiB");
        assert_eq!(super::human_bytes(1 << 30), "1.0 GiB");
    }
}
