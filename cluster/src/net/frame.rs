//! Length-prefixed frames: a 4-byte big-endian length, then the body.
//!
//! Owns: reading a frame without trusting its prefix (checked against a cap before any body
//! byte is read, and the body read as it arrives rather than allocated from the prefix), and
//! writing one in a single buffer.

use std::io::{self, IoSlice};

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

/// The largest frame of the handshake, in bytes: its messages are a few dozen bytes, so an
/// unauthenticated peer can make a connection hold no more than this.
pub const HANDSHAKE_FRAME_MAX: usize = 128;

/// The length prefix's size.
const PREFIX: usize = 4;

/// Reads one frame of at most `max` bytes.
///
/// # Errors
/// `InvalidData` for a prefix over `max`; `UnexpectedEof` for a stream that ends inside a
/// frame; the stream's own errors.
pub(crate) async fn read<S: AsyncRead + Unpin>(stream: &mut S, max: usize) -> io::Result<Vec<u8>> {
    let mut prefix = [0u8; PREFIX];
    stream.read_exact(&mut prefix).await?;
    let len = u32::from_be_bytes(prefix) as usize;
    if len > max {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("a frame of {len} bytes, over the cap of {max}"),
        ));
    }
    // Grown as bytes arrive: a peer announcing a large frame and sending nothing costs nothing.
    let mut body = Vec::with_capacity(len.min(64 << 10));
    (&mut *stream).take(len as u64).read_to_end(&mut body).await?;
    if body.len() != len {
        return Err(io::Error::new(
            io::ErrorKind::UnexpectedEof,
            format!("the stream ended inside a frame ({} of {len} bytes)", body.len()),
        ));
    }
    Ok(body)
}

/// Writes one frame made of `parts` (concatenated), in one buffer so it leaves in as few
/// segments as the kernel allows, and flushes it.
///
/// # Errors
/// `InvalidInput` for a frame over 4 GiB; the stream's own errors.
pub(crate) async fn write<S: AsyncWrite + Unpin>(
    stream: &mut S,
    parts: &[&[u8]],
) -> io::Result<()> {
    let len: usize = parts.iter().map(|p| p.len()).sum();
    let prefix = u32::try_from(len).map_err(|_| {
        io::Error::new(io::ErrorKind::InvalidInput, format!("a frame of {len} bytes"))
    })?;
    let prefix = prefix.to_be_bytes();
    if !stream.is_write_vectored() {
        let mut out = Vec::with_capacity(PREFIX + len);
        out.extend_from_slice(&prefix);
        for part in parts {
            out.extend_from_slice(part);
        }
        stream.write_all(&out).await?;
        return stream.flush().await;
    }
    // Written where they lie, without gathering them into one buffer first: a forwarded page
    // is tens of kilobytes.
    let mut slices: Vec<IoSlice<'_>> =
        std::iter::once(&prefix[..]).chain(parts.iter().copied()).map(IoSlice::new).collect();
    let mut left = &mut slices[..];
    while !left.is_empty() {
        let written = stream.write_vectored(left).await?;
        if written == 0 {
            return Err(io::Error::new(io::ErrorKind::WriteZero, "the stream took no bytes"));
        }
        IoSlice::advance_slices(&mut left, written);
    }
    stream.flush().await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_frame_round_trips_and_the_cap_is_checked_before_the_body() {
        let mut buf = Vec::new();
        write(&mut buf, &[b"he", b"llo"]).await.unwrap();
        assert_eq!(read(&mut &buf[..], 5).await.unwrap(), b"hello");
        let err = read(&mut &buf[..], 4).await.unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::InvalidData);

        // A huge prefix and no body: refused without allocating.
        let huge = u32::MAX.to_be_bytes();
        assert_eq!(
            read(&mut &huge[..], 1 << 20).await.unwrap_err().kind(),
            io::ErrorKind::InvalidData
        );
        // Truncated: the prefix says 5, 3 bytes follow.
        let mut short = 5u32.to_be_bytes().to_vec();
        short.extend_from_slice(b"abc");
        assert_eq!(
            read(&mut &short[..], 16).await.unwrap_err().kind(),
            io::ErrorKind::UnexpectedEof
        );
    }

    /// A stream that takes at most three bytes a call, in vectored writes or not.
    struct Trickle {
        taken: Vec<u8>,
        vectored: bool,
    }

    impl tokio::io::AsyncWrite for Trickle {
        fn poll_write(
            mut self: std::pin::Pin<&mut Self>,
            _: &mut std::task::Context<'_>,
            buf: &[u8],
        ) -> std::task::Poll<io::Result<usize>> {
            let n = buf.len().min(3);
            self.taken.extend_from_slice(&buf[..n]);
            std::task::Poll::Ready(Ok(n))
        }

        fn poll_write_vectored(
            mut self: std::pin::Pin<&mut Self>,
            _: &mut std::task::Context<'_>,
            bufs: &[IoSlice<'_>],
        ) -> std::task::Poll<io::Result<usize>> {
            let mut n = 0;
            for byte in bufs.iter().flat_map(|b| b.iter()).take(3) {
                self.taken.push(*byte);
                n += 1;
            }
            std::task::Poll::Ready(Ok(n))
        }

        fn is_write_vectored(&self) -> bool {
            self.vectored
        }

        fn poll_flush(
            self: std::pin::Pin<&mut Self>,
            _: &mut std::task::Context<'_>,
        ) -> std::task::Poll<io::Result<()>> {
            std::task::Poll::Ready(Ok(()))
        }

        fn poll_shutdown(
            self: std::pin::Pin<&mut Self>,
            _: &mut std::task::Context<'_>,
        ) -> std::task::Poll<io::Result<()>> {
            std::task::Poll::Ready(Ok(()))
        }
    }

    #[tokio::test]
    async fn a_frame_written_a_few_bytes_at_a_time_arrives_whole() {
        let parts: [&[u8]; 4] = [b"", b"a body of some length", b"x", b"and its tag"];
        for vectored in [true, false] {
            let mut stream = Trickle { taken: Vec::new(), vectored };
            write(&mut stream, &parts).await.unwrap();
            let read = read(&mut &stream.taken[..], 64).await.unwrap();
            assert_eq!(read, parts.concat(), "vectored: {vectored}");
        }
    }
}
