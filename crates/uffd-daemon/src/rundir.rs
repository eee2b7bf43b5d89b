//! The daemon's run directory: `<base>/<pid>`, holding the agent library and the sockets.
//!
//! Layout and modes. Every process of the tree must reach the agent's socket and load the
//! agent library, including processes that dropped their privileges (a server's workers, `su`
//! and `runuser` inside the tree): so the base and the run directory are `0711` (searchable,
//! not listable, writable by the owner only), the library `0444` and the agent socket `0666`.
//! Who may talk to the daemon is decided by the peer's credentials at `accept` (a process of
//! the daemon's tree), not by the socket's mode. The control socket (counters) is `0600`.
//!
//! Nothing is followed or changed that the daemon did not create: the base must be a real
//! directory (not a symlink) owned by the daemon's user and writable by nobody else, or the
//! daemon stops with an error naming it. Its one change to an existing base is to make its own
//! `0700` base searchable (`0711`), the mode earlier versions created it with. Run directories
//! left by daemons that died (kill -9) are removed at the next start, with the named backing
//! file each noted there (a regular file of this user only).

use std::os::unix::fs::{DirBuilderExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

use anyhow::{bail, Context};

/// Mode of the base and the run directory.
const DIR_MODE: u32 = 0o711;

/// Where daemons put their run directories: `UFFD_DAEMON_RUN_DIR`, else a default per user.
pub fn base() -> PathBuf {
    std::env::var_os("UFFD_DAEMON_RUN_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(default_base)
}

/// The default base: `/run/uffd-daemon` for root, under `XDG_RUNTIME_DIR` or `/tmp` otherwise.
pub fn default_base() -> PathBuf {
    // SAFETY: getuid cannot fail.
    let uid = unsafe { libc::getuid() };
    if uid == 0 {
        PathBuf::from("/run/uffd-daemon")
    } else if let Some(x) = std::env::var_os("XDG_RUNTIME_DIR") {
        PathBuf::from(x).join("uffd-daemon")
    } else {
        PathBuf::from(format!("/tmp/uffd-daemon-{uid}"))
    }
}

/// Creates this daemon's run directory under [`base`], after removing those of dead daemons.
pub fn create() -> anyhow::Result<PathBuf> {
    let base = base();
    ensure_base(&base)?;
    remove_stale(&base);
    let dir = base.join(std::process::id().to_string());
    // A directory of a dead daemon that had our pid.
    if let Ok(m) = std::fs::symlink_metadata(&dir) {
        if m.is_dir() && m.uid() == my_uid() {
            let _ = std::fs::remove_dir_all(&dir);
        } else {
            bail!(
                "{} exists and is not a run directory of this user: remove it",
                dir.display()
            );
        }
    }
    std::fs::DirBuilder::new()
        .mode(DIR_MODE)
        .create(&dir)
        .with_context(|| format!("creating the run directory {}", dir.display()))?;
    // The umask may have narrowed it; it is ours, just made.
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(DIR_MODE))
        .with_context(|| format!("setting the mode of {}", dir.display()))?;
    check_owned(&dir)?;
    Ok(dir)
}

fn my_uid() -> u32 {
    // SAFETY: getuid cannot fail.
    unsafe { libc::getuid() }
}

/// The base exists (created here if not) as a directory of ours that nobody else can write.
fn ensure_base(base: &Path) -> anyhow::Result<()> {
    match std::fs::symlink_metadata(base) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            if let Some(parent) = base.parent() {
                std::fs::create_dir_all(parent)
                    .with_context(|| format!("creating {}", parent.display()))?;
            }
            match std::fs::DirBuilder::new().mode(DIR_MODE).create(base) {
                Ok(()) => std::fs::set_permissions(base, std::fs::Permissions::from_mode(DIR_MODE))
                    .with_context(|| format!("setting the mode of {}", base.display()))?,
                // Another daemon made it meanwhile: checked below like any existing one.
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
                Err(e) => {
                    return Err(e)
                        .with_context(|| format!("creating the run base {}", base.display()))
                }
            }
        }
        Err(e) => return Err(e).with_context(|| format!("reading {}", base.display())),
        Ok(m) if m.is_dir() && m.uid() == my_uid() && m.mode() & 0o7777 == 0o700 => {
            // Ours, as earlier versions made it: searchable now, so that processes of the tree
            // that dropped their privileges reach the agent.
            std::fs::set_permissions(base, std::fs::Permissions::from_mode(DIR_MODE))
                .with_context(|| format!("setting the mode of {}", base.display()))?;
        }
        Ok(_) => {}
    }
    check_owned(base)
}

/// `path` is a real directory (not a symlink), owned by the daemon's user, writable by nobody
/// else.
fn check_owned(path: &Path) -> anyhow::Result<()> {
    let m =
        std::fs::symlink_metadata(path).with_context(|| format!("reading {}", path.display()))?;
    if m.file_type().is_symlink() {
        bail!(
            "run directory {} is a symbolic link: refusing to follow it (set UFFD_DAEMON_RUN_DIR \
             to a directory of your own)",
            path.display()
        );
    }
    if !m.is_dir() {
        bail!("run directory {} is not a directory", path.display());
    }
    if m.uid() != my_uid() {
        bail!(
            "run directory {} belongs to uid {}, not to this user ({}): use UFFD_DAEMON_RUN_DIR \
             to name a directory of your own",
            path.display(),
            m.uid(),
            my_uid()
        );
    }
    if m.mode() & 0o022 != 0 {
        bail!(
            "run directory {} is writable by others (mode {:o}): use UFFD_DAEMON_RUN_DIR to name \
             a directory only you can write",
            path.display(),
            m.mode() & 0o7777
        );
    }
    Ok(())
}

/// Removes run directories under `base` whose daemon is gone (a pid that no longer runs
/// `uffd-daemon`): a daemon killed with SIGKILL cannot clean up after itself.
fn remove_stale(base: &Path) {
    let Ok(entries) = std::fs::read_dir(base) else {
        return;
    };
    for e in entries.flatten() {
        let Some(pid) = e.file_name().to_str().and_then(|s| s.parse::<i32>().ok()) else {
            continue;
        };
        if pid == std::process::id() as i32 || daemon_alive(pid) {
            continue;
        }
        let Ok(m) = std::fs::symlink_metadata(e.path()) else {
            continue;
        };
        if m.is_dir() && m.uid() == my_uid() {
            remove_noted_backing_file(&e.path());
            let _ = std::fs::remove_dir_all(e.path());
        }
    }
}

/// The name of the note, in a run directory, of the backing file the daemon created.
const BACKING_NOTE: &str = "backing-file";

/// Notes in the run directory `dir` the backing file the daemon created at `path`, so that the
/// next daemon removes it if this one dies without doing so.
pub fn note_backing_file(dir: &Path, path: &Path) {
    let abs = std::fs::canonicalize(path).unwrap_or_else(|_| path.to_path_buf());
    let _ = std::fs::write(dir.join(BACKING_NOTE), abs.as_os_str().as_encoded_bytes());
}

/// Removes the backing file a dead daemon noted in its run directory `dir`: a regular file of
/// this user (never a device, never a symlink).
fn remove_noted_backing_file(dir: &Path) {
    let Ok(bytes) = std::fs::read(dir.join(BACKING_NOTE)) else {
        return;
    };
    // SAFETY: the bytes were written from an OsStr by `note_backing_file` on this system.
    let path = PathBuf::from(unsafe { std::ffi::OsString::from_encoded_bytes_unchecked(bytes) });
    if let Ok(m) = std::fs::symlink_metadata(&path) {
        if m.file_type().is_file() && m.uid() == my_uid() && std::fs::remove_file(&path).is_ok() {
            eprintln!(
                "uffd-daemon: removed {}, the backing file of a daemon that died",
                path.display()
            );
        }
    }
}

/// Whether `pid` is a live uffd-daemon.
fn daemon_alive(pid: i32) -> bool {
    std::fs::read(format!("/proc/{pid}/comm"))
        .is_ok_and(|c| String::from_utf8_lossy(&c).trim_end() == "uffd-daemon")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tmp(name: &str) -> PathBuf {
        let p = std::env::temp_dir().join(format!("uffd-rundir-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&p);
        let _ = std::fs::remove_file(&p);
        p
    }

    #[test]
    fn a_symlink_base_is_refused_and_not_followed() {
        let victim = tmp("victim");
        std::fs::create_dir(&victim).unwrap();
        std::fs::set_permissions(&victim, std::fs::Permissions::from_mode(0o755)).unwrap();
        let link = tmp("link");
        std::os::unix::fs::symlink(&victim, &link).unwrap();
        let e = ensure_base(&link).unwrap_err().to_string();
        assert!(
            e.contains("symbolic link") && e.contains(&*link.to_string_lossy()),
            "{e}"
        );
        let mode = std::fs::metadata(&victim).unwrap().mode() & 0o7777;
        assert_eq!(mode, 0o755, "the victim's mode was changed");
        std::fs::remove_file(&link).unwrap();
        std::fs::remove_dir(&victim).unwrap();
    }

    #[test]
    fn a_shared_base_is_refused_and_left_alone() {
        let shared = tmp("shared");
        std::fs::create_dir(&shared).unwrap();
        std::fs::set_permissions(&shared, std::fs::Permissions::from_mode(0o1777)).unwrap();
        let e = ensure_base(&shared).unwrap_err().to_string();
        assert!(e.contains("writable by others"), "{e}");
        let mode = std::fs::metadata(&shared).unwrap().mode() & 0o7777;
        assert_eq!(mode, 0o1777, "the shared directory's mode was changed");
        std::fs::remove_dir(&shared).unwrap();
    }

    #[test]
    fn a_base_of_another_user_is_refused_by_name() {
        if my_uid() != 0 {
            return; // only root can make a directory of another user here
        }
        let other = tmp("other");
        std::fs::create_dir(&other).unwrap();
        let c = std::ffi::CString::new(other.to_string_lossy().as_bytes()).unwrap();
        // SAFETY: chown(2) on a path we just created, with a valid C string.
        let rc = unsafe { libc::chown(c.as_ptr(), 65534, 65534) };
        assert_eq!(rc, 0);
        let e = ensure_base(&other).unwrap_err().to_string();
        assert!(
            e.contains("belongs to uid 65534") && e.contains(&*other.to_string_lossy()),
            "{e}"
        );
        std::fs::remove_dir(&other).unwrap();
    }

    #[test]
    fn a_new_base_is_searchable_and_private_and_old_ones_become_searchable() {
        let b = tmp("new");
        ensure_base(&b).unwrap();
        assert_eq!(std::fs::metadata(&b).unwrap().mode() & 0o7777, 0o711);
        std::fs::set_permissions(&b, std::fs::Permissions::from_mode(0o700)).unwrap();
        ensure_base(&b).unwrap();
        assert_eq!(std::fs::metadata(&b).unwrap().mode() & 0o7777, 0o711);
        // A stale run directory of a dead daemon goes; a live one's stays.
        std::fs::create_dir(b.join("999999999")).unwrap();
        std::fs::create_dir(b.join(std::process::id().to_string())).unwrap();
        // ... with its named backing file, which goes too.
        let backing = tmp("backing");
        std::fs::write(&backing, b"ciphertext").unwrap();
        note_backing_file(&b.join("999999999"), &backing);
        remove_stale(&b);
        assert!(!b.join("999999999").exists());
        assert!(!backing.exists(), "the dead daemon's backing file stayed");
        assert!(b.join(std::process::id().to_string()).exists());
        std::fs::remove_dir_all(&b).unwrap();
    }
}
