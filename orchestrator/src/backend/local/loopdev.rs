//! Mounting a filesystem image through a loop device with the system calls themselves:
//! `LOOP_CTL_GET_FREE`, `LOOP_CONFIGURE` with `LO_FLAGS_AUTOCLEAR`, then `mount(2)`.
//!
//! Why not `mount -o loop`: it is a process to start, and then libmount's work, about
//! 8 ms of a sandbox create on this machine against 1 to 2 ms here (measured in
//! `docs/sandbox-disk.md`). The loop device detaches itself when its last user goes:
//! the descriptor opened here is closed on return, so from then on the mount alone holds
//! it, and unmounting it (the sandbox's teardown) frees it; if the mount fails, closing
//! the descriptor frees it at once.
//!
//! `LOOP_CONFIGURE` needs Linux 5.8; where it is missing the caller falls back to
//! `mount(8)`.
//!
//! The disk pool ([`super::diskpool`]) mounts its images ahead under a private mount of
//! its own ([`private_mount`]); a create then takes one with [`move_mount`].

use std::fs::{File, OpenOptions};
use std::io;
use std::os::fd::AsRawFd;
use std::path::Path;

/// `LOOP_CTL_GET_FREE` (linux/loop.h).
const LOOP_CTL_GET_FREE: u64 = 0x4C82;
/// `LOOP_CONFIGURE` (linux/loop.h, Linux 5.8).
const LOOP_CONFIGURE: u64 = 0x4C0A;
/// `LO_FLAGS_AUTOCLEAR`: detach on last close.
const LO_FLAGS_AUTOCLEAR: u32 = 4;
/// Tries when another process takes the free device first.
const TRIES: usize = 16;

/// `struct loop_info64` (linux/loop.h).
#[repr(C)]
struct LoopInfo64 {
    lo_device: u64,
    lo_inode: u64,
    lo_rdevice: u64,
    lo_offset: u64,
    lo_sizelimit: u64,
    lo_number: u32,
    lo_encrypt_type: u32,
    lo_encrypt_key_size: u32,
    lo_flags: u32,
    lo_file_name: [u8; 64],
    lo_crypt_name: [u8; 64],
    lo_encrypt_key: [u8; 32],
    lo_init: [u64; 2],
}

/// `struct loop_config` (linux/loop.h).
#[repr(C)]
struct LoopConfig {
    fd: u32,
    block_size: u32,
    info: LoopInfo64,
    reserved: [u64; 8],
}

impl LoopConfig {
    fn new(backing: &File, name: &Path) -> LoopConfig {
        let mut file_name = [0u8; 64];
        let bytes = std::os::unix::ffi::OsStrExt::as_bytes(name.as_os_str());
        // The name is only shown by `losetup -l`; keep its end, which names the sandbox.
        let tail = &bytes[bytes.len().saturating_sub(63)..];
        file_name[..tail.len()].copy_from_slice(tail);
        LoopConfig {
            fd: backing.as_raw_fd() as u32,
            block_size: 0,
            info: LoopInfo64 {
                lo_device: 0,
                lo_inode: 0,
                lo_rdevice: 0,
                lo_offset: 0,
                lo_sizelimit: 0,
                lo_number: 0,
                lo_encrypt_type: 0,
                lo_encrypt_key_size: 0,
                lo_flags: LO_FLAGS_AUTOCLEAR,
                lo_file_name: file_name,
                lo_crypt_name: [0; 64],
                lo_encrypt_key: [0; 32],
                lo_init: [0; 2],
            },
            reserved: [0; 8],
        }
    }
}

/// Attaches `image` to a free loop device; answers the device, open (closing it detaches
/// the device unless something else, a mount, holds it).
fn attach(image: &Path) -> io::Result<(File, String)> {
    let backing = OpenOptions::new().read(true).write(true).open(image)?;
    let control = OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/loop-control")?;
    let config = LoopConfig::new(&backing, image);
    for _ in 0..TRIES {
        // SAFETY: LOOP_CTL_GET_FREE takes no argument and returns a device number.
        let n = unsafe { libc::ioctl(control.as_raw_fd(), LOOP_CTL_GET_FREE as _) };
        if n < 0 {
            return Err(io::Error::last_os_error());
        }
        let path = format!("/dev/loop{n}");
        let device = OpenOptions::new().read(true).write(true).open(&path)?;
        // SAFETY: `config` is a complete `struct loop_config` that outlives the call;
        // the kernel only reads it.
        let r = unsafe {
            libc::ioctl(
                device.as_raw_fd(),
                LOOP_CONFIGURE as _,
                &config as *const LoopConfig,
            )
        };
        if r == 0 {
            return Ok((device, path));
        }
        let e = io::Error::last_os_error();
        // Another process configured it between our two calls: take the next.
        if e.raw_os_error() != Some(libc::EBUSY) {
            return Err(e);
        }
    }
    Err(io::Error::new(
        io::ErrorKind::ResourceBusy,
        "every free loop device was taken first",
    ))
}

/// Mounts the ext4 `image` at `mount_point` (nosuid, nodev, noatime) through a loop
/// device that detaches itself when unmounted.
pub fn mount_ext4(image: &Path, mount_point: &Path) -> io::Result<()> {
    use rustix::mount::MountFlags;
    let (device, path) = attach(image)?;
    // `noinit_itable`: the inode tables of a fresh sparse image read as zeros already;
    // the kernel's background zeroing would only write the holes full.
    rustix::mount::mount(
        path.as_str(),
        mount_point,
        "ext4",
        MountFlags::NOSUID | MountFlags::NODEV | MountFlags::NOATIME,
        c"noinit_itable",
    )?;
    drop(device);
    Ok(())
}

/// Makes `dir` a mount of its own with private propagation (a bind mount of itself), so
/// that the mounts made under it can be moved out with `MS_MOVE`: the kernel refuses to
/// move a mount whose parent is shared, as `/` is on systemd hosts. It also keeps those
/// mounts from propagating into the host's other mount namespaces.
pub fn private_mount(dir: &Path) -> io::Result<()> {
    use rustix::mount::{MountPropagationFlags, UnmountFlags};
    rustix::mount::mount_bind(dir, dir)?;
    if let Err(e) = rustix::mount::mount_change(dir, MountPropagationFlags::PRIVATE) {
        let _ = rustix::mount::unmount(dir, UnmountFlags::empty());
        return Err(e.into());
    }
    Ok(())
}

/// Moves the mount at `from` to `to` (`MS_MOVE`): one system call, and still one mount,
/// so whoever unmounts `to` frees the loop device behind it.
pub fn move_mount(from: &Path, to: &Path) -> io::Result<()> {
    Ok(rustix::mount::mount_move(from, to)?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_loop_structures_have_the_kernels_sizes() {
        assert_eq!(std::mem::size_of::<LoopInfo64>(), 232);
        assert_eq!(std::mem::size_of::<LoopConfig>(), 304);
    }

    /// The system-call path itself (the backend falls back to mount(8) silently, so
    /// the integration tests alone would not notice it failing).
    #[tokio::test]
    async fn an_image_mounts_through_a_loop_device_that_detaches_on_unmount() {
        if !rustix::process::geteuid().is_root()
            || !crate::backend::local::disk::tests::mkfs_available()
        {
            eprintln!("skipped: needs root and mkfs.ext4");
            return;
        }
        let dir = tempfile::tempdir().unwrap();
        let (image, at) = (dir.path().join("d.img"), dir.path().join("m"));
        std::fs::create_dir(&at).unwrap();
        let limit = crate::backend::local::disk::DiskLimit {
            bytes: 32 << 20,
            inodes: 2048,
        };
        crate::backend::local::disk::make_image(&image, limit)
            .await
            .unwrap();
        mount_ext4(&image, &at).expect("mounting through LOOP_CONFIGURE");
        let fs = rustix::fs::statfs(&at).unwrap();
        assert_eq!(fs.f_type as i64, 0xEF53, "ext4 mounted");
        let attached = || {
            std::fs::read_dir("/sys/block")
                .unwrap()
                .flatten()
                .filter_map(|e| std::fs::read_to_string(e.path().join("loop/backing_file")).ok())
                .any(|f| f.trim() == image.to_string_lossy())
        };
        assert!(attached());
        rustix::mount::unmount(&at, rustix::mount::UnmountFlags::empty()).unwrap();
        // The kernel detaches an autoclear device right after the last close.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while attached() {
            assert!(
                std::time::Instant::now() < deadline,
                "the loop device stayed"
            );
            std::thread::yield_now();
        }
    }
}
