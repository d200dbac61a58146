//! PID 1 duties: the init split, the harness tools, the image's user.

pub mod fsuser;
pub mod init;
pub mod tools;
pub mod user;
