//! The fake servers' side of HTTP/1.1 in the CLI's tests: one request at a time from a
//! keep-alive connection, with a `Content-Length` body (all the clients under test send).

use std::io::{BufRead, BufReader, Read};
use std::net::TcpStream;

/// One request's head (request line and headers) and body; `None` once the connection
/// ends.
pub fn read_request(reader: &mut BufReader<TcpStream>) -> Option<(String, String)> {
    let mut head = String::new();
    let mut length = 0usize;
    loop {
        let mut line = String::new();
        if reader.read_line(&mut line).unwrap_or(0) == 0 {
            return None;
        }
        if line.trim_end().is_empty() {
            break;
        }
        if let Some((name, value)) = line.split_once(':')
            && name.eq_ignore_ascii_case("content-length")
        {
            length = value.trim().parse().unwrap_or(0);
        }
        head.push_str(&line);
    }
    let mut body = vec![0; length];
    reader.read_exact(&mut body).ok()?;
    Some((head, String::from_utf8_lossy(&body).into_owned()))
}
