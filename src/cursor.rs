//! The one cursor codec.
//!
//! A cursor is `base64url(version ‖ kind ‖ resource ‖ position ‖ [binding] ‖ tag)` where `tag`
//! is a truncated HMAC-SHA256 over everything before it, keyed by a secret kept in the data dir.
//! So a cursor is opaque to clients, tamper-evident, survives restarts, and is bound to the
//! endpoint (`kind`) and resource (sheet or report id) it came from: any other use is a 422.
//!
//! A cursor of a listRows request with `filter` or `fields` is also bound to them: version 2
//! carries the request's [`query_binding`] (a hash of their normalized form), and a cursor
//! presented with another binding is refused. Version 1 (no binding, read as binding 0) is what
//! every other request gets, so cursors issued before bindings existed stay valid where no
//! filter or fields are given.

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine;
use hmac::{Hmac, Mac};
use sha2::{Digest, Sha256};

const TAG_LEN: usize = 12;
/// Version 1: version, kind, resource, position.
const BODY_V1: usize = 1 + 1 + 8 + 8;
/// Version 2: version 1 and a query binding.
const BODY_V2: usize = BODY_V1 + 8;

/// The binding of a request's query (the normalized text of what the cursor is bound to, empty
/// for nothing): the first 8 bytes of its SHA-256, never 0, or 0 for the empty text.
pub fn query_binding(normalized: &str) -> u64 {
    if normalized.is_empty() {
        return 0;
    }
    let digest = Sha256::digest(normalized.as_bytes());
    u64::from_be_bytes(digest[..8].try_into().expect("8 bytes")).max(1)
}

/// What a cursor pages through.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum Kind {
    /// `GET /sheets` (resource 0).
    Sheets = 1,
    /// `GET /sheets/{id}/rows` and the rows inside `GET /sheets/{id}`.
    Rows = 2,
    /// `GET /reports` (resource 0).
    Reports = 3,
    /// `POST /reports/{id}/run`.
    ReportRun = 4,
    /// `GET /sheets/{id}/changes` (position: the `seq` of the next change to read).
    Changes = 5,
    /// `GET /webhooks` (resource: the calling key's id; position: the last webhook id seen).
    Webhooks = 6,
}

/// Why a cursor was refused.
#[derive(Debug, PartialEq, Eq)]
pub enum CursorError {
    /// Not a cursor at all, or altered.
    Malformed,
    /// A real cursor of another endpoint or resource.
    WrongPlace,
    /// A real cursor of this resource, issued for another `filter` or `fields`.
    OtherQuery,
}

/// Signs and checks cursors.
#[derive(Clone)]
pub struct CursorCodec {
    key: [u8; 32],
    /// The HMAC keyed with `key`, before any message: cloned for each tag, so a tag costs the
    /// message's hashing only, not the key's two blocks again (every page of rows signs one
    /// cursor and checks another).
    keyed: Hmac<Sha256>,
}

impl CursorCodec {
    /// A codec with a secret key.
    pub fn new(key: [u8; 32]) -> Self {
        let keyed = Hmac::<Sha256>::new_from_slice(&key).expect("HMAC takes any key length");
        CursorCodec { key, keyed }
    }

    /// The key, for a backup to carry (cursors keep their meaning on a restored server).
    pub fn key(&self) -> &[u8; 32] {
        &self.key
    }

    fn tag(&self, body: &[u8]) -> [u8; TAG_LEN] {
        let mut mac = self.keyed.clone();
        mac.update(body);
        let full = mac.finalize().into_bytes();
        let mut tag = [0; TAG_LEN];
        tag.copy_from_slice(&full[..TAG_LEN]);
        tag
    }

    /// A cursor for `position` (the last id seen, or an offset) in `resource` of `kind`.
    pub fn encode(&self, kind: Kind, resource: u64, position: u64) -> String {
        self.encode_bound(kind, resource, position, 0)
    }

    /// A cursor as [`CursorCodec::encode`], also bound to a [`query_binding`] (0: none).
    pub fn encode_bound(&self, kind: Kind, resource: u64, position: u64, binding: u64) -> String {
        let mut bytes = Vec::with_capacity(BODY_V2 + TAG_LEN);
        bytes.push(if binding == 0 { 1 } else { 2 });
        bytes.push(kind as u8);
        bytes.extend_from_slice(&resource.to_be_bytes());
        bytes.extend_from_slice(&position.to_be_bytes());
        if binding != 0 {
            bytes.extend_from_slice(&binding.to_be_bytes());
        }
        let tag = self.tag(&bytes);
        bytes.extend_from_slice(&tag);
        URL_SAFE_NO_PAD.encode(bytes)
    }

    /// The position of a cursor, if it is genuine and belongs to `kind` and `resource`.
    pub fn decode(&self, cursor: &str, kind: Kind, resource: u64) -> Result<u64, CursorError> {
        self.decode_bound(cursor, kind, resource, 0)
    }

    /// The position of a cursor, if it is genuine, belongs to `kind` and `resource`, and was
    /// issued for `binding`.
    pub fn decode_bound(
        &self,
        cursor: &str,
        kind: Kind,
        resource: u64,
        binding: u64,
    ) -> Result<u64, CursorError> {
        let bytes = URL_SAFE_NO_PAD.decode(cursor).map_err(|_| CursorError::Malformed)?;
        let body_len = match bytes.first() {
            Some(1) => BODY_V1,
            Some(2) => BODY_V2,
            _ => return Err(CursorError::Malformed),
        };
        if bytes.len() != body_len + TAG_LEN {
            return Err(CursorError::Malformed);
        }
        let (body, tag) = bytes.split_at(body_len);
        let mut mac = self.keyed.clone();
        mac.update(body);
        mac.verify_truncated_left(tag).map_err(|_| CursorError::Malformed)?;
        let word = |at: usize| u64::from_be_bytes(body[at..at + 8].try_into().expect("8 bytes"));
        if body[1] != kind as u8 || word(2) != resource {
            return Err(CursorError::WrongPlace);
        }
        let issued_for = if body_len == BODY_V2 { word(18) } else { 0 };
        if issued_for != binding {
            return Err(CursorError::OtherQuery);
        }
        Ok(word(10))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_and_binding() {
        let c = CursorCodec::new([7; 32]);
        let cur = c.encode(Kind::Rows, 10, 1234);
        assert_eq!(c.decode(&cur, Kind::Rows, 10), Ok(1234));
        assert_eq!(c.decode(&cur, Kind::Rows, 11), Err(CursorError::WrongPlace));
        assert_eq!(c.decode(&cur, Kind::Sheets, 10), Err(CursorError::WrongPlace));
        assert_eq!(
            CursorCodec::new([8; 32]).decode(&cur, Kind::Rows, 10),
            Err(CursorError::Malformed)
        );
        assert_eq!(c.decode("not a cursor", Kind::Rows, 10), Err(CursorError::Malformed));
    }

    #[test]
    fn a_bound_cursor_serves_only_its_query_and_unbound_ones_only_none() {
        let c = CursorCodec::new([7; 32]);
        let (a, b) = (query_binding("filter=a"), query_binding("filter=b"));
        assert_eq!(query_binding(""), 0);
        assert!(a != 0 && a != b);
        let bound = c.encode_bound(Kind::Rows, 10, 55, a);
        assert_eq!(c.decode_bound(&bound, Kind::Rows, 10, a), Ok(55));
        assert_eq!(c.decode_bound(&bound, Kind::Rows, 10, b), Err(CursorError::OtherQuery));
        assert_eq!(c.decode(&bound, Kind::Rows, 10), Err(CursorError::OtherQuery));
        assert_eq!(c.decode_bound(&bound, Kind::Rows, 11, a), Err(CursorError::WrongPlace));
        let plain = c.encode(Kind::Rows, 10, 55);
        assert_eq!(c.encode_bound(Kind::Rows, 10, 55, 0), plain, "binding 0 is version 1");
        assert_eq!(c.decode_bound(&plain, Kind::Rows, 10, a), Err(CursorError::OtherQuery));
        let raw = URL_SAFE_NO_PAD.decode(&bound).unwrap();
        for i in 0..raw.len() {
            let mut bad = raw.clone();
            bad[i] ^= 0x01;
            let bad = URL_SAFE_NO_PAD.encode(&bad);
            assert!(c.decode_bound(&bad, Kind::Rows, 10, a).is_err(), "byte {i}");
        }
    }

    #[test]
    fn every_altered_byte_is_refused() {
        let c = CursorCodec::new([1; 32]);
        let raw = URL_SAFE_NO_PAD.decode(c.encode(Kind::Rows, 10, 99)).unwrap();
        for i in 0..raw.len() {
            let mut bad = raw.clone();
            bad[i] ^= 0x01;
            assert!(c.decode(&URL_SAFE_NO_PAD.encode(&bad), Kind::Rows, 10).is_err(), "byte {i}");
        }
    }
}
