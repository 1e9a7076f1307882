//! A minimal HTTP/1.1 client over a plain socket: the tests see the bytes
//! the gateway sends, status, headers, chunked bodies and events included.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::time::Duration;

/// A response.
#[derive(Debug)]
pub struct Reply {
    pub status: u16,
    /// Header lines, names lowercased.
    pub headers: Vec<(String, String)>,
    pub body: String,
}

impl Reply {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }

    pub fn json(&self) -> serde_json::Value {
        serde_json::from_str(&self.body).unwrap_or_else(|e| panic!("not JSON ({e}): {}", self.body))
    }

    /// The `data:` payloads of a server-sent event stream, in order.
    pub fn events(&self) -> Vec<String> {
        self.body
            .lines()
            .filter_map(|l| l.strip_prefix("data: ").or_else(|| l.strip_prefix("data:")))
            .map(str::to_string)
            .collect()
    }
}

/// Sends a request and opens the response: status and headers read.
pub fn open(
    addr: &str,
    method: &str,
    path: &str,
    body: &str,
) -> (u16, Vec<(String, String)>, BufReader<TcpStream>) {
    let mut s = TcpStream::connect(addr).expect("connecting to the gateway");
    s.set_read_timeout(Some(Duration::from_secs(120))).unwrap();
    write!(
        s,
        "{method} {path} HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\n\
         Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    let mut r = BufReader::new(s);
    let mut line = String::new();
    r.read_line(&mut line).unwrap();
    let status = line
        .split(' ')
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or_else(|| panic!("no status line: {line:?}"));
    let mut headers = Vec::new();
    loop {
        line.clear();
        r.read_line(&mut line).unwrap();
        let l = line.trim_end();
        if l.is_empty() {
            break;
        }
        if let Some((n, v)) = l.split_once(':') {
            headers.push((n.trim().to_ascii_lowercase(), v.trim().to_string()));
        }
    }
    (status, headers, r)
}

/// A whole request and response.
pub fn request(addr: &str, method: &str, path: &str, body: &str) -> Reply {
    let (status, headers, mut r) = open(addr, method, path, body);
    let chunked = headers
        .iter()
        .any(|(n, v)| n == "transfer-encoding" && v.contains("chunked"));
    let mut raw = Vec::new();
    r.read_to_end(&mut raw).unwrap();
    let body = if chunked { dechunk(&raw) } else { raw };
    Reply {
        status,
        headers,
        body: String::from_utf8(body).unwrap(),
    }
}

pub fn post(addr: &str, path: &str, body: &serde_json::Value) -> Reply {
    request(addr, "POST", path, &body.to_string())
}

fn dechunk(mut raw: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    loop {
        let Some(end) = raw.windows(2).position(|w| w == b"\r\n") else {
            return out;
        };
        let size = std::str::from_utf8(&raw[..end])
            .unwrap()
            .split(';')
            .next()
            .unwrap();
        let n = usize::from_str_radix(size.trim(), 16).unwrap();
        if n == 0 {
            return out;
        }
        out.extend_from_slice(&raw[end + 2..end + 2 + n]);
        raw = &raw[end + 2 + n + 2..];
    }
}
