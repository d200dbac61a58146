//! Image records: `ROOT/images/<name>.json`, one per image name, naming its manifest,
//! config and layers.

use std::fs;
use std::io;
use std::time::{SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};

use super::inner::Inner;
use super::sync::lock;
use crate::digest;
use crate::manifest::ConfigFile;
use crate::{Image, ImageConfig, ImageError};

/// What `ROOT/images/<name>.json` holds.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(super) struct Record {
    pub(super) reference: String,
    /// The platform manifest's digest.
    pub(super) digest: String,
    /// The index's digest, when the name pointed at one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(super) index_digest: Option<String>,
    pub(super) config_digest: String,
    pub(super) diff_ids: Vec<String>,
    config: ImageConfig,
    /// Unix seconds of the pull or import.
    pub(super) created: u64,
}

impl Record {
    /// The `layers/<hex>` and `blobs/<hex>` keys it names: what gc must keep for it.
    pub(super) fn keys(&self) -> Result<Vec<String>, ImageError> {
        let mut keys = Vec::new();
        for diff_id in &self.diff_ids {
            keys.push(format!("layers/{}", digest::hex_of(diff_id)?));
        }
        for blob in [
            Some(&self.digest),
            Some(&self.config_digest),
            self.index_digest.as_ref(),
        ]
        .into_iter()
        .flatten()
        {
            keys.push(format!("blobs/{}", digest::hex_of(blob)?));
        }
        Ok(keys)
    }
}

impl Inner {
    /// Records an image under its name and returns it.
    pub(super) fn record(
        &self,
        reference: &str,
        digest: &str,
        index_digest: Option<String>,
        config_digest: &str,
        config: &ConfigFile,
    ) -> Result<Image, ImageError> {
        let record = Record {
            reference: reference.to_string(),
            digest: digest.to_string(),
            index_digest,
            config_digest: config_digest.to_string(),
            diff_ids: config.diff_ids().to_vec(),
            config: config.image_config(),
            created: SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map_or(0, |d| d.as_secs()),
        };
        let json = serde_json::to_vec_pretty(&record)
            .map_err(|err| ImageError::invalid_by("image record", err.to_string(), err))?;
        let path = self.record_path(reference);
        {
            let _records = lock(&self.records);
            self.write_atomic(&path, &json)?;
        }
        self.gc_state.changed();
        self.image_of(&record)
    }

    pub(super) fn read_record(&self, reference: &str) -> Result<Option<Record>, ImageError> {
        let path = self.record_path(reference);
        let bytes = match fs::read(&path) {
            Ok(bytes) => bytes,
            Err(err) if err.kind() == io::ErrorKind::NotFound => return Ok(None),
            Err(err) => return Err(ImageError::io("cannot read", &path)(err)),
        };
        let record: Record = serde_json::from_slice(&bytes).map_err(|err| {
            ImageError::invalid_by(
                format!("image record {}", path.display()),
                err.to_string(),
                err,
            )
        })?;
        // A hashed file name could in theory collide: the record says whose it is.
        Ok((record.reference == reference).then_some(record))
    }

    /// All records. With `strict`, an unreadable record is an error (gc must not
    /// delete the layers of an image it could not read); without, it is skipped.
    pub(super) fn read_records(&self, strict: bool) -> Result<Vec<Record>, ImageError> {
        let dir = self.root.join("images");
        let mut records = Vec::new();
        for entry in fs::read_dir(&dir).map_err(ImageError::io("cannot list", &dir))? {
            let entry = entry.map_err(ImageError::io("cannot list", &dir))?;
            let path = entry.path();
            if path.extension().is_some_and(|ext| ext == "json") {
                let parsed = fs::read(&path)
                    .map_err(ImageError::io("cannot read", &path))
                    .and_then(|bytes| {
                        serde_json::from_slice::<Record>(&bytes).map_err(|err| {
                            ImageError::invalid_by(
                                format!("image record {}", path.display()),
                                err.to_string(),
                                err,
                            )
                        })
                    });
                match parsed {
                    Ok(record) => records.push(record),
                    Err(err) if strict => return Err(err),
                    Err(_) => {}
                }
            }
        }
        Ok(records)
    }

    pub(super) fn image_of(&self, record: &Record) -> Result<Image, ImageError> {
        Ok(Image {
            reference: record.reference.clone(),
            digest: record.digest.clone(),
            layers: record
                .diff_ids
                .iter()
                .map(|diff_id| self.layer_path(diff_id))
                .collect::<Result<_, _>>()?,
            config: record.config.clone(),
        })
    }
}
