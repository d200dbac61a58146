//! Terminal frames: the JSON text frames of `/v1/pty/{id}/attach` and of the compatible
//! PTY WebSocket (`/v1/pty/compat`, proxied from `/sandboxes/{id}/exec/pty`), both
//! directions (the agent reads client frames; the CLI reads server frames), then what
//! the agent does with a parsed client frame short of touching a terminal: decode stdin,
//! resolve a signal, quote an `init` argv for a login shell. Also the API key of a
//! WebSocket upgrade (`server::extract::url_pairs`, the `?api_key=` query).
//! Invariants: every parsed frame survives serialize -> parse unchanged; a resolved
//! signal is 1..=64; `shell_join` quotes so that the shell splits the line back into
//! exactly the argv; percent-encoding any query value decodes back to it.
#![no_main]

use libfuzzer_sys::fuzz_target;
use orchard::server::extract::url_pairs;
use orchard_agent::api::pty::shell_join;
use orchard_fuzz::round_trip;
use orchard_protocol::output::b64_decode;
use orchard_protocol::pty::{CompatClientFrame, CompatServerFrame, PtyClientFrame, PtyServerFrame};
use orchard_protocol::signal::Signal;

/// Splits a line the way a POSIX shell does for words made only of plain characters,
/// single-quoted strings and backslash escapes (what `shell_join` writes).
fn sh_split(line: &str) -> Vec<String> {
    let mut words = Vec::new();
    let mut word: Option<String> = None;
    let mut chars = line.chars();
    while let Some(c) = chars.next() {
        match c {
            ' ' => {
                if let Some(w) = word.take() {
                    words.push(w);
                }
            }
            '\'' => {
                let w = word.get_or_insert_with(String::new);
                for q in chars.by_ref() {
                    if q == '\'' {
                        break;
                    }
                    w.push(q);
                }
            }
            '\\' => {
                let w = word.get_or_insert_with(String::new);
                w.extend(chars.next());
            }
            c => word.get_or_insert_with(String::new).push(c),
        }
    }
    words.extend(word);
    words
}

fn signal(sig: &Signal) {
    if let Some(n) = sig.number() {
        assert!((1..=64).contains(&n), "{sig:?} -> {n}");
    }
}

fn percent_encode(s: &str) -> String {
    s.bytes().map(|b| format!("%{b:02X}")).collect()
}

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    if let Ok(frame) = serde_json::from_str::<CompatClientFrame>(text) {
        round_trip(&frame);
        match &frame {
            CompatClientFrame::Init {
                cmd: Some(argv), ..
            } if !argv.is_empty() => {
                let line = shell_join(argv);
                assert_eq!(&sh_split(&line), argv, "shell_join gave {line:?}");
            }
            CompatClientFrame::Stdin { data } => {
                let _ = b64_decode(data);
            }
            CompatClientFrame::Signal { sig } => signal(sig),
            _ => {}
        }
    }
    if let Ok(frame) = serde_json::from_str::<PtyClientFrame>(text) {
        round_trip(&frame);
        match &frame {
            PtyClientFrame::Stdin { data } => {
                let _ = b64_decode(data);
            }
            PtyClientFrame::Signal { sig } => signal(sig),
            _ => {}
        }
    }
    if let Ok(frame) = serde_json::from_str::<PtyServerFrame>(text) {
        round_trip(&frame);
    }
    if let Ok(frame) = serde_json::from_str::<CompatServerFrame>(text) {
        round_trip(&frame);
    }
    let pairs = url_pairs(text);
    assert!(pairs.len() <= text.split('&').count());
    let encoded = format!("api_key={}", percent_encode(text));
    assert_eq!(
        url_pairs(&encoded),
        vec![("api_key".to_string(), text.to_string())]
    );
});
