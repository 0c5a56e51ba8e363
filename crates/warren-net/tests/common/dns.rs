//! DNS questions from inside a slot (hickory-proto builds and reads the messages).

use std::net::{Ipv4Addr, SocketAddr, UdpSocket};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use hickory_proto::op::{Message, MessageType, OpCode, Query, ResponseCode};
use hickory_proto::rr::rdata::A;
use hickory_proto::rr::{Name, RData, Record, RecordType};
use warren_net::netns;

use super::OPEN;

/// An A question for `name`.
pub fn query(name: &str) -> Vec<u8> {
    let mut m = Message::new();
    m.set_id(0x5a5a)
        .set_message_type(MessageType::Query)
        .set_op_code(OpCode::Query)
        .set_recursion_desired(true);
    m.add_query(Query::query(Name::from_ascii(name).unwrap(), RecordType::A));
    m.to_vec().unwrap()
}

pub fn parse(bytes: &[u8]) -> (ResponseCode, Vec<Ipv4Addr>) {
    let m = Message::from_vec(bytes).expect("a DNS answer");
    let ips = m
        .answers()
        .iter()
        .filter_map(|r| match r.data() {
            RData::A(a) => Some(a.0),
            _ => None,
        })
        .collect();
    (m.response_code(), ips)
}

/// Asks `server` for `name` over UDP from inside the slot.
pub fn resolve(
    ns: &std::path::Path,
    server: SocketAddr,
    name: &str,
) -> (ResponseCode, Vec<Ipv4Addr>) {
    let socket = netns::run_in(ns, || UdpSocket::bind("0.0.0.0:0"))
        .expect("enter netns")
        .expect("bind");
    socket.set_read_timeout(Some(OPEN)).unwrap();
    socket
        .send_to(&query(name), server)
        .expect("send the query");
    let mut buf = [0u8; 1500];
    let (n, _) = socket
        .recv_from(&mut buf)
        .unwrap_or_else(|e| panic!("no answer for {name} from {server}: {e}"));
    parse(&buf[..n])
}

/// A DNS server (UDP) in `ns` that knows `names` and records every name it is asked.
pub struct Upstream {
    pub asked: Arc<Mutex<Vec<String>>>,
    stop: Arc<AtomicBool>,
}

impl Drop for Upstream {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

pub fn serve(
    ns: &std::path::Path,
    addr: SocketAddr,
    names: Vec<(&'static str, Ipv4Addr)>,
) -> Upstream {
    let socket = netns::run_in(ns, move || UdpSocket::bind(addr))
        .expect("enter netns")
        .expect("bind the test DNS server");
    socket
        .set_read_timeout(Some(Duration::from_millis(50)))
        .unwrap();
    let asked = Arc::new(Mutex::new(Vec::new()));
    let stop = Arc::new(AtomicBool::new(false));
    let (log, flag) = (asked.clone(), stop.clone());
    std::thread::spawn(move || {
        let mut buf = [0u8; 1500];
        while !flag.load(Ordering::Relaxed) {
            let Ok((n, peer)) = socket.recv_from(&mut buf) else {
                continue;
            };
            let Ok(q) = Message::from_vec(&buf[..n]) else {
                continue;
            };
            let Some(query) = q.queries().first().cloned() else {
                continue;
            };
            let asked_for = query.name().to_ascii().trim_end_matches('.').to_string();
            log.lock().unwrap().push(asked_for.clone());
            let mut r = Message::new();
            r.set_id(q.id())
                .set_message_type(MessageType::Response)
                .set_op_code(OpCode::Query)
                .set_recursion_available(true);
            r.add_query(query.clone());
            match names.iter().find(|(n, _)| *n == asked_for) {
                Some((_, ip)) => {
                    r.add_answer(Record::from_rdata(
                        query.name().clone(),
                        30,
                        RData::A(A(*ip)),
                    ));
                }
                None => {
                    r.set_response_code(ResponseCode::NXDomain);
                }
            }
            let _ = socket.send_to(&r.to_vec().unwrap(), peer);
        }
    });
    Upstream { asked, stop }
}
