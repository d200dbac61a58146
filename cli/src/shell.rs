//! `orchard sandbox shell`: an interactive terminal in a sandbox.
//!
//! `POST /v1/sandboxes/{id}/pty` starts the program on a terminal of our size, then a
//! WebSocket to `.../pty/{tid}/attach` carries [`PtyClientFrame`]s (keystrokes, resizes)
//! one way and [`PtyServerFrame`]s (output, exit) the other. When stdin is a terminal it
//! is put in raw mode for the session, so every key (Ctrl-C included) goes to the remote
//! program, and [`RawMode`] puts it back on any way out. When stdin is not a terminal
//! (a pipe, a file) nothing is switched; at its end the remote terminal gets Ctrl-D,
//! the end-of-file character, so a shell reading a script ends (and again after each
//! output frame, for a while: a Ctrl-D queued while the terminal is in canonical mode
//! but read after the program switched it to raw mode, as shells with line editing do,
//! arrives as a NUL byte, so the first one can be lost).
//!
//! Signals to this process: SIGWINCH sends the new size; SIGINT (only a `kill`, or Ctrl-C
//! when stdin is not the terminal) is forwarded to the remote foreground job; SIGTERM and
//! SIGHUP close the remote terminal and end the session with 128 + the signal.

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::time::Duration;

use base64::Engine as _;
use futures_util::{SinkExt, StreamExt};
use orchard_protocol::pty::{PtyClientFrame, PtyCreate, PtyInfo, PtyServerFrame};
use orchard_protocol::signal::Signal;
use orchard_protocol::Command;
use reqwest::Method;
use tokio::signal::unix::{signal, SignalKind};
use tokio::sync::mpsc;
use tokio_tungstenite::tungstenite::Message;

use super::client::{segment, Client};
use super::term::{self, RawMode};
use super::CliError;

/// Ctrl-D: what a terminal in canonical mode reads as end of file.
const EOT: u8 = 0x04;
/// Ctrl-Ds sent again, one per output frame, after the end of a piped stdin (see the
/// module doc for why one is not enough).
const EOT_REPEATS: u8 = 16;
/// Time allowed to close the remote terminal at the end.
const CLOSE_LIMIT: Duration = Duration::from_secs(5);

/// Options of `sandbox shell`.
#[derive(Debug, Default)]
pub struct ShellOptions {
    pub cwd: Option<String>,
    pub env: BTreeMap<String, String>,
    /// The program; empty for the image's shell.
    pub command: Vec<String>,
}

/// Runs the session; answers the program's exit code.
pub async fn run(client: &Client, id: &str, opts: ShellOptions) -> Result<i32, CliError> {
    let interactive = term::is_tty(term::STDIN);
    let size = term::local_size();
    let create = PtyCreate {
        command: (!opts.command.is_empty()).then_some(Command::Argv(opts.command)),
        cwd: opts.cwd,
        env: opts.env,
        rows: size.map(|s| s.0),
        cols: size.map(|s| s.1),
        ..Default::default()
    };
    let base = format!("/v1/sandboxes/{}/pty", segment(id));
    let info: PtyInfo = client
        .json(
            client.request(Method::POST, &base).json(&create),
            "the new terminal",
        )
        .await?;
    let tid = segment(&info.id);
    let outcome = match attach(client, &format!("{base}/{tid}/attach"), interactive, size).await {
        // The connection broke, perhaps just as the program ended (a proxy that drops
        // the last frames): the terminal itself still knows how it ended.
        Err(err @ CliError::Transport { .. }) => match exit_of(client, &base, &tid).await {
            Some(code) => Ok(code),
            None => Err(err),
        },
        other => other,
    };
    // The terminal is this command's own: close it whichever way the session ended. After
    // the program's exit this frees its slot (the agent keeps exited terminals, counted
    // against its limit, for a while); after an error it stops a program nobody can
    // reach any more. Best effort, and bounded: the answer is already decided.
    let close = client.send(client.request(Method::DELETE, &format!("{base}/{tid}")));
    let _ = tokio::time::timeout(CLOSE_LIMIT, close).await;
    outcome
}

/// The exit status of the terminal's program, if it has ended.
async fn exit_of(client: &Client, base: &str, tid: &str) -> Option<i32> {
    let request = client.request(Method::GET, &format!("{base}/{tid}"));
    let info: PtyInfo = tokio::time::timeout(CLOSE_LIMIT, client.json(request, "the terminal"))
        .await
        .ok()?
        .ok()?;
    (!info.alive).then(|| info.exit_code.or(info.signal.map(|s| 128 + s)).unwrap_or(1))
}

/// Attaches and runs the session, the local terminal raw meanwhile.
async fn attach(
    client: &Client,
    path: &str,
    interactive: bool,
    size: Option<(u16, u16)>,
) -> Result<i32, CliError> {
    let socket = client.websocket(path).await?;
    // Raw mode only once attached, so earlier errors print normally; the guard lives
    // until this function returns, whichever way, so the terminal is restored before
    // anything else is printed.
    let _raw = if interactive {
        Some(RawMode::enter(term::STDIN).map_err(|e| CliError::io("setting up the terminal", e))?)
    } else {
        None
    };
    session(client, socket, interactive, size).await
}

/// Relays one terminal session: keys, resizes and signals out, output in, until the
/// program exits or the connection ends; answers the exit status.
// Over 100 lines because it is one select loop: each arm is a terminal event, and their
// order (resizes first) and shared state (size, Ctrl-D repeats) read best together.
async fn session(
    client: &Client,
    socket: super::client::WebSocket,
    interactive: bool,
    mut size: Option<(u16, u16)>,
) -> Result<i32, CliError> {
    let signal_stream =
        |kind: SignalKind| signal(kind).map_err(|e| CliError::io("installing a signal handler", e));
    let mut winch = signal_stream(SignalKind::window_change())?;
    let mut term_signal = signal_stream(SignalKind::terminate())?;
    let mut hangup = signal_stream(SignalKind::hangup())?;
    let mut interrupt = signal_stream(SignalKind::interrupt())?;
    let mut stdin = spawn_stdin_reader()?;
    let mut stdin_open = true;
    // Ctrl-Ds still to send in answer to output, once a piped stdin has ended.
    let mut eot_repeats = 0u8;
    let (mut sink, mut stream) = socket.split();
    let broken = |e: tokio_tungstenite::tungstenite::Error| CliError::Transport {
        url: client.base().to_string(),
        reason: e.to_string(),
    };
    let mut stdout = std::io::stdout();

    let outcome = loop {
        tokio::select! {
            // Biased, resizes first: a resize and the keys typed after it then reach the
            // remote terminal in that order.
            biased;
            _ = winch.recv() => {
                if let Some(frame) = resize_if_changed(&mut size) {
                    sink.send(frame).await.map_err(broken)?;
                }
            }
            _ = term_signal.recv() => {
                let _ = sink.send(frame(&PtyClientFrame::Close)).await;
                break Ok(128 + libc::SIGTERM);
            }
            _ = hangup.recv() => {
                let _ = sink.send(frame(&PtyClientFrame::Close)).await;
                break Ok(128 + libc::SIGHUP);
            }
            _ = interrupt.recv() => {
                let sig = PtyClientFrame::Signal { sig: Signal::Name("INT".into()) };
                sink.send(frame(&sig)).await.map_err(broken)?;
            }
            message = stream.next() => match message {
                Some(Ok(Message::Text(text))) => {
                    match serde_json::from_str::<PtyServerFrame>(&text) {
                        Ok(PtyServerFrame::Attached { .. }) => {}
                        Ok(PtyServerFrame::Output { data, replay }) => {
                            let bytes = base64::engine::general_purpose::STANDARD
                                .decode(data)
                                .map_err(|e| CliError::protocol("a terminal output frame", e))?;
                            write_out(&mut stdout, &bytes)?;
                            // Output after the program was sent Ctrl-D may be a prompt
                            // in raw mode that got a NUL instead (see the module doc):
                            // end of file once more. Best effort: a failed send shows
                            // up on the next read.
                            if !replay && eot_repeats > 0 {
                                eot_repeats -= 1;
                                let _ = sink.send(stdin_frame(&[EOT])).await;
                            }
                        }
                        Ok(PtyServerFrame::Exit { code, signal }) => {
                            break Ok(code.or(signal.map(|s| 128 + s)).unwrap_or(1));
                        }
                        Ok(PtyServerFrame::Error { message }) => {
                            // \r: the terminal may be raw, where \n does not return.
                            eprint!("\r\norchard: the terminal: {message}\r\n");
                        }
                        // A frame type of a newer server: nothing to do with it.
                        Err(_) => {}
                    }
                }
                Some(Ok(Message::Binary(bytes))) => write_out(&mut stdout, &bytes)?,
                Some(Ok(Message::Close(close))) => {
                    let why = close
                        .filter(|c| !c.reason.is_empty())
                        .map(|c| format!(" ({}: {})", u16::from(c.code), c.reason))
                        .unwrap_or_default();
                    break Err(CliError::Transport {
                        url: client.base().to_string(),
                        reason: format!("the server closed the terminal before the program ended{why}"),
                    });
                }
                // Pings are answered by tungstenite itself.
                Some(Ok(_)) => {}
                Some(Err(e)) => break Err(broken(e)),
                None => break Err(CliError::Transport {
                    url: client.base().to_string(),
                    reason: "the terminal connection ended before the program did".into(),
                }),
            },
            chunk = stdin.recv(), if stdin_open => match chunk {
                Some(bytes) => {
                    // The window may have changed an instant before these keys were
                    // typed, with its SIGWINCH not handled yet: send the size first so
                    // the keys are read at the size they were typed at.
                    if let Some(frame) = resize_if_changed(&mut size) {
                        sink.send(frame).await.map_err(broken)?;
                    }
                    sink.send(stdin_frame(&bytes)).await.map_err(broken)?;
                }
                None => {
                    stdin_open = false;
                    // A raw terminal has no end of file (Ctrl-D is just a key): its end
                    // means it is gone. A pipe's end is the script's end.
                    if !interactive {
                        sink.send(stdin_frame(&[EOT])).await.map_err(broken)?;
                        eot_repeats = EOT_REPEATS;
                    }
                }
            },
        }
    };
    // Best effort: the program has ended or we are leaving anyway.
    let _ = sink.send(Message::Close(None)).await;
    let _ = stdout.flush();
    outcome
}

/// A resize frame when our window size differs from `last` (which is updated).
fn resize_if_changed(last: &mut Option<(u16, u16)>) -> Option<Message> {
    let now = term::local_size()?;
    if *last == Some(now) {
        return None;
    }
    *last = Some(now);
    Some(frame(&PtyClientFrame::Resize {
        rows: now.0,
        cols: now.1,
    }))
}

fn stdin_frame(bytes: &[u8]) -> Message {
    frame(&PtyClientFrame::Stdin {
        data: base64::engine::general_purpose::STANDARD.encode(bytes),
    })
}

fn frame(f: &PtyClientFrame) -> Message {
    // Serialising these plain enums cannot fail; an empty text would be ignored.
    Message::text(serde_json::to_string(f).unwrap_or_default())
}

fn write_out(out: &mut std::io::Stdout, bytes: &[u8]) -> Result<(), CliError> {
    out.write_all(bytes)
        .and_then(|()| out.flush())
        .map_err(|e| CliError::io("writing stdout", e))
}

/// Reads stdin on a thread of its own (a blocking read cannot be cancelled, and a tokio
/// blocking task would hold up the runtime's shutdown), chunk by chunk as the bytes come.
/// The channel closes at end of file or on a read error. The thread stays blocked in
/// `read` after the session; the process ends right after, which ends it.
fn spawn_stdin_reader() -> Result<mpsc::Receiver<Vec<u8>>, CliError> {
    let (tx, rx) = mpsc::channel(16);
    std::thread::Builder::new()
        .name("orchard-stdin".into())
        .spawn(move || {
            let mut stdin = std::io::stdin();
            let mut buf = vec![0u8; 8192];
            loop {
                match stdin.read(&mut buf) {
                    Ok(0) => break,
                    Ok(n) => {
                        if tx.blocking_send(buf[..n].to_vec()).is_err() {
                            break;
                        }
                    }
                    Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                    Err(_) => break,
                }
            }
        })
        .map_err(|e| CliError::io("starting the stdin reader", e))?;
    Ok(rx)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames_are_the_protocol_json() {
        let Message::Text(text) = stdin_frame(b"ls\r") else {
            panic!("not text");
        };
        assert_eq!(text.as_str(), r#"{"type":"stdin","data":"bHMN"}"#);
        let Message::Text(text) = frame(&PtyClientFrame::Resize {
            rows: 50,
            cols: 132,
        }) else {
            panic!("not text");
        };
        assert_eq!(text.as_str(), r#"{"type":"resize","rows":50,"cols":132}"#);
    }
}
