//! A layer blob from a registry or an imported archive: `unpack::unpack` of arbitrary
//! bytes (plain tar, gzip or zstd, sniffed) into an empty directory.
//! Invariants: nothing outside the directory changes; the diff_id of a plain tar is the
//! digest of the bytes read; no overlayfs attribute other than the opaque marker
//! (`trusted.overlay.opaque=y`, from a `.wh..wh..opq` whiteout) is set, so a layer cannot
//! redirect or metacopy its way to other directories.
#![no_main]

use std::fs;
use std::path::Path;

use libfuzzer_sys::fuzz_target;
use orchard::image::digest::of_bytes;
use orchard::image::unpack::{get_xattr, unpack, Compression, OPAQUE_XATTR};
use orchard_fuzz::{diff, remove_all, scratch, snapshot, Node};

const OVERLAY_XATTRS: &[&str] = &[
    "trusted.overlay.redirect",
    "trusted.overlay.metacopy",
    "trusted.overlay.origin",
    "trusted.overlay.upper",
    "trusted.overlay.impure",
    "trusted.overlay.nlink",
];

fn fixture(base: &Path) {
    let outside = base.join("outside");
    if !outside.exists() {
        fs::create_dir_all(outside.join("sub")).unwrap();
        fs::write(outside.join("secret"), b"outside").unwrap();
    }
    let dest = base.join("layer");
    remove_all(&dest);
    fs::create_dir(&dest).unwrap();
}

fuzz_target!(|data: &[u8]| {
    let base = scratch("layer");
    fixture(&base);
    let dest = base.join("layer");
    let before = snapshot(&base);
    let mut reader = data;
    let result = unpack(&mut reader, &dest, "fuzz layer");
    let after = snapshot(&base);

    let outside = |s: &orchard_fuzz::Snapshot| -> orchard_fuzz::Snapshot {
        s.iter()
            .filter(|(p, _)| !p.starts_with("layer"))
            .map(|(p, n)| (p.clone(), n.clone()))
            .collect()
    };
    let (out_before, out_after) = (outside(&before), outside(&after));
    assert!(
        out_before == out_after,
        "unpacking changed files outside the layer ({result:?}):\n{}",
        diff(&out_before, &out_after)
    );
    for (rel, node) in &after {
        if !rel.starts_with("layer") || matches!(node, Node::Link { .. }) {
            continue;
        }
        let path = base.join(rel);
        for name in OVERLAY_XATTRS {
            assert_eq!(
                get_xattr(&path, name).ok().flatten(),
                None,
                "{name} set on {}",
                rel.display()
            );
        }
        if let Ok(Some(value)) = get_xattr(&path, OPAQUE_XATTR) {
            assert_eq!(value, b"y", "opaque marker on {}", rel.display());
            assert!(
                matches!(node, Node::Dir { .. }),
                "opaque non-directory {}",
                rel.display()
            );
        }
    }
    if let Ok(unpacked) = &result {
        if unpacked.compression == Compression::None {
            assert_eq!(unpacked.diff_id, of_bytes(data));
        }
    }
});
