//! The vault on disk: reading a note as it is, and putting a new one in
//! its place atomically and durably.
//!
//! A note is written to a hidden temporary file beside it (its name starts
//! with `.`, so Obsidian, Syncthing's ignore patterns and the vault reader
//! pass it by), flushed to disk, renamed over the note, and the folder is
//! flushed so the rename itself survives a power cut. `rename(2)` replaces
//! the name in one step, so a reader opens either the old note or the new
//! one, whole, never a mix or a prefix. Folders made on the way are
//! flushed into their parents too, or a crash could lose the folder and
//! the note with it.
//!
//! Everything here blocks (fsync); the writer calls it through
//! `spawn_blocking`.

use std::fs::{self, File, OpenOptions};
use std::io::{self, Write as _};
use std::path::Path;

/// What is at a note's path now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Found {
    /// Nothing: the note does not exist yet.
    Absent,
    /// A note, with its bytes.
    Note(Vec<u8>),
    /// Something that is not a file (a folder): no write may replace it.
    NotAFile,
}

/// Reads what is at `vault/rel` now.
pub(crate) fn read(vault: &Path, rel: &str) -> io::Result<Found> {
    let target = vault.join(rel);
    match fs::symlink_metadata(&target) {
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Found::Absent),
        Err(e) => return Err(e),
        Ok(meta) if meta.is_dir() => return Ok(Found::NotAFile),
        Ok(_) => {}
    }
    match fs::read(&target) {
        Ok(bytes) => Ok(Found::Note(bytes)),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(Found::Absent),
        Err(e) => Err(e),
    }
}

/// Puts `bytes` at `vault/rel` atomically and durably (see the module
/// doc). `tag` makes the temporary file's name: one per write, so two
/// writers of one file never share a temporary, and a write tried again
/// after a crash reuses (truncates) the one it left behind.
pub(crate) fn put(vault: &Path, rel: &str, bytes: &[u8], tag: &str) -> io::Result<()> {
    let target = vault.join(rel);
    let (Some(folder), Some(name)) = (target.parent(), target.file_name()) else {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("{} names no file in a folder", target.display()),
        ));
    };
    make_folders(vault, folder)?;
    let temp = folder.join(format!(".{}.{tag}.tmp", name.to_string_lossy()));
    let written = write_synced(&temp, bytes, &target).and_then(|()| fs::rename(&temp, &target));
    if let Err(e) = written {
        // Nothing replaced the note; the temporary is only litter now.
        let _ = fs::remove_file(&temp);
        return Err(e);
    }
    sync_folder(folder)
}

/// Writes `bytes` to a new `temp`, with the permissions of the note it
/// will replace (if any), and flushes it to disk.
fn write_synced(temp: &Path, bytes: &[u8], replaces: &Path) -> io::Result<()> {
    let mut file = OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .open(temp)?;
    file.write_all(bytes)?;
    if let Ok(meta) = fs::metadata(replaces) {
        file.set_permissions(meta.permissions())?;
    }
    file.sync_all()
}

/// Makes the folders from `vault` down to `folder` that are missing.
fn make_folders(vault: &Path, folder: &Path) -> io::Result<()> {
    if !folder.starts_with(vault) {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!(
                "{} is not inside the vault {}",
                folder.display(),
                vault.display()
            ),
        ));
    }
    make_missing(folder)
}

/// Makes the vault's own folder (and its parents) when missing, flushed
/// like any folder the writer makes.
pub(crate) fn make_root(vault: &Path) -> io::Result<()> {
    make_missing(vault)
}

/// Makes `dir` and whichever of its parents are missing, and flushes each
/// new one's entry into its parent.
fn make_missing(dir: &Path) -> io::Result<()> {
    let mut missing: Vec<&Path> = Vec::new();
    let mut at = Some(dir);
    while let Some(d) = at.filter(|d| !d.as_os_str().is_empty() && !d.exists()) {
        missing.push(d);
        at = d.parent();
    }
    for d in missing.iter().rev() {
        match fs::create_dir(d) {
            Ok(()) => {}
            // Another writer made it meanwhile: as good.
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
            Err(e) => return Err(e),
        }
    }
    for d in missing.iter().rev() {
        match d.parent() {
            Some(parent) if !parent.as_os_str().is_empty() => sync_folder(parent)?,
            _ => sync_folder(Path::new("."))?,
        }
    }
    Ok(())
}

/// Flushes a folder's entries (a rename or a new entry in it) to disk.
fn sync_folder(folder: &Path) -> io::Result<()> {
    File::open(folder)?.sync_all()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_note_is_put_in_new_folders_and_replaced_leaving_no_temporary() {
        let vault = tempfile::tempdir().unwrap();
        put(vault.path(), "memory/ops/a/b.md", b"one", "t1").unwrap();
        assert_eq!(
            read(vault.path(), "memory/ops/a/b.md").unwrap(),
            Found::Note(b"one".to_vec())
        );
        put(vault.path(), "memory/ops/a/b.md", b"two", "t2").unwrap();
        assert_eq!(
            read(vault.path(), "memory/ops/a/b.md").unwrap(),
            Found::Note(b"two".to_vec())
        );
        let left: Vec<_> = fs::read_dir(vault.path().join("memory/ops/a"))
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(left, vec![std::ffi::OsString::from("b.md")]);
    }

    #[test]
    fn a_folder_is_not_a_note_and_a_missing_note_is_absent() {
        let vault = tempfile::tempdir().unwrap();
        fs::create_dir_all(vault.path().join("memory/ops/x.md")).unwrap();
        assert_eq!(
            read(vault.path(), "memory/ops/x.md").unwrap(),
            Found::NotAFile
        );
        assert_eq!(
            read(vault.path(), "memory/ops/y.md").unwrap(),
            Found::Absent
        );
    }

    #[test]
    fn the_root_is_made_with_its_parents() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("data/vault");
        make_root(&root).unwrap();
        assert!(root.is_dir());
        make_root(&root).unwrap();
    }
}
