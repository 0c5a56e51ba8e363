//! The pieces of the Connect protocol (JSON codec) the CLI speaks to a sandbox's agent:
//! streaming envelopes and error bodies.

use anyhow::{anyhow, Context};
use serde_json::Value;

/// Envelope flag: the end-of-stream message (`{}` or `{"error": …}`).
pub const END_STREAM: u8 = 0x02;

/// One message as an envelope: flags byte, big-endian length, JSON payload.
pub fn encode_envelope(msg: &Value) -> anyhow::Result<Vec<u8>> {
    let payload = serde_json::to_vec(msg)?;
    let len = u32::try_from(payload.len()).context("message too long")?;
    let mut out = Vec::with_capacity(5 + payload.len());
    out.push(0);
    out.extend_from_slice(&len.to_be_bytes());
    out.extend_from_slice(&payload);
    Ok(out)
}

#[derive(Debug, PartialEq)]
pub enum Frame {
    /// A stream message.
    Message(Value),
    /// The end-of-stream trailer: `Ok` for `{}`, `Err` when it carries an error.
    End(Result<(), String>),
}

/// Splits a response body, fed in arbitrary chunks, into envelopes.
#[derive(Default)]
pub struct Decoder {
    buf: Vec<u8>,
}

impl Decoder {
    pub fn push(&mut self, chunk: &[u8]) {
        self.buf.extend_from_slice(chunk);
    }

    /// The next complete envelope, if one has arrived.
    pub fn next_frame(&mut self) -> anyhow::Result<Option<Frame>> {
        if self.buf.len() < 5 {
            return Ok(None);
        }
        let len = u32::from_be_bytes([self.buf[1], self.buf[2], self.buf[3], self.buf[4]]) as usize;
        if self.buf.len() < 5 + len {
            return Ok(None);
        }
        let flags = self.buf[0];
        if flags & 0x01 != 0 {
            return Err(anyhow!("the sandbox sent a compressed message"));
        }
        let msg: Value =
            serde_json::from_slice(&self.buf[5..5 + len]).context("malformed stream message")?;
        self.buf.drain(..5 + len);
        if flags & END_STREAM != 0 {
            return Ok(Some(Frame::End(match msg.get("error") {
                Some(err) => Err(error_text(err)),
                None => Ok(()),
            })));
        }
        Ok(Some(Frame::Message(msg)))
    }
}

/// `code: message` of a Connect error object.
pub fn error_text(err: &Value) -> String {
    let code = err["code"].as_str().unwrap_or("error");
    match err["message"].as_str() {
        Some(m) if !m.is_empty() => format!("{code}: {m}"),
        _ => code.to_string(),
    }
}

/// The exit status the CLI reports for an `end` event.
pub fn exit_code(end: &Value) -> u8 {
    end["exitCode"]
        .as_i64()
        .map_or(0, |c| u8::try_from(c).unwrap_or(1))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn envelope_round_trip() {
        let msg = json!({"process": {"pid": 7}});
        let bytes = encode_envelope(&msg).unwrap();
        assert_eq!(bytes[0], 0);
        assert_eq!(
            u32::from_be_bytes([bytes[1], bytes[2], bytes[3], bytes[4]]) as usize,
            bytes.len() - 5
        );
        let mut d = Decoder::default();
        d.push(&bytes);
        assert_eq!(d.next_frame().unwrap(), Some(Frame::Message(msg)));
        assert_eq!(d.next_frame().unwrap(), None);
    }

    #[test]
    fn split_chunks_and_trailer() {
        let mut body = encode_envelope(&json!({"event": {"start": {"pid": 3}}})).unwrap();
        body.extend(encode_envelope(&json!({"event": {"data": {"pty": "aGk="}}})).unwrap());
        let trailer = br#"{"error":{"code":"not_found","message":"gone"}}"#;
        body.push(END_STREAM);
        body.extend_from_slice(&(trailer.len() as u32).to_be_bytes());
        body.extend_from_slice(trailer);

        let mut d = Decoder::default();
        let mut frames = Vec::new();
        // One byte at a time: every split point must work.
        for b in &body {
            d.push(std::slice::from_ref(b));
            while let Some(f) = d.next_frame().unwrap() {
                frames.push(f);
            }
        }
        assert_eq!(frames.len(), 3);
        assert_eq!(
            frames[0],
            Frame::Message(json!({"event": {"start": {"pid": 3}}}))
        );
        assert_eq!(frames[2], Frame::End(Err("not_found: gone".into())));
    }

    #[test]
    fn clean_trailer() {
        let mut d = Decoder::default();
        d.push(&[END_STREAM, 0, 0, 0, 2, b'{', b'}']);
        assert_eq!(d.next_frame().unwrap(), Some(Frame::End(Ok(()))));
    }

    #[test]
    fn malformed_payload_is_an_error() {
        let mut d = Decoder::default();
        d.push(&[0, 0, 0, 0, 1, b'{']);
        assert!(d.next_frame().is_err());
    }

    #[test]
    fn exit_codes() {
        assert_eq!(exit_code(&json!({"exited": true})), 0);
        assert_eq!(exit_code(&json!({"exitCode": 3})), 3);
        assert_eq!(exit_code(&json!({"exitCode": -1})), 1);
    }
}
