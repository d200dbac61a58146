//! End-to-end tests across the parts: a real `orchard serve` (in-process router over the
//! real local backend and image store), the static musl agent as PID 1 of real runc
//! sandboxes, requests over real HTTP. The design's `tests/` folder.
//!
//! `regressions` pins, one `regression_*` test each, the bugs fixed so far that needed
//! the orchestrator, the agent and runc together to show; bugs of one part are pinned
//! beside that part's code (see the list in that module's header).
//!
//! They need root, runc, the static agent (`make agent`) and the test images
//! (`make images`); as another user each test prints `skipped: <test> needs root and
//! runc` and passes.

mod regressions;
mod util;
