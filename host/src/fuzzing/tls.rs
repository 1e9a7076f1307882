//! TLS handshakes fed raw bytes: a server (P0's configuration) reading a
//! client's first flight, and a client reading a server's answer to its
//! hello. Certificates are made once per process by `suffuse certs`' code.

use std::sync::{Arc, OnceLock};

use rustls::pki_types::ServerName;
use rustls::{ClientConnection, Connection, ServerConnection};

use crate::net::{Role, TlsConfig, make_certs};

struct Fixture {
    /// P0, as it accepts connections.
    server: TlsConfig,
    /// A client, as it dials P0.
    client: TlsConfig,
    /// The client's first flight to P0.
    hello: Vec<u8>,
}

fn fixture() -> &'static Fixture {
    static FIXTURE: OnceLock<Fixture> = OnceLock::new();
    FIXTURE.get_or_init(|| make().unwrap_or_else(|e| panic!("the fuzz TLS fixture: {e}")))
}

fn make() -> Result<Fixture, String> {
    let dir = std::env::temp_dir().join(format!("suffuse-fuzz-tls-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let loaded = make_certs(&dir, 365).and_then(|()| {
        Ok((
            TlsConfig::load(&dir, Role::P0)?,
            TlsConfig::load(&dir, Role::Client)?,
        ))
    });
    let _ = std::fs::remove_dir_all(&dir);
    let (server, client) = loaded.map_err(|e| e.to_string())?;
    let mut conn = dial(&client)?;
    let mut hello = Vec::new();
    while conn.wants_write() {
        conn.write_tls(&mut hello).map_err(|e| e.to_string())?;
    }
    Ok(Fixture {
        server,
        client,
        hello,
    })
}

fn dial(client: &TlsConfig) -> Result<Connection, String> {
    let name = ServerName::try_from(Role::P0.dns()).map_err(|e| e.to_string())?;
    let (config, _) = client.rustls();
    ClientConnection::new(Arc::clone(config), name)
        .map(Connection::from)
        .map_err(|e| e.to_string())
}

/// A genuine client's first flight (its ClientHello) to P0.
pub fn tls_client_hello() -> &'static [u8] {
    &fixture().hello
}

/// P0's server reads `bytes` as a connection's first records. Returns the
/// bytes it would send back, or why it stopped.
pub fn tls_server_reads(bytes: &[u8]) -> Result<Vec<u8>, String> {
    let (_, config) = fixture().server.rustls();
    let conn = ServerConnection::new(Arc::clone(config)).map_err(|e| e.to_string())?;
    feed(conn.into(), bytes)
}

/// A client that sent its hello to P0 reads `bytes` as the answer.
pub fn tls_client_reads(bytes: &[u8]) -> Result<Vec<u8>, String> {
    let mut conn = dial(&fixture().client)?;
    let mut sink = Vec::new();
    while conn.wants_write() {
        conn.write_tls(&mut sink).map_err(|e| e.to_string())?;
    }
    feed(conn, bytes)
}

/// Feeds records as a socket would, processing after each read, and
/// collects what the connection answers.
fn feed(mut conn: Connection, bytes: &[u8]) -> Result<Vec<u8>, String> {
    let mut rest = bytes;
    let mut out = Vec::new();
    while !rest.is_empty() {
        let n = conn.read_tls(&mut rest).map_err(|e| e.to_string())?;
        if n == 0 {
            break;
        }
        conn.process_new_packets().map_err(|e| e.to_string())?;
        while conn.wants_write() {
            conn.write_tls(&mut out).map_err(|e| e.to_string())?;
        }
    }
    Ok(out)
}
