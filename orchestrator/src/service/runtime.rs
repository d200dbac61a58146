//! What this process keeps per ready sandbox and never stores: a client of its agent,
//! and whether a job worker for it runs here.
//! The store holds the agent's endpoint and token (data); [`Runtime::live`] turns them
//! into a [`Live`] once and reuses it. An entry is keyed by the record's incarnation
//! (`uid`) and endpoint: a new sandbox under an old id, or an agent that moved, gets a
//! new client.
//!
//! Every client, the probes of new sandboxes and the `/v1` proxy share the runtime's one
//! connection [`Pool`], so a sandbox's compatible jobs and proxied calls reuse the same
//! keep-alive connections.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};

use orchard_client::{AgentClient, Pool};

use crate::backend::AgentEndpoint;
use crate::state::{AgentRecord, SandboxRecord};

/// A ready sandbox's agent, as this process reaches it.
pub struct Live {
    /// A pooled client of its agent.
    pub agent: AgentClient,
    /// How to reach it directly.
    pub endpoint: AgentEndpoint,
    /// When it became ready (ms since the epoch).
    pub ready_ms: u64,
    /// `bash` when the image has it, else `sh`.
    pub shell: String,
    /// Default working directory: the configured one, made at create; `/` when it
    /// could not be made (a read-only image).
    pub workdir: String,
}

impl Live {
    /// A client for the agent `rec`, over `pool`'s connections.
    pub fn new(rec: &AgentRecord, pool: &Pool) -> Live {
        Live {
            agent: AgentClient::with_pool(pool.clone(), rec.endpoint.client(), rec.token.clone()),
            endpoint: rec.endpoint.clone(),
            ready_ms: rec.ready_ms,
            shell: rec.shell.clone(),
            workdir: rec.workdir.clone(),
        }
    }
}

/// The agent clients of this process, by sandbox id, and their connection pool.
#[derive(Default)]
pub struct Runtime {
    /// Held briefly to look up or insert a client; never across an await.
    agents: Mutex<HashMap<String, (String, Arc<Live>)>>,
    pool: Pool,
    /// The sandboxes (id, incarnation) with a job worker in this process.
    workers: Mutex<HashSet<(String, String)>>,
}

impl Runtime {
    /// The connections to every agent.
    pub fn pool(&self) -> &Pool {
        &self.pool
    }

    /// The live agent of a ready record (`None` before it is ready).
    pub fn live(&self, rec: &SandboxRecord) -> Option<Arc<Live>> {
        let agent = rec.agent.as_ref()?;
        let mut agents = self.agents.lock().unwrap_or_else(|p| p.into_inner());
        if let Some((uid, live)) = agents.get(&rec.id) {
            if uid == &rec.uid && live.endpoint == agent.endpoint {
                return Some(live.clone());
            }
        }
        let live = Arc::new(Live::new(agent, &self.pool));
        agents.insert(rec.id.clone(), (rec.uid.clone(), live.clone()));
        Some(live)
    }

    /// Registers a job worker for `id` incarnation `uid`; `false` when one runs already.
    pub fn claim_worker(&self, id: &str, uid: &str) -> bool {
        self.workers
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert((id.to_string(), uid.to_string()))
    }

    /// The worker of `id` incarnation `uid` ended.
    pub fn worker_done(&self, id: &str, uid: &str) {
        self.workers
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&(id.to_string(), uid.to_string()));
    }

    /// Forgets the client of `id` (the sandbox is gone).
    pub fn forget(&self, id: &str) {
        self.agents
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(id);
    }
}
