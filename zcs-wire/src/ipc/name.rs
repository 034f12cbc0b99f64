//! Where a control socket lives ([`SocketName`]), how its name travels in a liveliness
//! token ([`SocketName::to_key_chunk`] / [`SocketName::from_key_chunk`]), and the 0700
//! runtime directory that holds path sockets ([`ensure_runtime_dir`]).

use std::ffi::OsStr;
use std::fmt;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{DirBuilderExt, MetadataExt, PermissionsExt};
use std::path::{Component, Path, PathBuf};

use nix::errno::Errno;
use nix::sys::socket::UnixAddr;
use rand::Rng;

/// Longest name that fits in `sockaddr_un.sun_path` (108 bytes): an abstract name after
/// its leading NUL byte, or a path before its terminating NUL byte.
pub const MAX_SOCKET_NAME_BYTES: usize = 107;

/// Prefix of every generated socket name.
const NAME_PREFIX: &str = "zcs-";
/// Bytes of randomness in a generated name (128 bits).
const NAME_RANDOM_BYTES: usize = 16;
/// Kind letter of an abstract name in the key-expression encoding.
const KIND_ABSTRACT: u8 = b'a';
/// Kind letter of a path name in the key-expression encoding.
const KIND_PATH: u8 = b'p';

/// Where a control socket lives.
///
/// `Abstract` is the default: a name in the Linux abstract namespace, scoped to the
/// network namespace, that vanishes with its last descriptor, so nothing is left behind
/// after a crash. `Path` is for peers in different network namespaces that share a
/// mounted directory; the file sits in a 0700 runtime directory and is removed when the
/// [`ControlListener`](super::ControlListener) is dropped.
///
/// Variants are public for matching; [`ControlListener::bind`](super::ControlListener::bind)
/// and [`ControlConn::connect`](super::ControlConn::connect) validate the name again.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum SocketName {
    /// Linux abstract-namespace name (the bytes after the leading NUL).
    Abstract(Vec<u8>),
    /// Filesystem socket path, absolute, inside a 0700 runtime directory.
    Path(PathBuf),
}

/// Why a string could not be decoded into a [`SocketName`]. Input comes from the
/// network (liveliness tokens), so every malformed case is an error, never a panic.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum DecodeNameError {
    /// The string, or the name it encodes, is empty.
    #[error("empty socket name")]
    Empty,
    /// The string is longer than any valid encoding.
    #[error("encoded socket name is {len} characters, more than the maximum {max}")]
    TooLong {
        /// Characters in the input.
        len: usize,
        /// Largest accepted length.
        max: usize,
    },
    /// The first character is not a known kind letter (`a` or `p`).
    #[error("unknown socket name kind {kind:?} (expected 'a' or 'p')")]
    UnknownKind {
        /// The offending first character.
        kind: char,
    },
    /// The body is not lowercase hex of whole bytes.
    #[error("socket name is not lowercase hex at offset {offset}")]
    BadHex {
        /// Byte offset in the input of the first bad character (or the input length
        /// when the hex has an odd number of digits).
        offset: usize,
    },
    /// The decoded name contains a NUL byte.
    #[error("socket name contains a NUL byte")]
    Nul,
    /// The decoded path is not absolute or contains `.`/`..` components.
    #[error("socket path {path:?} must be absolute and normalised (no '.' or '..')")]
    BadPath {
        /// The decoded path (lossy).
        path: String,
    },
}

/// Why a socket name could not be turned into a socket address.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum InvalidNameError {
    /// The name is empty.
    #[error("empty socket name")]
    Empty,
    /// The name does not fit in `sun_path`.
    #[error("socket name is {len} bytes, more than the maximum {max}")]
    TooLong {
        /// Bytes in the name.
        len: usize,
        /// [`MAX_SOCKET_NAME_BYTES`].
        max: usize,
    },
    /// The name contains a NUL byte.
    #[error("socket name contains a NUL byte")]
    Nul,
    /// A path name that is relative or has `.`/`..` components.
    #[error("socket path {0:?} must be absolute and normalised")]
    BadPath(PathBuf),
}

/// Failure to create or verify the runtime directory of path sockets.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RuntimeDirError {
    /// A syscall on the directory failed.
    #[error("{call} on {path:?} failed")]
    Sys {
        /// The failing call.
        call: &'static str,
        /// The directory.
        path: PathBuf,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// Something that is not a directory (possibly a symlink) is in the way.
    #[error("{path:?} exists and is not a directory (symlinks are refused)")]
    NotADirectory {
        /// The path.
        path: PathBuf,
    },
    /// The directory belongs to another user.
    #[error("{path:?} is owned by uid {owner}, not by us (uid {me})")]
    WrongOwner {
        /// The directory.
        path: PathBuf,
        /// Its owner.
        owner: u32,
        /// Our effective uid.
        me: u32,
    },
    /// The directory is accessible to others.
    #[error("{path:?} has mode {mode:o}; refusing anything but 0700")]
    InsecureMode {
        /// The directory.
        path: PathBuf,
        /// Its permission bits.
        mode: u32,
    },
    /// The socket name is not a path, or has no parent directory.
    #[error("socket name {0} has no parent directory")]
    NoParent(String),
}

/// Lowercase hex of `bytes`.
fn hex(bytes: &[u8]) -> String {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut s = String::with_capacity(bytes.len() * 2);
    for &b in bytes {
        s.push(char::from(DIGITS[usize::from(b >> 4)]));
        s.push(char::from(DIGITS[usize::from(b & 0xf)]));
    }
    s
}

/// Value of one lowercase hex digit.
fn hex_digit(c: u8) -> Option<u8> {
    match c {
        b'0'..=b'9' => Some(c - b'0'),
        b'a'..=b'f' => Some(c - b'a' + 10),
        _ => None,
    }
}

/// A fresh `zcs-<32 hex>` name with 128 bits from the thread CSPRNG (seeded from the OS).
fn random_name() -> String {
    let mut bytes = [0u8; NAME_RANDOM_BYTES];
    rand::rng().fill(&mut bytes[..]);
    format!("{NAME_PREFIX}{}", hex(&bytes))
}

/// Whether `p` is absolute and has no `.`/`..` components.
fn path_is_normal(p: &Path) -> bool {
    p.is_absolute()
        && p.components()
            .all(|c| matches!(c, Component::RootDir | Component::Normal(_)))
        // `Path::components` silently drops interior `.`; look at the raw bytes too.
        && !p
            .as_os_str()
            .as_bytes()
            .split(|&b| b == b'/')
            .any(|seg| seg == b"." || seg == b"..")
}

impl SocketName {
    /// A new abstract name, `zcs-<32 hex digits>` (128 random bits).
    pub fn random_abstract() -> Self {
        Self::Abstract(random_name().into_bytes())
    }

    /// A new path name `dir/zcs-<32 hex digits>.sock`. Creates `dir` with mode 0700 if
    /// it is missing and verifies it otherwise (see [`ensure_runtime_dir`]).
    pub fn random_path_in(dir: &Path) -> Result<Self, RuntimeDirError> {
        ensure_runtime_dir(dir)?;
        Ok(Self::Path(dir.join(format!("{}.sock", random_name()))))
    }

    /// Encode as one Zenoh key-expression chunk: a kind letter (`a` abstract, `p` path)
    /// followed by lowercase hex of the name bytes. Only `[0-9a-f]` and the kind letter
    /// appear, so the result never contains `/ * $ # ? @`.
    pub fn to_key_chunk(&self) -> String {
        let (kind, bytes) = match self {
            Self::Abstract(n) => (KIND_ABSTRACT, n.as_slice()),
            Self::Path(p) => (KIND_PATH, p.as_os_str().as_bytes()),
        };
        let mut s = String::with_capacity(1 + 2 * bytes.len());
        s.push(char::from(kind));
        s.push_str(&hex(bytes));
        s
    }

    /// Decode a chunk made by [`to_key_chunk`](Self::to_key_chunk). The input is
    /// untrusted: length, alphabet, kind, NUL bytes and path shape are all checked.
    pub fn from_key_chunk(s: &str) -> Result<Self, DecodeNameError> {
        Self::decode(s).inspect_err(|e| {
            tracing::debug!(input_len = s.len(), error = %crate::error::Chain(&e), "socket name rejected");
        })
    }

    fn decode(s: &str) -> Result<Self, DecodeNameError> {
        let max = 1 + 2 * MAX_SOCKET_NAME_BYTES;
        let raw = s.as_bytes();
        if raw.len() > max {
            return Err(DecodeNameError::TooLong { len: raw.len(), max });
        }
        let Some((&kind, body)) = raw.split_first() else {
            return Err(DecodeNameError::Empty);
        };
        if kind != KIND_ABSTRACT && kind != KIND_PATH {
            let kind = s.chars().next().unwrap_or('\0');
            return Err(DecodeNameError::UnknownKind { kind });
        }
        if body.is_empty() {
            return Err(DecodeNameError::Empty);
        }
        let mut bytes = Vec::with_capacity(body.len() / 2);
        for (i, pair) in body.chunks(2).enumerate() {
            let offset = 1 + 2 * i;
            let [hi, lo] = pair else {
                return Err(DecodeNameError::BadHex { offset: raw.len() });
            };
            let hi = hex_digit(*hi).ok_or(DecodeNameError::BadHex { offset })?;
            let lo = hex_digit(*lo).ok_or(DecodeNameError::BadHex { offset: offset + 1 })?;
            bytes.push(hi << 4 | lo);
        }
        if bytes.contains(&0) {
            return Err(DecodeNameError::Nul);
        }
        if kind == KIND_ABSTRACT {
            return Ok(Self::Abstract(bytes));
        }
        let path = PathBuf::from(OsStr::from_bytes(&bytes));
        if !path_is_normal(&path) {
            return Err(DecodeNameError::BadPath { path: path.to_string_lossy().into_owned() });
        }
        Ok(Self::Path(path))
    }

    /// Check the name and build its `sockaddr_un`.
    pub(super) fn to_unix_addr(&self) -> Result<UnixAddr, InvalidNameError> {
        let bytes = match self {
            Self::Abstract(n) => n.as_slice(),
            Self::Path(p) => p.as_os_str().as_bytes(),
        };
        if bytes.is_empty() {
            return Err(InvalidNameError::Empty);
        }
        if bytes.len() > MAX_SOCKET_NAME_BYTES {
            return Err(InvalidNameError::TooLong { len: bytes.len(), max: MAX_SOCKET_NAME_BYTES });
        }
        if bytes.contains(&0) {
            return Err(InvalidNameError::Nul);
        }
        let addr = match self {
            Self::Abstract(n) => UnixAddr::new_abstract(n),
            Self::Path(p) => {
                if !path_is_normal(p) {
                    return Err(InvalidNameError::BadPath(p.clone()));
                }
                UnixAddr::new(p.as_path())
            }
        };
        // Length and NUL were checked above, so this cannot fail; map defensively.
        addr.map_err(|_: Errno| InvalidNameError::TooLong { len: bytes.len(), max: MAX_SOCKET_NAME_BYTES })
    }
}

impl fmt::Display for SocketName {
    /// Abstract names print as `@name` (as `ss -x` does), paths as the path.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Abstract(n) => write!(f, "@{}", String::from_utf8_lossy(n)),
            Self::Path(p) => write!(f, "{}", p.display()),
        }
    }
}

/// The default parent for path sockets: `$XDG_RUNTIME_DIR/zenoh-cuda-shm` when
/// `XDG_RUNTIME_DIR` is set and absolute, else `/tmp/zenoh-cuda-shm-<euid>`.
pub fn default_runtime_dir() -> PathBuf {
    match std::env::var_os("XDG_RUNTIME_DIR").map(PathBuf::from) {
        Some(dir) if dir.is_absolute() => dir.join("zenoh-cuda-shm"),
        _ => PathBuf::from(format!("/tmp/zenoh-cuda-shm-{}", nix::unistd::geteuid().as_raw())),
    }
}

/// Make sure `dir` is a directory owned by our effective uid with mode exactly 0700.
///
/// A missing directory is created (parents with default permissions, the last
/// component with 0700, then `chmod` 0700 so the umask cannot weaken or break it). An
/// existing one must not be a symlink, must be ours and must already be 0700:
/// a directory someone loosened is refused rather than silently "fixed".
pub fn ensure_runtime_dir(dir: &Path) -> Result<(), RuntimeDirError> {
    ensure_runtime_dir_inner(dir).inspect_err(|e| {
        tracing::debug!(?dir, error = %crate::error::Chain(&e), "runtime directory unusable");
    })
}

fn ensure_runtime_dir_inner(dir: &Path) -> Result<(), RuntimeDirError> {
    let sys = |call: &'static str| {
        move |source: std::io::Error| RuntimeDirError::Sys { call, path: dir.to_path_buf(), source }
    };
    tracing::trace!(?dir, "mkdir 0700");
    let created = match std::fs::DirBuilder::new().mode(0o700).create(dir) {
        Ok(()) => true,
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => false,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            if let Some(parent) = dir.parent() {
                tracing::trace!(?parent, "mkdir -p");
                std::fs::create_dir_all(parent).map_err(sys("mkdir -p"))?;
            }
            match std::fs::DirBuilder::new().mode(0o700).create(dir) {
                Ok(()) => true,
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => false,
                Err(e) => return Err(sys("mkdir")(e)),
            }
        }
        Err(e) => return Err(sys("mkdir")(e)),
    };
    if created {
        tracing::trace!(?dir, "chmod 0700");
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700)).map_err(sys("chmod"))?;
    }
    tracing::trace!(?dir, "lstat");
    let meta = std::fs::symlink_metadata(dir).map_err(sys("lstat"))?;
    if !meta.file_type().is_dir() {
        return Err(RuntimeDirError::NotADirectory { path: dir.to_path_buf() });
    }
    let me = nix::unistd::geteuid().as_raw();
    if meta.uid() != me {
        return Err(RuntimeDirError::WrongOwner { path: dir.to_path_buf(), owner: meta.uid(), me });
    }
    let mode = meta.mode() & 0o7777;
    if mode != 0o700 {
        return Err(RuntimeDirError::InsecureMode { path: dir.to_path_buf(), mode });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ipc_random_abstract_names_are_unique_and_long() {
        let a = SocketName::random_abstract();
        let b = SocketName::random_abstract();
        assert_ne!(a, b);
        let SocketName::Abstract(n) = &a else { panic!("not abstract") };
        assert_eq!(n.len(), NAME_PREFIX.len() + 2 * NAME_RANDOM_BYTES);
        assert!(n.starts_with(NAME_PREFIX.as_bytes()));
    }

    #[test]
    fn ipc_key_chunk_roundtrip_and_alphabet() {
        let names = [
            SocketName::random_abstract(),
            SocketName::Path(PathBuf::from("/run/user/1000/zenoh-cuda-shm/zcs-00.sock")),
            SocketName::Abstract(vec![0xff, 0x01, b'/', b'*']),
        ];
        for n in names {
            let s = n.to_key_chunk();
            assert!(s.bytes().all(|c| c.is_ascii_digit() || c.is_ascii_lowercase()));
            assert!(!s.is_empty() && !s.starts_with('@'));
            assert_eq!(SocketName::from_key_chunk(&s).unwrap(), n);
        }
    }

    #[test]
    fn ipc_key_chunk_rejects_garbage() {
        use DecodeNameError as E;
        let long = format!("a{}", "61".repeat(MAX_SOCKET_NAME_BYTES + 1));
        type Check = fn(&E) -> bool;
        let cases: &[(&str, Check)] = &[
            ("", |e| matches!(e, E::Empty)),
            ("a", |e| matches!(e, E::Empty)),
            ("x6162", |e| matches!(e, E::UnknownKind { kind: 'x' })),
            ("é6162", |e| matches!(e, E::UnknownKind { kind: 'é' })),
            ("a616", |e| matches!(e, E::BadHex { offset: 4 })),
            ("a61G2", |e| matches!(e, E::BadHex { offset: 3 })),
            ("a6A62", |e| matches!(e, E::BadHex { offset: 2 })),
            ("a61/2", |e| matches!(e, E::BadHex { .. })),
            ("a61é", |e| matches!(e, E::BadHex { .. })),
            ("a6100", |e| matches!(e, E::Nul)),
            ("p6162", |e| matches!(e, E::BadPath { .. })), // "ab": relative
            ("p2f2e2e2f6574632f706173737764", |e| {
                matches!(e, E::BadPath { .. }) // "/../etc/passwd"
            }),
            ("p2f612f2e2f62", |e| matches!(e, E::BadPath { .. })), // "/a/./b"
            (&long, |e| matches!(e, E::TooLong { .. })),
        ];
        for (input, check) in cases {
            let err = SocketName::from_key_chunk(input).unwrap_err();
            assert!(check(&err), "{input:?} gave {err:?}");
            let _ = err.to_string();
        }
    }

    #[test]
    fn ipc_to_unix_addr_validates() {
        assert_eq!(SocketName::Abstract(vec![]).to_unix_addr().unwrap_err(), InvalidNameError::Empty);
        assert!(matches!(SocketName::Abstract(vec![b'x'; 108]).to_unix_addr(), Err(InvalidNameError::TooLong { .. })));
        assert!(SocketName::Abstract(vec![b'x'; 107]).to_unix_addr().is_ok());
        assert_eq!(SocketName::Abstract(b"a\0b".to_vec()).to_unix_addr().unwrap_err(), InvalidNameError::Nul);
        assert!(matches!(SocketName::Path("rel/x".into()).to_unix_addr(), Err(InvalidNameError::BadPath(_))));
    }

    #[test]
    fn ipc_display() {
        assert_eq!(SocketName::Abstract(b"zcs-1".to_vec()).to_string(), "@zcs-1");
        assert_eq!(SocketName::Path("/a/b".into()).to_string(), "/a/b");
    }

    proptest::proptest! {
        #[test]
        fn ipc_decode_arbitrary_strings_never_panics(s in "\\PC{0,300}") {
            let _ = SocketName::from_key_chunk(&s);
        }

        #[test]
        fn ipc_decode_near_valid_strings_never_panics(s in "[ap][0-9a-fA-F/.\\x00]{0,260}") {
            if let Ok(n) = SocketName::from_key_chunk(&s) {
                // Whatever decodes must be usable as an address and re-encode the same.
                proptest::prop_assert!(n.to_unix_addr().is_ok());
                proptest::prop_assert_eq!(n.to_key_chunk(), s);
            }
        }

        #[test]
        fn ipc_abstract_names_roundtrip(
            bytes in proptest::collection::vec(1u8..=255, 1..=MAX_SOCKET_NAME_BYTES)
        ) {
            let n = SocketName::Abstract(bytes);
            let chunk = n.to_key_chunk();
            proptest::prop_assert!(chunk.bytes().all(|c| c.is_ascii_digit() || c.is_ascii_lowercase()));
            proptest::prop_assert_eq!(SocketName::from_key_chunk(&chunk), Ok(n));
        }
    }
}
