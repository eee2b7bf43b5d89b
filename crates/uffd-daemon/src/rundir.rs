//! The daemon's run directory: `<base>/<pid>` (or `<pid>-<n>`: below), holding the agent
//! library and the sockets.
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
//!
//! A live daemon holds an exclusive `flock` on its directory's `lock` file for its whole life:
//! a directory whose lock nobody holds is a dead daemon's. Not the pid in the directory's name:
//! daemons in different pid namespaces share the base, and there the number names another
//! process or none. (Judged by the number, a daemon starting outside removed the live directory
//! of a daemon in a pid namespace of its own, whose number there, 22, was a kernel thread's
//! outside: its agent socket went with it, and its fork children could not greet; a daemon in
//! a namespace of its own, seeing none of the others' numbers, would remove every other
//! daemon's.) Two daemons can have the same number in two namespaces: the second takes
//! `<pid>-<n>`. A directory without a lock (a daemon older than the locks) is never removed.

use std::os::unix::ffi::OsStringExt;
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

use anyhow::{bail, Context};

/// Mode of the base and the run directory.
const DIR_MODE: u32 = 0o711;

/// The file in a run directory whose exclusive `flock` its live daemon holds.
const LOCK: &str = "lock";

/// Where daemons put their run directories: `UFFD_DAEMON_RUN_DIR`, else a default per user.
pub fn base() -> PathBuf {
    std::env::var_os("UFFD_DAEMON_RUN_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(default_base)
}

/// The default base: `/run/uffd-daemon` for root, under `XDG_RUNTIME_DIR` or `/tmp` otherwise.
pub fn default_base() -> PathBuf {
    let uid = crate::sys::getuid();
    if uid == 0 {
        PathBuf::from("/run/uffd-daemon")
    } else if let Some(x) = std::env::var_os("XDG_RUNTIME_DIR") {
        PathBuf::from(x).join("uffd-daemon")
    } else {
        PathBuf::from(format!("/tmp/uffd-daemon-{uid}"))
    }
}

/// Creates this daemon's run directory under [`base`], after removing those of dead daemons,
/// and takes its lock: the lock is held as long as the returned file is open.
pub(crate) fn create() -> anyhow::Result<(PathBuf, std::fs::File)> {
    create_in(&base())
}

/// [`create`] under `base`. The directory is made under a temporary name (`.new-...`, which
/// no daemon looks at), locked there, and renamed into place: a run directory under its own
/// name always holds its live daemon's lock.
fn create_in(base: &Path) -> anyhow::Result<(PathBuf, std::fs::File)> {
    ensure_base(base)?;
    remove_stale(base);
    let pid = std::process::id();
    let mut nonce = [0u8; 8];
    crate::sys::random_bytes(&mut nonce).context("random bytes for a temporary name")?;
    let tmp = base.join(format!(".new-{pid}-{:016x}", u64::from_ne_bytes(nonce)));
    std::fs::DirBuilder::new()
        .mode(DIR_MODE)
        .create(&tmp)
        .with_context(|| format!("creating the run directory {}", tmp.display()))?;
    let made = lock_and_place(base, &tmp, pid);
    if made.is_err() {
        let _ = std::fs::remove_dir_all(&tmp);
    }
    made
}

/// Locks the new directory `tmp` and renames it to `<pid>`, or to `<pid>-<n>` where a live
/// daemon of another pid namespace has that name (a dead daemon's directory under the name is
/// removed first).
fn lock_and_place(base: &Path, tmp: &Path, pid: u32) -> anyhow::Result<(PathBuf, std::fs::File)> {
    // The umask may have narrowed it; it is ours, just made.
    std::fs::set_permissions(tmp, std::fs::Permissions::from_mode(DIR_MODE))
        .with_context(|| format!("setting the mode of {}", tmp.display()))?;
    check_owned(tmp)?;
    let lock_path = tmp.join(LOCK);
    let lock = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&lock_path)
        .with_context(|| format!("creating {}", lock_path.display()))?;
    if !crate::sys::try_flock(&lock, true)
        .with_context(|| format!("locking {}", lock_path.display()))?
    {
        bail!("{} is locked by another process", lock_path.display());
    }
    for n in 0..64u32 {
        let dir = match n {
            0 => base.join(pid.to_string()),
            n => base.join(format!("{pid}-{n}")),
        };
        if let Ok(m) = std::fs::symlink_metadata(&dir) {
            if !(m.is_dir() && m.uid() == my_uid()) {
                bail!(
                    "{} exists and is not a run directory of this user: remove it",
                    dir.display()
                );
            }
            if !is_stale(&dir) {
                continue;
            }
            // A directory of a dead daemon that had this name.
            remove_noted_backing_file(&dir);
            let _ = std::fs::remove_dir_all(&dir);
        }
        match std::fs::rename(tmp, &dir) {
            Ok(()) => return Ok((dir, lock)),
            // Another daemon took the name meanwhile (not empty: its lock is in it).
            Err(e) if matches!(e.raw_os_error(), Some(libc::ENOTEMPTY | libc::EEXIST)) => {}
            Err(e) => {
                return Err(e)
                    .with_context(|| format!("renaming {} to {}", tmp.display(), dir.display()))
            }
        }
    }
    bail!(
        "no free run directory for pid {pid} under {}: 64 live daemons of other pid namespaces \
         have this number",
        base.display()
    )
}

fn my_uid() -> u32 {
    crate::sys::getuid()
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

/// Removes run directories under `base` whose daemon is shown gone ([`is_stale`]): a daemon
/// killed with SIGKILL cannot clean up after itself.
fn remove_stale(base: &Path) {
    let Ok(entries) = std::fs::read_dir(base) else {
        return;
    };
    for e in entries.flatten() {
        if pid_of_name(&e.file_name().to_string_lossy()).is_none() {
            continue;
        }
        let Ok(m) = std::fs::symlink_metadata(e.path()) else {
            continue;
        };
        if m.is_dir() && m.uid() == my_uid() && is_stale(&e.path()) {
            remove_noted_backing_file(&e.path());
            let _ = std::fs::remove_dir_all(e.path());
        }
    }
}

/// The pid a run directory's name begins with (`<pid>` or `<pid>-<n>`): the daemon's number in
/// its own pid namespace, which may not be the reader's.
pub fn pid_of_name(name: &str) -> Option<u32> {
    let digits = name.split_once('-').map_or(name, |(p, _)| p);
    digits.parse().ok()
}

/// Whether the run directory `dir` is a dead daemon's: nobody holds its lock. One without a
/// lock, made by a daemon older than the locks, is left alone: the pid in its name says nothing
/// certain (the reader cannot tell whether that daemon was in its pid namespace), and a live
/// daemon's directory removed cuts its processes off, while a dead one's left costs a few
/// bytes.
fn is_stale(dir: &Path) -> bool {
    match std::fs::File::open(dir.join(LOCK)) {
        // (A shared lock: two daemons looking at once do not take each other for the owner.)
        Ok(f) => crate::sys::try_flock(&f, false).unwrap_or(false),
        Err(_) => false,
    }
}

/// The name of the note, in a run directory, of the backing file the daemon created.
const BACKING_NOTE: &str = "backing-file";

/// Notes in the run directory `dir` the backing file the daemon created at `path`, so that the
/// next daemon removes it if this one dies without doing so.
pub(crate) fn note_backing_file(dir: &Path, path: &Path) {
    let abs = std::fs::canonicalize(path).unwrap_or_else(|_| path.to_path_buf());
    let _ = std::fs::write(dir.join(BACKING_NOTE), abs.as_os_str().as_encoded_bytes());
}

/// Removes the backing file a dead daemon noted in its run directory `dir`: a regular file of
/// this user (never a device, never a symlink).
fn remove_noted_backing_file(dir: &Path) {
    let Ok(bytes) = std::fs::read(dir.join(BACKING_NOTE)) else {
        return;
    };
    // (On Unix any bytes are an OsString: `note_backing_file` wrote an OsStr's.)
    let path = PathBuf::from(std::ffi::OsString::from_vec(bytes));
    if let Ok(m) = std::fs::symlink_metadata(&path) {
        if m.file_type().is_file() && m.uid() == my_uid() && std::fs::remove_file(&path).is_ok() {
            tracing::info!(
                "removed {}, the backing file of a daemon that died",
                path.display()
            );
        }
    }
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
        std::os::unix::fs::chown(&other, Some(65534), Some(65534)).unwrap();
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
        // A stale run directory of a dead daemon goes (its lock held by nobody); a live one's
        // stays, whatever its name says, and so does one made before the locks.
        let dead = b.join("999999999");
        let old = b.join("999999998");
        let live = b.join("999999997-1");
        for d in [&dead, &old, &live] {
            std::fs::create_dir(d).unwrap();
        }
        std::fs::write(dead.join(LOCK), b"").unwrap();
        let held = std::fs::File::create(live.join(LOCK)).unwrap();
        assert!(crate::sys::try_flock(&held, true).unwrap());
        // ... with its named backing file, which goes too.
        let backing = tmp("backing");
        std::fs::write(&backing, b"ciphertext").unwrap();
        note_backing_file(&dead, &backing);
        remove_stale(&b);
        assert!(!dead.exists());
        assert!(!backing.exists(), "the dead daemon's backing file stayed");
        assert!(
            old.exists(),
            "a directory without a lock went on the strength of a number"
        );
        assert!(
            live.exists(),
            "a live daemon's directory went (its number is not ours)"
        );
        // Our own number's directory held by a live daemon of another pid namespace: another
        // name is taken, locked from the moment it has it.
        let mine = b.join(std::process::id().to_string());
        std::fs::create_dir(&mine).unwrap();
        let other = std::fs::File::create(mine.join(LOCK)).unwrap();
        assert!(crate::sys::try_flock(&other, true).unwrap());
        let (dir, lock) = create_in(&b).unwrap();
        assert_eq!(dir, b.join(format!("{}-1", std::process::id())));
        assert!(mine.join(LOCK).exists());
        assert!(!is_stale(&dir));
        drop(lock);
        assert!(is_stale(&dir));
        assert_eq!(pid_of_name("4242-3"), Some(4242));
        assert_eq!(pid_of_name("lock"), None);
        assert_eq!(pid_of_name(".new-4242-00ff"), None);
        drop((held, other));
        std::fs::remove_dir_all(&b).unwrap();
    }
}
