//! DNS questions from inside a slot (hickory-proto builds and reads the messages).

use std::net::{Ipv4Addr, SocketAddr, UdpSocket};

use hickory_proto::op::{Message, MessageType, OpCode, Query, ResponseCode};
use hickory_proto::rr::{Name, RData, RecordType};
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
