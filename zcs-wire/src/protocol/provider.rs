//! The host provider's wire: its token, the reference a publisher names it by, and
//! the requests and replies of its clients.

use serde::{Deserialize, Serialize};

use super::*;

/// Names a host provider: its random id and its socket (as
/// [`crate::ipc::SocketName::to_key_chunk`]).
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct ProviderRef {
    /// The provider's random instance id.
    pub id: u64,
    /// Its socket.
    pub socket: String,
}

/// A provider's liveliness token: `@zcs/v1/provider/<boot_id>/<id-hex>/<socket-chunk>`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProviderToken {
    /// The kernel it serves (`boot_id`).
    pub boot_id: String,
    /// Id and socket.
    pub provider: ProviderRef,
}

impl ProviderToken {
    /// Encodes the token's key expression.
    pub fn to_key(&self) -> String {
        format!("{TOKEN_ROOT}/provider/{}/{:016x}/{}", self.boot_id, self.provider.id, self.provider.socket)
    }

    /// Key expression matching every provider token of one kernel.
    pub fn selector(boot_id: &str) -> String {
        format!("{TOKEN_ROOT}/provider/{boot_id}/*/*")
    }

    /// Parses a provider token; `None` for anything malformed.
    pub fn parse(ke: &str) -> Option<Self> {
        let rest = ke.strip_prefix(TOKEN_ROOT)?.strip_prefix("/provider/")?;
        let parts: Vec<&str> = rest.split('/').collect();
        if parts.len() != 3 || !parts.iter().all(|p| valid_chunk(p)) || parts[1].len() > 16 {
            return None;
        }
        let id = u64::from_str_radix(parts[1], 16).ok()?;
        Some(Self { boot_id: parts[0].to_owned(), provider: ProviderRef { id, socket: parts[2].to_owned() } })
    }
}

/// Requests to the host provider (client → provider). `Borrow` and `Open` are answered
/// with the request's `tag`; `Return`, `Close` and `Report` are not answered.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum ProviderRequest {
    /// First message on a connection.
    Hello {
        /// The client's random id (its session).
        client: u64,
        /// The program name, for the registry.
        program: String,
    },
    /// Lend me a block of `size` bytes on `device` (a [`Group`] device chunk).
    Borrow {
        /// Echoed in the answer.
        tag: u64,
        /// `cuda-<uuid>` or `host`.
        device: String,
        /// Bytes; rounded up to the provider's size class.
        size: u64,
    },
    /// I no longer use this loan (the borrower only).
    Return {
        /// The loan id.
        loan: u64,
    },
    /// The FD of a lent block, named by its loan id in a descriptor.
    Open {
        /// Echoed in the answer.
        tag: u64,
        /// The loan id.
        loan: u64,
    },
    /// I no longer map these loans' blocks.
    Close {
        /// Loan ids.
        loans: Vec<u64>,
    },
    /// What my publishers and subscribers are doing (sent about once a second; the
    /// provider keeps the latest, for the registry).
    Report(ProcessReport),
}

/// Answers of the host provider (provider → client).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum ProviderReply {
    /// Answer to `Hello`.
    Welcome {
        /// The provider's id.
        provider: u64,
        /// The devices it lends blocks of.
        devices: Vec<String>,
    },
    /// Answer to `Borrow`: the block's FD follows.
    Lent {
        /// The request's tag.
        tag: u64,
        /// The loan id: names the block in descriptors; unguessable.
        loan: u64,
        /// The block's size.
        size: u64,
    },
    /// Answer to `Open`: the block's FD follows.
    Opened {
        /// The request's tag.
        tag: u64,
        /// The block's size.
        size: u64,
    },
    /// A `Borrow` or `Open` was refused.
    Refused {
        /// The request's tag.
        tag: u64,
        /// Why.
        reason: String,
        /// True when retrying cannot help (unknown device, unknown loan).
        permanent: bool,
    },
}
