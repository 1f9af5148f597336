//! Policy files run inside the gateway, so a file that another user could have written is
//! refused: every component read from disk (startup, the directory watcher, the admin API) goes
//! through [`read_trusted`].
//!
//! A file, and the directory it lives in, must be owned by the gateway's effective user or by
//! root, and writable by neither group nor others. Root may write anything anyway, so trusting
//! root-owned files (a package or a read-only volume) adds nobody. The file's mode and owner are
//! read from the open handle, so the bytes checked are the bytes read.

use crate::error::PolicyError;
use std::io::Read;
use std::path::Path;

/// Read the component at `path` after checking its owner and mode and its directory's.
pub(crate) fn read_trusted(path: &Path) -> Result<Vec<u8>, PolicyError> {
    let io = |e: std::io::Error| PolicyError::Io(format!("{}: {e}", path.display()));
    let mut file = std::fs::File::open(path).map_err(io)?;
    check(path, &file.metadata().map_err(io)?, "file")?;
    for dir in directories(path) {
        let metadata = std::fs::metadata(&dir)
            .map_err(|e| PolicyError::Io(format!("{}: {e}", dir.display())))?;
        check(&dir, &metadata, "directory")?;
    }
    let mut bytes = Vec::new();
    file.read_to_end(&mut bytes).map_err(io)?;
    Ok(bytes)
}

/// The directory `path` is named in and, when `path` is a link (a Kubernetes volume's
/// `..data/`), the one its target really lives in.
fn directories(path: &Path) -> Vec<std::path::PathBuf> {
    let parent = |p: &Path| match p.parent() {
        Some(dir) if !dir.as_os_str().is_empty() => dir.to_path_buf(),
        _ => Path::new(".").to_path_buf(),
    };
    let mut dirs = vec![parent(path)];
    if let Ok(real) = std::fs::canonicalize(path) {
        let real = parent(&real);
        if !dirs
            .iter()
            .any(|d| std::fs::canonicalize(d).is_ok_and(|d| d == real))
        {
            dirs.push(real);
        }
    }
    dirs
}

#[cfg(unix)]
fn check(path: &Path, metadata: &std::fs::Metadata, what: &str) -> Result<(), PolicyError> {
    use std::os::unix::fs::MetadataExt;
    check_mode(path, metadata.mode(), metadata.uid(), effective_uid(), what)
}

#[cfg(not(unix))]
fn check(_path: &Path, _metadata: &std::fs::Metadata, _what: &str) -> Result<(), PolicyError> {
    Ok(())
}

/// The rule itself: `mode` and `owner` of `path` (a policy `what`) for a gateway running as
/// `euid`.
fn check_mode(
    path: &Path,
    mode: u32,
    owner: u32,
    euid: u32,
    what: &str,
) -> Result<(), PolicyError> {
    if owner != euid && owner != 0 {
        return Err(PolicyError::Untrusted(format!(
            "policy {what} {} is owned by uid {owner}, not by the gateway's user (uid {euid}) \
             or root: run `chown {euid} {}`",
            path.display(),
            path.display()
        )));
    }
    if mode & 0o022 != 0 {
        return Err(PolicyError::Untrusted(format!(
            "policy {what} {} is writable by group or others (mode {:04o}): run `chmod go-w {}`",
            path.display(),
            mode & 0o7777,
            path.display()
        )));
    }
    Ok(())
}

/// The gateway's effective user id, found without `unsafe` (the workspace denies it, and
/// `rustix` has `geteuid` only behind its `process` feature, which would rebuild wasmtime): on
/// Linux `/proc/self` is owned by the process's effective uid; elsewhere (or without `/proc`) a
/// file the process creates is owned by it. Looked up once. If neither works the gateway trusts
/// only root's files: a failure refuses, never admits.
#[cfg(unix)]
fn effective_uid() -> u32 {
    static EUID: std::sync::OnceLock<u32> = std::sync::OnceLock::new();
    *EUID.get_or_init(|| {
        use std::os::unix::fs::MetadataExt;
        if let Ok(proc_self) = std::fs::metadata("/proc/self") {
            return proc_self.uid();
        }
        let probe = std::env::temp_dir().join(format!(
            ".switchyard-euid-{}-{:?}",
            std::process::id(),
            std::thread::current().id()
        ));
        let uid = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(&probe)
            .and_then(|file| file.metadata())
            .map(|metadata| metadata.uid());
        let _ = std::fs::remove_file(&probe);
        uid.unwrap_or_else(|error| {
            tracing::warn!(%error, "cannot tell the gateway's user: only root's policy files are trusted");
            0
        })
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn group_or_other_write_and_foreign_owners_are_refused() {
        let path = Path::new("/p/x.wasm");
        assert!(check_mode(path, 0o100644, 1000, 1000, "file").is_ok());
        assert!(check_mode(path, 0o100600, 0, 1000, "file").is_ok());
        assert!(check_mode(path, 0o040755, 1000, 1000, "directory").is_ok());
        let err = check_mode(path, 0o100664, 1000, 1000, "file")
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("/p/x.wasm") && err.contains("chmod go-w"),
            "{err}"
        );
        assert!(err.contains("mode 0664"), "{err}");
        let err = check_mode(Path::new("/p"), 0o041777, 0, 1000, "directory")
            .unwrap_err()
            .to_string();
        assert!(err.contains("policy directory /p"), "{err}");
        let err = check_mode(path, 0o100644, 2000, 1000, "file")
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("uid 2000") && err.contains("chown 1000"),
            "{err}"
        );
    }

    #[cfg(unix)]
    #[test]
    fn a_group_writable_file_or_directory_is_not_read() {
        use std::os::unix::fs::PermissionsExt;
        let set = |p: &Path, mode: u32| {
            std::fs::set_permissions(p, std::fs::Permissions::from_mode(mode)).unwrap();
        };
        let dir = tempfile::tempdir().unwrap();
        set(dir.path(), 0o755);
        let file = dir.path().join("p.wasm");
        std::fs::write(&file, b"bytes").unwrap();
        set(&file, 0o644);
        assert_eq!(read_trusted(&file).unwrap(), b"bytes");
        for mode in [0o664, 0o666] {
            set(&file, mode);
            let err = read_trusted(&file).unwrap_err();
            assert!(matches!(err, PolicyError::Untrusted(_)), "{err}");
            let err = err.to_string();
            assert!(err.contains(&format!("(mode {mode:04o})")), "{err}");
            assert!(err.contains("chmod go-w"), "{err}");
        }
        set(&file, 0o644);
        set(dir.path(), 0o777);
        let err = read_trusted(&file).unwrap_err();
        assert!(matches!(err, PolicyError::Untrusted(_)), "{err}");
        let err = err.to_string();
        assert!(
            err.contains("policy directory") && err.contains("mode 0777"),
            "{err}"
        );
        // Through a link, the directory the target lives in counts too.
        let linked = tempfile::tempdir().unwrap();
        set(linked.path(), 0o755);
        let link = linked.path().join("l.wasm");
        std::os::unix::fs::symlink(&file, &link).unwrap();
        let err = read_trusted(&link).unwrap_err().to_string();
        assert!(err.contains("policy directory"), "{err}");
        set(dir.path(), 0o755);
        assert_eq!(read_trusted(&link).unwrap(), b"bytes");
    }

    #[cfg(unix)]
    #[test]
    fn the_effective_uid_owns_what_the_process_creates() {
        use std::os::unix::fs::MetadataExt;
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("mine");
        std::fs::write(&file, b"").unwrap();
        assert_eq!(effective_uid(), std::fs::metadata(&file).unwrap().uid());
    }
}
