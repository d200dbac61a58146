//! The git capability as a client sees it: errors mapped to API codes, and the
//! routes over HTTP through the full router.

use orchard_protocol::ErrorCode;

use super::{git_text, repo_with_patch};
use crate::api::git::{apply, diff, repo_path, reset, status, GitError};
use crate::error::ApiError;

#[test]
fn malformed_patches_and_bad_requests_are_invalid_arguments() {
    let (dir, _) = repo_with_patch();
    let root = dir.path();
    for bad in ["", "not a patch\n", "diff --git a/x b/x\n@@ -1 +1 @@\n-a\n"] {
        let err = apply(root, bad, false, false).unwrap_err();
        assert!(matches!(err, GitError::BadPatch(_)), "{bad:?}: {err:?}");
        assert_eq!(ApiError::from(err).code, ErrorCode::InvalidArgument);
    }
    let err = diff(root, Some("no-such-branch"), true, true).unwrap_err();
    assert!(matches!(err, GitError::BadRevision { .. }), "{err:?}");
    assert_eq!(ApiError::from(err).code, ErrorCode::InvalidArgument);
    let err = reset(root, Some("HEAD~5"), true, true).unwrap_err();
    assert_eq!(ApiError::from(err).code, ErrorCode::InvalidArgument);

    let plain = tempfile::tempdir().unwrap();
    let err = status(plain.path()).unwrap_err();
    let api = ApiError::from(err);
    assert_eq!(api.code, ErrorCode::NotFound);
    assert!(
        api.message.starts_with("no git repository at "),
        "{}",
        api.message
    );
    let api = ApiError::from(status(&plain.path().join("missing")).unwrap_err());
    assert_eq!(api.code, ErrorCode::NotFound);
    assert_eq!(
        ApiError::from(repo_path("relative").unwrap_err()).code,
        ErrorCode::InvalidArgument
    );
}

/// One HTTP/1.1 exchange with the agent's router: status and JSON body.
async fn post_json(
    addr: std::net::SocketAddr,
    path: &str,
    body: serde_json::Value,
) -> (u16, serde_json::Value) {
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    let body = body.to_string();
    let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    let head = format!(
        "POST {path} HTTP/1.1\r\nhost: x\r\nx-orchard-token: tok\r\n\
         content-type: application/json\r\ncontent-length: {}\r\n\
         connection: close\r\n\r\n",
        body.len()
    );
    stream.write_all(head.as_bytes()).await.unwrap();
    stream.write_all(body.as_bytes()).await.unwrap();
    let mut raw = Vec::new();
    stream.read_to_end(&mut raw).await.unwrap();
    let split = raw.windows(4).position(|w| w == b"\r\n\r\n").unwrap();
    let status = String::from_utf8_lossy(&raw[9..12]).parse().unwrap();
    (status, serde_json::from_slice(&raw[split + 4..]).unwrap())
}

#[tokio::test]
async fn routes_answer_over_http() {
    let addr = crate::server::test_http::serve().await;
    let (dir, patch) = repo_with_patch();
    let repo = dir.path().display().to_string();

    let (code, body) = post_json(addr, "/v1/git/status", serde_json::json!({"repo": repo})).await;
    assert_eq!(code, 200, "{body}");
    assert_eq!(body["clean"], true);
    assert_eq!(body["branch"], "main");

    let (code, body) = post_json(
        addr,
        "/v1/git/apply",
        serde_json::json!({"repo": repo, "patch": patch, "check_only": true}),
    )
    .await;
    assert_eq!(code, 200, "{body}");
    assert_eq!(body["applied"], true);
    let (code, body) = post_json(
        addr,
        "/v1/git/apply",
        serde_json::json!({"repo": repo, "patch": patch}),
    )
    .await;
    assert_eq!((code, &body["applied"]), (200, &serde_json::json!(true)));

    let (code, body) = post_json(addr, "/v1/git/diff", serde_json::json!({"repo": repo})).await;
    assert_eq!(code, 200, "{body}");
    assert_eq!(body["patch"], patch);
    assert_eq!(body["files_changed"], 2);

    let (code, body) = post_json(
        addr,
        "/v1/git/commit",
        serde_json::json!({"repo": repo, "message": "over http"}),
    )
    .await;
    assert_eq!(code, 200, "{body}");
    assert_eq!(body["files_changed"], 2);
    let commit = body["commit"].as_str().unwrap().to_string();
    let author = git_text(dir.path(), &["log", "-1", "--format=%an <%ae>"]);
    assert_eq!(author.trim(), "Orchard Agent <agent@orchard.invalid>");

    let (code, body) = post_json(
        addr,
        "/v1/git/reset",
        serde_json::json!({"repo": repo, "target": "HEAD~1"}),
    )
    .await;
    assert_eq!(code, 200, "{body}");
    assert_ne!(body["head"], commit);

    let (code, body) = post_json(
        addr,
        "/v1/git/status",
        serde_json::json!({"repo": "/nowhere"}),
    )
    .await;
    assert_eq!(code, 404, "{body}");
    assert_eq!(body["code"], "not_found");
    assert_eq!(body["message"], "no git repository at /nowhere");
    let (code, body) = post_json(addr, "/v1/git/status", serde_json::json!({})).await;
    assert_eq!(
        (code, &body["code"]),
        (400, &serde_json::json!("invalid_json"))
    );
    let (code, body) = post_json(
        addr,
        "/v1/git/diff",
        serde_json::json!({"repo": repo, "base": "nope"}),
    )
    .await;
    assert_eq!(
        (code, &body["code"]),
        (400, &serde_json::json!("invalid_argument"))
    );
}
