//! Signal names on the wire.
//!
//! Clients name signals as `"TERM"`, `"SIGTERM"` or a number; the agent turns them into
//! numbers. The table is Linux x86_64's, which is the only platform a sandbox runs on.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// A signal, by name (`"INT"`, `"SIGKILL"`) or by number.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(untagged)]
pub enum Signal {
    /// A signal number.
    Number(i32),
    /// A signal name, with or without the `SIG` prefix, any case.
    Name(String),
}

const NAMES: &[(&str, i32)] = &[
    ("HUP", 1),
    ("INT", 2),
    ("QUIT", 3),
    ("ILL", 4),
    ("TRAP", 5),
    ("ABRT", 6),
    ("BUS", 7),
    ("FPE", 8),
    ("KILL", 9),
    ("USR1", 10),
    ("SEGV", 11),
    ("USR2", 12),
    ("PIPE", 13),
    ("ALRM", 14),
    ("TERM", 15),
    ("CHLD", 17),
    ("CONT", 18),
    ("STOP", 19),
    ("TSTP", 20),
    ("TTIN", 21),
    ("TTOU", 22),
    ("WINCH", 28),
];

impl Signal {
    /// The signal number, or `None` for an unknown name or an out-of-range number.
    pub fn number(&self) -> Option<i32> {
        match self {
            Signal::Number(n) if (1..=64).contains(n) => Some(*n),
            Signal::Number(_) => None,
            Signal::Name(name) => {
                let upper = name.trim().to_ascii_uppercase();
                let bare = upper.strip_prefix("SIG").unwrap_or(&upper);
                NAMES.iter().find(|(n, _)| *n == bare).map(|(_, num)| *num)
            }
        }
    }
}

/// The conventional name of a signal number, without the `SIG` prefix.
pub fn name_of(number: i32) -> Option<&'static str> {
    NAMES
        .iter()
        .find(|(_, n)| *n == number)
        .map(|(name, _)| *name)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_and_numbers_parse() {
        assert_eq!(Signal::Name("term".into()).number(), Some(15));
        assert_eq!(Signal::Name("SIGKILL".into()).number(), Some(9));
        assert_eq!(Signal::Number(2).number(), Some(2));
        assert_eq!(Signal::Number(0).number(), None);
        assert_eq!(Signal::Name("NOPE".into()).number(), None);
        let parsed: Signal = serde_json::from_str("\"INT\"").unwrap();
        assert_eq!(parsed.number(), Some(2));
        let parsed: Signal = serde_json::from_str("9").unwrap();
        assert_eq!(parsed.number(), Some(9));
        assert_eq!(name_of(15), Some("TERM"));
    }
}
