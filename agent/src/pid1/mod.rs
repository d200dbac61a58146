//! PID 1's duties beyond serving: what the sandbox's first process owes the image.
//!
//! [`init`] splits an agent started as PID 1 into a tiny dumpable init (holding the
//! image's environment, reaping orphans, forwarding signals) and the protected agent;
//! [`tools`] publishes the harness tools before the agent listens; [`user`] is the
//! image's `User`, whom every command runs as, and [`fsuser`] takes on that user's
//! file-system identity for the file operations the agent does for a client.

pub mod fsuser;
pub mod init;
pub mod tools;
pub mod user;
