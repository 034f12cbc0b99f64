//! Liveliness tokens: locality groups, roles, and the key layout of our tokens.

use serde::{Deserialize, Serialize};

use super::*;

/// A locality group: processes that can map each other's blocks (same kernel, same
/// device). Only a subscriber of the publisher's group attempts the handshake.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct Group {
    /// `/proc/sys/kernel/random/boot_id`, lower-case.
    pub boot_id: String,
    /// `cuda-<32 hex of the GPU UUID>` or `host` (memfd blocks).
    pub device: String,
}

impl Group {
    /// The device chunk of a process whose blocks are host memory (memfds).
    pub const HOST: &str = "host";

    /// Whether this group's blocks are host memory.
    pub fn is_host(&self) -> bool {
        self.device == Self::HOST
    }

    /// The group key chunk for a GPU UUID.
    pub fn cuda_device(uuid: &crate::cuda::GpuUuid) -> String {
        let mut s = String::from("cuda-");
        for b in uuid.0 {
            s.push_str(&format!("{b:02x}"));
        }
        s
    }

    /// The GPU a device chunk names ([`Group::cuda_device`]'s form), if it names one.
    pub fn cuda_uuid(device: &str) -> Option<crate::cuda::GpuUuid> {
        let hex = device.strip_prefix("cuda-")?;
        if hex.len() != 32 {
            return None;
        }
        let mut uuid = [0u8; 16];
        for (i, b) in uuid.iter_mut().enumerate() {
            *b = u8::from_str_radix(hex.get(2 * i..2 * i + 2)?, 16).ok()?;
        }
        Some(crate::cuda::GpuUuid(uuid))
    }
}

pub(super) fn valid_chunk(s: &str) -> bool {
    !s.is_empty() && s.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
}

/// Hex of a key expression, so any key fits in one token chunk.
pub fn hex_key(key: &str) -> String {
    key.bytes().map(|b| format!("{b:02x}")).collect()
}

fn unhex_key(s: &str) -> Option<String> {
    if s.is_empty() || !s.len().is_multiple_of(2) || s.len() > 2048 {
        return None;
    }
    let bytes: Option<Vec<u8>> =
        (0..s.len()).step_by(2).map(|i| u8::from_str_radix(s.get(i..i + 2)?, 16).ok()).collect();
    String::from_utf8(bytes?).ok()
}

/// Who a token describes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Role {
    /// A publisher (its token names its control socket).
    Pub,
    /// A GPU-aware subscriber.
    Sub,
}

/// A parsed liveliness token:
/// `@zcs/v1/<pub|sub>/<key-hex>/<instance-hex>/<boot_id>/<device>[/<socket-chunk>]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Token {
    /// Publisher or subscriber.
    pub role: Role,
    /// The user's key expression (a subscriber's may contain wildcards).
    pub key: String,
    /// The entity's random instance id.
    pub instance: u64,
    /// Its locality group.
    pub group: Group,
    /// A publisher's control socket, as [`crate::ipc::SocketName::to_key_chunk`].
    pub socket: Option<String>,
}

impl Token {
    /// Encodes the token's key expression.
    pub fn to_key(&self) -> String {
        let role = match self.role {
            Role::Pub => "pub",
            Role::Sub => "sub",
        };
        let mut k = format!(
            "{TOKEN_ROOT}/{role}/{}/{:016x}/{}/{}",
            hex_key(&self.key),
            self.instance,
            self.group.boot_id,
            self.group.device
        );
        if let Some(s) = &self.socket {
            k.push('/');
            k.push_str(s);
        }
        k
    }

    /// Parses a token key expression; `None` for anything malformed.
    pub fn parse(ke: &str) -> Option<Self> {
        let rest = ke.strip_prefix(TOKEN_ROOT)?.strip_prefix('/')?;
        let parts: Vec<&str> = rest.split('/').collect();
        let (role, n) = match *parts.first()? {
            "pub" => (Role::Pub, 6),
            "sub" => (Role::Sub, 5),
            _ => return None,
        };
        if parts.len() != n || !parts[1..].iter().all(|p| valid_chunk(p)) {
            return None;
        }
        let instance = u64::from_str_radix(parts[2], 16).ok()?;
        Some(Self {
            role,
            key: unhex_key(parts[1])?,
            instance,
            group: Group { boot_id: parts[3].to_owned(), device: parts[4].to_owned() },
            socket: (role == Role::Pub).then(|| parts[5].to_owned()),
        })
    }
}
