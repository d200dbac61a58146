//! The compatible file routes' work, apart from HTTP: an upload streamed through its
//! parser ([`parser`]) into a bounded spool ([`spool`]), then to the agent ([`upload`]);
//! a download streamed from the agent as the route's JSON document, base64 encoded on
//! the way ([`download`]); a directory listing. The routes (`server::compat`) only
//! read the request, call these and answer.

pub mod download;
pub mod parser;
pub mod spool;
pub mod upload;

use orchard_protocol::compat::{FileListing, ListedFile};
use orchard_protocol::files::FileKind;

use super::{iso, Error, Service, Tenant};

/// Largest body of the compatible file upload (base64 inflates by a third).
pub const MAX_UPLOAD_JSON: usize = 512 << 20;

/// The error of a call that got no answer from the agent (a 502 naming why): a
/// transport failure in its own words, without the "transport: " the client's message
/// puts before them.
pub fn agent_unreachable(e: orchard_client::ClientError) -> Error {
    let reason = match &e {
        orchard_client::ClientError::Transport { message, .. } => message.clone(),
        e => e.to_string(),
    };
    Error::AgentUnreachable { reason, source: e }
}

impl Service {
    /// The entries of directory `path` (the default working directory when absent or
    /// empty) in the compatible form, sorted by name.
    pub async fn list_files(
        &self,
        tenant: &Tenant,
        id: &str,
        path: Option<&str>,
    ) -> Result<FileListing, Error> {
        let live = self.ready(tenant, id).await?;
        let path = match path {
            Some(p) if !p.is_empty() => Service::resolve(&live, p),
            _ => Service::default_dir(&live).to_string(),
        };
        let list = live.agent.list_dir(&path, 1).await?;
        let truncated = list.truncated;
        let mut files: Vec<ListedFile> = list
            .entries
            .into_iter()
            .map(|e| ListedFile {
                name: e.name,
                kind: if e.kind == FileKind::Directory {
                    "directory"
                } else {
                    "file"
                }
                .into(),
                size: e.size,
                modified: iso(e.modified_ms.max(0) as u64),
            })
            .collect();
        files.sort_by(|a, b| a.name.cmp(&b.name));
        Ok(FileListing {
            path,
            files,
            truncated,
        })
    }
}

#[cfg(test)]
mod tests;
