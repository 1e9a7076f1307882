//! Mutual TLS 1.3 on every link (rustls on ring), with roles in the
//! certificates.
//!
//! `suffuse certs --out DIR` makes a CA and one certificate per role (P0,
//! P1, the client), each naming its role as a DNS name (`p0.suffuse`, ...).
//! Every side presents its certificate and checks the other's against the
//! CA, so a link is authenticated both ways before a frame is read. A
//! client checks that the server it dialed holds the role it dialed (P0 or
//! P1); a server learns its peer's role from the certificate
//! ([`Role::of`]) and the caller refuses a role it does not expect (a
//! client certificate cannot act as P1). The CA's key is not kept: to
//! rotate, make a new set.

use std::fmt;
use std::io::{self, IoSlice, Read, Write};
use std::net::TcpStream;
use std::path::Path;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use rustls::{ClientConfig, ClientConnection, Connection, RootCertStore, ServerConfig};

use super::NetError;
use super::transport::Transport;

/// Who holds a certificate.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Role {
    /// Server P0.
    P0,
    /// Server P1.
    P1,
    /// The client.
    Client,
}

impl Role {
    /// Every role.
    pub const ALL: [Role; 3] = [Role::P0, Role::P1, Role::Client];

    /// The file stem of the role's certificate and key.
    pub const fn file(self) -> &'static str {
        match self {
            Role::P0 => "p0",
            Role::P1 => "p1",
            Role::Client => "client",
        }
    }

    /// The DNS name its certificate carries.
    pub const fn dns(self) -> &'static str {
        match self {
            Role::P0 => "p0.suffuse",
            Role::P1 => "p1.suffuse",
            Role::Client => "client.suffuse",
        }
    }

    /// The role a certificate (already verified against the CA) names.
    fn of(cert: &CertificateDer<'_>) -> Option<Role> {
        let ee = webpki::EndEntityCert::try_from(cert).ok()?;
        Role::ALL.into_iter().find(|r| {
            ServerName::try_from(r.dns())
                .is_ok_and(|name| ee.verify_is_valid_for_subject_name(&name).is_ok())
        })
    }
}

impl fmt::Display for Role {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.file())
    }
}

/// This side's TLS identity and trust.
pub struct TlsConfig {
    role: Role,
    client: Arc<ClientConfig>,
    server: Arc<ServerConfig>,
}

impl fmt::Debug for TlsConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "TlsConfig {{ role: {} }}", self.role)
    }
}

fn bad(what: String) -> NetError {
    NetError::Tls(what)
}

impl TlsConfig {
    /// Loads `DIR/ca.pem` and this role's `DIR/{role}.pem` and
    /// `DIR/{role}.key`.
    pub fn load(dir: &Path, role: Role) -> Result<TlsConfig, NetError> {
        let read = |name: String| {
            let p = dir.join(name);
            std::fs::read(&p).map_err(|e| bad(format!("{}: {e}", p.display())))
        };
        let ca = CertificateDer::from_pem_slice(&read("ca.pem".into())?)
            .map_err(|e| bad(format!("ca.pem: {e}")))?;
        let cert = CertificateDer::from_pem_slice(&read(format!("{}.pem", role.file()))?)
            .map_err(|e| bad(format!("{}.pem: {e}", role.file())))?;
        // The private key: refused if others may read or write it, as the
        // key files are (crate::private).
        let key_path = dir.join(format!("{}.key", role.file()));
        let meta = std::fs::metadata(&key_path)
            .map_err(|e| bad(format!("{}: {e}", key_path.display())))?;
        if let Some(w) = crate::private::check_file(&key_path, &meta)
            .map_err(|e| bad(format!("{}: {e}", key_path.display())))?
        {
            crate::private::warn(&w);
        }
        let key = PrivateKeyDer::from_pem_slice(&read(format!("{}.key", role.file()))?)
            .map_err(|e| bad(format!("{}.key: {e}", role.file())))?;
        let mut roots = RootCertStore::empty();
        roots.add(ca).map_err(|e| bad(format!("ca.pem: {e}")))?;
        let roots = Arc::new(roots);
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let tls13 = [&rustls::version::TLS13];
        let client = ClientConfig::builder_with_provider(provider.clone())
            .with_protocol_versions(&tls13)
            .map_err(|e| bad(e.to_string()))?
            .with_root_certificates(roots.clone())
            .with_client_auth_cert(vec![cert.clone()], key.clone_key())
            .map_err(|e| bad(format!("{}.pem/.key: {e}", role.file())))?;
        let verifier =
            rustls::server::WebPkiClientVerifier::builder_with_provider(roots, provider.clone())
                .build()
                .map_err(|e| bad(e.to_string()))?;
        let server = ServerConfig::builder_with_provider(provider)
            .with_protocol_versions(&tls13)
            .map_err(|e| bad(e.to_string()))?
            .with_client_cert_verifier(verifier)
            .with_single_cert(vec![cert], key)
            .map_err(|e| bad(format!("{}.pem/.key: {e}", role.file())))?;
        Ok(TlsConfig {
            role,
            client: Arc::new(client),
            server: Arc::new(server),
        })
    }

    /// The rustls configurations this side dials and accepts with.
    pub(crate) fn rustls(&self) -> (&Arc<ClientConfig>, &Arc<ServerConfig>) {
        (&self.client, &self.server)
    }

    /// Dials: a handshake as this role with a server that must hold `peer`.
    pub(super) fn connect(
        &self,
        sock: TcpStream,
        peer: Role,
        within: Duration,
    ) -> Result<Tls, NetError> {
        let name = ServerName::try_from(peer.dns()).map_err(|e| bad(e.to_string()))?;
        let conn =
            ClientConnection::new(self.client.clone(), name).map_err(|e| bad(e.to_string()))?;
        Tls::handshake(sock, conn.into(), within)
    }

    /// Accepts: a handshake as this role's server; the peer's role comes
    /// from its certificate.
    pub(super) fn accept(
        &self,
        sock: TcpStream,
        within: Duration,
    ) -> Result<(Tls, Role), NetError> {
        let conn =
            rustls::ServerConnection::new(self.server.clone()).map_err(|e| bad(e.to_string()))?;
        let tls = Tls::handshake(sock, conn.into(), within)?;
        let role = tls
            .peer_role()
            .ok_or_else(|| bad("the peer's certificate names no suffuse role".into()))?;
        Ok((tls, role))
    }
}

/// A TLS connection over a socket. Reads and writes go through the one
/// rustls state under a lock, but the socket is read and written outside
/// it, so one thread can block writing a frame while another reads.
pub struct Tls {
    sock: TcpStream,
    conn: Mutex<Connection>,
    /// Held while records are produced and sent, so they leave in order.
    sending: Mutex<()>,
    /// Ciphertext read off the socket and not yet given to rustls (locked
    /// after `conn`).
    unread: Mutex<Vec<u8>>,
}

impl fmt::Debug for Tls {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Tls { .. }")
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

fn invalid(e: rustls::Error) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, e)
}

/// Hands rustls the ciphertext in `unread` while it has room for the
/// plaintext (a socket read can hold several records, and rustls refuses
/// records once 16 KiB of plaintext wait); keeps the rest. Returns the
/// bytes taken.
fn feed(conn: &mut Connection, unread: &mut Vec<u8>) -> io::Result<usize> {
    let mut rest = &unread[..];
    while !rest.is_empty() && conn.wants_read() {
        conn.read_tls(&mut rest)?;
        conn.process_new_packets().map_err(invalid)?;
    }
    let used = unread.len() - rest.len();
    unread.drain(..used);
    Ok(used)
}

/// Bytes read off the socket at a time: one full TLS record.
const RECORD: usize = 16 * 1024 + 256;

impl Tls {
    /// Runs the handshake to the end within `within`: a peer that stalls
    /// or trickles its handshake is dropped at the deadline.
    fn handshake(sock: TcpStream, mut conn: Connection, within: Duration) -> Result<Tls, NetError> {
        let deadline = Instant::now().checked_add(within);
        let step = |conn: &mut Connection| -> io::Result<()> {
            let left = deadline.map_or(within, |d| d.saturating_duration_since(Instant::now()));
            if left.is_zero() {
                return Err(io::ErrorKind::TimedOut.into());
            }
            sock.set_read_timeout(Some(left))?;
            sock.set_write_timeout(Some(left))?;
            while conn.wants_write() {
                conn.write_tls(&mut &sock)?;
            }
            if conn.is_handshaking() {
                if conn.read_tls(&mut &sock)? == 0 {
                    return Err(io::ErrorKind::UnexpectedEof.into());
                }
                conn.process_new_packets().map_err(invalid)?;
            }
            Ok(())
        };
        while conn.is_handshaking() || conn.wants_write() {
            if let Err(e) = step(&mut conn) {
                // Best effort: the alert that says why, if rustls has one.
                let _ = conn.write_tls(&mut &sock);
                // A timeout or a peer that closed reads as it does on an
                // established link; anything else is TLS's own failure.
                return Err(match NetError::on_link(e, "the TLS handshake") {
                    NetError::Io(e) => bad(format!("TLS handshake failed: {e}")),
                    typed => typed,
                });
            }
        }
        Ok(Tls {
            sock,
            conn: Mutex::new(conn),
            sending: Mutex::new(()),
            unread: Mutex::new(Vec::new()),
        })
    }

    fn peer_role(&self) -> Option<Role> {
        let conn = lock(&self.conn);
        conn.peer_certificates()?.first().and_then(Role::of)
    }
}

impl Transport for Tls {
    fn socket(&self) -> Option<&TcpStream> {
        Some(&self.sock)
    }

    fn read(&self, buf: &mut [u8]) -> io::Result<usize> {
        let mut raw = vec![0u8; RECORD];
        loop {
            {
                let mut conn = lock(&self.conn);
                match conn.reader().read(buf) {
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                    other => return other,
                }
                // Records read off the socket earlier, held back while
                // their plaintext would not fit, come before new ones.
                let mut unread = lock(&self.unread);
                if !unread.is_empty() && feed(&mut conn, &mut unread)? > 0 {
                    continue;
                }
            }
            // No plaintext is waiting: read more records off the socket
            // (with the caller's timeout), outside the lock.
            let n = (&self.sock).read(&mut raw)?;
            if n == 0 {
                return Ok(0);
            }
            let mut conn = lock(&self.conn);
            let mut unread = lock(&self.unread);
            unread.extend_from_slice(&raw[..n]);
            feed(&mut conn, &mut unread)?;
        }
    }

    fn write_vectored(&self, bufs: &[IoSlice<'_>]) -> io::Result<usize> {
        let _order = lock(&self.sending);
        let mut records = Vec::new();
        let taken = {
            let mut conn = lock(&self.conn);
            let taken = conn.writer().write_vectored(bufs)?;
            while conn.wants_write() {
                conn.write_tls(&mut records)?;
            }
            taken
        };
        (&self.sock).write_all(&records)?;
        Ok(taken)
    }

    fn resumable_writes(&self) -> bool {
        false
    }
}

/// Writes a fresh CA and one certificate and key per role into `dir`
/// (created 0700; keys 0600). The CA's key is dropped.
pub fn make_certs(dir: &Path, valid_days: u32) -> Result<(), NetError> {
    use rcgen::{
        BasicConstraints, CertificateParams, CertifiedIssuer, DnType, ExtendedKeyUsagePurpose,
        IsCa, KeyPair, KeyUsagePurpose,
    };
    use std::os::unix::fs::OpenOptionsExt;
    let e = |e: rcgen::Error| bad(format!("making certificates: {e}"));
    let write = |name: &str, text: &str, mode: u32| {
        let p = dir.join(name);
        std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(mode)
            .open(&p)
            .and_then(|mut f| f.write_all(text.as_bytes()))
            .map_err(|e| bad(format!("{}: {e}", p.display())))
    };
    crate::private::private_dir(dir).map_err(|e| bad(format!("{}: {e}", dir.display())))?;
    // Valid from a day ago (clocks disagree) for `valid_days` days, not
    // rcgen's 1975 to 4096: a certificate should expire and be rotated.
    let now = time::OffsetDateTime::now_utc();
    let window = |p: &mut CertificateParams| {
        p.not_before = now - time::Duration::days(1);
        p.not_after = now + time::Duration::days(i64::from(valid_days));
    };
    let mut ca = CertificateParams::new(Vec::<String>::new()).map_err(e)?;
    window(&mut ca);
    ca.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
    ca.distinguished_name
        .push(DnType::CommonName, "suffuse deployment CA");
    ca.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
    let ca = CertifiedIssuer::self_signed(ca, KeyPair::generate().map_err(e)?).map_err(e)?;
    write("ca.pem", &ca.pem(), 0o644)?;
    for role in Role::ALL {
        let mut p = CertificateParams::new(vec![role.dns().to_string()]).map_err(e)?;
        window(&mut p);
        p.distinguished_name.push(DnType::CommonName, role.dns());
        p.extended_key_usages = match role {
            // P1 dials P0, so the servers' certificates serve both ways.
            Role::P0 | Role::P1 => vec![
                ExtendedKeyUsagePurpose::ServerAuth,
                ExtendedKeyUsagePurpose::ClientAuth,
            ],
            Role::Client => vec![ExtendedKeyUsagePurpose::ClientAuth],
        };
        let key = KeyPair::generate().map_err(e)?;
        let cert = p.signed_by(&key, &ca).map_err(e)?;
        write(&format!("{}.pem", role.file()), &cert.pem(), 0o644)?;
        write(&format!("{}.key", role.file()), &key.serialize_pem(), 0o600)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    /// Issue 27: certificates are valid for the days asked for (from a day
    /// before now), not 1975 to 4096. The DER holds the validity as
    /// UTCTime `YYMMDDhhmmssZ`, so the dates are found by their text.
    #[test]
    fn certificates_expire_when_asked() {
        let d = std::env::temp_dir().join(format!("suffuse-certs-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        make_certs(&d, 30).unwrap();
        let utc = |t: time::OffsetDateTime| {
            format!(
                "{:02}{:02}{:02}",
                t.year() % 100,
                u8::from(t.month()),
                t.day()
            )
        };
        let now = time::OffsetDateTime::now_utc();
        for name in ["ca.pem", "p0.pem", "p1.pem", "client.pem"] {
            let der =
                CertificateDer::from_pem_slice(&std::fs::read(d.join(name)).unwrap()).unwrap();
            let text = String::from_utf8_lossy(der.as_ref());
            let (from, until) = (
                utc(now - time::Duration::days(1)),
                utc(now + time::Duration::days(30)),
            );
            assert!(
                text.contains(&from) && text.contains(&until),
                "{name}: {from}..{until}"
            );
            assert!(!text.contains("40960101"), "{name} still valid until 4096");
        }
        let _ = std::fs::remove_dir_all(&d);
    }

    /// Issue 27 (low): a private key that others may read was loaded
    /// silently. It is refused now, and one its group may read is loaded.
    #[test]
    fn a_private_key_others_may_read_is_refused() {
        use std::os::unix::fs::PermissionsExt;
        let d = std::env::temp_dir().join(format!("suffuse-keymode-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        make_certs(&d, 30).unwrap();
        let key = d.join("client.key");
        for (mode, loads) in [(0o600, true), (0o640, true), (0o644, false), (0o604, false)] {
            std::fs::set_permissions(&key, std::fs::Permissions::from_mode(mode)).unwrap();
            let r = TlsConfig::load(&d, Role::Client);
            assert_eq!(r.is_ok(), loads, "{mode:03o}");
            if let Err(e) = r {
                assert!(e.to_string().contains("chmod 600"), "{e}");
            }
        }
        let _ = std::fs::remove_dir_all(&d);
    }
}
