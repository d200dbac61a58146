//! Process machinery: starting, reaping and watching the commands the agent runs.

pub mod buffer;
pub mod chunks;
pub mod placement;
pub mod procfs;
pub mod reaper;
pub mod spawn;
pub mod supervise;
