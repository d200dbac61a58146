//! The runtime's files in every sandbox, whatever its image holds, as Docker and the
//! kubelet give them: `/etc/hosts` (localhost for IPv4 and IPv6, and the sandbox's own
//! name), `/etc/hostname`, and `/etc/resolv.conf` when the sandbox has egress.
//!
//! They are the runtime's, not the image's. Each is written in the sandbox's own
//! directory on the host, on its disk (so what sandbox code writes to them counts
//! against its disk, like its writable layer), and bind-mounted over the image's path:
//! the image's copy stays as it is, and what is written to the file never reaches the
//! overlay. Where the image lacks the file (or `/etc`), an empty mount point is made in
//! the overlay; a symlink there (`/etc/resolv.conf -> ../run/systemd/...`) is replaced
//! by one rather than followed to a place of the image's choosing. Those mount points
//! are all the overlay holds of these files, and snapshots leave them out
//! ([`RuntimeFile::in_root`]): a fork makes its own, with its own name.

use std::fs;
use std::io;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use crate::backend::local::network::{NetworkMode, SLIRP_RESOLV_CONF};
use crate::backend::local::rootfs::{resolve_in_root, RootfsError};

/// The sandbox's address on slirp4netns' `tap0` (see `network`), its name's address when
/// it has egress (as a pod's name has the pod IP).
const SLIRP_ADDRESS: &str = "10.0.2.100";

/// Errors of this module.
#[derive(Debug, thiserror::Error)]
pub enum RuntimeFileError {
    /// `/etc` of the image could not be resolved inside its root.
    #[error(transparent)]
    Root(#[from] RootfsError),
    /// The image has a directory where the file goes.
    #[error("the image has a directory at {0}, where the runtime's file goes")]
    Directory(String),
    /// A file or mount point could not be made.
    #[error("{op} {path}: {source}")]
    Io {
        /// What was being done.
        op: &'static str,
        /// The file.
        path: PathBuf,
        /// The error.
        source: io::Error,
    },
}

fn io_err<'a>(op: &'static str, path: &'a Path) -> impl FnOnce(io::Error) -> RuntimeFileError + 'a {
    move |source| RuntimeFileError::Io {
        op,
        path: path.to_path_buf(),
        source,
    }
}

/// One of the runtime's files, ready to be bind-mounted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RuntimeFile {
    /// Its path in the sandbox's root, relative (`etc/hosts`): where it is mounted, and
    /// what a snapshot leaves out of the writable layer.
    pub in_root: PathBuf,
    /// The host file mounted there.
    pub source: PathBuf,
}

impl RuntimeFile {
    /// The absolute mount destination in the sandbox (`/etc/hosts`).
    pub fn destination(&self) -> String {
        format!("/{}", self.in_root.display())
    }
}

/// `/etc/hosts` of a sandbox named `hostname`: localhost for IPv4 and IPv6 (with
/// Docker's IPv6 names), and the sandbox's name on its own address. Without egress
/// that is 127.0.1.1, as on Debian hosts: on loopback, but not 127.0.0.1, whose reverse
/// lookup answers `localhost` (so `hostname -f` and Python's `getfqdn()` give the name).
pub fn hosts(hostname: &str, network: NetworkMode) -> String {
    let own = match network {
        NetworkMode::None => "127.0.1.1",
        NetworkMode::Egress { .. } => SLIRP_ADDRESS,
    };
    format!(
        "127.0.0.1\tlocalhost\n\
         ::1\tlocalhost ip6-localhost ip6-loopback\n\
         fe00::0\tip6-localnet\n\
         ff00::0\tip6-mcastprefix\n\
         ff02::1\tip6-allnodes\n\
         ff02::2\tip6-allrouters\n\
         {own}\t{hostname}\n"
    )
}

/// The files a sandbox gets: name under `/etc` and content.
fn contents(hostname: &str, network: NetworkMode) -> Vec<(&'static str, String)> {
    let mut files = vec![
        ("hosts", hosts(hostname, network)),
        ("hostname", format!("{hostname}\n")),
    ];
    if matches!(network, NetworkMode::Egress { .. }) {
        files.push(("resolv.conf", SLIRP_RESOLV_CONF.to_string()));
    }
    files
}

/// Writes the runtime's files of a sandbox in `host_dir` (made here) and makes their
/// mount points in `root` (its mounted overlay) where the image has none.
pub fn prepare(
    root: &Path,
    host_dir: &Path,
    hostname: &str,
    network: NetworkMode,
) -> Result<Vec<RuntimeFile>, RuntimeFileError> {
    fs::create_dir_all(host_dir).map_err(io_err("creating", host_dir))?;
    let etc = resolve_in_root(root, "/etc")?;
    if fs::symlink_metadata(&etc).is_err() {
        fs::create_dir_all(&etc).map_err(io_err("creating", &etc))?;
        fs::set_permissions(&etc, fs::Permissions::from_mode(0o755))
            .map_err(io_err("setting the mode of", &etc))?;
    }
    let etc_in_root = etc.strip_prefix(root).unwrap_or(Path::new("etc"));
    let mut files = Vec::new();
    for (name, content) in contents(hostname, network) {
        let source = host_dir.join(name);
        fs::write(&source, content).map_err(io_err("writing", &source))?;
        fs::set_permissions(&source, fs::Permissions::from_mode(0o644))
            .map_err(io_err("setting the mode of", &source))?;
        let in_root = etc_in_root.join(name);
        mount_point(&etc.join(name), &in_root)?;
        files.push(RuntimeFile { in_root, source });
    }
    Ok(files)
}

/// Makes `path` a regular file to mount over: kept when it is one, made when missing,
/// replacing a symlink (or a device, a FIFO) of the image in the overlay.
fn mount_point(path: &Path, in_root: &Path) -> Result<(), RuntimeFileError> {
    match fs::symlink_metadata(path) {
        Ok(m) if m.is_file() => return Ok(()),
        Ok(m) if m.is_dir() => {
            return Err(RuntimeFileError::Directory(format!(
                "/{}",
                in_root.display()
            )))
        }
        Ok(_) => fs::remove_file(path).map_err(io_err("removing", path))?,
        Err(_) => {}
    }
    fs::write(path, b"").map_err(io_err("creating", path))?;
    fs::set_permissions(path, fs::Permissions::from_mode(0o644))
        .map_err(io_err("setting the mode of", path))
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::symlink;

    use super::*;

    const EGRESS: NetworkMode = NetworkMode::Egress {
        allow_host_loopback: false,
    };

    #[test]
    fn hosts_names_localhost_both_ways_and_the_sandbox() {
        let h = hosts("sb-1", NetworkMode::None);
        assert!(h.starts_with("127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n"));
        assert!(h.ends_with("127.0.1.1\tsb-1\n"), "{h}");
        assert!(hosts("sb-1", EGRESS).ends_with("10.0.2.100\tsb-1\n"));
    }

    #[test]
    fn an_image_without_etc_gets_one_with_mount_points_and_the_files_are_written_apart() {
        let dir = tempfile::tempdir().unwrap();
        let (root, host) = (dir.path().join("root"), dir.path().join("files"));
        fs::create_dir(&root).unwrap();
        let files = prepare(&root, &host, "sb-1", NetworkMode::None).unwrap();
        let names: Vec<_> = files.iter().map(|f| f.destination()).collect();
        assert_eq!(names, ["/etc/hosts", "/etc/hostname"]);
        for f in &files {
            assert_eq!(
                fs::read(root.join(&f.in_root)).unwrap(),
                b"",
                "an empty mount point"
            );
            assert!(f.source.starts_with(&host));
        }
        assert_eq!(fs::read_to_string(host.join("hostname")).unwrap(), "sb-1\n");
        assert!(
            !host.join("resolv.conf").exists(),
            "no resolver without egress"
        );
    }

    #[test]
    fn the_images_files_are_kept_and_a_symlink_is_replaced_not_followed() {
        let dir = tempfile::tempdir().unwrap();
        let (root, host) = (dir.path().join("root"), dir.path().join("files"));
        fs::create_dir_all(root.join("etc")).unwrap();
        fs::write(root.join("etc/hosts"), "10.9.9.9 image\n").unwrap();
        let outside = dir.path().join("host-resolv.conf");
        fs::write(&outside, "nameserver 1.1.1.1\n").unwrap();
        symlink(&outside, root.join("etc/resolv.conf")).unwrap();
        let files = prepare(&root, &host, "sb-1", EGRESS).unwrap();
        assert_eq!(files.len(), 3);
        assert_eq!(
            fs::read_to_string(root.join("etc/hosts")).unwrap(),
            "10.9.9.9 image\n",
            "the image's copy is not changed"
        );
        let resolv = root.join("etc/resolv.conf");
        assert!(fs::symlink_metadata(&resolv).unwrap().is_file());
        assert_eq!(
            fs::read_to_string(&outside).unwrap(),
            "nameserver 1.1.1.1\n",
            "the link's target is untouched"
        );
        assert_eq!(
            fs::read_to_string(host.join("resolv.conf")).unwrap(),
            SLIRP_RESOLV_CONF
        );
    }

    #[test]
    fn a_directory_where_the_file_goes_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("root");
        fs::create_dir_all(root.join("etc/hostname")).unwrap();
        let err = prepare(&root, &dir.path().join("f"), "sb-1", NetworkMode::None).unwrap_err();
        assert!(err.to_string().contains("/etc/hostname"), "{err}");
    }
}
