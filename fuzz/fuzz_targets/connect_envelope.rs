//! Connect framing and JSON decoding of the agent (`warren_proto::server`): streamed envelopes (split into chunks of a
//! fuzzer-chosen size, so reassembly across chunk borders is covered), unary bodies of the
//! request types clients send, and the Connect headers the agent parses.
#![no_main]

use axum::http::{header, HeaderMap, HeaderValue};
use bytes::Bytes;
use libfuzzer_sys::fuzz_target;
use warren_proto::server::{self as connect, EnvelopeReader};
use warren_proto::filesystem::{
    CreateWatcherRequest, ListDirRequest, MakeDirRequest, MoveRequest, RemoveRequest, StatRequest,
    WatchDirRequest,
};
use warren_proto::process::{
    CloseStdinRequest, ConnectRequest, SendInputRequest, SendSignalRequest, StartRequest,
    StreamInputRequest, UpdateRequest,
};

/// Reads every message of the stream as `T`, as a streaming handler would.
fn read_stream<T: serde::de::DeserializeOwned>(data: &[u8], chunk: usize) {
    let chunks: Vec<Result<Bytes, std::io::Error>> = data
        .chunks(chunk)
        .map(|c| Ok(Bytes::copy_from_slice(c)))
        .collect();
    let mut reader = EnvelopeReader::new(futures::stream::iter(chunks));
    futures::executor::block_on(async {
        // Bounded: a message is at least the 5-byte prefix, so the input bounds the count.
        while let Ok(Some(_)) = reader.next::<T>().await {}
    });
}

fn unary<T: serde::de::DeserializeOwned>(headers: &HeaderMap, body: &[u8]) {
    let _ = connect::decode_unary::<T>(headers, body);
}

fuzz_target!(|data: &[u8]| {
    let Some((&selector, rest)) = data.split_first() else {
        return;
    };
    let chunk = usize::from(selector >> 2).max(1);
    match selector & 3 {
        0 => read_stream::<StreamInputRequest>(rest, chunk),
        1 => read_stream::<WatchDirRequest>(rest, chunk),
        2 => read_stream::<serde::de::IgnoredAny>(rest, chunk),
        _ => read_stream::<StartRequest>(rest, chunk),
    }

    let mut headers = HeaderMap::new();
    headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    unary::<StartRequest>(&headers, rest);
    unary::<ConnectRequest>(&headers, rest);
    unary::<SendInputRequest>(&headers, rest);
    unary::<SendSignalRequest>(&headers, rest);
    unary::<CloseStdinRequest>(&headers, rest);
    unary::<UpdateRequest>(&headers, rest);
    unary::<StatRequest>(&headers, rest);
    unary::<MakeDirRequest>(&headers, rest);
    unary::<MoveRequest>(&headers, rest);
    unary::<ListDirRequest>(&headers, rest);
    unary::<RemoveRequest>(&headers, rest);
    unary::<CreateWatcherRequest>(&headers, rest);

    // The Connect headers, with the input as their value.
    if let Ok(value) = HeaderValue::from_bytes(rest) {
        let mut headers = HeaderMap::new();
        headers.insert("connect-timeout-ms", value.clone());
        headers.insert("keepalive-ping-interval", value.clone());
        headers.insert(header::CONTENT_TYPE, value);
        let _ = connect::timeout(&headers);
        let _ = connect::keepalive_interval(&headers);
        let _ = connect::is_stream_content_type(&headers);
        unary::<StartRequest>(&headers, b"{}");
    }
});
