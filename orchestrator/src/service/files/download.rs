//! The compatible file download (`GET /sandboxes/{id}/files?path=`): `{"path",
//! "content", "size"}` (`compat::FileContent`) written as the file streams from the
//! agent, base64 encoded on the way. Memory stays bounded whatever the file's size (a
//! whole-file answer once took the server to 3.6 GB for a 1 GiB sparse file). An agent
//! failing mid-file ends the stream with an error, which the client sees as a broken
//! body.

use bytes::Bytes;
use futures_util::Stream;
use http_body_util::BodyExt;
use orchard_protocol::output::b64_encode;

use crate::service::{Error, Service, Tenant};

impl Service {
    /// The file at `path` (made absolute against the sandbox's working directory) as
    /// the pieces of its JSON document. The agent's refusal (a missing file, a
    /// directory) is an error before the first piece.
    pub async fn download(
        &self,
        tenant: &Tenant,
        id: &str,
        path: &str,
    ) -> Result<impl Stream<Item = Result<Bytes, std::io::Error>> + Send + 'static, Error> {
        let live = self.ready(tenant, id).await?;
        let path = Service::resolve(&live, path);
        let body = live.agent.read_stream(&path).await?;
        Ok(base64_json_stream(&path, body))
    }
}

/// The pieces of `{"path":<path>,"content":"<base64 of body>","size":N}`, written as
/// `body`'s frames come: each piece is the base64 of whole 3-byte groups, the rest
/// carried to the next, so the pieces join into one valid base64 string.
pub fn base64_json_stream<B>(
    path: &str,
    body: B,
) -> impl Stream<Item = Result<Bytes, std::io::Error>> + Send + 'static
where
    B: hyper::body::Body<Data = Bytes> + Unpin + Send + 'static,
    B::Error: std::fmt::Display,
{
    struct St<B> {
        body: B,
        prefix: Option<String>,
        carry: Vec<u8>,
        size: u64,
        done: bool,
    }
    let prefix = format!(
        "{{\"path\":{},\"content\":\"",
        serde_json::to_string(path).unwrap_or_else(|_| "\"\"".into())
    );
    let st = St {
        body,
        prefix: Some(prefix),
        carry: Vec::new(),
        size: 0,
        done: false,
    };
    futures_util::stream::unfold(st, |mut st| async move {
        if let Some(p) = st.prefix.take() {
            return Some((Ok(Bytes::from(p)), st));
        }
        if st.done {
            return None;
        }
        loop {
            match st.body.frame().await {
                Some(Ok(frame)) => {
                    let Ok(data) = frame.into_data() else {
                        continue;
                    };
                    st.size += data.len() as u64;
                    st.carry.extend_from_slice(&data);
                    // Whole 3-byte groups now; the rest waits for the next frame.
                    let whole = st.carry.len() / 3 * 3;
                    if whole == 0 {
                        continue;
                    }
                    let out = b64_encode(&st.carry[..whole]);
                    st.carry.drain(..whole);
                    return Some((Ok(Bytes::from(out)), st));
                }
                Some(Err(e)) => {
                    st.done = true;
                    return Some((Err(std::io::Error::other(e.to_string())), st));
                }
                None => {
                    st.done = true;
                    let tail = format!("{}\",\"size\":{}}}", b64_encode(&st.carry), st.size);
                    return Some((Ok(Bytes::from(tail)), st));
                }
            }
        }
    })
}
