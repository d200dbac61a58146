//! The host's static busybox (`busybox-static`) as the userland of a test root
//! filesystem or image layer.

use std::fs;
use std::os::unix::fs::{symlink, PermissionsExt};
use std::path::Path;
use std::process::Command;
use std::sync::OnceLock;

/// The applets of the host's `/bin/busybox`, listed once per process.
pub fn busybox_applets() -> &'static [String] {
    static APPLETS: OnceLock<Vec<String>> = OnceLock::new();
    APPLETS.get_or_init(|| {
        let list = Command::new("/bin/busybox")
            .arg("--list")
            .output()
            .expect("running /bin/busybox --list (install busybox-static)");
        assert!(list.status.success(), "/bin/busybox --list failed");
        String::from_utf8_lossy(&list.stdout)
            .lines()
            .map(str::trim)
            .filter(|a| !a.is_empty() && !a.contains('/'))
            .map(String::from)
            .collect()
    })
}

/// Copies `/bin/busybox` to `<root>/bin/busybox` and links every applet beside it.
pub fn install_busybox(root: &Path) {
    let bin = root.join("bin");
    fs::create_dir_all(&bin).expect("creating bin/ of a test root");
    fs::copy("/bin/busybox", bin.join("busybox")).expect("copying /bin/busybox");
    fs::set_permissions(bin.join("busybox"), fs::Permissions::from_mode(0o755))
        .expect("making busybox executable");
    for applet in busybox_applets() {
        // `busybox --list` names busybox itself: keep the binary.
        if applet != "busybox" {
            symlink("busybox", bin.join(applet)).expect("linking a busybox applet");
        }
    }
}
