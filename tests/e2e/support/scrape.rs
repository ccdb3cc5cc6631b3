//! Scraping the controller's metrics server over plain HTTP/1.1 (no client crate needed for
//! three GETs), and reading one series out of the exposition.

use std::net::SocketAddr;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// A loopback address with a port free right now (for a metrics server, or a port that
/// nothing listens on).
pub fn free_addr() -> SocketAddr {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|listener| listener.local_addr())
        .expect("free loopback port")
}

/// An HTTP answer.
pub struct Answer {
    /// Status code.
    pub status: u16,
    /// `Content-Type` header value ("" when none).
    pub content_type: String,
    /// The body.
    pub body: String,
}

/// [`get`], or `None` while nothing listens on `addr` yet.
pub async fn try_get(addr: SocketAddr, path: &str) -> Option<Answer> {
    TcpStream::connect(addr).await.ok()?;
    Some(get(addr, path).await)
}

/// One HTTP/1.1 GET, read to the end (`Connection: close`).
pub async fn get(addr: SocketAddr, path: &str) -> Answer {
    let mut stream = TcpStream::connect(addr).await.expect("connect");
    let request = format!("GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n");
    stream.write_all(request.as_bytes()).await.expect("send");
    let mut raw = Vec::new();
    tokio::time::timeout(Duration::from_secs(10), stream.read_to_end(&mut raw))
        .await
        .expect("an answer in time")
        .expect("read");
    let raw = String::from_utf8(raw).expect("UTF-8");
    let (head, body) = raw.split_once("\r\n\r\n").expect("headers and body");
    let status = head
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .expect("a status");
    let content_type = head
        .lines()
        .find_map(|line| {
            let (name, value) = line.split_once(':')?;
            name.eq_ignore_ascii_case("content-type")
                .then(|| value.trim().to_string())
        })
        .unwrap_or_default();
    Answer {
        status,
        content_type,
        body: body.to_string(),
    }
}

/// The value of one series in an exposition (`name{labels}` exactly as printed).
pub fn sample(text: &str, series: &str) -> Option<f64> {
    text.lines().find_map(|line| {
        line.strip_prefix(series)?
            .strip_prefix(' ')?
            .split(' ')
            .next()?
            .parse()
            .ok()
    })
}

/// How many passes the controller serving metrics on `addr` has finished without error for
/// `controller` (`lock`, `claim`, `pod`, ...); `None` while nothing listens there yet.
pub async fn passes(addr: SocketAddr, controller: &str) -> Option<f64> {
    let series = format!(r#"turnstile_reconcile_total{{controller="{controller}",result="ok"}}"#);
    let answer = try_get(addr, "/metrics").await?;
    Some(sample(&answer.body, &series).unwrap_or_default())
}

/// Waits until `controller` has finished more passes than `before`: the positive sign that it
/// looked at what changed after `before` was read. Gives up (panics) after `wait`.
pub async fn passed_since(addr: SocketAddr, controller: &str, before: f64, wait: Duration) {
    let deadline = tokio::time::Instant::now() + wait;
    while passes(addr, controller)
        .await
        .is_none_or(|passes| passes <= before)
    {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the {controller} controller never looked"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}
