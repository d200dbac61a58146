//! `orchard-cli`, the command line for people: `orchard sandbox ...`, `orchard image ...`
//! and `orchard snapshot ...`, talking to a running `orchard serve` over its REST API
//! (`docs/api.md`). It needs nothing of the orchestrator but the wire types
//! (`orchard-protocol`) and, for `sandbox exec --direct`, the agent client
//! (`orchard-client`), so a change here does not rebuild the server.
//!
//! The server and key come from the same variables as the SDK (`SANDBOX_BASE_URL`,
//! `SANDBOX_API_KEY`) or from `--url` / `--api-key` ([`Connect`]). The `orchard` binary
//! (the orchestrator crate's `main.rs`) parses [`SandboxCommand`] / [`ImageCommand`] /
//! [`SnapshotCommand`] with clap and hands them to [`sandbox`] / [`image`] /
//! [`snapshot`], which answer the process exit code (for `sandbox exec` and `sandbox
//! shell` the remote program's) or a [`CliError`] worth printing as is.
//!
//! - [`client`]: the HTTP client (auth header, error bodies, NDJSON lines, WebSocket
//!   upgrade).
//! - `sandbox`: create, ls, exec (streamed), rm; `shell`: an interactive terminal over
//!   WebSocket with the local terminal in raw mode (`term`).
//! - `image`: pull and import with a progress bar (`progress`), ls, rm.
//! - `snapshot`: pause, resume, snapshot a sandbox; list, inspect, delete and fork
//!   snapshots.
//! - `args`: parsing of `KEY=VALUE` and durations.

mod args;
pub mod client;
mod image;
mod progress;
mod sandbox;
mod shell;
mod snapshot;
mod term;

use std::path::PathBuf;
use std::time::Duration;

pub use args::{parse_duration, parse_key_value};

/// Where the server is and how to authenticate, shared by every subcommand.
#[derive(clap::Args, Debug, Clone)]
pub struct Connect {
    /// Base URL of the orchard server.
    #[arg(
        long,
        env = "SANDBOX_BASE_URL",
        default_value = "http://127.0.0.1:8000",
        global = true
    )]
    pub url: String,
    /// API key, sent as `X-API-Key`.
    // hide_env_values: `--help` must not print the secret from the environment.
    #[arg(long, env = "SANDBOX_API_KEY", hide_env_values = true, global = true)]
    pub api_key: Option<String>,
}

/// `orchard sandbox ...`.
#[derive(clap::Subcommand, Debug)]
pub enum SandboxCommand {
    /// Start a sandbox of IMAGE; prints its id once it is ready.
    Create {
        /// Image reference (`busybox:latest`); pulled first when not in the store.
        image: String,
        /// CPU limit, like `2` or `500m`.
        #[arg(long)]
        cpu: Option<String>,
        /// Memory limit, like `1Gi` or `512Mi`.
        #[arg(long)]
        memory: Option<String>,
        /// Allow network egress (denied by default).
        #[arg(long)]
        network: bool,
        /// How long the sandbox lives (`3600`, `90s`, `15m`, `2h`, `1d`); default the
        /// server's.
        #[arg(long, value_parser = parse_duration)]
        ttl: Option<Duration>,
        /// How long to wait for it to be ready; default the server's.
        #[arg(long, value_parser = parse_duration)]
        ready_timeout: Option<Duration>,
        /// A label, `KEY=VALUE`; repeatable.
        #[arg(long = "label", value_name = "KEY=VALUE", value_parser = parse_key_value)]
        labels: Vec<(String, String)>,
        /// An environment variable of every command, `KEY=VALUE`; repeatable.
        #[arg(long = "env", value_name = "KEY=VALUE", value_parser = parse_key_value)]
        env: Vec<(String, String)>,
        /// The id to give it; generated when absent.
        #[arg(long)]
        id: Option<String>,
        /// Print the whole sandbox object as JSON instead of its id.
        #[arg(long)]
        json: bool,
    },
    /// List your sandboxes.
    Ls {
        /// Print JSON instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// Run a command in a sandbox, streaming its output; exits with its exit code
    /// (128 + the signal when it was killed by one).
    Exec {
        /// The sandbox.
        id: String,
        /// Working directory.
        #[arg(long)]
        cwd: Option<String>,
        /// An environment variable, `KEY=VALUE`; repeatable.
        #[arg(long = "env", value_name = "KEY=VALUE", value_parser = parse_key_value)]
        env: Vec<(String, String)>,
        /// Time limit (`30`, `1.5`, `500ms`, `10m`); default the server's.
        #[arg(long, value_parser = parse_duration)]
        timeout: Option<Duration>,
        /// Run the words of COMMAND joined by spaces as one `/bin/sh -c` string.
        #[arg(long)]
        sh: bool,
        /// Read all of standard input first and give it to the command.
        #[arg(short = 'i', long)]
        stdin: bool,
        /// Call the sandbox's agent directly (its pod IP on Kubernetes, its socket on
        /// this host), with the token the server gives; the server only looks it up.
        #[arg(long)]
        direct: bool,
        /// The program and its arguments (after `--` when they start with `-`).
        #[arg(
            required = true,
            trailing_var_arg = true,
            allow_hyphen_values = true,
            value_name = "COMMAND"
        )]
        command: Vec<String>,
    },
    /// Delete sandboxes.
    Rm {
        /// The sandboxes.
        #[arg(required = true)]
        ids: Vec<String>,
    },
    /// Freeze a sandbox: its processes keep their memory and use no CPU; its commands
    /// and files answer 409 until it is resumed.
    Pause {
        /// The sandbox.
        id: String,
    },
    /// Thaw a paused sandbox.
    Resume {
        /// The sandbox.
        id: String,
    },
    /// Snapshot a sandbox's filesystem changes and shell sessions (running processes
    /// are not captured); prints the snapshot id.
    Snapshot {
        /// The sandbox.
        id: String,
        /// A label, `KEY=VALUE`; repeatable.
        #[arg(long = "label", value_name = "KEY=VALUE", value_parser = parse_key_value)]
        labels: Vec<(String, String)>,
        /// Print the whole snapshot as JSON.
        #[arg(long)]
        json: bool,
    },
    /// An interactive terminal in a sandbox (a shell, or COMMAND); exits with the
    /// program's exit code.
    Shell {
        /// The sandbox.
        id: String,
        /// Working directory.
        #[arg(long)]
        cwd: Option<String>,
        /// An environment variable, `KEY=VALUE`; repeatable.
        #[arg(long = "env", value_name = "KEY=VALUE", value_parser = parse_key_value)]
        env: Vec<(String, String)>,
        /// The program and its arguments, after `--`; default the image's shell.
        #[arg(last = true, value_name = "COMMAND")]
        command: Vec<String>,
    },
}

/// `orchard snapshot ...`.
#[derive(clap::Subcommand, Debug)]
pub enum SnapshotCommand {
    /// List your snapshots.
    Ls {
        /// Print JSON instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// Print a snapshot as JSON.
    Get {
        /// The snapshot.
        id: String,
    },
    /// Delete snapshots (refused while sandboxes forked from one exist).
    Rm {
        /// The snapshots.
        #[arg(required = true)]
        ids: Vec<String>,
    },
    /// Start COUNT sandboxes from a snapshot; prints their ids once all are ready.
    Fork {
        /// The snapshot.
        id: String,
        /// How many (1-64).
        #[arg(long, short = 'k', default_value_t = 1)]
        count: u32,
        /// A label of every fork, `KEY=VALUE`; repeatable.
        #[arg(long = "label", value_name = "KEY=VALUE", value_parser = parse_key_value)]
        labels: Vec<(String, String)>,
        /// How long each fork lives (`3600`, `15m`, `2h`); default the server's.
        #[arg(long, value_parser = parse_duration)]
        ttl: Option<Duration>,
        /// Print the forks as JSON.
        #[arg(long)]
        json: bool,
    },
}

/// `orchard image ...`.
#[derive(clap::Subcommand, Debug)]
pub enum ImageCommand {
    /// Pull an image from its registry into the server's store.
    Pull {
        /// Image reference (`python:3.11-slim`, `ghcr.io/org/img@sha256:...`).
        reference: String,
    },
    /// Upload an image: a `docker save` or OCI layout archive (tar, tar.gz, tar.zst),
    /// or an OCI layout directory.
    Import {
        /// The archive or the layout directory.
        path: PathBuf,
        /// The name to store it as; default the name(s) the archive carries.
        #[arg(long)]
        name: Option<String>,
    },
    /// List the images of the store.
    Ls {
        /// Print JSON instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// Remove images from the store.
    Rm {
        /// The images.
        #[arg(required = true)]
        references: Vec<String>,
    },
}

/// Why a command failed. The messages are meant to be printed as they are.
#[derive(Debug, thiserror::Error)]
pub enum CliError {
    /// No connection could be made.
    #[error("cannot reach the server at {url}: {reason}")]
    Unreachable {
        /// The server's base URL.
        url: String,
        /// Why, with the underlying causes.
        reason: String,
    },
    /// The connection broke or timed out after it was made.
    #[error("the connection to the server at {url} failed: {reason}")]
    Transport {
        /// The server's base URL.
        url: String,
        /// Why, with the underlying causes.
        reason: String,
    },
    /// The server answered with an error status.
    #[error("{status}: {detail}")]
    Api {
        /// HTTP status code.
        status: u16,
        /// The machine-readable code of the error body, when there was one.
        code: Option<client::ApiCode>,
        /// The server's message (`detail`, or the agent's `message`).
        detail: String,
    },
    /// A stream (exec, pull) ended with an error frame.
    #[error("{what} failed: {message}")]
    Remote {
        /// What was going on.
        what: String,
        /// The server's message.
        message: String,
    },
    /// The server answered something this client does not understand.
    #[error("unexpected answer from the server ({what}): {reason}")]
    Protocol {
        /// Which answer.
        what: String,
        /// What was wrong with it.
        reason: String,
    },
    /// `--url` is not an http(s) URL.
    #[error("invalid server URL {url:?}: {reason}")]
    BadUrl {
        /// As given.
        url: String,
        /// Why it was refused.
        reason: String,
    },
    /// An argument was refused before anything was sent.
    #[error("{0}")]
    Usage(String),
    /// A local file, the terminal or a standard stream failed.
    #[error("{what}: {source}")]
    Io {
        /// What was being done.
        what: String,
        /// The error.
        source: std::io::Error,
    },
}

impl CliError {
    pub(crate) fn io(what: impl Into<String>, source: std::io::Error) -> Self {
        CliError::Io {
            what: what.into(),
            source,
        }
    }

    pub(crate) fn protocol(what: impl Into<String>, reason: impl ToString) -> Self {
        CliError::Protocol {
            what: what.into(),
            reason: reason.to_string(),
        }
    }
}

/// Runs an `orchard sandbox` subcommand; answers the process exit code.
pub async fn sandbox(connect: &Connect, cmd: SandboxCommand) -> Result<i32, CliError> {
    let client = client::Client::new(connect)?;
    match cmd {
        SandboxCommand::Create {
            image,
            cpu,
            memory,
            network,
            ttl,
            ready_timeout,
            labels,
            env,
            id,
            json,
        } => {
            let body = sandbox::CreateBody {
                image,
                id,
                cpu,
                memory,
                block_network: !network,
                ready_timeout_s: ready_timeout.map(args::whole_seconds),
                ttl_s: ttl.map(args::whole_seconds),
                env: env.into_iter().collect(),
                labels: labels.into_iter().collect(),
                wait: true,
            };
            sandbox::create(&client, &body, json).await
        }
        SandboxCommand::Ls { json } => sandbox::list(&client, json).await,
        SandboxCommand::Exec {
            id,
            cwd,
            env,
            timeout,
            sh,
            stdin,
            direct,
            command,
        } => {
            let opts = sandbox::ExecOptions {
                cwd,
                env: env.into_iter().collect(),
                timeout,
                shell: sh,
                stdin,
            };
            if direct {
                sandbox::exec_direct(&client, &id, command, opts).await
            } else {
                sandbox::exec(&client, &id, command, opts).await
            }
        }
        SandboxCommand::Rm { ids } => sandbox::remove(&client, &ids).await,
        SandboxCommand::Pause { id } => snapshot::pause_or_resume(&client, &id, true).await,
        SandboxCommand::Resume { id } => snapshot::pause_or_resume(&client, &id, false).await,
        SandboxCommand::Snapshot { id, labels, json } => {
            snapshot::take(&client, &id, labels.into_iter().collect(), json).await
        }
        SandboxCommand::Shell {
            id,
            cwd,
            env,
            command,
        } => {
            let opts = shell::ShellOptions {
                cwd,
                env: env.into_iter().collect(),
                command,
            };
            shell::run(&client, &id, opts).await
        }
    }
}

/// Runs an `orchard snapshot` subcommand; answers the process exit code.
pub async fn snapshot(connect: &Connect, cmd: SnapshotCommand) -> Result<i32, CliError> {
    let client = client::Client::new(connect)?;
    match cmd {
        SnapshotCommand::Ls { json } => snapshot::list(&client, json).await,
        SnapshotCommand::Get { id } => snapshot::get(&client, &id).await,
        SnapshotCommand::Rm { ids } => snapshot::remove(&client, &ids).await,
        SnapshotCommand::Fork {
            id,
            count,
            labels,
            ttl,
            json,
        } => {
            let ttl_s = ttl.map(args::whole_seconds);
            snapshot::fork(
                &client,
                &id,
                count,
                labels.into_iter().collect(),
                ttl_s,
                json,
            )
            .await
        }
    }
}

/// Runs an `orchard image` subcommand; answers the process exit code.
pub async fn image(connect: &Connect, cmd: ImageCommand) -> Result<i32, CliError> {
    let client = client::Client::new(connect)?;
    match cmd {
        ImageCommand::Pull { reference } => image::pull(&client, &reference).await,
        ImageCommand::Import { path, name } => image::import(&client, &path, name.as_deref()).await,
        ImageCommand::Ls { json } => image::list(&client, json).await,
        ImageCommand::Rm { references } => image::remove(&client, &references).await,
    }
}

#[cfg(test)]
mod tests {
    use clap::{Parser, Subcommand};

    use super::*;

    /// The shape the binary wires these into.
    #[derive(Parser, Debug)]
    struct Cli {
        #[command(subcommand)]
        cmd: Top,
    }

    #[derive(Subcommand, Debug)]
    enum Top {
        Sandbox {
            #[command(flatten)]
            connect: Connect,
            #[command(subcommand)]
            cmd: SandboxCommand,
        },
        Image {
            #[command(flatten)]
            connect: Connect,
            #[command(subcommand)]
            cmd: ImageCommand,
        },
    }

    fn parse(args: &[&str]) -> Result<Cli, clap::Error> {
        Cli::try_parse_from(std::iter::once("orchard").chain(args.iter().copied()))
    }

    #[test]
    fn clap_definitions_are_consistent() {
        use clap::CommandFactory;
        Cli::command().debug_assert();
    }

    #[test]
    fn exec_takes_the_command_after_the_options_with_or_without_dashes() {
        let cli = parse(&[
            "sandbox", "exec", "sb-1", "--cwd", "/tmp", "--env", "A=b=c", "--", "ls", "-l",
        ])
        .unwrap();
        let Top::Sandbox {
            cmd:
                SandboxCommand::Exec {
                    id,
                    cwd,
                    env,
                    command,
                    ..
                },
            ..
        } = cli.cmd
        else {
            panic!("not exec: {cli:?}");
        };
        assert_eq!(id, "sb-1");
        assert_eq!(cwd.as_deref(), Some("/tmp"));
        assert_eq!(env, vec![("A".to_string(), "b=c".to_string())]);
        assert_eq!(command, vec!["ls", "-l"]);

        let cli = parse(&["sandbox", "exec", "sb-1", "sh", "-c", "exit 3"]).unwrap();
        let Top::Sandbox {
            cmd: SandboxCommand::Exec { command, .. },
            ..
        } = cli.cmd
        else {
            panic!("not exec");
        };
        assert_eq!(command, vec!["sh", "-c", "exit 3"]);
        assert!(parse(&["sandbox", "exec", "sb-1"]).is_err());
    }

    #[test]
    fn bad_key_values_and_durations_are_usage_errors() {
        assert!(parse(&["sandbox", "create", "busybox", "--label", "novalue"]).is_err());
        assert!(parse(&["sandbox", "create", "busybox", "--env", "=x"]).is_err());
        assert!(parse(&["sandbox", "create", "busybox", "--ttl", "soon"]).is_err());
        let cli = parse(&[
            "sandbox", "create", "busybox", "--ttl", "15m", "--label", "a=1", "--label", "b=",
        ])
        .unwrap();
        let Top::Sandbox {
            cmd: SandboxCommand::Create { ttl, labels, .. },
            ..
        } = cli.cmd
        else {
            panic!("not create");
        };
        assert_eq!(ttl, Some(Duration::from_secs(900)));
        assert_eq!(labels.len(), 2);
    }

    #[test]
    fn connect_options_are_accepted_after_the_subcommand() {
        let cli = parse(&["image", "ls", "--url", "http://h:1", "--api-key", "k"]).unwrap();
        let Top::Image { connect, .. } = cli.cmd else {
            panic!("not image");
        };
        assert_eq!(connect.url, "http://h:1");
        assert_eq!(connect.api_key.as_deref(), Some("k"));
    }

    #[test]
    fn shell_command_comes_after_dashes() {
        let cli = parse(&["sandbox", "shell", "sb-1", "--", "top", "-b"]).unwrap();
        let Top::Sandbox {
            cmd: SandboxCommand::Shell { command, .. },
            ..
        } = cli.cmd
        else {
            panic!("not shell");
        };
        assert_eq!(command, vec!["top", "-b"]);
    }
}
