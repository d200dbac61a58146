//! Process machinery: starting, reaping and watching the commands the agent runs, with
//! no HTTP in it.
//!
//! [`spawn`] starts every command (exec, background process, session shell, terminal)
//! in its own process group and registers its exit with the [`reaper`], the only
//! place that waits on children; [`supervise`] watches a command to its end, pumping
//! its output through [`chunks`] into a sink (the [`buffer`]s of a capability), and
//! enforces its time limit. [`placement`] pins a new command to its spawner's CPU when
//! every CPU is busy; [`procfs`] reads `/proc` (process counts, CPU time, descendants,
//! sessions).

pub mod buffer;
pub mod chunks;
pub mod placement;
pub mod procfs;
pub mod reaper;
pub mod spawn;
pub mod supervise;
