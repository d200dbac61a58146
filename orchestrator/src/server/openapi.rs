//! The orchestrator's OpenAPI document, generated from [`ROUTES`] and the wire types,
//! plus every agent route under `/v1/sandboxes/{id}`. Served at `/openapi.json`,
//! committed as `orchestrator/openapi.json` and compared by a test; the integration
//! tests call every route of [`ROUTES`] against the router so the list cannot name a
//! route that does not exist.

use std::sync::OnceLock;

use orchard_protocol::compat::{
    ApplyPatch, CreateSandbox, CreatedSandbox, Detail, ExecJob, FileContent, FileListing, Job,
    PatchResult, QueuedJob, SandboxAck, SandboxStatus, UploadFile, Uploaded,
};
use orchard_protocol::openapi::{agent_routes, document, Body, Param, Route};
use orchard_protocol::sandbox::{
    ImageList, ImageRemoved, PullEvent, PullRequest, Sandbox, SandboxCreate, SandboxDone,
    SandboxList,
};
use orchard_protocol::snapshot::{
    ForkRequest, ForkResult, Snapshot, SnapshotCreate, SnapshotDeleted, SnapshotList,
};
use schemars::gen::SchemaGenerator;
use schemars::schema::Schema;
use schemars::JsonSchema;
use serde_json::{json, Value};

fn schema<T: JsonSchema>(gen: &mut SchemaGenerator) -> Schema {
    gen.subschema_for::<T>()
}

fn any_json(_: &mut SchemaGenerator) -> Schema {
    Schema::Bool(true)
}

const TIMEOUT: Param = ("timeout", "number", false, "Seconds to wait server-side.");
const PATH: Param = (
    "path",
    "string",
    true,
    "Path in the sandbox (relative: under /workspace or /).",
);

const LIST_PATH: Param = (
    "path",
    "string",
    false,
    "Directory in the sandbox (relative: under /workspace or /); default the working directory.",
);

/// The orchestrator's own routes (the agent's are added under `/v1/sandboxes/{id}`).
pub const ROUTES: &[Route] = &[
    Route { method: "GET", path: "/", summary: "Banner.", auth: false, query: &[], request: Body::Empty, response: Body::Json(any_json) },
    Route { method: "GET", path: "/health", summary: "Liveness of the orchestrator.", auth: false, query: &[], request: Body::Empty, response: Body::Json(any_json) },
    Route { method: "GET", path: "/metrics", summary: "Prometheus metrics.", auth: false, query: &[], request: Body::Empty, response: Body::Bytes("text/plain") },
    Route { method: "GET", path: "/openapi.json", summary: "This document.", auth: false, query: &[], request: Body::Empty, response: Body::Json(any_json) },
    Route { method: "GET", path: "/resources", summary: "Capacity: CPUs, memory, sandboxes.", auth: true, query: &[], request: Body::Empty, response: Body::Json(any_json) },
    Route { method: "POST", path: "/sandboxes", summary: "Create a sandbox (answers at once, status pending).", auth: true, query: &[], request: Body::Json(schema::<CreateSandbox>), response: Body::Json(schema::<CreatedSandbox>) },
    Route { method: "GET", path: "/sandboxes/{id}", summary: "A sandbox's status.", auth: true, query: &[], request: Body::Empty, response: Body::Json(schema::<SandboxStatus>) },
    Route { method: "DELETE", path: "/sandboxes/{id}", summary: "Delete a sandbox and everything it holds.", auth: true, query: &[], request: Body::Empty, response: Body::Json(schema::<SandboxAck>) },
    Route { method: "GET", path: "/sandboxes/{id}/wait", summary: "Wait until the sandbox is ready (408 on time-out).", auth: true, query: &[TIMEOUT], request: Body::Empty, response: Body::Json(schema::<SandboxStatus>) },
    Route { method: "POST", path: "/sandboxes/{id}/heartbeat", summary: "Keep a heartbeat-tracked sandbox alive.", auth: true, query: &[], request: Body::Empty, response: Body::Json(schema::<SandboxAck>) },
    Route { method: "POST", path: "/sandboxes/{id}/exec", summary: "Queue a command (a job); with wait=true answer the finished job.", auth: true, query: &[], request: Body::Json(schema::<ExecJob>), response: Body::Json(schema::<QueuedJob>) },
    Route { method: "GET", path: "/sandboxes/{id}/exec/pty", summary: "Terminal over WebSocket, Orchard-compatible frames (auth: ?api_key= or subprotocol api_key.<key>).", auth: true, query: &[("api_key", "string", false, "The API key.")], request: Body::WebSocket, response: Body::WebSocket },
    Route { method: "POST", path: "/sandboxes/{id}/apply_patch", summary: "Apply a unified diff in the default directory, all or nothing.", auth: true, query: &[], request: Body::Json(schema::<ApplyPatch>), response: Body::Json(schema::<PatchResult>) },
    Route { method: "POST", path: "/sandboxes/{id}/files", summary: "Write a file (base64 content).", auth: true, query: &[], request: Body::Json(schema::<UploadFile>), response: Body::Json(schema::<Uploaded>) },
    Route { method: "GET", path: "/sandboxes/{id}/files", summary: "Read a file (base64 content).", auth: true, query: &[PATH], request: Body::Empty, response: Body::Json(schema::<FileContent>) },
    Route { method: "GET", path: "/sandboxes/{id}/files/list", summary: "List a directory.", auth: true, query: &[LIST_PATH], request: Body::Empty, response: Body::Json(schema::<FileListing>) },
    Route { method: "GET", path: "/jobs/{id}", summary: "A job.", auth: true, query: &[], request: Body::Empty, response: Body::Json(schema::<Job>) },
    Route { method: "GET", path: "/jobs/{id}/wait", summary: "Wait for a job to finish; a job still running is answered as running.", auth: true, query: &[TIMEOUT], request: Body::Empty, response: Body::Json(schema::<Job>) },
    Route { method: "POST", path: "/v1/sandboxes", summary: "Create a sandbox; by default answers once it is ready, with its agent endpoint and token.", auth: true, query: &[], request: Body::Json(schema::<SandboxCreate>), response: Body::Json(schema::<Sandbox>) },
    Route { method: "GET", path: "/v1/sandboxes", summary: "The caller's sandboxes.", auth: true, query: &[], request: Body::Empty, response: Body::Json(schema::<SandboxList>) },
    Route { method: "GET", path: "/v1/sandboxes/{id}", summary: "A sandbox.", auth: true, query: &[], request: Body::Empty, response: Body::Json(schema::<Sandbox>) },
    Route { method: "DELETE", path: "/v1/sandboxes/{id}", summary: "Delete a sandbox.", auth: true, query: &[], request: Body::Empty, response: Body::Json(schema::<SandboxDone>) },
    Route { method: "GET", path: "/v1/sandboxes/{id}/wait", summary: "Wait until ready (408 on time-out).", auth: true, query: &[TIMEOUT], request: Body::Empty, response: Body::Json(schema::<Sandbox>) },
    Route { method: "POST", path: "/v1/sandboxes/{id}/heartbeat", summary: "Heartbeat.", auth: true, query: &[], request: Body::Empty, response: Body::Json(schema::<SandboxDone>) },
    Route { method: "POST", path: "/v1/sandboxes/{id}/pause", summary: "Freeze the sandbox: processes and memory kept, no CPU; its agent routes answer 409 until resumed.", auth: true, query: &[], request: Body::Empty, response: Body::Json(schema::<Sandbox>) },
    Route { method: "POST", path: "/v1/sandboxes/{id}/resume", summary: "Thaw a paused sandbox.", auth: true, query: &[], request: Body::Empty, response: Body::Json(schema::<Sandbox>) },
    Route { method: "POST", path: "/v1/sandboxes/{id}/snapshots", summary: "Snapshot the sandbox's filesystem changes and shell sessions (frozen meanwhile; running processes are not captured).", auth: true, query: &[], request: Body::OptionalJson(schema::<SnapshotCreate>), response: Body::Json(schema::<Snapshot>) },
    Route { method: "GET", path: "/v1/snapshots", summary: "The caller's snapshots.", auth: true, query: &[], request: Body::Empty, response: Body::Json(schema::<SnapshotList>) },
    Route { method: "GET", path: "/v1/snapshots/{snapshot_id}", summary: "A snapshot.", auth: true, query: &[], request: Body::Empty, response: Body::Json(schema::<Snapshot>) },
    Route { method: "DELETE", path: "/v1/snapshots/{snapshot_id}", summary: "Delete a snapshot (409 while sandboxes forked from it exist).", auth: true, query: &[], request: Body::Empty, response: Body::Json(schema::<SnapshotDeleted>) },
    Route { method: "POST", path: "/v1/snapshots/{snapshot_id}/fork", summary: "Start count sandboxes from a snapshot; by default answers once all are ready.", auth: true, query: &[], request: Body::OptionalJson(schema::<ForkRequest>), response: Body::Json(schema::<ForkResult>) },
    Route { method: "GET", path: "/v1/images", summary: "Images in the store.", auth: true, query: &[], request: Body::Empty, response: Body::Json(schema::<ImageList>) },
    Route { method: "DELETE", path: "/v1/images", summary: "Remove an image.", auth: true, query: &[("reference", "string", true, "The image.")], request: Body::Empty, response: Body::Json(schema::<ImageRemoved>) },
    Route { method: "POST", path: "/v1/images/pull", summary: "Pull an image; progress as NDJSON.", auth: true, query: &[], request: Body::Json(schema::<PullRequest>), response: Body::Ndjson(schema::<PullEvent>) },
    Route { method: "POST", path: "/v1/images/import", summary: "Import an image archive (docker save or OCI layout, as tar).", auth: true, query: &[("name", "string", false, "Name to give the image.")], request: Body::Bytes("application/x-tar"), response: Body::Json(schema::<ImageList>) },
];

/// The agent's routes as served under `/v1/sandboxes/{id}`.
pub fn proxied_routes() -> Vec<Route> {
    agent_routes()
        .into_iter()
        .filter(|r| {
            r.path.starts_with("/v1/")
                && r.path != "/v1/pty/compat"
                && r.path != format!("/v1/{}", super::proxy::NOT_PROXIED)
        })
        .map(|r| Route {
            method: r.method,
            // Leaked once: the document is built once per process.
            path: Box::leak(
                format!("/v1/sandboxes/{{id}}{}", &r.path["/v1".len()..])
                    .replace("{id}/processes/{id}", "{id}/processes/{pid}")
                    .replace("{id}/sessions/{id}", "{id}/sessions/{sid}")
                    .replace("{id}/pty/{id}", "{id}/pty/{tid}")
                    .into_boxed_str(),
            ),
            summary: r.summary,
            auth: true,
            query: r.query,
            request: r.request,
            response: r.response,
        })
        .collect()
}

/// The whole document.
pub fn document_value() -> Value {
    let proxied = proxied_routes();
    let mut doc = document(
        "orchard",
        env!("CARGO_PKG_VERSION"),
        ROUTES.iter().chain(proxied.iter()),
    );
    let mut gen = schemars::gen::SchemaSettings::openapi3().into_generator();
    let detail = serde_json::to_value(schema::<Detail>(&mut gen)).unwrap_or(Value::Null);
    for (k, v) in gen.take_definitions() {
        doc["components"]["schemas"][k] = serde_json::to_value(v).unwrap_or(Value::Null);
    }
    // Our own routes answer `Detail`. The proxied ones pass the agent's `ErrorBody`,
    // but the server answers some of their errors itself (a missing key, an unknown or
    // unready sandbox, an unreachable agent), as `Detail`.
    let error = json!({"$ref": "#/components/schemas/ErrorBody"});
    if let Some(paths) = doc["paths"].as_object_mut() {
        for (path, ops) in paths.iter_mut() {
            let ours = ROUTES.iter().any(|r| r.path == path);
            let schema = if ours {
                detail.clone()
            } else {
                json!({"anyOf": [error, detail]})
            };
            if let Some(ops) = ops.as_object_mut() {
                for op in ops.values_mut() {
                    op["responses"]["default"]["content"]["application/json"]["schema"] =
                        schema.clone();
                }
            }
        }
    }
    // Routes whose success is not 200.
    for (method, path, status) in [
        ("post", "/v1/sandboxes", "201"),
        ("post", "/v1/sandboxes/{id}/snapshots", "201"),
        ("post", "/v1/snapshots/{snapshot_id}/fork", "201"),
    ] {
        if let Some(responses) = doc["paths"][path][method]["responses"].as_object_mut() {
            if let Some(ok) = responses.remove("200") {
                responses.insert(status.to_string(), ok);
            }
        }
    }
    doc["components"]["securitySchemes"] =
        json!({"apiKey": {"type": "apiKey", "in": "header", "name": "X-API-Key"}});
    doc["security"] = json!([{"apiKey": []}]);
    doc
}

/// The document as served.
pub fn document_json() -> String {
    static DOC: OnceLock<String> = OnceLock::new();
    DOC.get_or_init(|| serde_json::to_string_pretty(&document_value()).unwrap_or_default() + "\n")
        .clone()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The committed document must be what the code generates. Run with
    /// `UPDATE_OPENAPI=1` (`make openapi`) to rewrite it after an intended change.
    #[test]
    fn committed_orchestrator_openapi_matches_the_code() {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/openapi.json");
        let generated = document_json();
        if std::env::var_os("UPDATE_OPENAPI").is_some() {
            std::fs::write(path, &generated).unwrap();
        }
        let committed = std::fs::read_to_string(path).unwrap_or_default();
        assert!(
            committed == generated,
            "orchestrator/openapi.json is out of date: run `make openapi` and commit it"
        );
    }

    #[test]
    fn every_agent_route_is_proxied_and_documented() {
        let doc = document_value();
        assert!(doc["paths"]["/v1/sandboxes/{id}/exec"]["post"].is_object());
        assert!(doc["paths"]["/v1/sandboxes/{id}/git/diff"]["post"].is_object());
        assert!(doc["paths"]["/sandboxes/{id}/exec"]["post"].is_object());
        assert!(doc["components"]["schemas"]["Detail"].is_object());
        assert!(doc["components"]["schemas"]["Job"].is_object());
    }
}
