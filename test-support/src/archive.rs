//! Archives the upload tests send.

/// A tar.gz of regular files, each `(path, contents)` with mode 0644.
pub fn tar_gz(files: &[(&str, &[u8])]) -> Vec<u8> {
    let gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    let mut builder = tar::Builder::new(gz);
    for (path, data) in files {
        let mut header = tar::Header::new_gnu();
        header.set_size(data.len() as u64);
        header.set_mode(0o644);
        header.set_entry_type(tar::EntryType::Regular);
        builder
            .append_data(&mut header, path, *data)
            .expect("appending to an in-memory tar");
    }
    builder
        .into_inner()
        .and_then(|gz| gz.finish())
        .expect("finishing an in-memory tar.gz")
}
