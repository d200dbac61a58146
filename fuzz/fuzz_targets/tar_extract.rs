//! The agent's tar upload (`PUT /v1/files/tar`): `archive::extract` of arbitrary bytes
//! (tar or tar.gz) into a directory that already holds files and links pointing out of
//! it. Invariants: nothing outside the target changes (no `..`, absolute path, or write
//! through a link, planted or archived, escapes); a failed extraction leaves the target
//! exactly as it was (all or nothing); no staging directory is left behind; no setuid or
//! setgid bit lands.
#![no_main]

use std::fs;
use std::os::unix::fs::symlink;
use std::path::Path;

use libfuzzer_sys::fuzz_target;
use orchard_agent::api::files::archive::{extract, STAGING_PREFIX};
use orchard_fuzz::{diff, remove_all, scratch, snapshot, Node};

fn fixture(base: &Path) {
    let outside = base.join("outside");
    if !outside.exists() {
        fs::create_dir_all(outside.join("sub")).unwrap();
        fs::write(outside.join("secret"), b"outside").unwrap();
        fs::write(base.join("outside-file"), b"outside file").unwrap();
    }
    let target = base.join("target");
    remove_all(&target);
    fs::create_dir_all(target.join("dir")).unwrap();
    fs::write(target.join("keep.txt"), b"keep").unwrap();
    fs::write(target.join("dir/inner.txt"), b"inner").unwrap();
    symlink("../outside", target.join("link-out")).unwrap();
    symlink("../outside-file", target.join("link-file")).unwrap();
    symlink(&outside, target.join("abs-link")).unwrap();
    symlink("../../outside", target.join("dir/up")).unwrap();
}

fuzz_target!(|data: &[u8]| {
    let base = scratch("tar");
    fixture(&base);
    let target = base.join("target");
    let before = snapshot(&base);
    let result = extract(data, &target);
    let after = snapshot(&base);

    let outside = |s: &orchard_fuzz::Snapshot| -> orchard_fuzz::Snapshot {
        s.iter()
            .filter(|(p, _)| !p.starts_with("target"))
            .map(|(p, n)| (p.clone(), n.clone()))
            .collect()
    };
    let (out_before, out_after) = (outside(&before), outside(&after));
    assert!(
        out_before == out_after,
        "extraction changed files outside the target ({result:?}):\n{}",
        diff(&out_before, &out_after)
    );
    for path in after.keys() {
        let name = path.file_name().unwrap().to_string_lossy();
        assert!(
            !name.starts_with(STAGING_PREFIX),
            "staging directory left behind: {}",
            path.display()
        );
    }
    match &result {
        Err(_) => assert!(
            before == after,
            "a failed extraction ({result:?}) changed the target:\n{}",
            diff(&before, &after)
        ),
        Ok(_) => {
            for (path, node) in &after {
                if let Node::File { mode, .. } | Node::Dir { mode } = node {
                    assert_eq!(mode & 0o6000, 0, "setuid/setgid on {}", path.display());
                }
            }
        }
    }
});
