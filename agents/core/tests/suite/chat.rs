//! Matrix events applied by the shared brain: who may instruct, what is
//! recorded, and what is answered.

use pretty_assertions::assert_eq;

use nisse_core::Event;

use super::harness::{CPU, Harness, at, settings};

const OP: &str = "@op2:example.org";

#[test]
fn the_operator_is_answered_and_recorded_strangers_only_recorded() {
    let mut h = Harness::desk(settings());
    // No item yet: a question is still answered, in the room.
    h.said(0, OP, "status?", "");
    let answers: Vec<String> = h.outbound().into_iter().map(|o| o.markdown).collect();
    assert_eq!(answers, ["No work item is open."]);
    // A stranger asking gets nothing.
    h.said(1, "@eve:example.org", "status?", "");
    assert_eq!(h.outbound().len(), 1);

    h.alert(2, "firing", CPU);
    let item = h.items().remove(0);
    h.said(3, OP, "desk: what is the load now?", &item.id);
    h.said(4, "@eve:example.org", "approve", &item.id);
    h.said(5, OP, "@bob:example.org stop", &item.id);
    let log: Vec<(String, bool, String)> = h.logged(&item.id, |e| match e {
        Event::Said {
            text,
            operator,
            read_as,
            ..
        } => Some((text, operator, read_as)),
        _ => None,
    });
    assert_eq!(
        log,
        [
            (
                "desk: what is the load now?".into(),
                true,
                "question".into()
            ),
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

#[test]
fn status_at_the_top_of_the_room_tells_where_every_open_item_stands() {
    let mut h = Harness::desk(settings());
    h.alert(0, "firing", CPU);
    h.alert(
        1,
        "firing",
        &[("alertname", "DiskFull"), ("instance", "host2")],
    );
    let items = h.items();
    assert_eq!(items.len(), 2);
    h.said(2, OP, "status", "");
    let answer = h.outbound().pop().unwrap();
    assert!(
        answer.envelope.unwrap().work_item_id.is_empty(),
        "in the room"
    );
    assert_eq!(
        answer.markdown,
        "2 open work items:\n- **#1** · HighCPU · active\n- **#2** · DiskFull · ready"
    );
    // In an item's thread it is that item's status.
    h.said(3, OP, "status", &items[1].id);
    let answer = h.outbound().pop().unwrap().markdown;
    assert!(
        answer.starts_with("Item **#2** · **DiskFull** · ready"),
        "{answer}"
    );
}

#[test]
fn park_puts_the_active_item_aside_for_the_next_which_keeps_its_place() {
    let mut h = Harness::desk(settings());
    h.alert(0, "firing", CPU);
    let first = h.items().remove(0);
    // Alone, it goes on.
    h.said(1, OP, "park", &first.id);
    assert!(
        h.outbound()
            .pop()
            .unwrap()
            .markdown
            .contains("Nothing else is waiting"),
    );
    h.alert(
        2,
        "firing",
        &[("alertname", "DiskFull"), ("instance", "host2")],
    );
    h.said(3, OP, "park", &first.id);
    let items = h.items();
    assert_eq!(
        (items[0].state, items[1].state),
        (nisse_core::State::Ready, nisse_core::State::Active)
    );
    assert!(
        h.outbound().iter().any(|o| o.markdown.contains(
            "Item **#1** is parked (it keeps its place in the queue); item **#2** goes on."
        )),
        "{:#?}",
        h.outbound()
    );
    // A stranger's park changes nothing.
    h.said(4, "@eve:example.org", "park", &items[1].id);
    assert_eq!(h.items()[1].state, nisse_core::State::Active);
    // Not being worked on: nothing to park.
    h.said(5, OP, "park", &first.id);
    assert!(
        h.outbound()
            .pop()
            .unwrap()
            .markdown
            .contains("nothing to park")
    );
}

#[test]
fn park_and_next_work_from_the_cli_too() {
    use nisse_bus::proto::{self, operator_command::Command};
    let mut h = Harness::desk(settings());
    h.alert(0, "firing", CPU);
    h.alert(
        1,
        "firing",
        &[("alertname", "DiskFull"), ("instance", "host2")],
    );
    h.alert(
        2,
        "firing",
        &[("alertname", "NoBackup"), ("instance", "host3")],
    );
    // #3 goes next, then #1 is parked: #3 takes over.
    let next = h.operator(at(3), "cli:op", "#3", Command::DoNext(proto::DoNext {}));
    assert!(
        h.reply(&next)
            .lines
            .iter()
            .any(|l| l == "Item **#3** goes next."),
        "{:?}",
        h.reply(&next)
    );
    let parked = h.operator(at(4), "cli:op", "#1", Command::Park(proto::Park {}));
    let reply = h.reply(&parked);
    assert!(reply.applied, "{reply:?}");
    assert!(
        reply
            .lines
            .iter()
            .any(|l| l.contains("item **#3** goes on")),
        "{reply:?}"
    );
    let states: Vec<_> = h.items().into_iter().map(|i| i.state).collect();
    use nisse_core::State::{Active, Ready};
    assert_eq!(states, [Ready, Ready, Active]);
    // Someone not on the allowlist changes nothing.
    h.operator(at(5), "cli:eve", "#3", Command::Park(proto::Park {}));
    assert_eq!(h.items()[2].state, Active);
}
