//! What the image store reads from a registry or an imported archive before it fetches
//! anything: manifests and indexes (`parse_manifest` with an arbitrary `Content-Type`,
//! then `select_platform` and `check_manifest`), image configs (`ConfigFile::parse`),
//! image references (`Reference::parse`) and `WWW-Authenticate` challenges.
//!
//! Input: the first line is the `Content-Type` (empty: none), the rest the document.
//! Invariants: a parsed manifest or index survives serialize -> parse unchanged; a
//! checked manifest names only sha256 digests (they become file names); a platform
//! chosen from an index is linux/amd64; a parsed reference is normalised (parsing its
//! text again gives it back) and has no `.`/`..` path component.
#![no_main]

use libfuzzer_sys::fuzz_target;
use orchard::image::digest::hex_of;
use orchard::image::manifest::{parse_manifest, select_platform, ConfigFile, ManifestDoc};
use orchard::image::registry::parse_challenge;
use orchard::image::store::check_manifest;
use orchard::image::Reference;

fn manifest_doc(doc: &[u8], content_type: Option<&str>) {
    let Ok(parsed) = parse_manifest(doc, content_type, "fuzz") else {
        return;
    };
    match parsed {
        ManifestDoc::Manifest(manifest) => {
            assert_eq!(manifest.schema_version, 2);
            let text = serde_json::to_vec(&manifest).unwrap();
            let again = match parse_manifest(&text, content_type, "fuzz") {
                Ok(ManifestDoc::Manifest(m)) => m,
                other => panic!("manifest {manifest:?} parsed back as {other:?}"),
            };
            assert_eq!(
                serde_json::to_value(&again).unwrap(),
                serde_json::to_value(&manifest).unwrap()
            );
            if check_manifest(&manifest, "fuzz").is_ok() {
                hex_of(&manifest.config.digest).expect("checked config digest");
                for layer in &manifest.layers {
                    let hex = hex_of(&layer.digest).expect("checked layer digest");
                    assert!(hex.bytes().all(|b| b.is_ascii_hexdigit()));
                }
            }
        }
        ManifestDoc::Index(index) => {
            let text = serde_json::to_vec(&index).unwrap();
            let again = match parse_manifest(&text, content_type, "fuzz") {
                Ok(ManifestDoc::Index(i)) => i,
                other => panic!("index {index:?} parsed back as {other:?}"),
            };
            assert_eq!(
                serde_json::to_value(&again).unwrap(),
                serde_json::to_value(&index).unwrap()
            );
            if let Ok(chosen) = select_platform(&index, "fuzz") {
                let platform = chosen.platform.as_ref().expect("chosen has a platform");
                assert_eq!(
                    (platform.os.as_str(), platform.architecture.as_str()),
                    ("linux", "amd64")
                );
            }
        }
    }
}

fn reference(text: &str) {
    let Ok(parsed) = Reference::parse(text) else {
        return;
    };
    let shown = parsed.to_string();
    let again = Reference::parse(&shown)
        .unwrap_or_else(|e| panic!("{text:?} normalised to {shown:?}, which does not parse: {e}"));
    assert_eq!(again, parsed, "{text:?} -> {shown:?}");
    assert!(!parsed.registry.contains('/'));
    assert!(parsed
        .repository
        .split('/')
        .all(|c| !c.is_empty() && c != "." && c != ".."));
    if let Some(digest) = &parsed.digest {
        hex_of(digest).expect("a parsed reference's digest is valid");
    }
    assert!(parsed.tag.is_some() || parsed.digest.is_some());
}

fuzz_target!(|data: &[u8]| {
    let (head, doc) = match data.iter().position(|&b| b == b'\n') {
        Some(i) => (&data[..i], &data[i + 1..]),
        None => (&b""[..], data),
    };
    let content_type = std::str::from_utf8(head).ok().filter(|s| !s.is_empty());
    manifest_doc(doc, content_type);

    let layers = usize::from(data.first().copied().unwrap_or(0) % 4);
    if let Ok(config) = ConfigFile::parse(doc, "fuzz", layers) {
        assert_eq!(config.diff_ids().len(), layers);
        let _ = config.image_config();
    }

    if let Ok(text) = std::str::from_utf8(data) {
        reference(text);
        if let Some(line) = text.lines().next() {
            reference(line);
            let _ = parse_challenge(line);
        }
        let _ = parse_challenge(text);
    }
});
