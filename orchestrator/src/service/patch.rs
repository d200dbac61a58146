//! The compatible `apply_patch`: the agent's libgit2 applies the patch all or nothing
//! in the sandbox's working directory; when it cannot take the patch at all (no
//! repository there, or a plain unified diff rather than `diff --git`, as users'
//! patches often are), the image's own `git apply` (or `patch -p1` where there is no
//! git) tries it instead. The answer is Orchard's: `{success, stdout, stderr,
//! exit_code, error}` in `git apply`'s words.

use std::time::Duration;

use orchard_client::ClientError;
use orchard_protocol::compat::PatchResult;
use orchard_protocol::git::{GitApplyRequest, GitApplyResult};

use super::{Error, Live, Service, Tenant};

/// Largest patch of `apply_patch`: the agent takes request bodies of at most 16 MiB.
pub const MAX_PATCH_BYTES: usize = 16 << 20;

/// What the agent's answer to a patch leaves to do.
#[derive(Debug, PartialEq)]
pub enum Verdict {
    /// The answer, applied or not.
    Done(PatchResult),
    /// libgit2 could not take the patch: the sandbox's own tools try it.
    WithTools,
}

impl Service {
    /// Applies `patch` in the sandbox's working directory within `timeout_seconds`
    /// (1 to 3600). A patch that does not apply is an answer (`success: false`), not
    /// an error.
    pub async fn apply_patch(
        &self,
        tenant: &Tenant,
        id: &str,
        patch: String,
        timeout_seconds: u64,
    ) -> Result<PatchResult, Error> {
        if patch.len() > MAX_PATCH_BYTES {
            return Err(Error::TooLarge(format!(
                "the patch is {} bytes; at most {MAX_PATCH_BYTES}",
                patch.len()
            )));
        }
        let live = self.ready(tenant, id).await?;
        let apply = GitApplyRequest {
            repo: Service::default_dir(&live).to_string(),
            patch,
            check_only: false,
            fuzzy: false,
        };
        let limit = Duration::from_secs(timeout_seconds.clamp(1, 3600));
        let answer = tokio::time::timeout(limit, live.agent.git_apply(&apply))
            .await
            .ok();
        match judge(answer, limit)? {
            Verdict::Done(r) => Ok(r),
            Verdict::WithTools => Ok(
                match patch_with_tools(&live, &apply.repo, &apply.patch, limit).await {
                    Ok(r) => r,
                    Err(e) => failed(e),
                },
            ),
        }
    }
}

/// The answer to a patch that could not be tried: `error` says why.
fn failed(error: String) -> PatchResult {
    PatchResult {
        success: false,
        stdout: String::new(),
        stderr: error.clone(),
        exit_code: 1,
        error: Some(error),
    }
}

/// What the agent's answer (`None`: none within `limit`) to a patch means. An error
/// the agent answered (libgit2 refusing the repository or the patch's form) hands the
/// patch to the sandbox's tools; one that got no answer is the call's error.
pub fn judge(
    answer: Option<Result<GitApplyResult, ClientError>>,
    limit: Duration,
) -> Result<Verdict, Error> {
    let result = match answer {
        None => failed(format!(
            "applying the patch took longer than {} s",
            limit.as_secs()
        )),
        Some(Err(ClientError::Api { .. })) => return Ok(Verdict::WithTools),
        Some(Err(e)) => return Err(e.into()),
        Some(Ok(r)) if r.applied => PatchResult {
            success: true,
            stdout: r
                .files
                .iter()
                .map(|f| format!("Applied patch to '{f}' cleanly.\n"))
                .collect(),
            stderr: String::new(),
            exit_code: 0,
            error: None,
        },
        Some(Ok(r)) => PatchResult {
            success: false,
            stdout: String::new(),
            stderr: r
                .conflicts
                .iter()
                .map(|c| match &c.header {
                    Some(h) => format!("error: patch failed: {} {h}: {}\n", c.path, c.reason),
                    None => format!("error: {}: {}\n", c.path, c.reason),
                })
                .collect(),
            exit_code: 1,
            error: None,
        },
    };
    Ok(Verdict::Done(result))
}

/// Applies `patch` in `dir` with the image's own `git apply` (or `patch -p1` when there
/// is no git), through a temporary file.
async fn patch_with_tools(
    live: &Live,
    dir: &str,
    patch: &str,
    limit: Duration,
) -> Result<PatchResult, String> {
    let tag = crate::random::hex(6).map_err(|e| e.to_string())?;
    let file = format!("/tmp/.orchard-patch-{tag}");
    live.agent
        .write_file(&file, patch.as_bytes().to_vec(), None)
        .await
        .map_err(|e| format!("cannot stage the patch: {e}"))?;
    let script =
        "cd \"$1\" || exit 1; if command -v git >/dev/null 2>&1; then git apply -v \"$2\"; \
                  else patch -p1 -i \"$2\"; fi; rc=$?; rm -f \"$2\"; exit $rc";
    let req = orchard_protocol::ExecRequest {
        command: orchard_protocol::Command::Argv(vec![
            live.shell.clone(),
            "-c".into(),
            script.into(),
            "apply_patch".into(),
            dir.into(),
            file.clone(),
        ]),
        timeout_ms: Some(limit.as_millis() as u64),
        ..Default::default()
    };
    let r = live
        .agent
        .exec(&req)
        .await
        .map_err(|e| format!("cannot run git apply: {e}"))?;
    let code = r.exit_code.or(r.signal.map(|s| 128 + s)).unwrap_or(1);
    Ok(PatchResult {
        success: code == 0 && !r.timed_out,
        stdout: r.stdout.text_lossy(),
        stderr: r.stderr.text_lossy(),
        exit_code: code,
        error: r
            .timed_out
            .then(|| format!("applying the patch took longer than {} s", limit.as_secs())),
    })
}

#[cfg(test)]
mod tests {
    use orchard_protocol::git::GitConflict;
    use orchard_protocol::{ErrorBody, ErrorCode};

    use super::*;
    use crate::backend::fake::FakeBackend;
    use crate::service::tests::{tenant, Harness};

    const LIMIT: Duration = Duration::from_secs(7);

    fn git_result(applied: bool, conflicts: Vec<GitConflict>) -> GitApplyResult {
        GitApplyResult {
            applied,
            files: vec!["a.txt".into(), "d/b.txt".into()],
            fuzzed: Vec::new(),
            conflicts,
        }
    }

    #[test]
    fn the_agents_answer_is_put_in_git_applys_words_and_its_refusal_hands_over() {
        let done = |v: Result<Verdict, Error>| match v {
            Ok(Verdict::Done(r)) => r,
            other => panic!("{other:?}"),
        };
        let r = done(judge(Some(Ok(git_result(true, Vec::new()))), LIMIT));
        assert_eq!(
            (r.success, r.exit_code, r.error, r.stderr.as_str()),
            (true, 0, None, "")
        );
        assert_eq!(
            r.stdout,
            "Applied patch to 'a.txt' cleanly.\nApplied patch to 'd/b.txt' cleanly.\n"
        );
        let conflicts = vec![
            GitConflict {
                path: "a.txt".into(),
                hunk: Some(2),
                header: Some("@@ -3,2 +3,2 @@".into()),
                reason: "does not match".into(),
            },
            GitConflict {
                path: "gone.txt".into(),
                hunk: None,
                header: None,
                reason: "no such file".into(),
            },
        ];
        let r = done(judge(Some(Ok(git_result(false, conflicts))), LIMIT));
        assert_eq!((r.success, r.exit_code, r.stdout.as_str()), (false, 1, ""));
        assert_eq!(
            r.stderr,
            "error: patch failed: a.txt @@ -3,2 +3,2 @@: does not match\nerror: gone.txt: no such file\n"
        );
        let r = done(judge(None, LIMIT));
        assert_eq!(
            (r.success, r.error.as_deref()),
            (false, Some("applying the patch took longer than 7 s"))
        );
        assert_eq!(r.stderr, "applying the patch took longer than 7 s");

        // The agent refusing (no repository, not a `diff --git`): the sandbox's tools.
        let refused = orchard_client::ClientError::Api {
            status: hyper::StatusCode::BAD_REQUEST,
            body: ErrorBody::new(ErrorCode::InvalidArgument, "not a git repository"),
        };
        assert_eq!(
            judge(Some(Err(refused)), LIMIT).unwrap(),
            Verdict::WithTools
        );
        // No answer at all is the call's error, not a fallback.
        let cut = orchard_client::ClientError::decode("a broken answer");
        let e = judge(Some(Err(cut)), LIMIT).unwrap_err();
        assert!(matches!(e, Error::AgentUnreachable { .. }), "{e:?}");
    }

    /// A harness with a ready sandbox whose working directory holds `f.txt` (`one two
    /// three`), in a git work tree when `git`; answers the harness, the sandbox and its
    /// working directory.
    async fn sandbox_with_f(git: bool) -> (Harness, String, std::path::PathBuf) {
        let h = Harness::new(FakeBackend::tcp()).await;
        let id = h.ready_sandbox().await;
        let workdir = h.dir.path().join("workspace");
        std::fs::write(workdir.join("f.txt"), "one\ntwo\nthree\n").unwrap();
        if git {
            let out = std::process::Command::new("git")
                .args(["init", "-q"])
                .current_dir(&workdir)
                .output()
                .unwrap();
            assert!(out.status.success(), "{out:?}");
        }
        (h, id, workdir)
    }

    /// Applies `patch` in `id`, which answers (whether or not the patch applied).
    async fn apply(h: &Harness, id: &str, patch: &str) -> PatchResult {
        h.service
            .apply_patch(&tenant(), id, patch.into(), 30)
            .await
            .unwrap()
    }

    const PATCH: &str =
        "diff --git a/f.txt b/f.txt\n--- a/f.txt\n+++ b/f.txt\n@@ -1,3 +1,3 @@\n one\n-two\n+TWO\n three\n";

    #[tokio::test]
    async fn a_patch_in_a_git_tree_is_applied_by_the_agent_without_the_fallback() {
        let (h, id, workdir) = sandbox_with_f(true).await;
        let r = apply(&h, &id, PATCH).await;
        // libgit2's words: `git apply -v` would say "Applied patch f.txt cleanly."
        assert_eq!(
            (r.success, r.stdout.as_str(), r.stderr.as_str()),
            (true, "Applied patch to 'f.txt' cleanly.\n", "")
        );
        let f = std::fs::read_to_string(workdir.join("f.txt")).unwrap();
        assert_eq!(f, "one\nTWO\nthree\n");
        // Again: it no longer applies, which is an answer, not an error.
        let r = apply(&h, &id, PATCH).await;
        assert_eq!(
            (r.success, r.exit_code, r.error.as_deref()),
            (false, 1, None)
        );
        assert!(r.stderr.starts_with("error: "), "{r:?}");
    }

    #[tokio::test]
    async fn a_plain_diff_outside_a_git_tree_falls_back_to_the_sandboxs_tools() {
        let (h, id, workdir) = sandbox_with_f(false).await;
        let plain = "--- a/f.txt\n+++ b/f.txt\n@@ -1,3 +1,3 @@\n one\n-two\n+TWO\n three\n";
        let r = apply(&h, &id, plain).await;
        assert_eq!(
            (r.success, r.exit_code, r.error.as_deref()),
            (true, 0, None),
            "{r:?}"
        );
        assert!(
            !r.stdout.contains("Applied patch to '"),
            "not libgit2: {r:?}"
        );
        let f = std::fs::read_to_string(workdir.join("f.txt")).unwrap();
        assert_eq!(f, "one\nTWO\nthree\n");
        // The tools' own failure is answered as theirs.
        let r = apply(&h, &id, plain).await;
        assert!(!r.success && r.exit_code != 0, "{r:?}");
        assert!(!r.stderr.is_empty(), "{r:?}");
    }

    #[tokio::test]
    async fn a_patch_over_the_limit_is_refused_before_the_sandbox_is_looked_up() {
        let h = Harness::new(FakeBackend::tcp()).await;
        let big = "x".repeat(MAX_PATCH_BYTES + 1);
        let e = h
            .service
            .apply_patch(&tenant(), "no-such-sandbox", big, 30)
            .await
            .unwrap_err();
        assert!(
            matches!(&e, Error::TooLarge(m) if m == &format!("the patch is {} bytes; at most {MAX_PATCH_BYTES}", MAX_PATCH_BYTES + 1)),
            "{e:?}"
        );
    }
}
