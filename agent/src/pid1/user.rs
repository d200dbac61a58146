//! The image's user: who the agent's commands run as when the image names a `User`
//! (`--user UID:GID[,GROUP...]`). The agent itself stays root, as PID 1 must (it binds
//! its socket and serves files anywhere); [`crate::proc::spawn`] starts every command as
//! this user, and [`super::fsuser`] takes on its file-system identity for file access.

/// The user commands run as: uid, gid and supplementary groups.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RunAs {
    /// User id.
    pub uid: u32,
    /// Primary group id.
    pub gid: u32,
    /// Supplementary groups.
    pub groups: Vec<u32>,
}

impl std::str::FromStr for RunAs {
    type Err = String;

    /// Parses `UID:GID[,GROUP...]`, e.g. `1000:1000,27,100`.
    fn from_str(text: &str) -> Result<Self, String> {
        let bad = || format!("{text:?} is not UID:GID[,GROUP...]");
        let (uid, rest) = text.split_once(':').ok_or_else(bad)?;
        let mut ids = rest.split(',');
        let gid = ids.next().ok_or_else(bad)?;
        let num = |v: &str| v.trim().parse::<u32>().map_err(|_| bad());
        Ok(RunAs {
            uid: num(uid)?,
            gid: num(gid)?,
            groups: ids.map(num).collect::<Result<_, _>>()?,
        })
    }
}

/// The image's user, when it is not root: set once at start-up from `--user`.
static RUN_AS: std::sync::OnceLock<RunAs> = std::sync::OnceLock::new();

/// Makes every command (exec, process, session, terminal) run as `user`. The agent
/// itself stays root: it must bind its socket and serve files anywhere.
pub fn set_run_as(user: RunAs) {
    let _ = RUN_AS.set(user);
}

/// The user commands run as, when the agent was given one.
pub fn run_as() -> Option<&'static RunAs> {
    RUN_AS.get()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn run_as_parses_uid_gid_and_groups() {
        let u: RunAs = "1000:100,27,44".parse().unwrap();
        assert_eq!(
            u,
            RunAs {
                uid: 1000,
                gid: 100,
                groups: vec![27, 44]
            }
        );
        assert_eq!("0:0".parse::<RunAs>().unwrap().groups, Vec::<u32>::new());
        assert!("root".parse::<RunAs>().is_err());
        assert!("1:x".parse::<RunAs>().is_err());
    }
}
