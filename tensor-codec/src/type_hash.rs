//! ROS 2 type names and RIHS01 type hashes (REP-2011), computed here, not pasted.
//!
//! rmw_zenoh puts both in every key expression:
//! `<domain>/<topic>/<pkg>::msg::dds_::<Msg>_/RIHS01_<64 hex>`.
//!
//! # The hash
//!
//! RIHS01 is SHA-256 over a canonical JSON rendering of the message's `TypeDescription`,
//! as `rosidl_generator_type_description` produces it:
//!
//! - `{"type_description": T, "referenced_type_descriptions": [R...]}`, where the `R` are
//!   every type `T` refers to, transitively, each once, sorted by type name;
//! - each type is `{"type_name": "pkg/msg/Name", "fields": [...]}` in `.msg` field order;
//! - each field is `{"name": ..., "type": {"type_id": ..., "capacity": ...,
//!   "string_capacity": ..., "nested_type_name": ...}}` (no default values, no comments),
//!   with `type_id` from `type_description_interfaces/msg/FieldType` (`+144` for an
//!   unbounded sequence, so `uint8[]` is 147);
//! - keys in exactly that order, `", "` and `": "` as separators, no newlines, non-ASCII
//!   escaped as `\uXXXX` (Python's `json.dumps(..., ensure_ascii=True)`).
//!
//! The result is written `RIHS01_` followed by the digest in lowercase hex.
//!
//! ```
//! use tensor_codec::cdr::Image;
//! use tensor_codec::type_hash::RosMessage;
//!
//! assert_eq!(Image::<Vec<u8>>::DDS_TYPE_NAME, "sensor_msgs::msg::dds_::Image_");
//! assert_eq!(
//!     Image::<Vec<u8>>::type_hash().to_string(),
//!     "RIHS01_d31d41a9a4c4bc8eae9be757b0beed306564f7526c88ea6a4588fb9582527d47"
//! );
//! ```

use std::fmt::{self, Write as _};
use std::sync::OnceLock;

use sha2::{Digest, Sha256};

use crate::cdr::{ExperimentalTensor, Header, Image, StringMsg, Time};

/// A RIHS01 type hash: the 32-byte SHA-256 digest. `Display` writes `RIHS01_<64 hex>`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct TypeHash([u8; 32]);

impl TypeHash {
    /// The prefix of the string form.
    pub const PREFIX: &'static str = "RIHS01_";

    /// Wraps a digest.
    pub const fn from_bytes(bytes: [u8; 32]) -> Self {
        TypeHash(bytes)
    }

    /// The digest.
    pub const fn as_bytes(&self) -> &[u8; 32] {
        &self.0
    }

    /// Parses `RIHS01_<64 lowercase hex>`, or returns `None`.
    pub fn parse(s: &str) -> Option<Self> {
        let hex = s.strip_prefix(Self::PREFIX)?.as_bytes();
        if hex.len() != 64 {
            return None;
        }
        let nibble = |c: u8| match c {
            b'0'..=b'9' => Some(c - b'0'),
            b'a'..=b'f' => Some(c - b'a' + 10),
            _ => None,
        };
        let mut out = [0u8; 32];
        for (byte, pair) in out.iter_mut().zip(hex.chunks_exact(2)) {
            *byte = nibble(pair[0])? << 4 | nibble(pair[1])?;
        }
        Some(TypeHash(out))
    }
}

impl fmt::Display for TypeHash {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(Self::PREFIX)?;
        for b in self.0 {
            write!(f, "{b:02x}")?;
        }
        Ok(())
    }
}

/// A ROS 2 message type this crate can describe.
pub trait RosMessage {
    /// The ROS type name, `"<pkg>/msg/<Name>"`.
    const TYPE_NAME: &'static str;
    /// The DDS-mangled name rmw_zenoh uses in key expressions, `"<pkg>::msg::dds_::<Name>_"`.
    const DDS_TYPE_NAME: &'static str;

    /// Whether the type has a top-level `uint8[]` field (rosidl's `has_buffer_fields`).
    /// Such types' volatile endpoints are *buffer-aware* in rmw_zenoh 0.10.5 / 0.12.0
    /// and later: their tokens carry a `backends:` chunk and their data may travel on
    /// `_buf*` keys.
    const HAS_BUFFER_FIELDS: bool;

    /// The RIHS01 hash, computed once per process from the type description.
    fn type_hash() -> TypeHash;
}

/// Converts `"<pkg>/msg/<Name>"` (or `srv`, `action`) into rmw_zenoh's
/// `"<pkg>::msg::dds_::<Name>_"`. Returns `None` unless the input has exactly three
/// non-empty `/`-separated parts.
pub fn dds_type_name(type_name: &str) -> Option<String> {
    let mut parts = type_name.split('/');
    let (pkg, kind, name) = (parts.next()?, parts.next()?, parts.next()?);
    if parts.next().is_some() || pkg.is_empty() || kind.is_empty() || name.is_empty() {
        return None;
    }
    Some(format!("{pkg}::{kind}::dds_::{name}_"))
}

// FieldType ids (type_description_interfaces/msg/FieldType.msg).
const NESTED: u8 = 1;
const UINT8: u8 = 3;
const UINT16: u8 = 5;
const INT32: u8 = 6;
const UINT32: u8 = 7;
const UINT64: u8 = 9;
const STRING: u8 = 17;
const UNBOUNDED_SEQUENCE: u8 = 144;
const UINT8_SEQ: u8 = UINT8 + UNBOUNDED_SEQUENCE;
const INT64_SEQ: u8 = 8 + UNBOUNDED_SEQUENCE;

/// One field of an individual type description.
struct Field {
    name: &'static str,
    type_id: u8,
    /// Array size (0 unless a fixed array).
    capacity: u64,
    /// Bound of a bounded string (0 otherwise).
    string_capacity: u64,
    /// `"pkg/msg/Name"` for nested types, `""` otherwise.
    nested_type_name: &'static str,
}

const fn field(name: &'static str, type_id: u8) -> Field {
    Field { name, type_id, capacity: 0, string_capacity: 0, nested_type_name: "" }
}

const fn nested(name: &'static str, type_name: &'static str) -> Field {
    Field { name, type_id: NESTED, capacity: 0, string_capacity: 0, nested_type_name: type_name }
}

/// Whether `desc` has a top-level unbounded `uint8[]` field (nested types do not count,
/// as in rosidl's generators).
const fn has_buffer_fields(desc: &Description) -> bool {
    let mut i = 0;
    while i < desc.fields.len() {
        if desc.fields[i].type_id == UINT8_SEQ {
            return true;
        }
        i += 1;
    }
    false
}

/// An individual type description: a type and its own fields.
struct Description {
    type_name: &'static str,
    fields: &'static [Field],
}

const TIME: Description =
    Description { type_name: "builtin_interfaces/msg/Time", fields: &[field("sec", INT32), field("nanosec", UINT32)] };

const HEADER: Description = Description {
    type_name: "std_msgs/msg/Header",
    fields: &[nested("stamp", TIME.type_name), field("frame_id", STRING)],
};

const IMAGE: Description = Description {
    type_name: "sensor_msgs/msg/Image",
    fields: &[
        nested("header", HEADER.type_name),
        field("height", UINT32),
        field("width", UINT32),
        field("encoding", STRING),
        field("is_bigendian", UINT8),
        field("step", UINT32),
        field("data", UINT8_SEQ),
    ],
};

const EXPERIMENTAL_TENSOR: Description = Description {
    type_name: "tensor_msgs/msg/ExperimentalTensor",
    fields: &[
        field("dtype_code", UINT8),
        field("dtype_bits", UINT8),
        field("dtype_lanes", UINT16),
        field("shape", INT64_SEQ),
        field("strides", INT64_SEQ),
        field("byte_offset", UINT64),
        field("data", UINT8_SEQ),
    ],
};

/// Every description nested types may refer to.
const KNOWN: &[&Description] = &[&TIME, &HEADER, &IMAGE, &EXPERIMENTAL_TENSOR];

fn lookup(type_name: &str) -> Option<&'static Description> {
    KNOWN.iter().copied().find(|d| d.type_name == type_name)
}

/// The transitive closure of nested types, sorted by name, without duplicates.
fn referenced(top: &Description) -> Vec<&'static Description> {
    let mut found: Vec<&'static Description> = Vec::new();
    let mut queue: Vec<&str> = top.fields.iter().map(|f| f.nested_type_name).collect();
    while let Some(name) = queue.pop() {
        if name.is_empty() || found.iter().any(|d| d.type_name == name) {
            continue;
        }
        // All nested names above are in KNOWN; an unknown one would be a bug in this file
        // and is caught by the tests that pin every hash.
        if let Some(desc) = lookup(name) {
            queue.extend(desc.fields.iter().map(|f| f.nested_type_name));
            found.push(desc);
        }
    }
    found.sort_by_key(|d| d.type_name);
    found
}

/// Appends `s` as a JSON string the way Python's `json.dumps(ensure_ascii=True)` does.
fn json_string(out: &mut String, s: &str) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\u{8}' => out.push_str("\\b"),
            '\u{c}' => out.push_str("\\f"),
            ' '..='~' => out.push(c),
            _ => {
                let mut units = [0u16; 2];
                for unit in c.encode_utf16(&mut units) {
                    // Writing to a String cannot fail.
                    let _ = write!(out, "\\u{unit:04x}");
                }
            }
        }
    }
    out.push('"');
}

fn json_description(out: &mut String, desc: &Description) {
    out.push_str("{\"type_name\": ");
    json_string(out, desc.type_name);
    out.push_str(", \"fields\": [");
    for (i, f) in desc.fields.iter().enumerate() {
        if i > 0 {
            out.push_str(", ");
        }
        out.push_str("{\"name\": ");
        json_string(out, f.name);
        // Writing to a String cannot fail.
        let _ = write!(
            out,
            ", \"type\": {{\"type_id\": {}, \"capacity\": {}, \"string_capacity\": {}, \"nested_type_name\": ",
            f.type_id, f.capacity, f.string_capacity
        );
        json_string(out, f.nested_type_name);
        out.push_str("}}");
    }
    out.push_str("]}");
}

/// The canonical JSON that RIHS01 hashes.
fn canonical_json(top: &Description) -> String {
    let mut out = String::with_capacity(1024);
    out.push_str("{\"type_description\": ");
    json_description(&mut out, top);
    out.push_str(", \"referenced_type_descriptions\": [");
    for (i, desc) in referenced(top).into_iter().enumerate() {
        if i > 0 {
            out.push_str(", ");
        }
        json_description(&mut out, desc);
    }
    out.push_str("]}");
    out
}

const STRING_MSG: Description = Description { type_name: "std_msgs/msg/String", fields: &[field("data", STRING)] };

fn compute(top: &Description) -> TypeHash {
    TypeHash(Sha256::digest(canonical_json(top).as_bytes()).into())
}

fn cached(cell: &'static OnceLock<TypeHash>, desc: &Description) -> TypeHash {
    *cell.get_or_init(|| compute(desc))
}

static TIME_HASH: OnceLock<TypeHash> = OnceLock::new();
static HEADER_HASH: OnceLock<TypeHash> = OnceLock::new();
static IMAGE_HASH: OnceLock<TypeHash> = OnceLock::new();
static EXPERIMENTAL_TENSOR_HASH: OnceLock<TypeHash> = OnceLock::new();
static STRING_MSG_HASH: OnceLock<TypeHash> = OnceLock::new();

impl RosMessage for Time {
    const TYPE_NAME: &'static str = TIME.type_name;
    const HAS_BUFFER_FIELDS: bool = has_buffer_fields(&TIME);
    const DDS_TYPE_NAME: &'static str = "builtin_interfaces::msg::dds_::Time_";

    fn type_hash() -> TypeHash {
        cached(&TIME_HASH, &TIME)
    }
}

impl RosMessage for Header {
    const TYPE_NAME: &'static str = HEADER.type_name;
    const HAS_BUFFER_FIELDS: bool = has_buffer_fields(&HEADER);
    const DDS_TYPE_NAME: &'static str = "std_msgs::msg::dds_::Header_";

    fn type_hash() -> TypeHash {
        cached(&HEADER_HASH, &HEADER)
    }
}

/// One hash for every data representation `D`.
impl<D> RosMessage for Image<D> {
    const TYPE_NAME: &'static str = IMAGE.type_name;
    const HAS_BUFFER_FIELDS: bool = has_buffer_fields(&IMAGE);
    const DDS_TYPE_NAME: &'static str = "sensor_msgs::msg::dds_::Image_";

    fn type_hash() -> TypeHash {
        cached(&IMAGE_HASH, &IMAGE)
    }
}

/// One hash for every data representation `D`.
impl<D> RosMessage for ExperimentalTensor<D> {
    const TYPE_NAME: &'static str = EXPERIMENTAL_TENSOR.type_name;
    const HAS_BUFFER_FIELDS: bool = has_buffer_fields(&EXPERIMENTAL_TENSOR);
    const DDS_TYPE_NAME: &'static str = "tensor_msgs::msg::dds_::ExperimentalTensor_";

    fn type_hash() -> TypeHash {
        cached(&EXPERIMENTAL_TENSOR_HASH, &EXPERIMENTAL_TENSOR)
    }
}

/// One hash for every text representation `D`.
impl<D> RosMessage for StringMsg<D> {
    const TYPE_NAME: &'static str = STRING_MSG.type_name;
    const HAS_BUFFER_FIELDS: bool = has_buffer_fields(&STRING_MSG);
    const DDS_TYPE_NAME: &'static str = "std_msgs::msg::dds_::String_";

    fn type_hash() -> TypeHash {
        cached(&STRING_MSG_HASH, &STRING_MSG)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // Expected values from research/rmw_zenoh.md §2: String and Header match published
    // values (design.md, ros-z), Image was seen in a third-party log, Time and
    // ExperimentalTensor were recomputed with rosidl's algorithm (and `rosbags` agrees,
    // see tensor-codec/python/test_cdr_rosbags.py).
    const EXPECTED_STRING_HASH: &str = "RIHS01_df668c740482bbd48fb39d76a70dfd4bd59db1288021743503259e948f6b1a18";
    const EXPECTED_HEADER_HASH: &str = "RIHS01_f49fb3ae2cf070f793645ff749683ac6b06203e41c891e17701b1cb597ce6a01";
    const EXPECTED_TIME_HASH: &str = "RIHS01_b106235e25a4c5ed35098aa0a61a3ee9c9b18d197f398b0e4206cea9acf9c197";
    const EXPECTED_IMAGE_HASH: &str = "RIHS01_d31d41a9a4c4bc8eae9be757b0beed306564f7526c88ea6a4588fb9582527d47";
    const EXPECTED_TENSOR_HASH: &str = "RIHS01_3137fa014c7c094b5e604cc24a07f342da9efe8d34af7b7169a3eac8447cab9f";

    #[test]
    fn known_hashes() {
        assert_eq!(Time::type_hash().to_string(), EXPECTED_TIME_HASH);
        assert_eq!(Header::type_hash().to_string(), EXPECTED_HEADER_HASH);
        assert_eq!(Image::<Vec<u8>>::type_hash().to_string(), EXPECTED_IMAGE_HASH);
        assert_eq!(Image::<&[u8]>::type_hash().to_string(), EXPECTED_IMAGE_HASH);
        assert_eq!(ExperimentalTensor::<Vec<u8>>::type_hash().to_string(), EXPECTED_TENSOR_HASH);
    }

    #[test]
    fn buffer_fields_are_top_level_uint8_sequences() {
        const { assert!(<Image<()> as RosMessage>::HAS_BUFFER_FIELDS) };
        const { assert!(<ExperimentalTensor<()> as RosMessage>::HAS_BUFFER_FIELDS) };
        // Header has no uint8[]; Image's is found at the top level, not through Header.
        const { assert!(!<Header as RosMessage>::HAS_BUFFER_FIELDS) };
        const { assert!(!<Time as RosMessage>::HAS_BUFFER_FIELDS) };
        const BYTES_INSIDE: Description =
            Description { type_name: "p/msg/Outer", fields: &[nested("image", IMAGE.type_name)] };
        assert!(!has_buffer_fields(&BYTES_INSIDE));
    }

    #[test]
    fn std_msgs_string_hash() {
        assert_eq!(<StringMsg<()> as RosMessage>::type_hash().to_string(), EXPECTED_STRING_HASH);
        const { assert!(!<StringMsg<()> as RosMessage>::HAS_BUFFER_FIELDS) };
    }

    #[test]
    fn canonical_json_shape() {
        let json = canonical_json(&HEADER);
        assert_eq!(
            json,
            concat!(
                r#"{"type_description": {"type_name": "std_msgs/msg/Header", "fields": ["#,
                r#"{"name": "stamp", "type": {"type_id": 1, "capacity": 0, "string_capacity": 0, "nested_type_name": "builtin_interfaces/msg/Time"}}, "#,
                r#"{"name": "frame_id", "type": {"type_id": 17, "capacity": 0, "string_capacity": 0, "nested_type_name": ""}}]}, "#,
                r#""referenced_type_descriptions": [{"type_name": "builtin_interfaces/msg/Time", "fields": ["#,
                r#"{"name": "sec", "type": {"type_id": 6, "capacity": 0, "string_capacity": 0, "nested_type_name": ""}}, "#,
                r#"{"name": "nanosec", "type": {"type_id": 7, "capacity": 0, "string_capacity": 0, "nested_type_name": ""}}]}]}"#,
            )
        );
        // Image refers to Header and, through it, Time: sorted by name.
        let names: Vec<_> = referenced(&IMAGE).iter().map(|d| d.type_name).collect();
        assert_eq!(names, ["builtin_interfaces/msg/Time", "std_msgs/msg/Header"]);
        assert!(referenced(&EXPERIMENTAL_TENSOR).is_empty());
    }

    #[test]
    fn json_escapes_like_python() {
        let mut s = String::new();
        json_string(&mut s, "a\"b\\c\n\u{1}é😀");
        assert_eq!(s, r#""a\"b\\c\n\u0001\u00e9\ud83d\ude00""#);
    }

    #[test]
    fn names() {
        assert_eq!(Image::<Vec<u8>>::TYPE_NAME, "sensor_msgs/msg/Image");
        assert_eq!(ExperimentalTensor::<Vec<u8>>::DDS_TYPE_NAME, "tensor_msgs::msg::dds_::ExperimentalTensor_");
        for (name, dds) in [
            (Time::TYPE_NAME, Time::DDS_TYPE_NAME),
            (Header::TYPE_NAME, Header::DDS_TYPE_NAME),
            (Image::<Vec<u8>>::TYPE_NAME, Image::<Vec<u8>>::DDS_TYPE_NAME),
            (ExperimentalTensor::<Vec<u8>>::TYPE_NAME, ExperimentalTensor::<Vec<u8>>::DDS_TYPE_NAME),
        ] {
            assert_eq!(dds_type_name(name).as_deref(), Some(dds));
        }
        assert_eq!(dds_type_name("a/srv/B").as_deref(), Some("a::srv::dds_::B_"));
        for bad in ["", "a/b", "a/b/c/d", "/msg/X", "a//X", "a/msg/"] {
            assert_eq!(dds_type_name(bad), None, "{bad}");
        }
    }

    #[test]
    fn parse_round_trip() {
        let h = Image::<Vec<u8>>::type_hash();
        assert_eq!(TypeHash::parse(&h.to_string()), Some(h));
        assert_eq!(TypeHash::from_bytes(*h.as_bytes()), h);
        assert_eq!(TypeHash::parse("RIHS01_00"), None);
        assert_eq!(TypeHash::parse(&EXPECTED_IMAGE_HASH.to_uppercase()), None);
        assert_eq!(TypeHash::parse(&EXPECTED_IMAGE_HASH.replace("RIHS01", "RIHS02")), None);
        assert_eq!(TypeHash::parse(&EXPECTED_IMAGE_HASH.replace('d', "g")), None);
    }
}
