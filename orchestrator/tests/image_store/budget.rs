//! The disk budget on a real store: least recently used images go first, images in use
//! and layers shared with kept images stay, an image handed out while a pass runs is
//! kept, and layers a real overlay mount uses survive their image's removal.

use std::collections::HashSet;
use std::path::{Path, PathBuf};

use orchard::image::gc::{self, Budget, InUse};
use orchard::image::{Image, ImageStore, StoreConfig};
use serde_json::json;

use super::{new_store, Overlay};
use crate::util::registry::{layer_tar, Compression, Layout};

/// `n` bytes that do not compress, so layers take their size on disk.
pub fn noise(seed: u8, n: usize) -> Vec<u8> {
    let mut state = 0x9E37_79B9_7F4A_7C15u64 ^ u64::from(seed);
    (0..n)
        .map(|_| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state as u8
        })
        .collect()
}

/// An OCI layout holding one image of `layers` (`(file, seed)` each, 256 KiB of
/// noise), tagged `latest`.
pub fn layout_of(layers: &[(&str, u8)]) -> Layout {
    let mut layout = Layout::new();
    let tars: Vec<(Vec<u8>, Compression)> = layers
        .iter()
        .map(|(file, seed)| {
            (
                layer_tar(&[(file, &noise(*seed, 256 << 10)[..])]),
                Compression::Gzip,
            )
        })
        .collect();
    let image = layout.image(&tars, json!({"Cmd": ["sh"]}), "amd64");
    layout.tag("latest", &image);
    layout
}

fn import(store: &ImageStore, layout: &Layout, name: &str) -> Image {
    store
        .import(layout.path(), Some(name))
        .unwrap()
        .pop()
        .unwrap()
}

fn nothing_in_use() -> InUse {
    InUse::default()
}

fn names(store: &ImageStore) -> Vec<String> {
    store
        .list()
        .unwrap()
        .into_iter()
        .map(|i| i.reference)
        .collect()
}

fn exists(paths: &[PathBuf]) -> Vec<bool> {
    paths.iter().map(|p| p.is_dir()).collect()
}

#[test]
fn the_budget_evicts_least_recently_used_unused_images_and_keeps_shared_layers() {
    let (_dir, store) = new_store(StoreConfig::default());
    // a and b share their base layer; c has its own.
    let a = import(&store, &layout_of(&[("base", 1), ("a", 2)]), "gc/a:latest");
    let b = import(&store, &layout_of(&[("base", 1), ("b", 3)]), "gc/b:latest");
    let c = import(&store, &layout_of(&[("c", 4)]), "gc/c:latest");
    assert_eq!(a.layers[0], b.layers[0], "one shared base layer");
    let total = store.usage().unwrap();
    assert!(total > 4 * (256 << 10), "{total}");

    // Off: measured, nothing removed.
    let off = store.enforce_budget(Budget::Off, nothing_in_use).unwrap();
    assert_eq!((off.bytes_before, off.bytes_after), (total, total));
    assert_eq!(off.removed, Default::default());
    // Under budget: nothing removed.
    let roomy = store
        .enforce_budget(Budget::Bytes(total), nothing_in_use)
        .unwrap();
    assert_eq!(roomy.removed, Default::default());

    // a is used (a create got it), c is in use by a sandbox: b is the one to go, and
    // removing it alone is enough; the base layer it shares with a stays.
    assert!(store.get("gc/a").unwrap().is_some());
    let in_use = || InUse {
        references: vec!["gc/c".into()],
        layers: Vec::new(),
    };
    let report = store
        .enforce_budget(Budget::Bytes(total - 1), in_use)
        .unwrap();
    assert_eq!(report.removed.images_removed, ["docker.io/gc/b:latest"]);
    assert_eq!(report.removed.layers_removed, 1);
    assert_eq!(exists(&b.layers), [true, false], "shared base kept");
    assert!(exists(&a.layers).iter().all(|e| *e) && exists(&c.layers).iter().all(|e| *e));
    assert_eq!(report.bytes_after, store.usage().unwrap());
    assert!(report.bytes_after < total - (256 << 10), "{report:?}");
    assert_eq!(
        report.removed.bytes_freed,
        report.bytes_before - report.bytes_after
    );
    assert_eq!(
        names(&store),
        ["docker.io/gc/a:latest", "docker.io/gc/c:latest"]
    );

    // A budget nothing can meet: everything unused goes, in LRU order, and what is in
    // use stays (the pass reports it is still over).
    let report = store.enforce_budget(Budget::Bytes(1), in_use).unwrap();
    assert_eq!(report.removed.images_removed, ["docker.io/gc/a:latest"]);
    assert_eq!(names(&store), ["docker.io/gc/c:latest"]);
    assert!(report.bytes_after > 1);
    assert!(exists(&a.layers).iter().all(|e| !e));
}

#[test]
fn an_image_handed_out_during_a_pass_is_kept() {
    let (_dir, store) = new_store(StoreConfig::default());
    let a = import(&store, &layout_of(&[("a", 5)]), "gc/a:latest");
    import(&store, &layout_of(&[("b", 6)]), "gc/b:latest");
    // A create resolves gc/a while the pass gathers what is in use (its sandbox is not
    // in any list yet).
    let racing = store.clone();
    let report = store
        .enforce_budget(Budget::Bytes(1), move || {
            assert!(racing.get("gc/a:latest").unwrap().is_some());
            InUse::default()
        })
        .unwrap();
    assert_eq!(report.removed.images_removed, ["docker.io/gc/b:latest"]);
    assert!(a.layers.iter().all(|l| l.is_dir()));
    assert_eq!(store.get("gc/a:latest").unwrap(), Some(a));
}

#[test]
fn layers_of_a_mounted_overlay_survive_their_image() {
    orchard_test_support::require_root!("overlayfs mounts");
    let (_dir, store) = new_store(StoreConfig::default());
    let a = import(&store, &layout_of(&[("a", 7), ("a2", 8)]), "gc/a:latest");
    let overlay = Overlay::mount(&a);
    assert!(overlay.path().join("a2").is_file());
    let mounted: HashSet<PathBuf> = gc::mounted_layers(store.root()).into_iter().collect();
    assert_eq!(mounted, a.layers.iter().cloned().collect());

    store.remove("gc/a:latest").unwrap();
    let root = store.root().to_path_buf();
    let in_use = move || InUse {
        references: Vec::new(),
        layers: gc::mounted_layers(&root),
    };
    let report = store
        .enforce_budget(Budget::Bytes(1), in_use.clone())
        .unwrap();
    assert_eq!(report.removed.layers_removed, 0, "{report:?}");
    assert!(overlay.path().join("a").is_file() && a.layers.iter().all(|l| l.is_dir()));

    drop(overlay);
    let report = store.enforce_budget(Budget::Bytes(1), in_use).unwrap();
    assert_eq!(report.removed.layers_removed, 2);
    assert!(a.layers.iter().all(|l| !Path::new(l).exists()));
}
