//! Publishing the harness tools (codex, claude, pi, opencode, hermes) inside the sandbox
//! the way Orchard users expect to find them (README.md, `make harness`):
//!
//! - the tools' directory itself (mounted read-only by the backend, e.g. at
//!   `/opt/sandbox-tools`, with `bin/` and `VERSIONS`), whose `bin/` the backend appends
//!   to PATH;
//! - a small shim in `/usr/local/bin` for each tool the image does not already provide,
//!   so that `kubectl exec`, `runc exec` or a shell that builds its own PATH finds it;
//! - `/etc/profile.d/orchard-sandbox-tools.sh`, which appends the tools' `bin/` to PATH
//!   again after `/etc/profile` has reset it, so login shells keep them.
//!
//! The agent does this once at start, before it listens and before any command of the
//! sandbox has run, inside the sandbox's own mount namespace: the image's symlinks
//! resolve inside the sandbox, never on the host. Files are created with `O_EXCL`, so
//! nothing the image holds is overwritten or followed at the last component. A
//! read-only root file system is not an error: the tools stay reachable through PATH.

use std::fs::{self, OpenOptions};
use std::io::{self, Write};
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

/// Where the shims go.
pub const SHIM_DIR: &str = "usr/local/bin";
/// The profile entry, under the root.
pub const PROFILE_ENTRY: &str = "etc/profile.d/orchard-sandbox-tools.sh";

/// What [`publish`] did.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Published {
    /// Tools that got a shim in `/usr/local/bin`.
    pub shims: Vec<String>,
    /// Tools the image already provides (no shim).
    pub provided: Vec<String>,
    /// Whether the profile entry was written (false when it existed already).
    pub profile: bool,
    /// What could not be done, one line each (a read-only image, say).
    pub warnings: Vec<String>,
}

/// A tool name that is safe as a file name and in a shell script.
fn plain_name(name: &str) -> bool {
    !name.is_empty()
        && !name.starts_with('.')
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
}

/// The sandbox path `p` under `root` (the sandbox's `/` in production; a temporary
/// directory in tests).
fn under(root: &Path, p: &str) -> PathBuf {
    root.join(p.trim_start_matches('/'))
}

/// True when the image has an executable `name` in one of the `path` directories,
/// leaving out the tools' own directory.
fn image_provides(root: &Path, path: &str, tools_bin: &str, name: &str) -> bool {
    path.split(':')
        .filter(|d| !d.is_empty() && *d != tools_bin && d.starts_with('/'))
        .any(|d| {
            fs::metadata(under(root, d).join(name))
                .map(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
                .unwrap_or(false)
        })
}

/// Creates `path` with `contents` and `mode`, only when nothing is there.
fn create_new(path: &Path, contents: &str, mode: u32) -> io::Result<bool> {
    match OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(mode)
        .open(path)
    {
        Ok(mut f) => {
            f.write_all(contents.as_bytes())?;
            // The umask may have cut the mode.
            f.set_permissions(fs::Permissions::from_mode(mode))?;
            Ok(true)
        }
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => Ok(false),
        Err(e) => Err(e),
    }
}

/// The shim of `name`: it runs the tool from the tools' directory.
pub fn shim(tools_dir: &str, name: &str) -> String {
    format!(
        "#!/bin/sh\n# {name} from the Orchard harness tools (read-only at {tools_dir}).\nexec {tools_dir}/bin/{name} \"$@\"\n"
    )
}

/// The profile entry: the tools' `bin/` appended to PATH (never prepended: the image's
/// own tools win), once.
pub fn profile_entry(tools_dir: &str) -> String {
    format!(
        "# Orchard harness tools: appended to PATH (login shells reset it in /etc/profile).\n\
         case \":$PATH:\" in\n  *\":{tools_dir}/bin:\"*) ;;\n  *) PATH=\"$PATH:{tools_dir}/bin\"; export PATH ;;\nesac\n"
    )
}

/// Publishes the tools found in `tools_dir/bin` (a sandbox path) under `root`, given the
/// sandbox's PATH. Never fails: what cannot be done is listed in the warnings.
pub fn publish(root: &Path, tools_dir: &str, path: &str) -> Published {
    let mut done = Published::default();
    let tools_dir = tools_dir.trim_end_matches('/');
    let tools_bin = format!("{tools_dir}/bin");
    let mut names: Vec<String> = match fs::read_dir(under(root, &tools_bin)) {
        Ok(entries) => entries
            .filter_map(|e| e.ok())
            .filter_map(|e| e.file_name().into_string().ok())
            .filter(|n| plain_name(n))
            .collect(),
        Err(e) => {
            done.warnings
                .push(format!("no tools published: cannot read {tools_bin}: {e}"));
            return done;
        }
    };
    names.sort();
    let shim_dir = root.join(SHIM_DIR);
    let mut shim_dir_ready = false;
    for name in names {
        if image_provides(root, path, &tools_bin, &name) {
            done.provided.push(name);
            continue;
        }
        if !shim_dir_ready {
            if let Err(e) = fs::DirBuilder::new()
                .recursive(true)
                .mode(0o755)
                .create(&shim_dir)
            {
                done.warnings
                    .push(format!("no shims: cannot make /{SHIM_DIR}: {e}"));
                break;
            }
            shim_dir_ready = true;
        }
        match create_new(&shim_dir.join(&name), &shim(tools_dir, &name), 0o755) {
            Ok(true) => done.shims.push(name),
            Ok(false) => done.provided.push(name),
            Err(e) => done
                .warnings
                .push(format!("no shim for {name} in /{SHIM_DIR}: {e}")),
        }
    }
    let profile = root.join(PROFILE_ENTRY);
    let made = profile
        .parent()
        .map(|d| fs::DirBuilder::new().recursive(true).mode(0o755).create(d))
        .unwrap_or(Ok(()))
        .and_then(|()| create_new(&profile, &profile_entry(tools_dir), 0o644));
    match made {
        Ok(written) => done.profile = written,
        Err(e) => done
            .warnings
            .push(format!("no profile entry /{PROFILE_ENTRY}: {e}")),
    }
    done
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::process::Command;

    fn tools(root: &Path, names: &[&str]) {
        let bin = root.join("opt/sandbox-tools/bin");
        fs::create_dir_all(&bin).unwrap();
        for n in names {
            let p = bin.join(n);
            fs::write(&p, format!("#!/bin/sh\necho {n} \"$@\"\n")).unwrap();
            fs::set_permissions(&p, fs::Permissions::from_mode(0o755)).unwrap();
        }
    }

    #[test]
    fn missing_tools_get_shims_and_the_image_s_own_are_left_alone() {
        let root = tempfile::tempdir().unwrap();
        let root = root.path();
        tools(root, &["codex", "claude", "pi", ".hidden", "bad name"]);
        // The image has its own `pi` on PATH, and a non-executable `claude` file.
        fs::create_dir_all(root.join("usr/bin")).unwrap();
        fs::write(root.join("usr/bin/pi"), "").unwrap();
        fs::set_permissions(root.join("usr/bin/pi"), fs::Permissions::from_mode(0o755)).unwrap();
        fs::write(root.join("usr/bin/claude"), "").unwrap();
        let path = "/usr/local/bin:/usr/bin:/opt/sandbox-tools/bin";
        let done = publish(root, "/opt/sandbox-tools/", path);
        assert_eq!(done.shims, ["claude", "codex"]);
        assert_eq!(done.provided, ["pi"]);
        assert!(done.profile);
        assert!(done.warnings.is_empty(), "{:?}", done.warnings);
        let shim_path = root.join("usr/local/bin/codex");
        assert_eq!(
            fs::read_to_string(&shim_path).unwrap(),
            shim("/opt/sandbox-tools", "codex")
        );
        assert_eq!(
            fs::metadata(&shim_path).unwrap().permissions().mode() & 0o777,
            0o755
        );
        assert_eq!(
            fs::metadata(root.join(PROFILE_ENTRY))
                .unwrap()
                .permissions()
                .mode()
                & 0o777,
            0o644
        );
        // Again (an agent restarted on the same file system): nothing new, nothing lost.
        let again = publish(root, "/opt/sandbox-tools", path);
        assert!(again.shims.is_empty());
        assert!(!again.profile);
        assert_eq!(again.provided, ["claude", "codex", "pi"]);
    }

    #[test]
    fn an_existing_file_or_symlink_is_never_overwritten_or_followed() {
        let root = tempfile::tempdir().unwrap();
        let root = root.path();
        tools(root, &["codex"]);
        fs::create_dir_all(root.join("usr/local/bin")).unwrap();
        let target = root.join("target");
        std::os::unix::fs::symlink(&target, root.join("usr/local/bin/codex")).unwrap();
        let done = publish(root, "/opt/sandbox-tools", "/usr/bin");
        assert!(done.shims.is_empty());
        assert!(!target.exists(), "the symlink was followed");
    }

    #[test]
    fn no_tools_directory_is_a_warning_not_an_error() {
        let root = tempfile::tempdir().unwrap();
        let done = publish(root.path(), "/opt/sandbox-tools", "/usr/bin");
        assert_eq!(done.shims.len() + done.provided.len(), 0);
        assert_eq!(done.warnings.len(), 1);
    }

    #[test]
    fn the_profile_entry_appends_once_in_a_real_shell() {
        let entry = profile_entry("/opt/sandbox-tools");
        let out = Command::new("sh")
            .arg("-c")
            .arg(format!("PATH=/usr/bin:/bin\n{entry}{entry}echo \"$PATH\""))
            .output()
            .unwrap();
        assert_eq!(
            String::from_utf8_lossy(&out.stdout),
            "/usr/bin:/bin:/opt/sandbox-tools/bin\n"
        );
    }
}
