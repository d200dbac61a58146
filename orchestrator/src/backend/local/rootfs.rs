//! A sandbox's root filesystem: an overlay of the image's layers (read-only, shared by
//! every sandbox of the image) under a per-sandbox upper and work directory, so the root
//! is writable and a sandbox's changes cost only what it writes.
//!
//! Also the few things done inside the rootfs before the container starts (reading
//! `/etc/passwd`, creating the working directory). An image
//! may hold any symlink, e.g. `/workspace -> /etc`; on the host that would point at the
//! host's `/etc`. Paths are therefore resolved the way the container will see them
//! ([`resolve_in_root`]): absolute link targets restart at the rootfs, `..` stops there.

use std::fs;
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::path::{Component, Path, PathBuf};
use std::time::Duration;

use crate::backend::local::sys::{MountRequest, Mounter, UnmountMode};

/// Longest option string `mount(2)` accepts: one page, NUL included.
const MAX_MOUNT_DATA: usize = 4095;
/// Symlinks followed in one resolution before giving up (Linux's own limit).
const MAX_LINKS: usize = 40;
/// Plain unmount attempts before detaching a busy mount.
const UNMOUNT_ATTEMPTS: usize = 20;

/// Errors of this module.
#[derive(Debug, thiserror::Error)]
pub enum RootfsError {
    /// An image layer directory is missing.
    #[error("image layer {0} is not a directory")]
    LayerMissing(PathBuf),
    /// A path holds a character overlayfs options cannot carry.
    #[error("path {0} contains ',', ':' or '\\', which overlayfs mount options cannot carry")]
    UnsafePath(PathBuf),
    /// Too many layers (or too long paths) for one mount call.
    #[error(
        "the overlay options for {layers} layers are {len} bytes, more than the {max} one \
         mount call takes: use a shorter backend root or flatten the image"
    )]
    OptionsTooLong {
        /// Number of layers.
        layers: usize,
        /// Length of the options.
        len: usize,
        /// The limit.
        max: usize,
    },
    /// `mount(2)` failed.
    #[error("mounting the overlay on {target}: {source}")]
    Mount {
        /// Mount point.
        target: PathBuf,
        /// The error.
        source: io::Error,
    },
    /// `umount2(2)` failed.
    #[error("unmounting {target}: {source}")]
    Unmount {
        /// Mount point.
        target: PathBuf,
        /// The error.
        source: io::Error,
    },
    /// A path inside the rootfs loops through symlinks.
    #[error("{0} resolves through more than 40 symlinks inside the image")]
    TooManyLinks(String),
    /// The working directory exists but is a file.
    #[error("the working directory {0} exists in the image but is not a directory")]
    NotADirectory(String),
    /// The image's user is not in its `/etc/passwd`.
    #[error("user {0:?} is not in the image's /etc/passwd")]
    UnknownUser(String),
    /// The image's group is not in its `/etc/group`.
    #[error("group {0:?} is not in the image's /etc/group")]
    UnknownGroup(String),
    /// Any other I/O error.
    #[error("{op} {path}: {source}")]
    Io {
        /// What we were doing.
        op: &'static str,
        /// On what.
        path: PathBuf,
        /// The error.
        source: io::Error,
    },
}

fn io_err<'a>(op: &'static str, path: &'a Path) -> impl FnOnce(io::Error) -> RootfsError + 'a {
    move |source| RootfsError::Io {
        op,
        path: path.to_path_buf(),
        source,
    }
}

fn check_option_path(p: &Path) -> Result<&str, RootfsError> {
    let s = p
        .to_str()
        .ok_or_else(|| RootfsError::UnsafePath(p.to_path_buf()))?;
    if s.contains([',', ':', '\\']) {
        return Err(RootfsError::UnsafePath(p.to_path_buf()));
    }
    Ok(s)
}

/// The overlay mount for `layers` (bottom first, as [`crate::image::Image`] lists them)
/// with `upper` and `work` on `target`.
pub fn overlay_request(
    layers: &[PathBuf],
    upper: &Path,
    work: &Path,
    target: &Path,
) -> Result<MountRequest, RootfsError> {
    // overlayfs lists lower dirs top first.
    let lower: Vec<&str> = layers
        .iter()
        .rev()
        .map(|l| check_option_path(l))
        .collect::<Result<_, _>>()?;
    let data = format!(
        "lowerdir={},upperdir={},workdir={}",
        lower.join(":"),
        check_option_path(upper)?,
        check_option_path(work)?
    );
    if data.len() > MAX_MOUNT_DATA {
        return Err(RootfsError::OptionsTooLong {
            layers: layers.len(),
            len: data.len(),
            max: MAX_MOUNT_DATA,
        });
    }
    Ok(MountRequest {
        source: "overlay".into(),
        target: target.to_path_buf(),
        fstype: "overlay".into(),
        flags: 0,
        data,
    })
}

/// Mounts the overlay of `layers` on `target`.
pub fn mount_overlay(
    mounter: &dyn Mounter,
    layers: &[PathBuf],
    upper: &Path,
    work: &Path,
    target: &Path,
) -> Result<(), RootfsError> {
    for layer in layers {
        if !layer.is_dir() {
            return Err(RootfsError::LayerMissing(layer.clone()));
        }
    }
    let req = overlay_request(layers, upper, work, target)?;
    mounter.mount(&req).map_err(|source| RootfsError::Mount {
        target: target.to_path_buf(),
        source,
    })
}

/// Unmounts `target`: plainly, retrying while busy (a process of the dying sandbox may
/// still hold it for a moment), then detached. Answers whether something was mounted.
pub fn unmount(mounter: &dyn Mounter, target: &Path) -> Result<bool, RootfsError> {
    for _ in 0..UNMOUNT_ATTEMPTS {
        match mounter.unmount(target, UnmountMode::Normal) {
            Ok(()) => return Ok(true),
            Err(e) if e.raw_os_error() == Some(libc::EINVAL) => return Ok(false),
            Err(e) if e.raw_os_error() == Some(libc::ENOENT) => return Ok(false),
            Err(e) if e.raw_os_error() == Some(libc::EBUSY) => {
                std::thread::sleep(Duration::from_millis(10))
            }
            Err(source) => {
                return Err(RootfsError::Unmount {
                    target: target.to_path_buf(),
                    source,
                })
            }
        }
    }
    mounter
        .unmount(target, UnmountMode::Detach)
        .map(|()| true)
        .map_err(|source| RootfsError::Unmount {
            target: target.to_path_buf(),
            source,
        })
}

/// Resolves `path` (as the container sees it) to a host path under `root`, following
/// symlinks inside `root` only. Components that do not exist are appended as they are.
pub fn resolve_in_root(root: &Path, path: &str) -> Result<PathBuf, RootfsError> {
    let mut pending: Vec<Vec<u8>> = components(Path::new(path));
    pending.reverse();
    let mut current: Vec<Vec<u8>> = Vec::new();
    let mut links = 0;
    while let Some(c) = pending.pop() {
        match c.as_slice() {
            b"." => continue,
            b".." => {
                current.pop();
                continue;
            }
            _ => {}
        }
        let mut candidate = current.clone();
        candidate.push(c);
        let host = join(root, &candidate);
        match fs::symlink_metadata(&host) {
            Ok(m) if m.file_type().is_symlink() => {
                links += 1;
                if links > MAX_LINKS {
                    return Err(RootfsError::TooManyLinks(path.to_string()));
                }
                let target = fs::read_link(&host).map_err(io_err("reading link", &host))?;
                if target.is_absolute() {
                    current.clear();
                }
                let mut more = components(&target);
                more.reverse();
                pending.extend(more);
            }
            _ => current = candidate,
        }
    }
    Ok(join(root, &current))
}

fn components(p: &Path) -> Vec<Vec<u8>> {
    p.components()
        .filter_map(|c| match c {
            Component::Normal(s) => Some(s.as_bytes().to_vec()),
            Component::ParentDir => Some(b"..".to_vec()),
            _ => None,
        })
        .collect()
}

fn join(root: &Path, parts: &[Vec<u8>]) -> PathBuf {
    let mut p = root.to_path_buf();
    for part in parts {
        p.push(std::ffi::OsStr::from_bytes(part));
    }
    p
}

/// The user the image asks for, resolved against its `/etc/passwd` and `/etc/group`.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct ResolvedUser {
    /// The image's `User` as written (`""` for none).
    pub spec: String,
    /// User id.
    pub uid: u32,
    /// Primary group id.
    pub gid: u32,
    /// Supplementary groups (from `/etc/group` membership).
    pub additional_gids: Vec<u32>,
    /// Home directory (`/` when the user is not in `/etc/passwd`).
    pub home: String,
}

struct PasswdEntry {
    name: String,
    uid: u32,
    gid: u32,
    home: String,
}

struct GroupEntry {
    name: String,
    gid: u32,
    members: Vec<String>,
}

/// Reads a file of the image through [`resolve_in_root`]; missing or not a regular file
/// reads as empty.
fn read_image_file(root: &Path, path: &str) -> Result<String, RootfsError> {
    let host = resolve_in_root(root, path)?;
    match fs::symlink_metadata(&host) {
        Ok(m) if m.is_file() => {
            let bytes = fs::read(&host).map_err(io_err("reading", &host))?;
            Ok(String::from_utf8_lossy(&bytes).into_owned())
        }
        _ => Ok(String::new()),
    }
}

fn passwd(root: &Path) -> Result<Vec<PasswdEntry>, RootfsError> {
    Ok(read_image_file(root, "/etc/passwd")?
        .lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.split(':').collect();
            Some(PasswdEntry {
                name: f.first()?.to_string(),
                uid: f.get(2)?.parse().ok()?,
                gid: f.get(3)?.parse().ok()?,
                home: f.get(5).map(|h| h.to_string()).unwrap_or_default(),
            })
        })
        .collect())
}

fn groups(root: &Path) -> Result<Vec<GroupEntry>, RootfsError> {
    Ok(read_image_file(root, "/etc/group")?
        .lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.split(':').collect();
            Some(GroupEntry {
                name: f.first()?.to_string(),
                gid: f.get(2)?.parse().ok()?,
                members: f
                    .get(3)
                    .map(|m| {
                        m.split(',')
                            .filter(|s| !s.is_empty())
                            .map(String::from)
                            .collect()
                    })
                    .unwrap_or_default(),
            })
        })
        .collect())
}

/// Resolves the image's `User` (`name`, `uid`, `name:group`, `uid:gid`, any mix) like
/// Docker: names must exist in the image, numbers need not; a user without a group
/// gets its passwd group (0 when it is not in passwd).
pub fn resolve_user(root: &Path, user: Option<&str>) -> Result<ResolvedUser, RootfsError> {
    let spec = user.unwrap_or("").trim();
    let (user_part, group_part) = match spec.split_once(':') {
        Some((u, g)) => (u, Some(g)),
        None => (spec, None),
    };
    let users = passwd(root)?;
    let entry = if user_part.is_empty() {
        users.iter().find(|e| e.uid == 0)
    } else if let Ok(uid) = user_part.parse::<u32>() {
        users.iter().find(|e| e.uid == uid)
    } else {
        Some(
            users
                .iter()
                .find(|e| e.name == user_part)
                .ok_or_else(|| RootfsError::UnknownUser(user_part.to_string()))?,
        )
    };
    let uid = match user_part.parse::<u32>() {
        Ok(uid) => uid,
        Err(_) => entry.map_or(0, |e| e.uid),
    };
    let all_groups = groups(root)?;
    let gid = match group_part.filter(|g| !g.is_empty()) {
        None => entry.map_or(0, |e| e.gid),
        Some(g) => match g.parse::<u32>() {
            Ok(gid) => gid,
            Err(_) => {
                all_groups
                    .iter()
                    .find(|e| e.name == g)
                    .ok_or_else(|| RootfsError::UnknownGroup(g.to_string()))?
                    .gid
            }
        },
    };
    let mut additional_gids: Vec<u32> = match entry {
        Some(e) => all_groups
            .iter()
            .filter(|g| g.members.contains(&e.name) && g.gid != gid)
            .map(|g| g.gid)
            .collect(),
        None => Vec::new(),
    };
    additional_gids.sort_unstable();
    additional_gids.dedup();
    let home = entry
        .map(|e| e.home.clone())
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| if uid == 0 { "/root".into() } else { "/".into() });
    Ok(ResolvedUser {
        spec: spec.to_string(),
        uid,
        gid,
        additional_gids,
        home,
    })
}

/// The sandbox's working directory: the image's (created when missing), else
/// `/workspace` when the image has one, else `/`.
pub fn prepare_workdir(root: &Path, configured: Option<&str>) -> Result<String, RootfsError> {
    let configured = configured.map(str::trim).filter(|w| !w.is_empty());
    let Some(dir) = configured else {
        let ws = resolve_in_root(root, "/workspace")?;
        return Ok(if ws.is_dir() { "/workspace" } else { "/" }.to_string());
    };
    // Docker reads a relative WORKDIR against "/".
    let dir = if dir.starts_with('/') {
        dir.to_string()
    } else {
        format!("/{dir}")
    };
    let host = resolve_in_root(root, &dir)?;
    match fs::metadata(&host) {
        Ok(m) if m.is_dir() => {}
        Ok(_) => return Err(RootfsError::NotADirectory(dir)),
        // The components that do not exist are plain names under a resolved parent, so
        // creating them cannot leave the rootfs.
        Err(_) => fs::create_dir_all(&host).map_err(io_err("creating", &host))?,
    }
    Ok(dir)
}

/// Gives `dir` in the rootfs to a non-root image user: made when missing, and handed
/// over when root owns it (its contents are left as they are). Orchard's `/workspace`
/// is where commands and the files API work, and both act as the image's user.
pub fn make_user_dir(root: &Path, dir: &str, uid: u32, gid: u32) -> Result<(), RootfsError> {
    use std::os::unix::fs::MetadataExt;
    let host = resolve_in_root(root, dir)?;
    match fs::symlink_metadata(&host) {
        Ok(m) if m.is_dir() && m.uid() == 0 => {}
        Ok(_) => return Ok(()),
        Err(_) => fs::create_dir_all(&host).map_err(io_err("creating", &host))?,
    }
    std::os::unix::fs::lchown(&host, Some(uid), Some(gid)).map_err(io_err("chowning", &host))
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::symlink;

    use super::*;
    use crate::backend::local::sys::{MountCall, RecordingMounter};

    #[test]
    fn the_overlay_lists_layers_top_first_with_upper_and_work() {
        let m = RecordingMounter::new();
        let dir = tempfile::tempdir().unwrap();
        let (a, b) = (dir.path().join("a"), dir.path().join("b"));
        fs::create_dir(&a).unwrap();
        fs::create_dir(&b).unwrap();
        let target = Path::new("/sb/rootfs");
        mount_overlay(
            &m,
            &[a.clone(), b.clone()],
            Path::new("/sb/upper"),
            Path::new("/sb/work"),
            target,
        )
        .unwrap();
        assert_eq!(
            m.calls(),
            vec![MountCall::Mount(MountRequest {
                source: "overlay".into(),
                target: target.into(),
                fstype: "overlay".into(),
                flags: 0,
                data: format!(
                    "lowerdir={}:{},upperdir=/sb/upper,workdir=/sb/work",
                    b.display(),
                    a.display()
                ),
            })]
        );
        assert!(unmount(&m, target).unwrap());
    }

    #[test]
    fn bad_layers_are_refused_before_any_mount() {
        let m = RecordingMounter::new();
        let up = Path::new("/u");
        let e = mount_overlay(&m, &[PathBuf::from("/no/such/layer")], up, up, up).unwrap_err();
        assert!(matches!(e, RootfsError::LayerMissing(_)), "{e}");
        let e = overlay_request(&[PathBuf::from("/a:b")], up, up, up).unwrap_err();
        assert!(matches!(e, RootfsError::UnsafePath(_)), "{e}");
        let many: Vec<PathBuf> = (0..200)
            .map(|i| PathBuf::from(format!("/var/lib/orchard/images/layers/{i:064}")))
            .collect();
        let e = overlay_request(&many, up, up, up).unwrap_err();
        assert!(
            matches!(e, RootfsError::OptionsTooLong { layers: 200, .. }),
            "{e}"
        );
        assert!(m.calls().is_empty());
    }

    #[test]
    fn a_busy_unmount_is_retried_then_detached() {
        let m = RecordingMounter::new();
        m.fail_unmounts_busy(UNMOUNT_ATTEMPTS);
        assert!(unmount(&m, Path::new("/x")).unwrap());
        let calls = m.calls();
        assert_eq!(calls.len(), UNMOUNT_ATTEMPTS + 1);
        assert_eq!(
            calls.last(),
            Some(&MountCall::Unmount {
                target: "/x".into(),
                mode: UnmountMode::Detach
            })
        );
    }

    #[test]
    fn symlinks_resolve_inside_the_root() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        fs::create_dir_all(root.join("real/sub")).unwrap();
        symlink("/real", root.join("abs")).unwrap();
        symlink("../../../../etc", root.join("escape")).unwrap();
        symlink("loop", root.join("loop")).unwrap();
        symlink("real/sub", root.join("rel")).unwrap();
        let r = |p: &str| resolve_in_root(root, p).unwrap();
        assert_eq!(r("/abs/sub"), root.join("real/sub"));
        assert_eq!(r("/escape/passwd"), root.join("etc/passwd"));
        assert_eq!(r("/rel/../x"), root.join("real/x"));
        assert_eq!(r("/../../.."), root.to_path_buf());
        assert!(matches!(
            resolve_in_root(root, "/loop"),
            Err(RootfsError::TooManyLinks(_))
        ));
    }

    #[test]
    fn the_workdir_is_created_inside_the_root_even_through_a_hostile_symlink() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("root");
        fs::create_dir_all(&root).unwrap();
        // On the host this would be <tmp>/outside.
        symlink("/../outside", root.join("work")).unwrap();
        assert_eq!(
            prepare_workdir(&root, Some("/work/app")).unwrap(),
            "/work/app"
        );
        assert!(root.join("outside/app").is_dir());
        assert!(!dir.path().join("outside").exists());
        assert_eq!(prepare_workdir(&root, None).unwrap(), "/");
        fs::create_dir(root.join("workspace")).unwrap();
        assert_eq!(prepare_workdir(&root, None).unwrap(), "/workspace");
        assert_eq!(prepare_workdir(&root, Some("srv")).unwrap(), "/srv");
        fs::write(root.join("file"), "").unwrap();
        assert!(matches!(
            prepare_workdir(&root, Some("/file")),
            Err(RootfsError::NotADirectory(_))
        ));
    }

    #[test]
    fn users_resolve_like_docker() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        fs::create_dir(root.join("etc")).unwrap();
        fs::write(
            root.join("etc/passwd"),
            "root:x:0:0:root:/root:/bin/sh\napp:x:1000:1000::/home/app:/bin/sh\n",
        )
        .unwrap();
        fs::write(
            root.join("etc/group"),
            "root:x:0:\napp:x:1000:\ndocker:x:999:app,other\nstaff:x:50:\n",
        )
        .unwrap();
        let r = |u: Option<&str>| resolve_user(root, u).unwrap();
        let root_user = r(None);
        assert_eq!(
            (root_user.uid, root_user.gid, root_user.home.as_str()),
            (0, 0, "/root")
        );
        let app = r(Some("app"));
        assert_eq!(
            (app.uid, app.gid, app.additional_gids.clone()),
            (1000, 1000, vec![999])
        );
        assert_eq!(app.home, "/home/app");
        assert_eq!(
            (r(Some("app:staff")).uid, r(Some("app:staff")).gid),
            (1000, 50)
        );
        let numeric = r(Some("4242:4343"));
        assert_eq!(
            (numeric.uid, numeric.gid, numeric.home.as_str()),
            (4242, 4343, "/")
        );
        assert_eq!(r(Some("4242")).gid, 0);
        assert_eq!(r(Some("1000")).home, "/home/app");
        assert!(matches!(
            resolve_user(root, Some("nobody")),
            Err(RootfsError::UnknownUser(_))
        ));
        assert!(matches!(
            resolve_user(root, Some("app:nogroup")),
            Err(RootfsError::UnknownGroup(_))
        ));
    }
}
