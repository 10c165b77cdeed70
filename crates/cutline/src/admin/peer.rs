//! Who is on the other end of an admin connection: the peer's user id, from the kernel
//! (`SO_PEERCRED` on Linux, `getpeereid` on the BSDs and macOS), and whether that user may control
//! the job (its own user, or root); and the one poll of the accept loops (`poll_readable`).

use std::os::unix::io::AsRawFd;
use std::os::unix::net::UnixStream;

/// The effective user id of this process.
pub(super) fn own_uid() -> u32 {
    // SAFETY: geteuid has no preconditions and cannot fail.
    unsafe { libc::geteuid() }
}

/// May a peer of user `peer` control a job run by user `own`? Its own user, and root (who may open
/// the socket file whatever its mode).
pub(super) fn allowed(peer: u32, own: u32) -> bool {
    peer == own || peer == 0
}

/// The user id of the process on the other end of `stream`, as the kernel recorded it at connect.
#[cfg(any(target_os = "linux", target_os = "android"))]
pub(super) fn peer_uid(stream: &UnixStream) -> std::io::Result<u32> {
    let mut cred = libc::ucred { pid: 0, uid: 0, gid: 0 };
    let mut len = std::mem::size_of::<libc::ucred>() as libc::socklen_t;
    // SAFETY: `cred` and `len` are valid for writes of the sizes passed; the descriptor is open for
    // the lifetime of `stream`.
    let r = unsafe {
        libc::getsockopt(
            stream.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_PEERCRED,
            (&mut cred as *mut libc::ucred).cast(),
            &mut len,
        )
    };
    if r != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(cred.uid)
}

/// The user id of the process on the other end of `stream`, as the kernel recorded it at connect.
#[cfg(not(any(target_os = "linux", target_os = "android")))]
pub(super) fn peer_uid(stream: &UnixStream) -> std::io::Result<u32> {
    let (mut uid, mut gid) = (0, 0);
    // SAFETY: `uid` and `gid` are valid for writes; the descriptor is open for the lifetime of `stream`.
    if unsafe { libc::getpeereid(stream.as_raw_fd(), &mut uid, &mut gid) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(uid)
}

/// `Err(reason)` if the peer of `stream` may not control the job run by user `own`.
pub(super) fn check(stream: &UnixStream, own: u32) -> Result<(), String> {
    match peer_uid(stream) {
        Ok(uid) if allowed(uid, own) => Ok(()),
        Ok(uid) => Err(format!(
            "user {uid} may not control this job: only its own user ({own}) and root may use its admin socket"
        )),
        Err(e) => Err(format!("cannot tell who is connecting ({e}); refused")),
    }
}

/// Sleep until one of `fds` is readable, the earliest of `deadlines` has come, or `limit` has passed
/// (the accept loops of the admin socket and the HTTP endpoint).
pub(super) fn poll_readable(
    fds: impl Iterator<Item = std::os::unix::io::RawFd>,
    deadlines: impl Iterator<Item = std::time::Instant>,
    limit: std::time::Duration,
) {
    let mut fds: Vec<libc::pollfd> = fds.map(|fd| libc::pollfd { fd, events: libc::POLLIN, revents: 0 }).collect();
    let now = std::time::Instant::now();
    let next = deadlines.min().map(|d| d.saturating_duration_since(now)).unwrap_or(limit);
    let ms = limit.min(next).as_millis().max(1) as libc::c_int;
    // SAFETY: `fds` is a valid array of `fds.len()` pollfd structures for the duration of the call.
    unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, ms) };
}
