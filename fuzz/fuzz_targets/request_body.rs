//! Request bodies as the servers read them: `service::json::parse_json` (the orchestrator's
//! JSON extractor; the agent's is the same serde parse behind an object check) into
//! every request type of the agent API, the orchestrator's `/v1` API and the compatible
//! API, then the quantities the create routes parse (`units::parse_cpu`,
//! `units::parse_memory`).
//! Invariants: a refused body is a client error (400 or 422), never a server error; a
//! parsed body survives serialize -> parse unchanged; a parsed quantity is in range and
//! a refused one is a 400.
#![no_main]

use libfuzzer_sys::fuzz_target;
use orchard::server::error;
use orchard::service::json::parse_json;
use orchard::service::units::{parse_cpu, parse_memory};
use orchard_fuzz::round_trip;
use orchard_protocol::compat::{ApplyPatch, CreateSandbox, ExecJob, UploadFile};
use orchard_protocol::files::{MkdirRequest, MoveRequest};
use orchard_protocol::git::{
    GitApplyRequest, GitCommitRequest, GitDiffRequest, GitResetRequest, GitStatusRequest,
};
use orchard_protocol::process::{SignalRequest, StdinWrite};
use orchard_protocol::pty::{PtyCreate, PtyResize};
use orchard_protocol::sandbox::{PullRequest, SandboxCreate};
use orchard_protocol::session::{SessionCreate, SessionRun};
use orchard_protocol::ExecRequest;

fn parse<T>(body: &[u8]) -> Option<T>
where
    T: serde::Serialize + serde::de::DeserializeOwned + PartialEq + std::fmt::Debug,
{
    match parse_json::<T>(body) {
        Ok(value) => {
            round_trip(&value);
            Some(value)
        }
        Err(err) => {
            let status = error::status(&err);
            assert!(
                status == 400 || status == 422,
                "{} answered {status}: {err}",
                std::any::type_name::<T>()
            );
            None
        }
    }
}

fn quantities(cpu: Option<&str>, memory: Option<&str>) {
    if let Some(cpu) = cpu {
        match parse_cpu(cpu) {
            Ok(v) => assert!(
                v.is_finite() && (0.01..=1024.0).contains(&v),
                "cpu {cpu:?} = {v}"
            ),
            Err(e) => assert_eq!(error::status(&e.into()), 400, "cpu {cpu:?}"),
        }
    }
    if let Some(memory) = memory {
        match parse_memory(memory) {
            Ok(v) => assert!((16 << 20..=1 << 50).contains(&v), "memory {memory:?} = {v}"),
            Err(e) => assert_eq!(error::status(&e.into()), 400, "memory {memory:?}"),
        }
    }
}

fuzz_target!(|body: &[u8]| {
    parse::<ExecRequest>(body);
    parse::<StdinWrite>(body);
    parse::<SignalRequest>(body);
    parse::<SessionCreate>(body);
    parse::<SessionRun>(body);
    parse::<PtyCreate>(body);
    parse::<PtyResize>(body);
    parse::<MkdirRequest>(body);
    parse::<MoveRequest>(body);
    parse::<GitStatusRequest>(body);
    parse::<GitDiffRequest>(body);
    parse::<GitApplyRequest>(body);
    parse::<GitCommitRequest>(body);
    parse::<GitResetRequest>(body);
    parse::<PullRequest>(body);
    parse::<ApplyPatch>(body);
    parse::<UploadFile>(body);
    if let Some(create) = parse::<SandboxCreate>(body) {
        quantities(create.cpu.as_deref(), create.memory.as_deref());
    }
    if let Some(create) = parse::<CreateSandbox>(body) {
        quantities(create.cpu.as_deref(), create.memory.as_deref());
    }
    // `timeout_seconds` is a float: compared as JSON values (serde_json's float parse
    // may differ from the printed value in the last bit, which the server never does).
    match parse_json::<ExecJob>(body) {
        Ok(job) => {
            let text = serde_json::to_string(&job).unwrap();
            let again: ExecJob = serde_json::from_str(&text).unwrap();
            assert_eq!(again.command, job.command);
            assert_eq!(again.env, job.env);
            assert_eq!(again.cwd, job.cwd);
            assert_eq!(
                again.timeout_seconds.is_some(),
                job.timeout_seconds.is_some()
            );
        }
        Err(err) => assert!(
            matches!(error::status(&err), 400 | 422),
            "ExecJob answered {}",
            error::status(&err)
        ),
    }
    // Bodies are usually short text: the quantity parsers get the raw text too.
    if let Ok(text) = std::str::from_utf8(body) {
        if text.len() < 64 {
            quantities(Some(text), Some(text));
        }
    }
});
