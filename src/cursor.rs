//! The one cursor codec.
//!
//! A cursor is `base64url(version ‖ kind ‖ resource ‖ position ‖ tag)` where `tag` is a
//! truncated HMAC-SHA256 over everything before it, keyed by a secret kept in the data dir. So a
//! cursor is opaque to clients, tamper-evident, survives restarts, and is bound to the endpoint
//! (`kind`) and resource (sheet or report id) it came from: any other use is a 422.

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine;
use hmac::{Hmac, Mac};
use sha2::Sha256;

const VERSION: u8 = 1;
const TAG_LEN: usize = 12;
const BODY_LEN: usize = 1 + 1 + 8 + 8;

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
}

/// Why a cursor was refused.
#[derive(Debug, PartialEq, Eq)]
pub enum CursorError {
    /// Not a cursor at all, or altered.
    Malformed,
    /// A real cursor of another endpoint or resource.
    WrongPlace,
}

/// Signs and checks cursors.
#[derive(Clone)]
pub struct CursorCodec {
    key: [u8; 32],
}

impl CursorCodec {
    /// A codec with a secret key.
    pub fn new(key: [u8; 32]) -> Self {
        CursorCodec { key }
    }

    fn tag(&self, body: &[u8]) -> [u8; TAG_LEN] {
        let mut mac = Hmac::<Sha256>::new_from_slice(&self.key).expect("HMAC takes any key length");
        mac.update(body);
        let full = mac.finalize().into_bytes();
        let mut tag = [0; TAG_LEN];
        tag.copy_from_slice(&full[..TAG_LEN]);
        tag
    }

    /// A cursor for `position` (the last id seen, or an offset) in `resource` of `kind`.
    pub fn encode(&self, kind: Kind, resource: u64, position: u64) -> String {
        let mut bytes = Vec::with_capacity(BODY_LEN + TAG_LEN);
        bytes.push(VERSION);
        bytes.push(kind as u8);
        bytes.extend_from_slice(&resource.to_be_bytes());
        bytes.extend_from_slice(&position.to_be_bytes());
        let tag = self.tag(&bytes);
        bytes.extend_from_slice(&tag);
        URL_SAFE_NO_PAD.encode(bytes)
    }

    /// The position of a cursor, if it is genuine and belongs to `kind` and `resource`.
    pub fn decode(&self, cursor: &str, kind: Kind, resource: u64) -> Result<u64, CursorError> {
        let bytes = URL_SAFE_NO_PAD.decode(cursor).map_err(|_| CursorError::Malformed)?;
        if bytes.len() != BODY_LEN + TAG_LEN || bytes[0] != VERSION {
            return Err(CursorError::Malformed);
        }
        let (body, tag) = bytes.split_at(BODY_LEN);
        let mut mac = Hmac::<Sha256>::new_from_slice(&self.key).expect("HMAC takes any key length");
        mac.update(body);
        mac.verify_truncated_left(tag).map_err(|_| CursorError::Malformed)?;
        let got_resource = u64::from_be_bytes(body[2..10].try_into().expect("8 bytes"));
        if body[1] != kind as u8 || got_resource != resource {
            return Err(CursorError::WrongPlace);
        }
        Ok(u64::from_be_bytes(body[10..18].try_into().expect("8 bytes")))
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
