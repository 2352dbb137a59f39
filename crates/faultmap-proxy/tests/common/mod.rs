//! Test helpers: a tiny blocking HTTP/1.1 client that reports exactly what
//! arrived (so cut bodies and resets are visible), and a tiny upstream
//! server with ranges, HEAD, PUT and keep-alive. Both use std sockets with
//! timeouts, so no test can hang on them.
#![allow(dead_code)]

use std::io::{self, BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::Duration;

/// Every socket read or write in the tests gives up after this long.
pub const IO_TIMEOUT: Duration = Duration::from_secs(10);

/// A deterministic body of `len` bytes.
pub fn pattern(len: usize) -> Vec<u8> {
    (0..len).map(|i| (i * 7 + i / 251) as u8).collect()
}

/// One answer as the client saw it.
#[derive(Debug)]
pub struct Reply {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    /// The body bytes that arrived.
    pub body: Vec<u8>,
    /// Why the body stopped before `Content-Length`, if it did.
    pub body_error: Option<io::ErrorKind>,
}

impl Reply {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    pub fn content_length(&self) -> Option<usize> {
        self.header("content-length").and_then(|v| v.parse().ok())
    }
}

/// A keep-alive HTTP/1.1 client connection.
pub struct Client {
    addr: SocketAddr,
    reader: BufReader<TcpStream>,
}

impl Client {
    pub fn connect(addr: SocketAddr) -> io::Result<Client> {
        let stream = TcpStream::connect_timeout(&addr, IO_TIMEOUT)?;
        stream.set_read_timeout(Some(IO_TIMEOUT))?;
        stream.set_write_timeout(Some(IO_TIMEOUT))?;
        Ok(Client {
            addr,
            reader: BufReader::new(stream),
        })
    }

    pub fn get(&mut self, path: &str, headers: &[(&str, &str)]) -> io::Result<Reply> {
        self.request("GET", path, headers, &[])
    }

    /// Sends one request (with `Host: <addr>` unless `headers` has one) and
    /// reads its answer. An error means no status line arrived.
    pub fn request(
        &mut self,
        method: &str,
        path: &str,
        headers: &[(&str, &str)],
        body: &[u8],
    ) -> io::Result<Reply> {
        let mut head = format!("{method} {path} HTTP/1.1\r\n");
        if !headers.iter().any(|(n, _)| n.eq_ignore_ascii_case("host")) {
            head += &format!("Host: {}\r\n", self.addr);
        }
        for (name, value) in headers {
            head += &format!("{name}: {value}\r\n");
        }
        if !body.is_empty() || method == "PUT" {
            head += &format!("Content-Length: {}\r\n", body.len());
        }
        head += "\r\n";
        let stream = self.reader.get_mut();
        stream.write_all(head.as_bytes())?;
        stream.write_all(body)?;

        let mut line = String::new();
        if self.reader.read_line(&mut line)? == 0 {
            return Err(io::ErrorKind::UnexpectedEof.into());
        }
        let status = line
            .split_whitespace()
            .nth(1)
            .and_then(|s| s.parse().ok())
            .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidData, line.clone()))?;
        let headers = read_headers(&mut self.reader)?;
        let mut reply = Reply {
            status,
            headers,
            body: Vec::new(),
            body_error: None,
        };
        let len = if method == "HEAD" {
            0
        } else {
            reply.content_length().unwrap_or(0)
        };
        let mut buf = [0u8; 64 * 1024];
        while reply.body.len() < len {
            let want = (len - reply.body.len()).min(buf.len());
            match self.reader.read(&mut buf[..want]) {
                Ok(0) => {
                    reply.body_error = Some(io::ErrorKind::UnexpectedEof);
                    break;
                }
                Ok(n) => reply.body.extend_from_slice(&buf[..n]),
                Err(e) => {
                    reply.body_error = Some(e.kind());
                    break;
                }
            }
        }
        Ok(reply)
    }
}

fn read_headers(reader: &mut impl BufRead) -> io::Result<Vec<(String, String)>> {
    let mut headers = Vec::new();
    loop {
        let mut line = String::new();
        if reader.read_line(&mut line)? == 0 {
            return Err(io::ErrorKind::UnexpectedEof.into());
        }
        let line = line.trim_end();
        if line.is_empty() {
            return Ok(headers);
        }
        if let Some((name, value)) = line.split_once(':') {
            headers.push((name.trim().to_string(), value.trim().to_string()));
        }
    }
}

/// A request as the upstream received it.
#[derive(Clone, Debug)]
pub struct Seen {
    pub method: String,
    pub target: String,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

impl Seen {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }
}

/// An upstream serving one object (any path) with ranges (`a-b`, `a-`,
/// `-n`), HEAD and PUT
/// (which replaces the object), one thread per connection, keep-alive.
pub struct Upstream {
    pub addr: SocketAddr,
    pub object: Arc<Mutex<Vec<u8>>>,
    pub seen: Arc<Mutex<Vec<Seen>>>,
    pub connections: Arc<AtomicU64>,
}

impl Upstream {
    pub fn start(object: Vec<u8>) -> Upstream {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind the test upstream");
        let upstream = Upstream {
            addr: listener.local_addr().expect("upstream address"),
            object: Arc::new(Mutex::new(object)),
            seen: Arc::default(),
            connections: Arc::default(),
        };
        let (object, seen, connections) = (
            Arc::clone(&upstream.object),
            Arc::clone(&upstream.seen),
            Arc::clone(&upstream.connections),
        );
        // The accept thread lives as long as the test process.
        thread::spawn(move || {
            for stream in listener.incoming().flatten() {
                connections.fetch_add(1, Ordering::Relaxed);
                let (object, seen) = (Arc::clone(&object), Arc::clone(&seen));
                thread::spawn(move || {
                    let _ = serve(stream, &object, &seen);
                });
            }
        });
        upstream
    }

    pub fn seen(&self) -> Vec<Seen> {
        self.seen.lock().unwrap().clone()
    }
}

fn serve(stream: TcpStream, object: &Mutex<Vec<u8>>, seen: &Mutex<Vec<Seen>>) -> io::Result<()> {
    stream.set_read_timeout(Some(IO_TIMEOUT))?;
    stream.set_write_timeout(Some(IO_TIMEOUT))?;
    let mut reader = BufReader::new(stream.try_clone()?);
    let mut writer = stream;
    loop {
        let mut line = String::new();
        if reader.read_line(&mut line)? == 0 {
            return Ok(());
        }
        let mut parts = line.split_whitespace();
        let (method, target) = (
            parts.next().unwrap_or("").to_string(),
            parts.next().unwrap_or("").to_string(),
        );
        let headers = read_headers(&mut reader)?;
        let mut request = Seen {
            method,
            target,
            headers,
            body: Vec::new(),
        };
        let len: usize = request
            .header("content-length")
            .and_then(|v| v.parse().ok())
            .unwrap_or(0);
        request.body = vec![0; len];
        reader.read_exact(&mut request.body)?;
        let (status, extra, body) = answer(&request, object);
        let mut head = format!(
            "HTTP/1.1 {status}\r\nContent-Length: {}\r\nETag: \"test\"\r\n{extra}\r\n",
            body.len()
        );
        if request.method == "HEAD" {
            head = format!(
                "HTTP/1.1 {status}\r\nContent-Length: {}\r\nETag: \"test\"\r\n\r\n",
                object.lock().unwrap().len()
            );
        }
        // Recorded before the answer, so a client that has its answer can
        // count on the record.
        let is_head = request.method == "HEAD";
        seen.lock().unwrap().push(request);
        writer.write_all(head.as_bytes())?;
        if !is_head {
            writer.write_all(&body)?;
        }
    }
}

fn answer(request: &Seen, object: &Mutex<Vec<u8>>) -> (&'static str, String, Vec<u8>) {
    let mut object = object.lock().unwrap();
    if request.method == "PUT" {
        *object = request.body.clone();
        return ("200 OK", String::new(), Vec::new());
    }
    let len = object.len();
    let range = request
        .header("range")
        .and_then(|r| r.strip_prefix("bytes="))
        .and_then(|r| r.split_once('-'))
        .and_then(|(a, b)| match (a.parse::<usize>(), b.parse::<usize>()) {
            (Ok(a), Ok(b)) => Some((a, b)),
            (Ok(a), Err(_)) if b.is_empty() => Some((a, usize::MAX)),
            (Err(_), Ok(n)) if a.is_empty() => Some((len.saturating_sub(n), usize::MAX)),
            _ => None,
        });
    match range {
        Some((first, last)) if first <= last && first < object.len() => {
            let last = last.min(object.len() - 1);
            (
                "206 Partial Content",
                format!("Content-Range: bytes {first}-{last}/{}\r\n", object.len()),
                object[first..=last].to_vec(),
            )
        }
        Some(_) => ("416 Range Not Satisfiable", String::new(), Vec::new()),
        None => ("200 OK", String::new(), object.clone()),
    }
}
