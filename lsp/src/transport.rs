//! The stdio transport: `Content-Length` frames in and out on two threads, as
//! `lsp-server`'s own, but hardened for what a client may send. A frame whose body is
//! not a JSON-RPC message is logged and skipped (lsp-server's reader would stop the
//! server), and a frame larger than [`MAX_FRAME`] is skipped without being held in
//! memory (lsp-server's would allocate whatever `Content-Length` says).

use std::io::{self, BufRead, Read, Write};
use std::thread::{self, JoinHandle};

use lsp_server::{Connection, Message};

/// The largest frame read: a document at the compiler's limit (8 MiB), JSON-escaped
/// (at most 6 bytes per byte for control characters), with room for the envelope.
pub const MAX_FRAME: usize = 6 * aplc_compiler::MAX_SOURCE_LEN + 64 * 1024;

/// A connection on stdin and stdout, and the writer thread to join at the end.
pub(crate) fn stdio() -> (Connection, JoinHandle<io::Result<()>>) {
    let (to_writer, from_server) = crossbeam_channel::bounded::<Message>(0);
    let (to_server, from_reader) = crossbeam_channel::bounded::<Message>(0);
    let writer = thread::spawn(move || {
        let mut stdout = io::stdout().lock();
        for message in from_server {
            message.write(&mut stdout)?;
            stdout.flush()?;
        }
        Ok(())
    });
    // The reader is not joined: after `exit` it may still be blocked on stdin.
    thread::spawn(move || {
        let mut stdin = io::stdin().lock();
        while let Some(frame) = read_frame(&mut stdin) {
            let Some(body) = frame else {
                continue;
            };
            let message = match serde_json::from_slice::<Message>(&body) {
                Ok(message) => message,
                Err(e) => {
                    eprintln!("aplc lsp: skipped a message that is not JSON-RPC: {e}");
                    continue;
                }
            };
            let exit = matches!(&message, Message::Notification(n) if n.method == "exit");
            if to_server.send(message).is_err() || exit {
                break;
            }
        }
    });
    let connection = Connection {
        sender: to_writer,
        receiver: from_reader,
    };
    (connection, writer)
}

/// One frame's body: `None` at the end of input; `Some(None)` for a frame that was
/// skipped (no length, or too long).
fn read_frame(input: &mut impl BufRead) -> Option<Option<Vec<u8>>> {
    let mut length: Option<usize> = None;
    let mut saw_header = false;
    loop {
        let mut line = Vec::new();
        // A header line is short; one without an end within 64 KiB is not a header.
        let n = input
            .by_ref()
            .take(64 * 1024)
            .read_until(b'\n', &mut line)
            .ok()?;
        if n == 0 {
            return None;
        }
        let line = String::from_utf8_lossy(&line);
        let line = line.trim_end();
        if line.is_empty() {
            if saw_header {
                break;
            }
            continue;
        }
        saw_header = true;
        if let Some((name, value)) = line.split_once(':')
            && name.trim().eq_ignore_ascii_case("content-length")
        {
            length = value.trim().parse().ok();
        }
    }
    let Some(length) = length else {
        eprintln!("aplc lsp: skipped a frame without a Content-Length");
        return Some(None);
    };
    if length > MAX_FRAME {
        eprintln!("aplc lsp: skipped a frame of {length} bytes (at most {MAX_FRAME})");
        io::copy(&mut input.by_ref().take(length as u64), &mut io::sink()).ok()?;
        return Some(None);
    }
    let mut body = vec![0; length];
    input.read_exact(&mut body).ok()?;
    Some(Some(body))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames() {
        let input =
            b"Content-Length: 2\r\n\r\n{}\r\n\r\nX: y\r\n\r\nContent-Length: 99999999999\r\n\r\nab";
        let mut reader = &input[..];
        assert_eq!(read_frame(&mut reader), Some(Some(b"{}".to_vec())));
        assert_eq!(read_frame(&mut reader), Some(None));
        assert_eq!(read_frame(&mut reader), Some(None));
        assert_eq!(read_frame(&mut reader), None);
    }
}
