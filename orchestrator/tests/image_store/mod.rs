//! Image store tests against a real registry (`util::registry`), with real files: pulls
//! through a docker.io mirror, whiteouts checked through a real overlayfs mount, indexes,
//! corrupted blobs, imports, shared concurrent pulls, gc, the python image, and the
//! Bearer and Basic authentication flows through an in-test proxy.

pub mod budget;
pub mod registry_auth;

use std::fs;
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::Path;
use std::process::Command;
use std::sync::{Arc, Mutex};

use orchard::image::unpack::{get_xattr, OPAQUE_XATTR};
use orchard::image::{Credentials, Image, ImageError, ImageStore, Progress, StoreConfig};
use serde_json::{json, Value};

use crate::util::registry::{
    dead_endpoint, image_layout, layer_tar, registry, sha256, Compression, Layout, Proxy,
    ProxyAuth, PushFormat,
};

/// A store in a fresh directory; the directory goes when the returned guard does.
fn new_store(config: StoreConfig) -> (tempfile::TempDir, ImageStore) {
    let dir = tempfile::tempdir().unwrap();
    let store = ImageStore::open(dir.path().join("store"), config).unwrap();
    (dir, store)
}

/// Docker Hub mirrored by the test registry, as an operator would configure it.
fn hub_mirror() -> StoreConfig {
    let mut config = StoreConfig::default();
    config
        .mirrors
        .insert("docker.io".into(), vec![registry().url()]);
    config
}

fn no_progress(_: Progress) {}

/// Pulls `name` from the test registry, by its host.
async fn pull_from_registry(store: &ImageStore, name: &str) -> Result<Image, ImageError> {
    store
        .pull(&format!("{}/{name}", registry().host), no_progress)
        .await
}

/// Names of the entries of a directory, sorted.
fn names(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = match fs::read_dir(dir) {
        Ok(entries) => entries
            .map(|e| e.unwrap().file_name().to_string_lossy().to_string())
            .collect(),
        Err(_) => Vec::new(),
    };
    names.sort();
    names
}

/// An overlayfs mount of an image's layers (read-only: lower dirs only), unmounted on drop.
struct Overlay {
    target: tempfile::TempDir,
}

impl Overlay {
    fn mount(image: &Image) -> Overlay {
        let target = tempfile::tempdir().unwrap();
        // overlayfs lists lower dirs top first.
        let lower: Vec<String> = image
            .layers
            .iter()
            .rev()
            .map(|p| p.display().to_string())
            .collect();
        let status = Command::new("mount")
            .args(["-t", "overlay", "overlay", "-o"])
            .arg(format!("lowerdir={}", lower.join(":")))
            .arg(target.path())
            .status()
            .unwrap();
        assert!(status.success(), "mount -t overlay failed");
        Overlay { target }
    }

    fn path(&self) -> &Path {
        self.target.path()
    }
}

impl Drop for Overlay {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(self.target.path()).status();
    }
}

#[tokio::test]
async fn pull_busybox_unqualified_through_a_docker_io_mirror() {
    registry().push_image("busybox", "latest", "library/busybox:latest");
    let (_dir, store) = new_store(hub_mirror());
    let reports = Arc::new(Mutex::new(Vec::new()));
    let sink = reports.clone();
    let image = store
        .pull("busybox:latest", move |p| sink.lock().unwrap().push(p))
        .await
        .unwrap();
    assert_eq!(image.reference, "docker.io/library/busybox:latest");
    assert!(image.digest.starts_with("sha256:"));
    assert_eq!(image.layers.len(), 1);
    let layer = &image.layers[0];
    assert!(layer.starts_with(store.root().join("layers")));
    let busybox = fs::metadata(layer.join("bin/busybox")).unwrap();
    assert!(busybox.len() > 100_000 && busybox.mode() & 0o111 != 0);
    assert_eq!(
        fs::read_link(layer.join("bin/sh")).unwrap(),
        Path::new("busybox")
    );
    assert!(fs::read_to_string(layer.join("etc/passwd"))
        .unwrap()
        .starts_with("root:x:0:0"));
    assert_eq!(
        fs::metadata(layer.join("tmp")).unwrap().mode() & 0o7777,
        0o1777
    );
    assert!(layer.join("workspace").is_dir());
    assert_eq!(image.config.cmd, ["sh"]);
    assert!(image.config.env.iter().any(|e| e.starts_with("PATH=")));

    let reports = reports.lock().unwrap().clone();
    let last = reports.last().expect("no progress reported");
    assert_eq!((last.layers_done, last.layers_total), (1, 1));
    assert!(reports
        .iter()
        .any(|p| p.layer_bytes_total > 0 && p.layer_bytes_done == p.layer_bytes_total));

    // The store answers for every spelling of the name, and lists it once.
    for name in [
        "busybox",
        "docker.io/library/busybox:latest",
        "library/busybox",
    ] {
        assert_eq!(store.get(name).unwrap().as_ref(), Some(&image), "{name}");
    }
    assert_eq!(store.list().unwrap(), std::slice::from_ref(&image));
    // A second pull finds the layer in place.
    let again = store.pull("busybox", no_progress).await.unwrap();
    assert_eq!(again, image);
}

#[tokio::test]
async fn mirrors_are_tried_in_order_and_failures_name_every_endpoint() {
    registry().push_image("busybox", "latest", "library/busybox:latest");
    let dead = format!("http://{}", dead_endpoint());
    let mut config = StoreConfig::default();
    config
        .mirrors
        .insert("docker.io".into(), vec![dead.clone(), registry().url()]);
    let (_dir, store) = new_store(config);
    let image = store.pull("busybox", no_progress).await.unwrap();
    assert_eq!(image.reference, "docker.io/library/busybox:latest");

    // Nothing answers: the error names the mirror and the upstream.
    let upstream = dead_endpoint().to_string();
    let mut config = StoreConfig::default();
    config.mirrors.insert(upstream.clone(), vec![dead.clone()]);
    let (_dir, store) = new_store(config);
    match store
        .pull(&format!("{upstream}/nothing:1"), no_progress)
        .await
    {
        Err(ImageError::Unreachable { tried, .. }) => {
            assert_eq!(tried.len(), 2, "{tried:?}");
            assert!(
                tried[0].starts_with(&format!("{dead} (mirror)")),
                "{tried:?}"
            );
            assert!(
                tried[1].starts_with(&format!("http://{upstream}")),
                "{tried:?}"
            );
        }
        other => panic!("{other:?}"),
    }

    // The registry answers but has no such image.
    let (_dir, store) = new_store(StoreConfig::default());
    let missing = format!("{}/no/such-image:1", registry().host);
    match store.pull(&missing, no_progress).await {
        Err(err @ ImageError::UnknownImage { .. }) => {
            assert!(err.to_string().contains("no/such-image"), "{err}")
        }
        other => panic!("{other:?}"),
    }
    assert!(matches!(
        store.pull("Not A Name", no_progress).await,
        Err(ImageError::InvalidReference { .. })
    ));
    assert_eq!(names(&store.root().join("layers")), Vec::<String>::new());
}

#[tokio::test]
async fn whiteouts_and_opaque_dirs_work_under_overlayfs() {
    orchard_test_support::require_root!("overlayfs mounts");
    registry().push_image("whiteout", "latest", "whiteout:latest");
    let (_dir, store) = new_store(StoreConfig::default());
    let image = pull_from_registry(&store, "whiteout:latest").await.unwrap();
    assert_eq!(image.layers.len(), 2);
    let (lower, upper) = (&image.layers[0], &image.layers[1]);

    // Layer 1 keeps owners, modes, links.
    let keep = fs::metadata(lower.join("data/keep.txt")).unwrap();
    assert_eq!(
        fs::metadata(lower.join("data/hard.txt")).unwrap().ino(),
        keep.ino()
    );
    assert_eq!(
        fs::read_link(lower.join("owned/link")).unwrap(),
        Path::new("../data/keep.txt")
    );
    let private = fs::metadata(lower.join("owned/private.txt")).unwrap();
    assert_eq!(
        (private.uid(), private.gid(), private.mode() & 0o7777),
        (1000, 1000, 0o640)
    );
    assert_eq!(
        fs::metadata(lower.join("owned/setuid")).unwrap().mode() & 0o7777,
        0o4755
    );
    assert_eq!(keep.mtime(), 1_704_067_200); // --mtime=2024-01-01T00:00:00Z in build.sh

    // Layer 2 holds an overlay whiteout and an opaque directory.
    let gone = fs::symlink_metadata(upper.join("data/gone.txt")).unwrap();
    assert!(gone.file_type().is_char_device());
    assert_eq!(gone.rdev(), 0);
    assert!(!upper.join("data/.wh.gone.txt").exists());
    assert_eq!(
        get_xattr(&upper.join("opaque"), OPAQUE_XATTR).unwrap(),
        Some(b"y".to_vec())
    );
    assert!(!upper.join("opaque/.wh..wh..opq").exists());

    // And overlayfs reads them as intended.
    let overlay = Overlay::mount(&image);
    let root = overlay.path();
    assert_eq!(names(&root.join("data")), ["hard.txt", "keep.txt"]);
    assert_eq!(names(&root.join("opaque")), ["new.txt"]);
    assert_eq!(
        fs::read_to_string(root.join("opaque/new.txt")).unwrap(),
        "new\n"
    );
    assert_eq!(
        fs::read_to_string(root.join("data/keep.txt")).unwrap(),
        "keep\n"
    );

    assert_eq!(image.config.working_dir.as_deref(), Some("/data"));
    assert_eq!(image.config.user.as_deref(), Some("1000:1000"));
    assert_eq!(image.config.entrypoint, ["/bin/true"]);
}

#[tokio::test]
async fn an_index_resolves_to_linux_amd64() {
    let mut layout = Layout::new();
    let run = json!({"Cmd": ["x"]});
    let arm = layout.image(
        &[(
            layer_tar(&[("arch", b"arm64 index test")]),
            Compression::Gzip,
        )],
        run.clone(),
        "arm64",
    );
    let amd = layout.image(
        &[(
            layer_tar(&[("arch", b"amd64 index test")]),
            Compression::Gzip,
        )],
        run,
        "amd64",
    );
    let index = layout.index(&[(&arm, "arm64"), (&amd, "amd64")]);
    layout.tag("multi", &index);
    let arm_only = layout.index(&[(&arm, "arm64")]);
    layout.tag("arm-only", &arm_only);
    registry().push(layout.path(), "multi", "index-test:multi", PushFormat::All);
    registry().push(
        layout.path(),
        "arm-only",
        "index-test:arm-only",
        PushFormat::All,
    );

    let (_dir, store) = new_store(StoreConfig::default());
    let image = pull_from_registry(&store, "index-test:multi")
        .await
        .unwrap();
    assert_eq!(image.digest, amd.digest);
    assert_eq!(
        fs::read(image.layers[0].join("arch")).unwrap(),
        b"amd64 index test"
    );
    // The index itself is kept (gc must keep it) next to the chosen manifest.
    assert!(store
        .root()
        .join("blobs/sha256")
        .join(&index.digest[7..])
        .is_file());

    match pull_from_registry(&store, "index-test:arm-only").await {
        Err(ImageError::NoMatchingPlatform { available, .. }) => {
            assert_eq!(available, "linux/arm64")
        }
        other => panic!("{other:?}"),
    }

    // Pinned by digest: the index digest selects the same manifest.
    let pinned = store
        .pull(
            &format!("{}/index-test@{}", registry().host, index.digest),
            no_progress,
        )
        .await
        .unwrap();
    assert_eq!(pinned.digest, amd.digest);
}

#[tokio::test]
async fn docker_schema2_zstd_and_uncompressed_layers_pull() {
    // Docker v2 schema 2 (skopeo converts the OCI busybox layout).
    registry().push(
        &image_layout("busybox"),
        "latest",
        "docker-format/busybox:v2s2",
        PushFormat::Docker,
    );
    let (_dir, store) = new_store(StoreConfig::default());
    let image = pull_from_registry(&store, "docker-format/busybox:v2s2")
        .await
        .unwrap();
    assert!(image.layers[0].join("bin/busybox").is_file());
    assert_eq!(image.config.cmd, ["sh"]);

    let mut layout = Layout::new();
    let written = layout.image(
        &[
            (
                layer_tar(&[("zstd.txt", b"from a zstd layer")]),
                Compression::Zstd,
            ),
            (
                layer_tar(&[("plain.txt", b"from a plain tar layer")]),
                Compression::None,
            ),
        ],
        json!({"Env": ["A=1"]}),
        "amd64",
    );
    layout.tag("mixed", &written);
    registry().push(
        layout.path(),
        "mixed",
        "compression-test:mixed",
        PushFormat::Oci,
    );
    let image = pull_from_registry(&store, "compression-test:mixed")
        .await
        .unwrap();
    assert_eq!(
        fs::read(image.layers[0].join("zstd.txt")).unwrap(),
        b"from a zstd layer"
    );
    assert_eq!(
        fs::read(image.layers[1].join("plain.txt")).unwrap(),
        b"from a plain tar layer"
    );
    assert_eq!(image.config.env, ["A=1"]);
}

#[tokio::test]
async fn a_corrupted_blob_fails_with_a_digest_mismatch_and_leaves_no_layer() {
    let mut layout = Layout::new();
    // Content of its own, so no other test shares the blob being damaged.
    let data: Vec<u8> = (0..200_000u32)
        .map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8)
        .collect();
    let written = layout.image(
        &[(layer_tar(&[("corrupt-test.bin", &data)]), Compression::Gzip)],
        json!({}),
        "amd64",
    );
    layout.tag("v1", &written);
    registry().push(layout.path(), "v1", "corrupt-test:v1", PushFormat::Oci);
    let manifest = layout.json(&written);
    let layer_digest = manifest["layers"][0]["digest"]
        .as_str()
        .unwrap()
        .to_string();
    let file = registry().blob_file(&layer_digest);
    let mut bytes = fs::read(&file).unwrap();
    let middle = bytes.len() / 2;
    for byte in &mut bytes[middle..middle + 64] {
        *byte ^= 0x5a;
    }
    fs::write(&file, &bytes).unwrap();

    let (_dir, store) = new_store(StoreConfig::default());
    match pull_from_registry(&store, "corrupt-test:v1").await {
        Err(err @ ImageError::DigestMismatch { .. }) => {
            let text = err.to_string();
            assert!(text.contains(&layer_digest), "{text}");
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(names(&store.root().join("layers")), Vec::<String>::new());
    assert_eq!(names(&store.root().join("tmp")), Vec::<String>::new());
    assert_eq!(names(&store.root().join("images")), Vec::<String>::new());
}

/// The blobs of the OCI layout `images/out/<name>`: (manifest, config bytes, layer blobs).
fn read_layout(path: &Path) -> (Value, Vec<u8>, Vec<Vec<u8>>) {
    let blob = |digest: &str| fs::read(path.join("blobs/sha256").join(&digest[7..])).unwrap();
    let index: Value = serde_json::from_slice(&fs::read(path.join("index.json")).unwrap()).unwrap();
    let manifest: Value =
        serde_json::from_slice(&blob(index["manifests"][0]["digest"].as_str().unwrap())).unwrap();
    let config = blob(manifest["config"]["digest"].as_str().unwrap());
    let layers = manifest["layers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|l| blob(l["digest"].as_str().unwrap()))
        .collect();
    (manifest, config, layers)
}

/// A `docker save` archive of an OCI layout, as Docker before 25 wrote it: config as
/// `<hex>.json`, each layer uncompressed as `<id>/layer.tar`, `manifest.json`.
fn docker_save(layout: &Path, repo_tags: &[&str], out: &Path) {
    let (_, config, layers) = read_layout(layout);
    let mut builder = tar::Builder::new(fs::File::create(out).unwrap());
    let mut add = |name: &str, bytes: &[u8]| {
        let mut header = tar::Header::new_gnu();
        header.set_size(bytes.len() as u64);
        header.set_mode(0o644);
        header.set_entry_type(tar::EntryType::Regular);
        builder.append_data(&mut header, name, bytes).unwrap();
    };
    let config_name = format!("{}.json", &sha256(&config)[7..]);
    add(&config_name, &config);
    let mut layer_names = Vec::new();
    for (i, layer) in layers.iter().enumerate() {
        let mut tar = Vec::new();
        std::io::copy(&mut flate2::read::GzDecoder::new(&layer[..]), &mut tar).unwrap();
        let name = format!("{:064x}/layer.tar", i + 1);
        add(&name, &tar);
        layer_names.push(name);
    }
    let manifest = json!([{"Config": config_name, "RepoTags": repo_tags, "Layers": layer_names}]);
    add("manifest.json", &serde_json::to_vec(&manifest).unwrap());
    builder.into_inner().unwrap();
}

#[test]
fn import_a_docker_save_archive() {
    let (dir, store) = new_store(StoreConfig::default());
    let archive = dir.path().join("busybox.tar");
    docker_save(
        &image_layout("busybox"),
        &["busybox-saved:1", "example.com/team/busybox:2"],
        &archive,
    );

    let images = store.import(&archive, None).unwrap();
    let references: Vec<&str> = images.iter().map(|i| i.reference.as_str()).collect();
    assert_eq!(
        references,
        [
            "docker.io/library/busybox-saved:1",
            "example.com/team/busybox:2"
        ]
    );
    let image = &images[0];
    assert_eq!(images[1].layers, image.layers);
    assert!(image.layers[0].join("bin/busybox").is_file());
    assert_eq!(image.config.cmd, ["sh"]);
    assert_eq!(store.get("busybox-saved:1").unwrap().as_ref(), Some(image));

    // Named explicitly, and gzip-compressed as people often ship them.
    let gzipped = dir.path().join("busybox.tar.gz");
    let mut encoder = flate2::write::GzEncoder::new(
        fs::File::create(&gzipped).unwrap(),
        flate2::Compression::fast(),
    );
    std::io::copy(&mut fs::File::open(&archive).unwrap(), &mut encoder).unwrap();
    encoder.finish().unwrap();
    let renamed = store.import(&gzipped, Some("renamed:3")).unwrap();
    assert_eq!(renamed.len(), 1);
    assert_eq!(renamed[0].reference, "docker.io/library/renamed:3");
    assert_eq!(renamed[0].digest, image.digest);
    assert_eq!(renamed[0].layers, image.layers);
    assert_eq!(names(&store.root().join("tmp")), Vec::<String>::new());

    // Not an image archive.
    let junk = dir.path().join("junk.tar");
    tar::Builder::new(fs::File::create(&junk).unwrap())
        .into_inner()
        .unwrap();
    assert!(matches!(
        store.import(&junk, None),
        Err(ImageError::Invalid { .. })
    ));
}

#[test]
fn import_an_oci_layout_directory_and_tar() {
    let (dir, store) = new_store(StoreConfig::default());
    let layout = image_layout("whiteout");
    // The layout names its image only by tag: the store wants a name.
    match store.import(&layout, None) {
        Err(ImageError::Invalid { reason, .. }) => {
            assert!(reason.contains("give a name"), "{reason}")
        }
        other => panic!("{other:?}"),
    }
    let from_dir = store.import(&layout, Some("whiteout:imported")).unwrap();
    assert_eq!(from_dir.len(), 1);
    let image = &from_dir[0];
    assert_eq!(image.reference, "docker.io/library/whiteout:imported");
    assert_eq!(image.layers.len(), 2);
    assert!(fs::symlink_metadata(image.layers[1].join("data/gone.txt"))
        .unwrap()
        .file_type()
        .is_char_device());

    let archive = dir.path().join("whiteout-oci.tar");
    let mut builder = tar::Builder::new(fs::File::create(&archive).unwrap());
    builder.append_dir_all(".", &layout).unwrap();
    builder.into_inner().unwrap();
    let from_tar = store
        .import(&archive, Some("localhost:5000/whiteout:tar"))
        .unwrap();
    assert_eq!(from_tar[0].digest, image.digest);
    assert_eq!(from_tar[0].layers, image.layers);

    // A layout with a damaged layer blob is refused and leaves nothing.
    let (_dir2, other) = new_store(StoreConfig::default());
    let mut layout2 = Layout::new();
    let written = layout2.image(
        &[(layer_tar(&[("f", b"import corrupt")]), Compression::Gzip)],
        json!({}),
        "amd64",
    );
    layout2.tag("latest", &written);
    let (manifest, _, _) = read_layout(layout2.path());
    let layer = manifest["layers"][0]["digest"].as_str().unwrap();
    let blob = layout2.path().join("blobs/sha256").join(&layer[7..]);
    let mut bytes = fs::read(&blob).unwrap();
    let last = bytes.len() - 1;
    bytes[last] ^= 1;
    fs::write(&blob, bytes).unwrap();
    assert!(matches!(
        other.import(layout2.path(), Some("broken:1")),
        Err(ImageError::DigestMismatch { .. })
    ));
    assert_eq!(names(&other.root().join("layers")), Vec::<String>::new());
    assert_eq!(other.list().unwrap(), []);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_pulls_download_each_blob_once() {
    let mut layout = Layout::new();
    let layers: Vec<(Vec<u8>, Compression)> = (0..3u32)
        .map(|n| {
            let data: Vec<u8> = (0..1_000_000u32)
                .map(|i| (i.wrapping_mul(n + 7) >> 3) as u8)
                .collect();
            (
                layer_tar(&[(&format!("concurrent-{n}.bin"), &data)]),
                Compression::Gzip,
            )
        })
        .collect();
    let written = layout.image(&layers, json!({"Cmd": ["c"]}), "amd64");
    layout.tag("a", &written);
    layout.tag("b", &written);
    registry().push(layout.path(), "a", "concurrent:a", PushFormat::Oci);
    registry().push(layout.path(), "b", "concurrent:b", PushFormat::Oci);
    let manifest = layout.json(&written);
    let layer_digests: Vec<String> = manifest["layers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|l| l["digest"].as_str().unwrap().to_string())
        .collect();
    let config_digest = manifest["config"]["digest"].as_str().unwrap().to_string();

    let proxy = Proxy::start(&registry().host, ProxyAuth::None).await;
    let (_dir, store) = new_store(StoreConfig::default());
    let name = format!("{}/concurrent:a", proxy.host);
    // One pull on its own task (which also checks that a pull can be spawned: Send).
    let spawned = {
        let (store, name) = (store.clone(), name.clone());
        tokio::spawn(async move { store.pull(&name, no_progress).await })
    };
    let (first, second) = tokio::join!(spawned, store.pull(&name, no_progress));
    let (first, second) = (first.unwrap().unwrap(), second.unwrap());
    assert_eq!(first, second);
    for digest in layer_digests.iter().chain([&config_digest]) {
        assert_eq!(
            proxy.blob_gets(digest),
            1,
            "blob {digest}: {:?}",
            proxy.seen()
        );
    }
    let manifest_gets = proxy
        .seen()
        .iter()
        .filter(|s| s.path.contains("/manifests/"))
        .count();
    assert_eq!(manifest_gets, 1, "{:?}", proxy.seen());

    // Two names with the same layers, pulled at once into a fresh store: each layer
    // is still fetched once.
    let proxy = Proxy::start(&registry().host, ProxyAuth::None).await;
    let (_dir, store) = new_store(StoreConfig::default());
    let (name_a, name_b) = (
        format!("{}/concurrent:a", proxy.host),
        format!("{}/concurrent:b", proxy.host),
    );
    let (a, b) = tokio::join!(
        store.pull(&name_a, no_progress),
        store.pull(&name_b, no_progress)
    );
    assert_eq!(a.unwrap().layers, b.unwrap().layers);
    for digest in &layer_digests {
        assert_eq!(
            proxy.blob_gets(digest),
            1,
            "blob {digest}: {:?}",
            proxy.seen()
        );
    }
}

#[tokio::test]
async fn gc_removes_unused_layers_and_keeps_used_ones() {
    registry().push_image("busybox", "latest", "library/busybox:latest");
    registry().push_image("whiteout", "latest", "whiteout:latest");
    let (_dir, store) = new_store(hub_mirror());
    let busybox = store.pull("busybox", no_progress).await.unwrap();
    let whiteout = pull_from_registry(&store, "whiteout:latest").await.unwrap();
    assert_eq!(store.gc().unwrap(), Default::default());

    store.remove(&whiteout.reference).unwrap();
    assert!(matches!(
        store.remove(&whiteout.reference),
        Err(ImageError::UnknownImage { .. })
    ));
    assert_eq!(store.get(&whiteout.reference).unwrap(), None);
    // A sandbox still running on the removed image keeps its layers through gc_keeping.
    let kept = store.gc_keeping(&whiteout.layers).unwrap();
    assert_eq!((kept.layers_removed, kept.blobs_removed), (0, 2));
    let report = store.gc().unwrap();
    assert_eq!(report.layers_removed, 2);
    assert!(report.bytes_freed > 0);
    assert!(whiteout.layers.iter().all(|layer| !layer.exists()));
    assert!(busybox.layers[0].join("bin/busybox").is_file());
    assert_eq!(store.get("busybox").unwrap(), Some(busybox.clone()));
    assert_eq!(store.gc().unwrap(), Default::default());
    assert_eq!(names(&store.root().join("tmp")), Vec::<String>::new());
    assert_eq!(names(&store.root().join("blobs/sha256")).len(), 2); // busybox manifest + config
}

#[tokio::test]
async fn python_3_11_slim_pulls_and_runs() {
    orchard_test_support::require_root!("chroot into the unpacked image");
    registry().push_image("python", "3.11-slim", "library/python:3.11-slim");
    let (_dir, store) = new_store(hub_mirror());
    let image = store.pull("python:3.11-slim", no_progress).await.unwrap();
    assert_eq!(image.reference, "docker.io/library/python:3.11-slim");
    assert_eq!(image.config.cmd, ["python3"]);
    let env = &image.config.env;
    assert!(
        env.iter()
            .any(|e| e.starts_with("PATH=/usr/local/sbin:/usr/local/bin:")),
        "{env:?}"
    );
    assert!(env.contains(&"LANG=C.UTF-8".to_string()), "{env:?}");
    assert!(
        env.iter().any(|e| e.starts_with("PYTHON_VERSION=3.11.")),
        "{env:?}"
    );
    let root = &image.layers[0];
    for tool in [
        "usr/bin/python3",
        "usr/bin/python",
        "usr/bin/pip",
        "usr/bin/git",
    ] {
        assert!(root.join(tool).exists(), "{tool} missing");
    }
    // The unpacked tree is a working root file system.
    let run = |args: &[&str]| {
        let output = Command::new("chroot")
            .arg(root)
            .args(args)
            .output()
            .unwrap();
        assert!(
            output.status.success(),
            "{args:?}: {}",
            String::from_utf8_lossy(&output.stderr)
        );
        String::from_utf8_lossy(&output.stdout).to_string()
    };
    assert!(run(&["python", "-c", "import sys; print(sys.version)"]).starts_with("3.11."));
    assert!(run(&["git", "--version"]).starts_with("git version"));
    assert!(run(&["pip", "--version"]).starts_with("pip "));
}

/// Pulls through an authenticating proxy with the given credentials.
async fn pull_through(
    proxy: &Proxy,
    credentials: Option<(&str, &str)>,
) -> Result<Image, ImageError> {
    let mut config = StoreConfig::default();
    if let Some((username, password)) = credentials {
        config
            .credentials
            .insert(proxy.host.clone(), Credentials::basic(username, password));
    }
    let (_dir, store) = new_store(config);
    store
        .pull(&format!("{}/whiteout:latest", proxy.host), no_progress)
        .await
}

#[tokio::test]
async fn bearer_token_challenge_flow() {
    registry().push_image("whiteout", "latest", "whiteout:latest");
    let proxy = Proxy::start(
        &registry().host,
        ProxyAuth::Bearer("alice".into(), "s3cret".into()),
    )
    .await;
    let image = pull_through(&proxy, Some(("alice", "s3cret")))
        .await
        .unwrap();
    assert_eq!(image.layers.len(), 2);
    let seen = proxy.seen();
    // One challenge, one token, then every registry request carried the token.
    assert_eq!(
        seen.iter().filter(|s| s.path.starts_with("/token")).count(),
        1,
        "{seen:?}"
    );
    assert_eq!(
        seen.iter().filter(|s| s.status == 401).count(),
        1,
        "{seen:?}"
    );
    let token_request = seen.iter().find(|s| s.path.starts_with("/token")).unwrap();
    assert!(
        token_request.path.contains("service=orchard-test"),
        "{token_request:?}"
    );
    assert!(
        token_request
            .path
            .contains("scope=repository%3Awhiteout%3Apull"),
        "{token_request:?}"
    );
    assert!(seen
        .iter()
        .filter(|s| s.path.starts_with("/v2/") && s.status == 200)
        .all(|s| s.authorization.as_deref() == Some("Bearer orchard-test-token")));

    for credentials in [Some(("alice", "wrong")), None] {
        match pull_through(&proxy, credentials).await {
            Err(err @ ImageError::AuthFailed { .. }) => {
                assert!(err.to_string().contains("token server"), "{err}")
            }
            other => panic!("{credentials:?}: {other:?}"),
        }
    }
}

#[tokio::test]
async fn basic_auth() {
    registry().push_image("whiteout", "latest", "whiteout:latest");
    let proxy = Proxy::start(
        &registry().host,
        ProxyAuth::Basic("bob".into(), "pw".into()),
    )
    .await;
    assert_eq!(
        pull_through(&proxy, Some(("bob", "pw")))
            .await
            .unwrap()
            .layers
            .len(),
        2
    );
    for credentials in [Some(("bob", "nope")), None] {
        assert!(
            matches!(
                pull_through(&proxy, credentials).await,
                Err(ImageError::AuthFailed { .. })
            ),
            "{credentials:?}"
        );
    }
}

#[test]
fn every_test_image_layout_exists() {
    for name in ["busybox", "empty", "whiteout", "python"] {
        image_layout(name);
    }
    // The empty image: one layer with no files.
    let (_dir, store) = new_store(StoreConfig::default());
    let images = store
        .import(&image_layout("empty"), Some("empty:latest"))
        .unwrap();
    assert_eq!(images[0].layers.len(), 1);
    assert_eq!(names(&images[0].layers[0]), Vec::<String>::new());
}

#[tokio::test]
async fn a_cancelled_pull_hands_over_and_leaves_no_work_behind() {
    registry().push_image("busybox", "latest", "library/busybox:latest");
    let dir = tempfile::tempdir().unwrap();
    // What a crashed process left: removed when a store opens.
    let stale = dir.path().join("store/tmp/999999999.0.layer");
    fs::create_dir_all(stale.join("half/done")).unwrap();
    let store = ImageStore::open(dir.path().join("store"), hub_mirror()).unwrap();
    assert!(!stale.exists());

    let cancelled = tokio::time::timeout(
        std::time::Duration::from_millis(2),
        store.pull("busybox", no_progress),
    );
    let (first, second) = tokio::join!(cancelled, store.pull("busybox", no_progress));
    let image = second.unwrap();
    if let Ok(result) = first {
        assert_eq!(result.unwrap(), image);
    }
    assert!(image.layers[0].join("bin/busybox").is_file());
    // The cancelled side's unpacking thread finishes on its own and cleans up.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while !names(&store.root().join("tmp")).is_empty() {
        assert!(
            std::time::Instant::now() < deadline,
            "{:?}",
            names(&store.root().join("tmp"))
        );
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
}

#[tokio::test]
async fn errors_read_well() {
    let (_dir, store) = new_store(StoreConfig::default());
    let dead = dead_endpoint();
    let messages = [
        store.pull(&format!("{dead}/x:1"), no_progress).await,
        pull_from_registry(&store, "missing:1").await,
        store.pull("UPPER", no_progress).await,
    ];
    for message in messages {
        let text = message.unwrap_err().to_string();
        eprintln!("{text}");
        assert!(!text.is_empty());
    }
}
