//! The OpenAPI 3.0 document of the agent API, generated from the wire types.
//!
//! [`agent_routes`] is the one list of the agent's routes; the agent's integration tests
//! call every entry against a real agent, and `protocol/openapi/agent.json` is this
//! document committed, compared by a test so an API change is always a reviewed diff.

use schemars::gen::{SchemaGenerator, SchemaSettings};
use schemars::schema::Schema;
use schemars::JsonSchema;
use serde_json::{json, Map, Value};

use crate::error::ErrorBody;
use crate::exec::{ExecEvent, ExecKept, ExecRequest, ExecResult};
use crate::files::{
    Done, ExtractResult, FileList, FileStat, MkdirRequest, MoveRequest, WriteResult,
};
use crate::health::{Health, TokenRotate, TokenRotated};
use crate::process::{ProcessInfo, ProcessList, ProcessOutput, SignalRequest, StdinWrite};
use crate::pty::{PtyCreate, PtyInfo, PtyList, PtyResize};
use crate::session::{
    SessionCreate, SessionInfo, SessionList, SessionRun, SessionRunResult, SessionState,
};

pub use crate::route::{Body, Param, Route};

fn schema<T: JsonSchema>(gen: &mut SchemaGenerator) -> Schema {
    gen.subschema_for::<T>()
}

const PATH: Param = ("path", "string", true, "Absolute path inside the sandbox.");

/// Every route the agent serves, core and per-capability lists together.
pub fn agent_routes() -> Vec<&'static Route> {
    AGENT_ROUTES.iter().chain(crate::git::GIT_ROUTES).collect()
}

/// The agent's core routes (exec, processes, sessions, files, health); capabilities
/// with their own module list theirs there (see [`agent_routes`]).
pub const AGENT_ROUTES: &[Route] = &[
    Route {
        method: "GET",
        path: "/livez",
        summary: "Liveness probe; the only route open without a token.",
        auth: false,
        query: &[],
        request: Body::Empty,
        response: Body::Bytes("text/plain"),
    },
    Route {
        method: "GET",
        path: "/v1/health",
        summary: "Version, uptime, process count and resource usage.",
        auth: true,
        query: &[],
        request: Body::Empty,
        response: Body::Json(schema::<Health>),
    },
    Route {
        method: "PUT",
        path: "/v1/token",
        summary: "Replace the agent's token; the old one is refused from then on.",
        auth: true,
        query: &[],
        request: Body::Json(schema::<TokenRotate>),
        response: Body::Json(schema::<TokenRotated>),
    },
    Route {
        method: "POST",
        path: "/v1/exec",
        summary: "Run a command and answer when it ends.",
        auth: true,
        query: &[],
        request: Body::Json(schema::<ExecRequest>),
        response: Body::Json(schema::<ExecResult>),
    },
    Route {
        method: "POST",
        path: "/v1/exec/stream",
        summary: "Run a command and stream its output: NDJSON events, or binary frames with `Accept: application/vnd.orchard.exec-frames`.",
        auth: true,
        query: &[],
        request: Body::Json(schema::<ExecRequest>),
        response: Body::NdjsonOrFrames(schema::<ExecEvent>),
    },
    Route {
        method: "GET",
        path: "/v1/exec/results/{id}",
        summary: "A command run with a `result_id`: waits while it runs, then its result.",
        auth: true,
        query: &[(
            "timeout_ms",
            "integer",
            false,
            "How long to wait for a running command; default 0 (answer at once).",
        )],
        request: Body::Empty,
        response: Body::Json(schema::<ExecKept>),
    },
    Route {
        method: "POST",
        path: "/v1/processes",
        summary: "Start a background process.",
        auth: true,
        query: &[],
        request: Body::Json(schema::<ExecRequest>),
        response: Body::Json(schema::<ProcessInfo>),
    },
    Route {
        method: "GET",
        path: "/v1/processes",
        summary: "List running and retained background processes.",
        auth: true,
        query: &[],
        request: Body::Empty,
        response: Body::Json(schema::<ProcessList>),
    },
    Route {
        method: "GET",
        path: "/v1/processes/{id}",
        summary: "One background process.",
        auth: true,
        query: &[],
        request: Body::Empty,
        response: Body::Json(schema::<ProcessInfo>),
    },
    Route {
        method: "DELETE",
        path: "/v1/processes/{id}",
        summary: "Kill the process group if running and forget the process.",
        auth: true,
        query: &[],
        request: Body::Empty,
        response: Body::Json(schema::<ProcessInfo>),
    },
    Route {
        method: "GET",
        path: "/v1/processes/{id}/output",
        summary: "Output since the given offsets.",
        auth: true,
        query: &[
            (
                "stdout_offset",
                "integer",
                false,
                "Absolute stdout offset; default 0.",
            ),
            (
                "stderr_offset",
                "integer",
                false,
                "Absolute stderr offset; default 0.",
            ),
            (
                "max_bytes",
                "integer",
                false,
                "Most bytes returned per stream; default 1 MiB.",
            ),
        ],
        request: Body::Empty,
        response: Body::Json(schema::<ProcessOutput>),
    },
    Route {
        method: "POST",
        path: "/v1/processes/{id}/stdin",
        summary: "Write to the process's stdin and optionally close it.",
        auth: true,
        query: &[],
        request: Body::Json(schema::<StdinWrite>),
        response: Body::Json(schema::<ProcessInfo>),
    },
    Route {
        method: "POST",
        path: "/v1/processes/{id}/signal",
        summary: "Send a signal to the process group (or only the leader).",
        auth: true,
        query: &[],
        request: Body::Json(schema::<SignalRequest>),
        response: Body::Json(schema::<ProcessInfo>),
    },
    Route {
        method: "GET",
        path: "/v1/processes/{id}/wait",
        summary: "Wait for the process to end; answers `running` if the wait ran out.",
        auth: true,
        query: &[(
            "timeout_ms",
            "integer",
            false,
            "Longest wait; default 30000.",
        )],
        request: Body::Empty,
        response: Body::Json(schema::<ProcessInfo>),
    },
    Route {
        method: "POST",
        path: "/v1/sessions",
        summary: "Start a persistent shell session, or bring back a captured one (`restore`).",
        auth: true,
        query: &[],
        request: Body::Json(schema::<SessionCreate>),
        response: Body::Json(schema::<SessionInfo>),
    },
    Route {
        method: "GET",
        path: "/v1/sessions",
        summary: "List sessions.",
        auth: true,
        query: &[],
        request: Body::Empty,
        response: Body::Json(schema::<SessionList>),
    },
    Route {
        method: "GET",
        path: "/v1/sessions/{id}",
        summary: "One session.",
        auth: true,
        query: &[],
        request: Body::Empty,
        response: Body::Json(schema::<SessionInfo>),
    },
    Route {
        method: "DELETE",
        path: "/v1/sessions/{id}",
        summary: "Kill the session's shell and everything it started.",
        auth: true,
        query: &[],
        request: Body::Empty,
        response: Body::Json(schema::<SessionInfo>),
    },
    Route {
        method: "POST",
        path: "/v1/sessions/{id}/run",
        summary: "Run a command in the session; cd, export and functions persist.",
        auth: true,
        query: &[],
        request: Body::Json(schema::<SessionRun>),
        response: Body::Json(schema::<SessionRunResult>),
    },
    Route {
        method: "GET",
        path: "/v1/sessions/{id}/state",
        summary: "The session's directory, exported variables and functions, captured between two of its commands (waits for a running one).",
        auth: true,
        query: &[],
        request: Body::Empty,
        response: Body::Json(schema::<SessionState>),
    },
    Route {
        method: "POST",
        path: "/v1/pty",
        summary: "Start a program on a new terminal.",
        auth: true,
        query: &[],
        request: Body::Json(schema::<PtyCreate>),
        response: Body::Json(schema::<PtyInfo>),
    },
    Route {
        method: "GET",
        path: "/v1/pty",
        summary: "List terminals.",
        auth: true,
        query: &[],
        request: Body::Empty,
        response: Body::Json(schema::<PtyList>),
    },
    Route {
        method: "GET",
        path: "/v1/pty/{id}",
        summary: "One terminal.",
        auth: true,
        query: &[],
        request: Body::Empty,
        response: Body::Json(schema::<PtyInfo>),
    },
    Route {
        method: "DELETE",
        path: "/v1/pty/{id}",
        summary: "Close a terminal (SIGHUP to its session, then SIGKILL).",
        auth: true,
        query: &[],
        request: Body::Empty,
        response: Body::Json(schema::<PtyInfo>),
    },
    Route {
        method: "POST",
        path: "/v1/pty/{id}/resize",
        summary: "Resize a terminal.",
        auth: true,
        query: &[],
        request: Body::Json(schema::<PtyResize>),
        response: Body::Json(schema::<PtyInfo>),
    },
    Route {
        method: "GET",
        path: "/v1/pty/{id}/attach",
        summary: "WebSocket: attach as a viewer (PtyClientFrame in, PtyServerFrame out; scrollback first).",
        auth: true,
        query: &[],
        request: Body::WebSocket,
        response: Body::WebSocket,
    },
    Route {
        method: "GET",
        path: "/v1/pty/compat",
        summary: "WebSocket: the Orchard-compatible terminal protocol (init first).",
        auth: true,
        query: &[],
        request: Body::WebSocket,
        response: Body::WebSocket,
    },
    Route {
        method: "GET",
        path: "/v1/files",
        summary: "Read a file, whole or a byte range, streamed.",
        auth: true,
        query: &[
            PATH,
            ("offset", "integer", false, "First byte; default 0."),
            (
                "length",
                "integer",
                false,
                "Most bytes; default to the end.",
            ),
        ],
        request: Body::Empty,
        response: Body::Bytes("application/octet-stream"),
    },
    Route {
        method: "PUT",
        path: "/v1/files",
        summary: "Write a file from the streamed body, atomically (temp file + rename).",
        auth: true,
        query: &[
            PATH,
            (
                "mode",
                "string",
                false,
                "Octal permission bits, e.g. 755; default 644.",
            ),
            (
                "parents",
                "boolean",
                false,
                "Create missing parents; default true.",
            ),
        ],
        request: Body::Bytes("application/octet-stream"),
        response: Body::Json(schema::<WriteResult>),
    },
    Route {
        method: "DELETE",
        path: "/v1/files",
        summary: "Remove a file, link or directory.",
        auth: true,
        query: &[
            PATH,
            (
                "recursive",
                "boolean",
                false,
                "Remove a non-empty directory; default false.",
            ),
        ],
        request: Body::Empty,
        response: Body::Json(schema::<Done>),
    },
    Route {
        method: "GET",
        path: "/v1/files/stat",
        summary: "Metadata of a path (links are not followed).",
        auth: true,
        query: &[PATH],
        request: Body::Empty,
        response: Body::Json(schema::<FileStat>),
    },
    Route {
        method: "GET",
        path: "/v1/files/list",
        summary: "List a directory, optionally several levels deep.",
        auth: true,
        query: &[
            PATH,
            ("depth", "integer", false, "Levels to descend; default 1."),
        ],
        request: Body::Empty,
        response: Body::Json(schema::<FileList>),
    },
    Route {
        method: "POST",
        path: "/v1/files/mkdir",
        summary: "Create a directory and its missing parents.",
        auth: true,
        query: &[],
        request: Body::Json(schema::<MkdirRequest>),
        response: Body::Json(schema::<Done>),
    },
    Route {
        method: "POST",
        path: "/v1/files/move",
        summary: "Move or rename a path.",
        auth: true,
        query: &[],
        request: Body::Json(schema::<MoveRequest>),
        response: Body::Json(schema::<Done>),
    },
    Route {
        method: "PUT",
        path: "/v1/files/archive",
        summary: "Extract a tar or tar.gz body into a directory, all or nothing.",
        auth: true,
        query: &[PATH],
        request: Body::Bytes("application/x-tar"),
        response: Body::Json(schema::<ExtractResult>),
    },
    Route {
        method: "GET",
        path: "/v1/files/archive",
        summary: "Download a file or directory as a tar.gz stream.",
        auth: true,
        query: &[PATH],
        request: Body::Empty,
        response: Body::Bytes("application/gzip"),
    },
];

fn content(gen: &mut SchemaGenerator, body: Body) -> Option<Value> {
    let (media, schema) = match body {
        Body::Empty | Body::WebSocket => return None,
        Body::Json(f) | Body::OptionalJson(f) => {
            ("application/json", serde_json::to_value(f(gen)).ok()?)
        }
        Body::Ndjson(f) => (crate::NDJSON, serde_json::to_value(f(gen)).ok()?),
        Body::NdjsonOrFrames(f) => {
            return Some(json!({
                crate::NDJSON: { "schema": serde_json::to_value(f(gen)).ok()? },
                crate::frames::EXEC_FRAMES: { "schema": {"type": "string", "format": "binary"} },
            }));
        }
        Body::Bytes(media) => (media, json!({"type": "string", "format": "binary"})),
    };
    Some(json!({ media: { "schema": schema } }))
}

/// Builds an OpenAPI 3.0 document for a list of routes.
pub fn document<'a>(
    title: &str,
    version: &str,
    routes: impl IntoIterator<Item = &'a Route>,
) -> Value {
    let mut gen = SchemaSettings::openapi3().into_generator();
    let error_schema = schema::<ErrorBody>(&mut gen);
    let mut paths = Map::new();
    for route in routes {
        let mut op = Map::new();
        op.insert("summary".into(), json!(route.summary));
        let mut params: Vec<Value> = route
            .query
            .iter()
            .map(|(name, ty, required, desc)| {
                json!({"name": name, "in": "query", "required": required,
                       "description": desc, "schema": {"type": ty}})
            })
            .collect();
        let mut rest = route.path;
        while let Some(start) = rest.find('{') {
            let Some(len) = rest[start..].find('}') else {
                break;
            };
            let name = &rest[start + 1..start + len];
            params.push(json!({"name": name, "in": "path", "required": true,
                               "schema": {"type": "string"}}));
            rest = &rest[start + len..];
        }
        if !params.is_empty() {
            op.insert("parameters".into(), Value::Array(params));
        }
        if let Some(c) = content(&mut gen, route.request) {
            let required = !matches!(route.request, Body::OptionalJson(_));
            op.insert(
                "requestBody".into(),
                json!({"required": required, "content": c}),
            );
        }
        let mut ok = match route.response {
            Body::WebSocket => json!({"description": "Upgraded to a WebSocket (101)."}),
            _ => json!({"description": "Success."}),
        };
        if let Some(c) = content(&mut gen, route.response) {
            ok["content"] = c;
        }
        op.insert(
            "responses".into(),
            json!({
                "200": ok,
                "default": {"description": "Error.",
                            "content": {"application/json": {"schema": error_schema}}}
            }),
        );
        if !route.auth {
            op.insert("security".into(), json!([]));
        }
        let entry = paths
            .entry(route.path.to_string())
            .or_insert_with(|| Value::Object(Map::new()));
        if let Value::Object(map) = entry {
            map.insert(route.method.to_ascii_lowercase(), Value::Object(op));
        }
    }
    let schemas: Map<String, Value> = gen
        .take_definitions()
        .into_iter()
        .map(|(k, v)| (k, serde_json::to_value(v).unwrap_or(Value::Null)))
        .collect();
    json!({
        "openapi": "3.0.3",
        "info": {"title": title, "version": version},
        "paths": paths,
        "components": {
            "schemas": schemas,
            "securitySchemes": {"token": {"type": "apiKey", "in": "header", "name": crate::TOKEN_HEADER}}
        },
        "security": [{"token": []}]
    })
}

/// The agent API document.
pub fn agent_document() -> Value {
    document("orchard-agent", env!("CARGO_PKG_VERSION"), agent_routes())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The committed document must be what the code generates. Run with
    /// `UPDATE_OPENAPI=1` to rewrite it after an intended change.
    #[test]
    fn committed_agent_openapi_matches_the_code() {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/openapi/agent.json");
        let generated = serde_json::to_string_pretty(&agent_document()).unwrap() + "\n";
        if std::env::var_os("UPDATE_OPENAPI").is_some() {
            std::fs::create_dir_all(concat!(env!("CARGO_MANIFEST_DIR"), "/openapi")).unwrap();
            std::fs::write(path, &generated).unwrap();
        }
        let committed = std::fs::read_to_string(path).unwrap_or_default();
        assert!(
            committed == generated,
            "protocol/openapi/agent.json is out of date: run `make openapi` and commit it"
        );
    }

    #[test]
    fn every_route_is_unique_and_documented() {
        let mut seen = std::collections::HashSet::new();
        for r in agent_routes() {
            assert!(
                seen.insert((r.method, r.path)),
                "duplicate {} {}",
                r.method,
                r.path
            );
            assert!(!r.summary.is_empty());
        }
        let doc = agent_document();
        assert!(doc["components"]["schemas"]["ExecRequest"].is_object());
        assert!(doc["components"]["schemas"]["ErrorBody"].is_object());
    }
}
