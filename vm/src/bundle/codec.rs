//! Encoding and decoding of bundle bytes: a fixed 24-byte header, then a postcard payload.
//!
//! [`decode`] reads untrusted bytes. It checks the header field by field, in the order
//! `spec/bundle-format.md` lists them, hands the payload to postcard only once its length
//! and checksum are right, and returns the bundle only after [`Bundle::validate`] accepted
//! it. Every failure is a [`BundleError`]; nothing here panics on bad input, and memory use
//! is bounded by a small multiple of the input length (postcard never preallocates more
//! than the remaining input can fill). The semantic rules live in `validate.rs`.

use xxhash_rust::xxh3::xxh3_64;

use super::Bundle;
use crate::Dialect;

/// The 8 magic bytes every bundle starts with.
///
/// Like PNG's signature, they contain a non-ASCII byte, a CR-LF pair and a Ctrl-Z, so
/// a bundle mangled by a text-mode transfer fails the magic check rather than decoding.
pub const MAGIC: [u8; 8] = *b"\x89APLB\r\n\x1a";
/// The bundle format version this VM reads and writes.
///
/// History: 1, the first format; 2 added [`Bundle::inputs`], the declared inputs.
pub const FORMAT_VERSION: u16 = 2;
/// The header flag (high byte) of a bundle whose payload carries a
/// [`Bundle::description`] after the bundle value. Earlier readers refuse every flag in
/// the high byte, so none of them misreads such a bundle.
pub const DESCRIBED: u16 = 0x0100;
/// The header flag (high byte) of a bundle whose payload carries linked agents
/// ([`Bundle::agents`]) after the bundle value and its description: a postcard sequence
/// of `(name, encoded bundle)` pairs, each bundle a complete one with its own header and
/// checksum, decoded as any other.
pub const LINKED: u16 = 0x0200;
/// The most agents one bundle links.
pub const MAX_LINKED_AGENTS: usize = 1024;
/// The flags of the high byte this version defines.
const CONTENT_FLAGS: u16 = DESCRIBED | LINKED;
/// The largest payload, in bytes, that [`encode`] writes and [`decode`] accepts.
pub const MAX_PAYLOAD_LEN: u64 = 64 * 1024 * 1024;

/// Why bytes could not be decoded as a bundle.
///
/// The variants are listed in the order [`decode`] checks for them: the first check that
/// fails decides the error.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum BundleError {
    /// The bytes do not start with [`MAGIC`] (this includes inputs shorter than it).
    #[error("not an aplc bundle: bad magic bytes")]
    BadMagic,
    /// The input ends inside the 24-byte header.
    #[error(
        "bundle header truncated: expected {} bytes, found {found}",
        HEADER_LEN
    )]
    HeaderTruncated {
        /// The length of the whole input.
        found: usize,
    },
    /// The header's format version is not [`FORMAT_VERSION`]. The message names both
    /// versions and says which side is newer, and what to do about it.
    #[error("{}", unsupported_version(*found))]
    UnsupportedVersion {
        /// The version the header declares.
        found: u16,
    },
    /// The header sets flags this version does not define.
    #[error(
        "unknown bundle flags {found:#06x} (format version {} defines the dialect, in the \
         low byte: 0x0000 spec, 0x0001 defuss-1.1; in the high byte, 0x0100, a description \
         follows the bundle value, and 0x0200, linked agents follow it)",
        FORMAT_VERSION
    )]
    UnknownFlags {
        /// The flags the header declares.
        found: u16,
    },
    /// The header declares a payload longer than [`MAX_PAYLOAD_LEN`].
    #[error(
        "absurd bundle payload length: the header declares {declared} bytes, the limit is {}",
        MAX_PAYLOAD_LEN
    )]
    AbsurdLength {
        /// The payload length the header declares.
        declared: u64,
    },
    /// Fewer payload bytes follow the header than it declares.
    #[error("bundle payload truncated: the header declares {declared} bytes, found {found}")]
    PayloadTruncated {
        /// The payload length the header declares.
        declared: u64,
        /// The number of bytes after the header.
        found: u64,
    },
    /// More bytes follow the header than the payload length it declares.
    #[error(
        "trailing bytes after the bundle payload: the header declares {declared} bytes, found {found}"
    )]
    TrailingBytes {
        /// The payload length the header declares.
        declared: u64,
        /// The number of bytes after the header.
        found: u64,
    },
    /// The payload's xxh3-64 hash differs from the header's checksum.
    #[error(
        "bundle checksum mismatch: the header says {expected:#018x}, the payload hashes to {found:#018x}"
    )]
    ChecksumMismatch {
        /// The checksum the header declares.
        expected: u64,
        /// The xxh3-64 hash of the payload as read.
        found: u64,
    },
    /// The payload is not a postcard-encoded [`Bundle`].
    #[error("malformed bundle payload: {0}")]
    Malformed(String),
    /// The payload decoded, but [`Bundle::validate`] rejected it; the message names the
    /// offending table index.
    #[error("invalid bundle: {0}")]
    Invalid(String),
}

/// The message of [`BundleError::UnsupportedVersion`].
#[cold]
fn unsupported_version(found: u16) -> String {
    let this = concat!("aplc ", env!("CARGO_PKG_VERSION"));
    if found > FORMAT_VERSION {
        format!(
            "unsupported bundle format version {found}: the bundle was built by a newer aplc, \
             and {this} reads format version {FORMAT_VERSION}; upgrade aplc to run it, or \
             rebuild it from its .apl source with this aplc"
        )
    } else {
        format!(
            "unsupported bundle format version {found}: the bundle was built by an older aplc, \
             and {this} reads format version {FORMAT_VERSION}; rebuild it from its .apl \
             source with this aplc"
        )
    }
}

/// Returns true when `bytes` start with the bundle magic.
///
/// This only sniffs the file type (to tell a bundle from `.apl` source); [`decode`] does
/// the actual checking.
pub fn is_bundle(bytes: &[u8]) -> bool {
    bytes.starts_with(&MAGIC)
}

/// Encodes a bundle to bytes: the header, then the postcard payload.
///
/// The bundle is not validated here; [`decode`] rejects bytes whose bundle fails
/// [`Bundle::validate`], so callers that build bundles by hand should validate first.
///
/// A payload longer than [`MAX_PAYLOAD_LEN`] is [`BundleError::AbsurdLength`], because no
/// reader would accept it: a source file near the compiler's size limit with hundreds of
/// thousands of tiny steps gets there.
pub fn encode(bundle: &Bundle) -> Result<Vec<u8>, BundleError> {
    // Serialize straight after a zeroed header, then fill the header in, so the payload
    // is never copied.
    let mut bytes = postcard::to_extend(bundle, vec![0u8; HEADER_LEN]).expect(
        "postcard serializes every Bundle: it holds only integers, strings, enums, \
         fixed arrays and sequences of known length",
    );
    let mut flags = bundle.dialect.bundle_flags();
    if let Some(description) = &bundle.description {
        flags |= DESCRIBED;
        bytes = postcard::to_extend(description, bytes).expect("postcard serializes every string");
    }
    if !bundle.agents.is_empty() {
        // What `decode` would refuse is not written.
        if bundle.agents.len() > MAX_LINKED_AGENTS {
            return Err(BundleError::Malformed(format!(
                "{} linked agents, more than {MAX_LINKED_AGENTS}",
                bundle.agents.len()
            )));
        }
        flags |= LINKED;
        let mut linked = Vec::with_capacity(bundle.agents.len());
        for agent in &bundle.agents {
            if !agent.bundle.agents.is_empty() {
                return Err(BundleError::Malformed(format!(
                    "linked agent `{}` links agents of its own: the root bundle holds them all",
                    agent.name
                )));
            }
            linked.push((agent.name.as_str(), encode(&agent.bundle)?));
        }
        bytes = postcard::to_extend(&linked, bytes).expect("postcard serializes strings and bytes");
    }
    let (header, payload) = bytes.split_at_mut(HEADER_LEN);
    let declared = payload.len() as u64;
    let Some(payload_len) = u32::try_from(payload.len())
        .ok()
        .filter(|&len| u64::from(len) <= MAX_PAYLOAD_LEN)
    else {
        return Err(BundleError::AbsurdLength { declared });
    };
    let header_fields = Header {
        version: FORMAT_VERSION,
        flags,
        payload_len,
        checksum: xxh3_64(payload),
    };
    header.copy_from_slice(&header_fields.to_bytes());
    Ok(bytes)
}

/// Decodes and validates untrusted bytes.
///
/// The checks run in a fixed order (magic, header length, version, flags, payload length,
/// checksum, postcard, [`Bundle::validate`]) and the first failure is returned. The
/// version is checked as soon as its two bytes are present, before the rest of the
/// header, so a bundle of a later format version always gets
/// [`BundleError::UnsupportedVersion`] even if that version's header is shorter.
pub fn decode(bytes: &[u8]) -> Result<Bundle, BundleError> {
    let (header, payload) = split_header(bytes)?;
    let declared = u64::from(header.payload_len);
    if declared > MAX_PAYLOAD_LEN {
        return Err(BundleError::AbsurdLength { declared });
    }
    // `usize` is at most 64 bits on every target Rust supports.
    let found = payload.len() as u64;
    if found < declared {
        return Err(BundleError::PayloadTruncated { declared, found });
    }
    if found > declared {
        return Err(BundleError::TrailingBytes { declared, found });
    }
    let hash = xxh3_64(payload);
    if hash != header.checksum {
        return Err(BundleError::ChecksumMismatch {
            expected: header.checksum,
            found: hash,
        });
    }
    let (mut bundle, mut rest) = postcard::take_from_bytes::<Bundle>(payload)
        .map_err(|err| BundleError::Malformed(err.to_string()))?;
    if header.flags & DESCRIBED != 0 {
        let (description, after) = postcard::take_from_bytes::<String>(rest)
            .map_err(|err| BundleError::Malformed(format!("the description: {err}")))?;
        bundle.description = Some(description);
        rest = after;
    }
    if header.flags & LINKED != 0 {
        let (linked, after) = postcard::take_from_bytes::<Vec<(String, Vec<u8>)>>(rest)
            .map_err(|err| BundleError::Malformed(format!("the linked agents: {err}")))?;
        bundle.agents = decode_linked(linked)?;
        rest = after;
    }
    if !rest.is_empty() {
        return Err(BundleError::Malformed(format!(
            "{} unused bytes after the bundle value",
            rest.len()
        )));
    }
    bundle.validate()?;
    // `split_header` checked the flags name a dialect.
    bundle.dialect = Dialect::from_bundle_flags(header.flags & !CONTENT_FLAGS).unwrap_or_default();
    Ok(bundle)
}

/// The linked agents of a payload, each decoded (and validated) as a bundle of its own:
/// named as agents are (`a-z`, digits, `_`, `-`), sorted, unique, at most
/// [`MAX_LINKED_AGENTS`], none linking agents of its own.
fn decode_linked(linked: Vec<(String, Vec<u8>)>) -> Result<Vec<super::LinkedAgent>, BundleError> {
    if linked.len() > MAX_LINKED_AGENTS {
        return Err(BundleError::Malformed(format!(
            "{} linked agents, more than {MAX_LINKED_AGENTS}",
            linked.len()
        )));
    }
    let mut agents: Vec<super::LinkedAgent> = Vec::with_capacity(linked.len());
    for (name, bytes) in linked {
        if !crate::names::is_agent_name(&name) {
            return Err(BundleError::Malformed(format!(
                "linked agent {name:?}: not an agent name"
            )));
        }
        if let Some(last) = agents.last()
            && last.name >= name
        {
            return Err(BundleError::Malformed(format!(
                "linked agent `{name}`: the agents are not sorted by name, or one repeats"
            )));
        }
        let bundle = decode(&bytes)
            .map_err(|err| BundleError::Malformed(format!("linked agent `{name}`: {err}")))?;
        if !bundle.agents.is_empty() {
            return Err(BundleError::Malformed(format!(
                "linked agent `{name}` links agents of its own"
            )));
        }
        agents.push(super::LinkedAgent { name, bundle });
    }
    Ok(agents)
}

/// The fields of a bundle's 24-byte header, as [`Bundle::read_header`] returns them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HeaderFields {
    /// The bundle format version.
    pub version: u16,
    /// Format flags: the low byte is the program's dialect (0 spec, 1 defuss-1.1); the
    /// high byte holds [`DESCRIBED`] when a description follows the bundle value and
    /// [`LINKED`] when linked agents follow it.
    pub flags: u16,
    /// The length of the postcard payload that follows the header, in bytes.
    pub payload_len: u32,
    /// The xxh3-64 hash of the payload.
    pub checksum: u64,
}

impl Bundle {
    /// Reads the header of untrusted bytes: the magic, the format version and the
    /// flags are checked as [`decode`] checks them, in the same order and with the same
    /// errors. The payload is not looked at, so its length and checksum are returned as
    /// declared, not verified: call [`decode`] for that.
    pub fn read_header(bytes: &[u8]) -> Result<HeaderFields, BundleError> {
        let (header, _) = split_header(bytes)?;
        Ok(HeaderFields {
            version: header.version,
            flags: header.flags,
            payload_len: header.payload_len,
            checksum: header.checksum,
        })
    }
}

/// Checks the magic, the format version and the flags, in that order, and splits the
/// header from the payload. Both [`decode`] and [`Bundle::read_header`] start here, so
/// they reject the same bytes with the same errors.
fn split_header(bytes: &[u8]) -> Result<(Header, &[u8]), BundleError> {
    if !is_bundle(bytes) {
        return Err(BundleError::BadMagic);
    }
    let truncated = || BundleError::HeaderTruncated { found: bytes.len() };
    let (prefix, _) = bytes
        .split_first_chunk::<VERSION_END>()
        .ok_or_else(truncated)?;
    // The version is checked as soon as its two bytes are present, so a later format
    // with a shorter header still gets `UnsupportedVersion`.
    let version = u16::from_le_bytes([prefix[8], prefix[9]]);
    if version != FORMAT_VERSION {
        return Err(BundleError::UnsupportedVersion { found: version });
    }
    let (header, payload) = bytes
        .split_first_chunk::<HEADER_LEN>()
        .ok_or_else(truncated)?;
    let header = Header::from_bytes(header);
    if Dialect::from_bundle_flags(header.flags & !CONTENT_FLAGS).is_none() {
        return Err(BundleError::UnknownFlags {
            found: header.flags,
        });
    }
    Ok((header, payload))
}

/// Length of the fixed header.
const HEADER_LEN: usize = 24;
/// End of the format version field: the magic plus the version.
const VERSION_END: usize = 10;

/// The header fields after the magic.
struct Header {
    version: u16,
    flags: u16,
    payload_len: u32,
    checksum: u64,
}

impl Header {
    fn from_bytes(bytes: &[u8; HEADER_LEN]) -> Header {
        let [
            _,
            _,
            _,
            _,
            _,
            _,
            _,
            _,
            v0,
            v1,
            f0,
            f1,
            l0,
            l1,
            l2,
            l3,
            c @ ..,
        ] = *bytes;
        Header {
            version: u16::from_le_bytes([v0, v1]),
            flags: u16::from_le_bytes([f0, f1]),
            payload_len: u32::from_le_bytes([l0, l1, l2, l3]),
            checksum: u64::from_le_bytes(c),
        }
    }

    fn to_bytes(&self) -> [u8; HEADER_LEN] {
        let mut bytes = [0u8; HEADER_LEN];
        bytes[..8].copy_from_slice(&MAGIC);
        bytes[8..10].copy_from_slice(&self.version.to_le_bytes());
        bytes[10..12].copy_from_slice(&self.flags.to_le_bytes());
        bytes[12..16].copy_from_slice(&self.payload_len.to_le_bytes());
        bytes[16..24].copy_from_slice(&self.checksum.to_le_bytes());
        bytes
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bundle::{
        Edge, EdgeTarget, Instr, LinkedAgent, MessageEntry, Role, SourceSpan, StepEntry, StepId,
        TemplateEntry, TemplateId, TemplateKind,
    };

    /// Two steps, `start` and `finish`, each with a system and a user message and a
    /// post phase; `start` goes to `finish`, `finish` returns.
    fn sample() -> Bundle {
        let span = |line: u32| SourceSpan {
            start: line * 10,
            end: line * 10 + 9,
            line,
            col: 1,
        };
        let template = |source: &str, step: u32, kind: TemplateKind, line: u32| TemplateEntry {
            source: source.to_owned(),
            step: StepId(step),
            kind,
            span: span(line),
        };
        let step_code = |step: u32, first_message: u32, post: u32| {
            [
                Instr::EnterStep(StepId(step)),
                Instr::BuildPrompts {
                    first: first_message,
                    count: 2,
                },
                Instr::CallProvider,
                Instr::ProcessResponse,
                Instr::CallTools,
                Instr::ClearNextStep,
                Instr::RenderPost(TemplateId(post)),
                Instr::Snapshot,
                Instr::Branch,
            ]
        };
        let code: Vec<Instr> = step_code(0, 0, 2)
            .into_iter()
            .chain(step_code(1, 2, 5))
            .collect();
        Bundle {
            compiler_version: "0.1.0".to_owned(),
            source_name: "sample.apl".to_owned(),
            source_hash: [7; 32],
            inputs: vec!["topic".to_owned()],
            steps: vec![
                StepEntry {
                    name: "start".to_owned(),
                    entry: 0,
                    span: span(1),
                },
                StepEntry {
                    name: "finish".to_owned(),
                    entry: 9,
                    span: span(8),
                },
            ],
            templates: vec![
                template("You are terse.", 0, TemplateKind::Prompt(Role::System), 2),
                template("Say hi.", 0, TemplateKind::Prompt(Role::User), 4),
                template(
                    "{{ set_context('next_step', 'finish') }}",
                    0,
                    TemplateKind::Post,
                    6,
                ),
                template("You are kind.", 1, TemplateKind::Prompt(Role::System), 9),
                template("Say bye.", 1, TemplateKind::Prompt(Role::User), 11),
                template("", 1, TemplateKind::Post, 13),
            ],
            messages: vec![
                MessageEntry {
                    role: Role::System,
                    template: TemplateId(0),
                },
                MessageEntry {
                    role: Role::User,
                    template: TemplateId(1),
                },
                MessageEntry {
                    role: Role::System,
                    template: TemplateId(3),
                },
                MessageEntry {
                    role: Role::User,
                    template: TemplateId(4),
                },
            ],
            code_spans: (0..code.len() as u32).map(span).collect(),
            code,
            edges: vec![
                Edge {
                    from: StepId(0),
                    to: EdgeTarget::Step(StepId(1)),
                    span: span(6),
                },
                Edge {
                    from: StepId(1),
                    to: EdgeTarget::Return,
                    span: span(13),
                },
            ],
            dialect: Dialect::Spec,
            description: None,
            agents: Vec::new(),
        }
    }

    /// Wraps `payload` in a header with a correct length and checksum.
    fn with_header(payload: &[u8]) -> Vec<u8> {
        let header = Header {
            version: FORMAT_VERSION,
            flags: 0,
            payload_len: payload.len() as u32,
            checksum: xxh3_64(payload),
        };
        let mut bytes = header.to_bytes().to_vec();
        bytes.extend_from_slice(payload);
        bytes
    }

    /// The validation message for `bundle`, encoded and decoded.
    fn invalid(bundle: &Bundle) -> String {
        let direct = bundle.validate().expect_err("bundle should be invalid");
        assert_eq!(
            decode(&encode(bundle).expect("encodes")),
            Err(direct.clone())
        );
        match direct {
            BundleError::Invalid(message) => message,
            other => panic!("expected BundleError::Invalid, got {other:?}"),
        }
    }

    #[test]
    fn an_oversized_payload_is_an_error_not_a_panic() {
        let mut bundle = sample();
        bundle.templates[0].source = "x".repeat(MAX_PAYLOAD_LEN as usize + 1);
        assert!(matches!(
            encode(&bundle),
            Err(BundleError::AbsurdLength { .. })
        ));
    }

    #[test]
    fn round_trip() {
        let bundle = sample();
        assert_eq!(bundle.validate(), Ok(()));
        let bytes = encode(&bundle).expect("encodes");
        assert!(is_bundle(&bytes));
        assert_eq!(bytes[..8], MAGIC);
        assert_eq!(bytes[8..10], [2, 0]);
        assert_eq!(bytes[10..12], [0, 0]);
        let len = u32::from_le_bytes(bytes[12..16].try_into().unwrap());
        assert_eq!(len as usize, bytes.len() - HEADER_LEN);
        let checksum = u64::from_le_bytes(bytes[16..24].try_into().unwrap());
        assert_eq!(checksum, xxh3_64(&bytes[HEADER_LEN..]));
        assert_eq!(decode(&bytes), Ok(bundle));
    }

    #[test]
    fn a_description_follows_the_bundle_value_under_its_flag() {
        let mut bundle = sample();
        let plain = encode(&bundle).expect("encodes");
        bundle.description = Some("Says hi, then bye.".to_owned());
        bundle.dialect = Dialect::Defuss11;
        let bytes = encode(&bundle).expect("encodes");
        assert_eq!(bytes[10..12], (DESCRIBED | 1).to_le_bytes());
        assert_eq!(decode(&bytes), Ok(bundle.clone()));
        // The bundle value itself is unchanged: the description only follows it.
        assert!(bytes.len() > plain.len());
        // A described bundle whose string is cut off is malformed, not a panic.
        let payload = &bytes[HEADER_LEN..bytes.len() - 3];
        let mut cut = with_header(payload);
        cut[10..12].copy_from_slice(&DESCRIBED.to_le_bytes());
        assert!(matches!(decode(&cut), Err(BundleError::Malformed(_))));
        // Any other high-byte flag is still unknown.
        let mut other = plain.clone();
        other[10..12].copy_from_slice(&0x0400u16.to_le_bytes());
        assert_eq!(
            decode(&other),
            Err(BundleError::UnknownFlags { found: 0x0400 })
        );
    }

    #[test]
    fn linked_agents_follow_the_bundle_value_under_their_flag() {
        let mut bundle = sample();
        let plain = encode(&bundle).expect("encodes");
        let mut child = sample();
        child.source_name = "translator.apl".to_owned();
        child.description = Some("Translates.".to_owned());
        bundle.agents = vec![
            LinkedAgent {
                name: "a-child".to_owned(),
                bundle: sample(),
            },
            LinkedAgent {
                name: "translator".to_owned(),
                bundle: child.clone(),
            },
        ];
        let bytes = encode(&bundle).expect("encodes");
        assert_eq!(bytes[10..12], LINKED.to_le_bytes());
        assert_eq!(decode(&bytes), Ok(bundle.clone()));
        // Without agents, the bytes are what earlier builds wrote.
        bundle.agents.clear();
        assert_eq!(encode(&bundle).expect("encodes"), plain);

        // Unsorted or repeated names, bad names, nested links and damaged children are
        // malformed bundles, never panics.
        let linked = |agents: Vec<(&str, Vec<u8>)>| {
            let mut payload = plain[HEADER_LEN..].to_vec();
            payload = postcard::to_extend(&agents, payload).unwrap();
            let mut bytes = with_header(&payload);
            bytes[10..12].copy_from_slice(&LINKED.to_le_bytes());
            decode(&bytes)
        };
        let child_bytes = encode(&child).unwrap();
        assert!(linked(vec![("b", child_bytes.clone()), ("a", child_bytes.clone())]).is_err());
        assert!(linked(vec![("a", child_bytes.clone()), ("a", child_bytes.clone())]).is_err());
        assert!(linked(vec![("../x", child_bytes.clone())]).is_err());
        assert!(linked(vec![("a", child_bytes[..child_bytes.len() - 1].to_vec())]).is_err());
        let mut nested = child.clone();
        nested.agents = vec![LinkedAgent {
            name: "z".to_owned(),
            bundle: sample(),
        }];
        let nested_bytes = encode(&nested).unwrap();
        let err = linked(vec![("a", nested_bytes)]).unwrap_err();
        assert!(err.to_string().contains("links agents of its own"), "{err}");
        assert!(matches!(
            linked(vec![("a", child_bytes)]),
            Ok(Bundle { ref agents, .. }) if agents.len() == 1
        ));
        let mut outer = sample();
        outer.agents = vec![LinkedAgent {
            name: "x".to_owned(),
            bundle: nested,
        }];
        assert!(encode(&outer).is_err());
    }

    #[test]
    fn read_header_returns_the_fields_and_checks_like_decode() {
        let bytes = encode(&sample()).expect("encodes");
        let header = Bundle::read_header(&bytes).unwrap();
        assert_eq!(header.version, FORMAT_VERSION);
        assert_eq!(header.flags, 0);
        assert_eq!(header.payload_len as usize, bytes.len() - HEADER_LEN);
        assert_eq!(header.checksum, xxh3_64(&bytes[HEADER_LEN..]));
        assert_eq!(Bundle::read_header(b"# prompt"), Err(BundleError::BadMagic));
        assert_eq!(
            Bundle::read_header(&bytes[..12]),
            Err(BundleError::HeaderTruncated { found: 12 })
        );
        let newer = FORMAT_VERSION + 1;
        let mut later = bytes.clone();
        later[8..10].copy_from_slice(&newer.to_le_bytes());
        assert_eq!(
            Bundle::read_header(&later),
            Err(BundleError::UnsupportedVersion { found: newer })
        );
        let mut flagged = bytes;
        flagged[10] = 2;
        assert_eq!(
            Bundle::read_header(&flagged),
            Err(BundleError::UnknownFlags { found: 2 })
        );
    }

    #[test]
    fn is_bundle_sniffs_only_the_magic() {
        assert!(is_bundle(&MAGIC));
        assert!(!is_bundle(b"# start\n"));
        assert!(!is_bundle(&MAGIC[..7]));
    }

    #[test]
    fn bad_magic() {
        let mut bytes = encode(&sample()).expect("encodes");
        bytes[1] ^= 0x20;
        assert_eq!(decode(&bytes), Err(BundleError::BadMagic));
        assert_eq!(decode(&[]), Err(BundleError::BadMagic));
        assert_eq!(decode(&MAGIC[..5]), Err(BundleError::BadMagic));
        assert_eq!(
            BundleError::BadMagic.to_string(),
            "not an aplc bundle: bad magic bytes"
        );
    }

    #[test]
    fn header_truncated() {
        let bytes = encode(&sample()).expect("encodes");
        for len in [8, 9, 10, 23] {
            assert_eq!(
                decode(&bytes[..len]),
                Err(BundleError::HeaderTruncated { found: len })
            );
        }
        assert_eq!(
            BundleError::HeaderTruncated { found: 9 }.to_string(),
            "bundle header truncated: expected 24 bytes, found 9"
        );
    }

    #[test]
    fn unsupported_version() {
        let mut bytes = encode(&sample()).expect("encodes");
        let newer = FORMAT_VERSION + 1;
        bytes[8..10].copy_from_slice(&newer.to_le_bytes());
        assert_eq!(
            decode(&bytes),
            Err(BundleError::UnsupportedVersion { found: newer })
        );
        // A later version wins over a header that is short by this version's layout.
        assert_eq!(
            decode(&bytes[..12]),
            Err(BundleError::UnsupportedVersion { found: newer })
        );
        let this = env!("CARGO_PKG_VERSION");
        assert_eq!(
            BundleError::UnsupportedVersion { found: 7 }.to_string(),
            format!(
                "unsupported bundle format version 7: the bundle was built by a newer aplc, \
                 and aplc {this} reads format version 2; upgrade aplc to run it, or rebuild \
                 it from its .apl source with this aplc"
            )
        );
        assert_eq!(
            BundleError::UnsupportedVersion { found: 1 }.to_string(),
            format!(
                "unsupported bundle format version 1: the bundle was built by an older aplc, \
                 and aplc {this} reads format version 2; rebuild it from its .apl source \
                 with this aplc"
            )
        );
    }

    #[test]
    fn unknown_flags() {
        let mut bytes = encode(&sample()).expect("encodes");
        bytes[10] = 0x04;
        let err = decode(&bytes).unwrap_err();
        assert_eq!(err, BundleError::UnknownFlags { found: 4 });
        assert_eq!(
            err.to_string(),
            "unknown bundle flags 0x0004 (format version 2 defines the dialect, in the low \
             byte: 0x0000 spec, 0x0001 defuss-1.1; in the high byte, 0x0100, a description \
             follows the bundle value, and 0x0200, linked agents follow it)"
        );
        bytes[10] = 0;
        bytes[11] = 0x04;
        assert_eq!(
            decode(&bytes).unwrap_err(),
            BundleError::UnknownFlags { found: 0x0400 }
        );
    }

    #[test]
    fn the_dialect_is_in_the_flags_and_a_spec_bundle_has_none() {
        let spec = encode(&sample()).expect("encodes");
        assert_eq!(&spec[10..12], &[0, 0]);
        assert_eq!(decode(&spec).expect("decodes").dialect, Dialect::Spec);

        let mut defuss = sample();
        defuss.dialect = Dialect::Defuss11;
        let bytes = encode(&defuss).expect("encodes");
        assert_eq!(&bytes[10..12], &[1, 0]);
        // The payload is the same: only the header says which dialect.
        assert_eq!(bytes[24..], spec[24..]);
        assert_eq!(decode(&bytes).expect("decodes"), defuss);
        assert_eq!(Bundle::read_header(&bytes).expect("reads").flags, 1);
    }

    #[test]
    fn absurd_length() {
        let mut bytes = encode(&sample()).expect("encodes");
        bytes[12..16].copy_from_slice(&(1u32 << 31).to_le_bytes());
        let err = decode(&bytes).unwrap_err();
        assert_eq!(err, BundleError::AbsurdLength { declared: 1 << 31 });
        assert_eq!(
            err.to_string(),
            "absurd bundle payload length: the header declares 2147483648 bytes, \
             the limit is 67108864"
        );
    }

    #[test]
    fn payload_truncated() {
        let bytes = encode(&sample()).expect("encodes");
        let declared = (bytes.len() - HEADER_LEN) as u64;
        assert_eq!(
            decode(&bytes[..bytes.len() - 1]),
            Err(BundleError::PayloadTruncated {
                declared,
                found: declared - 1
            })
        );
        assert_eq!(
            decode(&bytes[..HEADER_LEN]),
            Err(BundleError::PayloadTruncated { declared, found: 0 })
        );
    }

    #[test]
    fn trailing_bytes() {
        let mut bytes = encode(&sample()).expect("encodes");
        let declared = (bytes.len() - HEADER_LEN) as u64;
        bytes.push(0);
        assert_eq!(
            decode(&bytes),
            Err(BundleError::TrailingBytes {
                declared,
                found: declared + 1
            })
        );
    }

    #[test]
    fn checksum_mismatch() {
        let mut bytes = encode(&sample()).expect("encodes");
        let expected = xxh3_64(&bytes[HEADER_LEN..]);
        let last = bytes.len() - 1;
        bytes[last] ^= 1;
        let found = xxh3_64(&bytes[HEADER_LEN..]);
        let err = decode(&bytes).unwrap_err();
        assert_eq!(err, BundleError::ChecksumMismatch { expected, found });
        let message = err.to_string();
        assert!(
            message.contains(&format!("{expected:#018x}"))
                && message.contains(&format!("{found:#018x}")),
            "{message}"
        );
    }

    #[test]
    fn malformed_payload() {
        // A string length far past the end of the input.
        let err = decode(&with_header(&[0xff, 0xff, 0xff, 0x0f, b'x'])).unwrap_err();
        assert!(
            matches!(&err, BundleError::Malformed(message) if !message.is_empty()),
            "{err:?}"
        );
        assert!(err.to_string().starts_with("malformed bundle payload: "));
        assert!(matches!(
            decode(&with_header(&[])),
            Err(BundleError::Malformed(_))
        ));
    }

    #[test]
    fn unused_payload_bytes_are_malformed() {
        let mut payload = postcard::to_allocvec(&sample()).unwrap();
        payload.push(0);
        assert_eq!(
            decode(&with_header(&payload)),
            Err(BundleError::Malformed(
                "1 unused bytes after the bundle value".to_owned()
            ))
        );
    }

    #[test]
    fn invalid_bundle_error_message() {
        let mut bundle = sample();
        bundle.steps.clear();
        assert_eq!(
            invalid(&bundle),
            "the step table is empty (a bundle needs at least one step)"
        );
        assert_eq!(
            decode(&encode(&bundle).expect("encodes"))
                .unwrap_err()
                .to_string(),
            "invalid bundle: the step table is empty (a bundle needs at least one step)"
        );
    }

    #[test]
    fn step_names_non_empty_and_unique() {
        let mut bundle = sample();
        bundle.steps[1].name.clear();
        assert_eq!(invalid(&bundle), "step 1 has an empty name");
        bundle.steps[1].name = "start".to_owned();
        assert_eq!(
            invalid(&bundle),
            "step 1 has the same name `start` as step 0"
        );
    }

    #[test]
    fn code_spans_match_code() {
        let mut bundle = sample();
        bundle.code_spans.pop();
        assert_eq!(
            invalid(&bundle),
            "the span table has 17 entries but the code has 18 instructions"
        );
    }

    #[test]
    fn first_step_starts_at_zero() {
        let mut bundle = sample();
        bundle.code.insert(0, Instr::Snapshot);
        bundle.code_spans.insert(0, SourceSpan::default());
        bundle.steps[0].entry = 1;
        bundle.steps[1].entry = 10;
        assert_eq!(
            invalid(&bundle),
            "step 0 starts at instruction 1, expected 0"
        );
    }

    #[test]
    fn steps_in_entry_order() {
        let mut bundle = sample();
        bundle.steps[1].entry = 0;
        assert_eq!(
            invalid(&bundle),
            "step 1 starts at instruction 0, not after step 0 (at 0): \
             steps must be in entry order"
        );
    }

    #[test]
    fn entry_inside_code() {
        let mut bundle = sample();
        bundle.steps[1].entry = 18;
        assert_eq!(
            invalid(&bundle),
            "step 1 starts at instruction 18, but the code has only 18 instructions"
        );
        let mut bundle = sample();
        bundle.code.clear();
        bundle.code_spans.clear();
        assert_eq!(
            invalid(&bundle),
            "step 0 starts at instruction 0, but the code has only 0 instructions"
        );
    }

    #[test]
    fn segment_starts_with_own_enter_step() {
        let mut bundle = sample();
        bundle.code[9] = Instr::EnterStep(StepId(0));
        assert_eq!(
            invalid(&bundle),
            "instruction 9, the entry of step 1, is EnterStep(StepId(0)), \
             expected EnterStep(StepId(1))"
        );
        let mut bundle = sample();
        bundle.code[0] = Instr::Snapshot;
        assert_eq!(
            invalid(&bundle),
            "instruction 0, the entry of step 0, is Snapshot, expected EnterStep(StepId(0))"
        );
    }

    #[test]
    fn segment_ends_with_branch() {
        let mut bundle = sample();
        bundle.code[17] = Instr::Snapshot;
        assert_eq!(
            invalid(&bundle),
            "instruction 17, the last of step 1, is Snapshot, expected Branch"
        );
        // A one-instruction step cannot both enter and branch.
        let mut bundle = sample();
        bundle.code.truncate(10);
        bundle.code_spans.truncate(10);
        assert_eq!(
            invalid(&bundle),
            "instruction 9, the last of step 1, is EnterStep(StepId(1)), expected Branch"
        );
    }

    #[test]
    fn no_enter_step_or_branch_inside_a_segment() {
        let mut bundle = sample();
        bundle.code[4] = Instr::Branch;
        assert_eq!(
            invalid(&bundle),
            "instruction 4 in step 0 is a Branch; only the last instruction of a step may be"
        );
        let mut bundle = sample();
        bundle.code[12] = Instr::EnterStep(StepId(1));
        assert_eq!(
            invalid(&bundle),
            "instruction 12 in step 1 is an EnterStep(StepId(1)); \
             only the first instruction of a step may be"
        );
    }

    #[test]
    fn template_ids_in_range() {
        let mut bundle = sample();
        bundle.code[15] = Instr::RenderPost(TemplateId(6));
        assert_eq!(
            invalid(&bundle),
            "instruction 15 (RenderPost) refers to template 6, but there are only 6 templates"
        );
        let mut bundle = sample();
        bundle.code[1] = Instr::RenderPre(TemplateId(99));
        assert_eq!(
            invalid(&bundle),
            "instruction 1 (RenderPre) refers to template 99, but there are only 6 templates"
        );
        let mut bundle = sample();
        bundle.messages[3].template = TemplateId(6);
        assert_eq!(
            invalid(&bundle),
            "message 3 refers to template 6, but there are only 6 templates"
        );
    }

    #[test]
    fn step_ids_in_range() {
        let mut bundle = sample();
        bundle.templates[5].step = StepId(2);
        assert_eq!(
            invalid(&bundle),
            "template 5 belongs to step 2, but there are only 2 steps"
        );
        let mut bundle = sample();
        bundle.edges[1].from = StepId(2);
        assert_eq!(
            invalid(&bundle),
            "edge 1 starts at step 2, but there are only 2 steps"
        );
        let mut bundle = sample();
        bundle.edges[0].to = EdgeTarget::Step(StepId(5));
        assert_eq!(
            invalid(&bundle),
            "edge 0 goes to step 5, but there are only 2 steps"
        );
    }

    #[test]
    fn message_ranges_in_range() {
        let mut bundle = sample();
        bundle.code[10] = Instr::BuildPrompts { first: 2, count: 3 };
        assert_eq!(
            invalid(&bundle),
            "instruction 10 (BuildPrompts) covers messages 2..5, but there are only 4 messages"
        );
        let mut bundle = sample();
        bundle.code[1] = Instr::BuildPrompts {
            first: u32::MAX,
            count: 1,
        };
        assert_eq!(
            invalid(&bundle),
            "instruction 1 (BuildPrompts) covers messages 4294967295 + 1, \
             which overflows a u32"
        );
        // An empty range at the end of the table is fine.
        let mut bundle = sample();
        bundle.code[10] = Instr::BuildPrompts { first: 4, count: 0 };
        assert_eq!(bundle.validate(), Ok(()));
    }
}
