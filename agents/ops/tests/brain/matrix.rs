//! Matrix events applied by the ops brain: who may instruct, what is
//! recorded, and what is answered.

use nisse_bus::proto::{MatrixEventKind, MatrixEventReceived};

use super::*;
use pretty_assertions::assert_eq;

const OP: &str = "@op:example.org";

fn config() -> Config {
    Config {
        operators: vec![format!("matrix:{OP}")],
        ..Config::default()
    }
}

fn said(h: &mut Harness, minute: i64, sender: &str, body: &str, item: &str) {
    let at = T0 + time::Duration::minutes(minute);
    let msg = MatrixEventReceived {
        envelope: Some(Envelope {
            agent: "ops".into(),
            work_item_id: item.into(),
            actor: Some(proto::Actor {
                kind: proto::ActorKind::External as i32,
                id: sender.into(),
            }),
            message_id: format!("matrix:$e{minute}"),
            created_at: Some(std::time::SystemTime::from(at).into()),
            ..Default::default()
        }),
        event_id: format!("$e{minute}"),
        sender: sender.into(),
        kind: MatrixEventKind::Message as i32,
        body: body.into(),
        ..Default::default()
    };
    h.apply(at, AnyMessage::InMatrix(msg));
}

#[test]
fn the_operator_is_answered_and_recorded_strangers_only_recorded() {
    let mut h = Harness::new(config());
    // No item yet: a question is still answered, in the room.
    said(&mut h, 0, OP, "status?", "");
    let answers: Vec<String> = h.outbound().into_iter().map(|o| o.markdown).collect();
    assert_eq!(answers, ["No work item is open."]);
    // A stranger asking gets nothing.
    said(&mut h, 1, "@eve:example.org", "status?", "");
    assert_eq!(h.outbound().len(), 1);

    h.alert(2, "firing", CPU);
    let item = h.items().remove(0);
    said(&mut h, 3, OP, "ops: what is the load now?", &item.id);
    said(&mut h, 4, "@eve:example.org", "approve", &item.id);
    said(&mut h, 5, OP, "@bob:example.org stop", &item.id);
    let log: Vec<(String, bool, String)> = h
        .store
        .events(&item.id)
        .unwrap()
        .into_iter()
        .filter_map(|e| match e.event {
            Event::Said {
                text,
                operator,
                read_as,
                ..
            } => Some((text, operator, read_as)),
            _ => None,
        })
        .collect();
    assert_eq!(
        log,
        [
            ("ops: what is the load now?".into(), true, "question".into()),
            ("approve".into(), false, "command".into()),
            (
                "@bob:example.org stop".into(),
                true,
                "for-someone-else".into()
            ),
        ]
    );
    // The question got the item's status; nothing else was answered.
    let last = h.outbound().pop().unwrap().markdown;
    assert!(
        last.starts_with(&format!("Item **#{}**", item.number)),
        "{last}"
    );
    assert_eq!(h.items().remove(0).state, item.state);
}
