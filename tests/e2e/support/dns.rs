//! A DNS server of a few records on 127.0.0.1:53 (UDP), for what needs DNS to be tried: a
//! `mongodb+srv://` URL names a host whose SRV record lists the servers. A process is pointed
//! at it with a `resolv.conf` of its own (`nameserver 127.0.0.1`, bind-mounted in a mount
//! namespace); nothing else on the machine uses it.

use std::net::Ipv4Addr;
use std::sync::{Arc, Mutex};

use tokio::net::UdpSocket;
use tokio::task::JoinHandle;

const TYPE_A: u16 = 1;
const TYPE_SRV: u16 = 33;
const CLASS_IN: u16 = 1;

/// The records served: SRV `(name, target, port)` and A `(name, address)`; every other
/// question is answered with no record.
#[derive(Debug, Clone, Default)]
pub struct Records {
    /// SRV records.
    pub srv: Vec<(String, String, u16)>,
    /// A records.
    pub a: Vec<(String, Ipv4Addr)>,
}

/// A running server; dropping it stops it.
pub struct DnsServer {
    task: JoinHandle<()>,
    asked: Arc<Mutex<Vec<(String, u16)>>>,
}

impl DnsServer {
    /// The questions asked so far: `(name, type)`, e.g. `("_mongodb._tcp.h", 33)` for SRV.
    pub fn asked(&self) -> Vec<(String, u16)> {
        self.asked.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }
}

impl Drop for DnsServer {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Serves `records` on 127.0.0.1:53, or says why it cannot (no privilege, or the port stays
/// taken for 30 s: another test's server holds it only while that test runs).
pub async fn serve(records: Records) -> std::io::Result<DnsServer> {
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(30);
    let socket = loop {
        match UdpSocket::bind((Ipv4Addr::LOCALHOST, 53)).await {
            Err(error)
                if error.kind() == std::io::ErrorKind::AddrInUse
                    && tokio::time::Instant::now() < deadline =>
            {
                tokio::time::sleep(std::time::Duration::from_millis(200)).await;
            }
            bound => break bound?,
        }
    };
    let asked = Arc::new(Mutex::new(Vec::new()));
    let log = Arc::clone(&asked);
    let task = tokio::spawn(async move {
        let mut buffer = [0u8; 1500];
        while let Ok((length, peer)) = socket.recv_from(&mut buffer).await {
            if let Some((question, answer)) = answer(&buffer[..length], &records) {
                log.lock().unwrap_or_else(|p| p.into_inner()).push(question);
                let _ = socket.send_to(&answer, peer).await;
            }
        }
    });
    Ok(DnsServer { task, asked })
}

/// `name` in DNS wire form (labels, then a zero byte).
fn encode_name(name: &str) -> Vec<u8> {
    let mut out = Vec::new();
    for label in name.trim_end_matches('.').split('.') {
        out.push(label.len() as u8);
        out.extend_from_slice(label.as_bytes());
    }
    out.push(0);
    out
}

/// The question of one query and its answer: the question echoed, then the matching records.
fn answer(query: &[u8], records: &Records) -> Option<((String, u16), Vec<u8>)> {
    if query.len() < 12 {
        return None;
    }
    // The question's name: labels from byte 12 up to a zero length.
    let mut at = 12;
    let mut labels = Vec::new();
    loop {
        let length = usize::from(*query.get(at)?);
        at += 1;
        if length == 0 {
            break;
        }
        labels.push(String::from_utf8_lossy(query.get(at..at + length)?).to_lowercase());
        at += length;
    }
    let qtype = u16::from_be_bytes([*query.get(at)?, *query.get(at + 1)?]);
    let question_end = at + 4;
    let name = labels.join(".");
    let mut answers: Vec<(u16, Vec<u8>)> = Vec::new();
    if qtype == TYPE_SRV {
        for (_, target, port) in records.srv.iter().filter(|(srv, ..)| *srv == name) {
            let mut data = vec![0, 0, 0, 0]; // priority 0, weight 0
            data.extend_from_slice(&port.to_be_bytes());
            data.extend(encode_name(target));
            answers.push((TYPE_SRV, data));
        }
    }
    if qtype == TYPE_A {
        for (_, address) in records.a.iter().filter(|(a, _)| *a == name) {
            answers.push((TYPE_A, address.octets().to_vec()));
        }
    }
    let mut out = Vec::with_capacity(512);
    out.extend_from_slice(&query[0..2]); // the query's id
    out.extend_from_slice(&[0x85, 0x80]); // a response, authoritative, recursion as asked
    out.extend_from_slice(&1u16.to_be_bytes());
    out.extend_from_slice(&(answers.len() as u16).to_be_bytes());
    out.extend_from_slice(&[0, 0, 0, 0]); // no authority, no additional records
    out.extend_from_slice(query.get(12..question_end)?);
    for (kind, data) in answers {
        out.extend_from_slice(&[0xC0, 0x0C]); // the question's name
        out.extend_from_slice(&kind.to_be_bytes());
        out.extend_from_slice(&CLASS_IN.to_be_bytes());
        out.extend_from_slice(&60u32.to_be_bytes());
        out.extend_from_slice(&(data.len() as u16).to_be_bytes());
        out.extend(data);
    }
    Some(((name, qtype), out))
}

/// A `mongodb+srv://` name for a MongoDB server on the loopback: the DNS server holding its
/// SRV record, and a `resolv.conf` naming that server (bind-mount it over
/// `/etc/resolv.conf` in the process's own mount namespace).
pub struct MongoSrv {
    /// The URL (TLS off: the SRV form turns it on by default, the test server speaks plain
    /// TCP).
    pub url: &'static str,
    /// The `resolv.conf` to bind-mount.
    pub resolv_conf: std::path::PathBuf,
    dns: DnsServer,
    _dir: tempfile::TempDir,
}

/// The host the URL names.
const SRV_HOST: &str = "locks.turnstile.test";

impl MongoSrv {
    /// Serves an SRV record for the server at `mongodb_uri` (`mongodb://127.0.0.1:PORT/`),
    /// listing a host of the same domain (as the driver requires) whose A record is the
    /// loopback; `None` after [`test_servers::skip_or_fail`] when port 53 cannot be had.
    pub async fn serve(mongodb_uri: &str, test: &str) -> Option<Self> {
        let port: u16 = mongodb_uri
            .trim_start_matches("mongodb://127.0.0.1:")
            .trim_end_matches('/')
            .parse()
            .expect("the test server's port");
        let records = Records {
            srv: vec![(
                format!("_mongodb._tcp.{SRV_HOST}"),
                "node1.turnstile.test".to_owned(),
                port,
            )],
            a: vec![("node1.turnstile.test".to_owned(), Ipv4Addr::LOCALHOST)],
        };
        let dns = match serve(records).await {
            Ok(server) => server,
            Err(error) => {
                test_servers::skip_or_fail(
                    test,
                    &format!("cannot serve DNS on 127.0.0.1:53: {error}"),
                    test_servers::under_ci(),
                );
                return None;
            }
        };
        let dir = tempfile::tempdir().expect("dir");
        let resolv_conf = dir.path().join("resolv.conf");
        std::fs::write(
            &resolv_conf,
            "nameserver 127.0.0.1\noptions timeout:2 attempts:2\n",
        )
        .expect("resolv.conf");
        Some(Self {
            url: "mongodb+srv://locks.turnstile.test/?tls=false",
            resolv_conf,
            dns,
            _dir: dir,
        })
    }

    /// Panics unless someone looked up the SRV record.
    pub fn assert_srv_looked_up(&self) {
        let asked = self.dns.asked();
        assert!(
            asked.contains(&(format!("_mongodb._tcp.{SRV_HOST}"), TYPE_SRV)),
            "the SRV record was looked up: {asked:?}"
        );
    }
}
