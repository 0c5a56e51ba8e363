//! [`HttpWebhookSender`]: the control plane's webhook deliveries, posted over HTTP(S).
//!
//! A delivery is the event's JSON as `GET /events/sandboxes` shows it (the HTTP API owns that
//! form and hands it over as an [`EncodeEvent`]), with E2B's headers `e2b-webhook-id`,
//! `e2b-delivery-id` (the same on every retry), `e2b-signature-version: v1` and
//! `e2b-signature`: the unpadded base64 of SHA-256 over the secret followed by the raw body.
//! Receivers on loopback, private, link-local or other internal addresses are refused (a
//! tenant must not reach the host's own services through the control plane) unless the
//! operator allows them (`warren serve --webhooks-to-private-addresses`); the address checked
//! is the one connected to, and redirects are not followed.

use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use base64::Engine;
use sha2::{Digest, Sha256};
use warren_control::{Delivery, SandboxEvent, SealedWebhook};

/// How an event becomes a delivery's body: its JSON as the events API shows it.
pub type EncodeEvent = fn(&SandboxEvent) -> serde_json::Result<Vec<u8>>;

/// E2B's `e2b-signature`: unpadded base64 of SHA-256(secret || body).
pub fn signature(secret: &str, body: &[u8]) -> String {
    let mut h = Sha256::new();
    h.update(secret.as_bytes());
    h.update(body);
    base64::engine::general_purpose::STANDARD_NO_PAD.encode(h.finalize())
}

/// Whether `ip` is one a tenant's webhook must not reach by default: the ranges sandbox
/// egress blocks, and the IPv6 ones, IPv6 forms carrying an IPv4 address judged by that
/// address (`warren_runtime::blocked`, shared with registry pulls).
fn internal(ip: IpAddr) -> bool {
    warren_runtime::blocked::HostPolicy::default()
        .check(ip)
        .is_err()
}

/// Posts deliveries for the control plane.
pub struct HttpWebhookSender {
    /// Let receivers be on internal addresses (tests, a receiver beside the server).
    pub allow_private: bool,
    /// The body of a delivery (`warren_server::event_payload`).
    pub encode: EncodeEvent,
}

#[async_trait::async_trait]
impl warren_control::WebhookSender for HttpWebhookSender {
    async fn send(&self, hook: &SealedWebhook, d: &Delivery) -> Result<(), String> {
        let url = reqwest_oci::Url::parse(&hook.hook.url).map_err(|e| format!("url: {e}"))?;
        let host = url.host_str().ok_or("url has no host")?.to_string();
        let port = url.port_or_known_default().ok_or("url has no port")?;
        let bare = host.trim_start_matches('[').trim_end_matches(']');
        let addrs: Vec<SocketAddr> = match bare.parse::<IpAddr>() {
            Ok(ip) => vec![SocketAddr::new(ip, port)],
            Err(_) => tokio::net::lookup_host((bare, port))
                .await
                .map_err(|e| format!("resolving {host}: {e}"))?
                .collect(),
        };
        let addr = addrs
            .into_iter()
            .find(|a| self.allow_private || !internal(a.ip()))
            .ok_or_else(|| format!("{host} is an internal address; webhooks may not reach it"))?;
        let body = (self.encode)(&d.event).map_err(|e| format!("encoding the event: {e}"))?;
        let _ = rustls::crypto::ring::default_provider().install_default();
        let builder = reqwest_oci::Client::builder();
        let client = builder
            .tls_certs_only(host_roots())
            .redirect(reqwest_oci::redirect::Policy::none())
            .timeout(Duration::from_secs(10))
            .resolve(bare, addr)
            .build()
            .map_err(|e| format!("client: {e}"))?;
        let resp = client
            .post(url)
            .header("content-type", "application/json")
            .header("e2b-webhook-id", &hook.hook.id)
            .header("e2b-delivery-id", &d.id)
            .header("e2b-signature-version", "v1")
            .header("e2b-signature", signature(&hook.secret, &body))
            .body(body)
            .send()
            .await
            .map_err(|e| format!("posting: {e}"))?;
        if resp.status().is_success() {
            Ok(())
        } else {
            Err(format!("the receiver answered {}", resp.status()))
        }
    }
}

/// The host's trust store ([`warren_tls::host_roots`], read once), which HTTPS receivers are
/// verified against.
fn host_roots() -> Vec<reqwest_oci::Certificate> {
    warren_tls::host_roots()
        .iter()
        .filter_map(|c| reqwest_oci::Certificate::from_der(c.as_ref()).ok())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn internal_addresses_are_known() {
        for a in [
            "127.0.0.1",
            "10.1.2.3",
            "172.16.0.1",
            "192.168.1.1",
            "169.254.169.254",
            "100.64.0.1",
            "0.0.0.0",
            "::1",
            "fd00::1",
            "fe80::1",
            "::ffff:127.0.0.1",
            // What the egress list has and this filter once missed.
            "168.63.129.16",
            "192.0.0.170",
            "198.18.0.1",
            "198.19.255.254",
            "240.0.0.1",
            "255.255.255.255",
            // NAT64, 6to4 and IPv4-compatible forms of internal IPv4 addresses.
            "64:ff9b::7f00:1",
            "64:ff9b::a9fe:a9fe",
            "64:ff9b:1::a00:1",
            "2002:7f00:1::1",
            "2002:a9fe:a9fe::",
            "2002:c0a8:101::1",
            "::127.0.0.1",
            "::a00:1",
            "::ffff:168.63.129.16",
            "fec0::1",
            "ff02::1",
        ] {
            assert!(internal(a.parse().unwrap()), "{a}");
        }
        for a in [
            "::ffff:203.0.113.5",
            "64:ff9b::cb00:7105",
            "2002:cb00:7105::1",
        ] {
            assert!(!internal(a.parse().unwrap()), "{a}");
        }
        for a in ["192.0.2.1", "203.0.113.5", "2001:db8::1"] {
            assert!(!internal(a.parse().unwrap()), "{a}");
        }
    }

    #[test]
    fn the_signature_is_the_hash_of_secret_and_body() {
        // sha256("secretbody"), base64 without padding.
        assert_eq!(
            signature("secret", b"body"),
            "YuouM0o8pKJyrkZVR45vYimhIRzExMogPwMGjY/kzew"
        );
        assert!(!signature("secret", b"body").ends_with('='));
    }

    fn delivery(url: &str) -> (SealedWebhook, Delivery) {
        let now = chrono::Utc::now();
        let hook = warren_control::Webhook {
            id: "hook1".into(),
            team: "t".into(),
            name: "n".into(),
            url: url.into(),
            enabled: true,
            events: vec![warren_control::EventKind::Created],
            created_at: now,
            updated_at: now,
        };
        let event = SandboxEvent {
            id: "ev1".into(),
            kind: warren_control::EventKind::Created,
            sandbox_id: "sbx1".into(),
            team: "t".into(),
            template: "base".into(),
            at: now,
            data: None,
        };
        let d = Delivery {
            id: "del1".into(),
            webhook_id: "hook1".into(),
            event,
            attempts: 0,
            next_at: now,
        };
        let sealed = SealedWebhook {
            hook,
            secret: "secret".into(),
        };
        (sealed, d)
    }

    fn encode(e: &SandboxEvent) -> serde_json::Result<Vec<u8>> {
        Ok(format!("{{\"id\":\"{}\"}}", e.id).into_bytes())
    }

    #[tokio::test]
    async fn a_delivery_is_posted_signed_to_an_allowed_receiver() {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        use warren_control::WebhookSender;
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let receiver = tokio::spawn(async move {
            let (mut conn, _) = listener.accept().await.unwrap();
            let mut got = Vec::new();
            let mut buf = [0u8; 4096];
            while !String::from_utf8_lossy(&got).ends_with("{\"id\":\"ev1\"}") {
                let n = conn.read(&mut buf).await.unwrap();
                assert!(n > 0, "the request ended early");
                got.extend_from_slice(&buf[..n]);
            }
            conn.write_all(b"HTTP/1.1 204 No Content\r\nconnection: close\r\n\r\n")
                .await
                .unwrap();
            String::from_utf8(got).unwrap().to_lowercase()
        });
        let (hook, d) = delivery(&format!("http://{addr}/hook"));
        let sender = HttpWebhookSender {
            allow_private: true,
            encode,
        };
        sender.send(&hook, &d).await.unwrap();
        let request = receiver.await.unwrap();
        assert!(request.starts_with("post /hook http/1.1\r\n"), "{request}");
        for header in [
            "content-type: application/json\r\n".to_string(),
            "e2b-webhook-id: hook1\r\n".to_string(),
            "e2b-delivery-id: del1\r\n".to_string(),
            "e2b-signature-version: v1\r\n".to_string(),
            format!(
                "e2b-signature: {}\r\n",
                signature("secret", b"{\"id\":\"ev1\"}").to_lowercase()
            ),
        ] {
            assert!(request.contains(&header), "{header} in {request}");
        }
    }

    #[tokio::test]
    async fn an_internal_receiver_is_refused_unless_allowed() {
        use warren_control::WebhookSender;
        let (hook, d) = delivery("http://127.0.0.1:9/hook");
        let sender = HttpWebhookSender {
            allow_private: false,
            encode,
        };
        assert_eq!(
            sender.send(&hook, &d).await.unwrap_err(),
            "127.0.0.1 is an internal address; webhooks may not reach it"
        );
    }
}
