//! What the CLI makes of the agent's process events (the wire itself is
//! `warren_proto::client`'s).

use warren_proto::process::process_event::{EndEvent, Event};
use warren_proto::process::{ProcessEvent, StartResponse};

/// The event a `Start` stream message carries, if any.
pub fn event(msg: StartResponse) -> Option<Event> {
    msg.event.and_then(|ProcessEvent { event }| event)
}

/// The exit status the CLI reports for an `end` event: the process's own when it fits, 1
/// otherwise (killed by a signal the agent reports as -1, say).
pub fn exit_code(end: &EndEvent) -> u8 {
    u8::try_from(end.exit_code).unwrap_or(1)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn end(exit_code: i32) -> EndEvent {
        EndEvent {
            exit_code,
            exited: true,
            ..Default::default()
        }
    }

    #[test]
    fn exit_codes() {
        assert_eq!(exit_code(&end(0)), 0);
        assert_eq!(exit_code(&end(3)), 3);
        assert_eq!(exit_code(&end(-1)), 1);
        assert_eq!(exit_code(&end(300)), 1);
    }

    #[test]
    fn an_end_event_without_exit_code_is_zero() {
        // proto3 JSON omits a zero exit code: `{"exited": true}` is a clean exit.
        let msg: StartResponse =
            serde_json::from_value(serde_json::json!({"event": {"end": {"exited": true}}}))
                .unwrap();
        match event(msg) {
            Some(Event::End(e)) => assert_eq!(exit_code(&e), 0),
            other => panic!("{other:?}"),
        }
    }
}
