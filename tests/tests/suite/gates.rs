//! Every code path that can lead to an execution, enumerated from the
//! workspace's source, and each shown to pass the kill switches.
//!
//! Oikos's kill switch was read only by code nothing called (§8.1). Here an
//! execution request can be built only from a `Permit`, a permit only by
//! `Permit::issue`, and `Permit::issue` reads the switches before anything
//! else. This test pins that down in the source itself: a new place that
//! builds an execution request, publishes on the execution subject, makes
//! a permit or skips the switches fails it, and whoever adds one must add
//! it here, on purpose, with the check it makes.

use std::path::{Path, PathBuf};

/// The workspace's Rust sources outside tests, benches and generated code.
fn sources() -> Vec<(String, String)> {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..");
    let mut out = Vec::new();
    walk(&root, &root, &mut out);
    assert!(out.len() > 20, "found only {} source files", out.len());
    out
}

fn walk(root: &Path, dir: &Path, out: &mut Vec<(String, String)>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        let name = path.file_name().unwrap().to_string_lossy().to_string();
        if path.is_dir() {
            if ["target", ".git", "tests", "benches", "fixtures"].contains(&name.as_str())
                || name.starts_with('.')
            {
                continue;
            }
            walk(root, &path, out);
        } else if name.ends_with(".rs") && name != "tests.rs" {
            // (`tests.rs` is a module's unit tests, `#[cfg(test)] mod
            // tests;`: not an execution path either.)
            let rel = path
                .strip_prefix(root)
                .unwrap()
                .to_string_lossy()
                .replace('\\', "/");
            let text = std::fs::read_to_string(&path).unwrap();
            // Unit tests inside a file are not an execution path.
            let code = match text.find("#[cfg(test)]") {
                Some(i) => text[..i].to_string(),
                None => text,
            };
            out.push((rel, code));
        }
    }
}

/// The files whose code contains `needle`.
fn files_with(sources: &[(String, String)], needle: &str) -> Vec<String> {
    let mut files: Vec<String> = sources
        .iter()
        .filter(|(_, code)| code.contains(needle))
        .map(|(f, _)| f.clone())
        .collect();
    files.sort();
    files
}

/// The function `signature` in `file`, up to its closing brace (the first
/// one at its own indentation).
fn body<'a>(sources: &'a [(String, String)], file: &str, signature: &str) -> &'a str {
    let code = &sources.iter().find(|(f, _)| f == file).unwrap().1;
    let start = code
        .find(signature)
        .unwrap_or_else(|| panic!("{file} has no `{signature}`"));
    let line_start = code[..start].rfind('\n').map_or(0, |i| i + 1);
    let indent = &code[line_start..start];
    let indent = &indent[..indent.len() - indent.trim_start().len()];
    let rest = &code[start..];
    let close = format!("\n{indent}}}\n");
    let end = rest.find(&close).map_or(rest.len(), |e| e + close.len());
    &rest[..end]
}

#[test]
fn every_path_to_an_execution_passes_the_kill_switches() {
    let src = sources();

    // 1. An execution request is built in one place.
    assert_eq!(
        files_with(&src, "ExecRequest {"),
        ["agents/core/src/gate.rs"],
        "an ExecRequest is built outside the gate"
    );
    // 2. ...from a permit, and queued without the emit check only there
    //    (emit refuses execution requests).
    //    `emit_exec` is the default timeout's way into it.
    let default = body(&src, "agents/core/src/gate.rs", "pub fn emit_exec(");
    assert!(
        default.contains("self.emit_exec_with_timeout(permit, what,"),
        "{default}"
    );
    let exec = body(
        &src,
        "agents/core/src/gate.rs",
        "pub fn emit_exec_with_timeout(",
    );
    assert!(exec.contains("permit: Permit"), "{exec}");
    // ...which also logs it, so the log and the request come from one
    // permit; and a verdict is asked for in one place, beside it.
    assert!(exec.contains("Event::ExecRequested"), "{exec}");
    assert_eq!(
        files_with(&src, "ClassifyRequest {"),
        ["agents/core/src/gate.rs"],
        "a ClassifyRequest is built outside the gate"
    );
    assert_eq!(
        files_with(&src, "emit_unchecked("),
        ["agents/core/src/gate.rs", "agents/core/src/store.rs"]
    );
    // A request sent again by the operator's `retry` is the stored bytes
    // of one the brain sent, under the same request id (an executor runs
    // a request id once), queued only there.
    assert_eq!(
        files_with(&src, "emit_encoded("),
        ["agents/core/src/requests.rs", "agents/core/src/store.rs"]
    );
    let emit = body(&src, "agents/core/src/store.rs", "pub fn emit<");
    assert!(
        emit.contains("SubjectKind::ExecReq") && emit.find("ExecReq") < emit.find("emit_unchecked"),
        "emit must refuse execution requests before queueing: {emit}"
    );
    // 3. Nothing else names the execution subject to publish on it: only
    //    the bus's own tables and the emit check.
    assert_eq!(
        files_with(&src, "SubjectKind::ExecReq"),
        ["agents/core/src/store.rs", "bus/src/topology.rs"]
    );
    // The same for MCP calls (seed L13: MCP tools pass the gates like
    // everything else): an McpRequest is built in the gate alone, from a
    // permit, logged there; emit refuses it; nothing else names its
    // subject.
    assert_eq!(
        files_with(&src, "McpRequest {"),
        ["agents/core/src/gate.rs"],
        "an McpRequest is built outside the gate"
    );
    let mcp = body(&src, "agents/core/src/gate.rs", "pub fn emit_mcp(");
    assert!(mcp.contains("permit: Permit"), "{mcp}");
    assert!(mcp.contains("Event::ExecRequested"), "{mcp}");
    assert!(
        emit.contains("SubjectKind::McpReq") && emit.find("McpReq") < emit.find("emit_unchecked"),
        "emit must refuse MCP calls before queueing: {emit}"
    );
    assert_eq!(
        files_with(&src, "SubjectKind::McpReq"),
        ["agents/core/src/store.rs", "bus/src/topology.rs"]
    );
    // 4. A permit is made only by `Permit::issue`, which reads the switches
    //    first: before the verdict, before the plan.
    assert_eq!(files_with(&src, "Permit {"), ["policy/src/gate.rs"]);
    let issue = body(&src, "policy/src/gate.rs", "pub fn issue(");
    let consult = issue
        .find("consult(")
        .expect("Permit::issue reads the switches");
    assert!(consult < issue.find("request.verdict").unwrap());
    assert!(consult < issue.find("match_call").unwrap());
    // 5. The paths that ask for an execution, each through a permit: the
    //    plan machinery's step runner, the agent loop's tool calls and the
    //    ops duties' host checks. A brain gets a permit in one place, from
    //    a verdict, and each path gets it in the same function that asks,
    //    before asking.
    assert_eq!(
        files_with(&src, "emit_exec("),
        [
            "agents/core/src/agent_loop/tools.rs",
            "agents/core/src/gate.rs",
            "agents/core/src/plans/runner.rs"
        ]
    );
    assert_eq!(
        files_with(&src, "emit_mcp("),
        [
            "agents/core/src/agent_loop/tools.rs",
            "agents/core/src/gate.rs",
            "agents/core/src/plans/runner.rs"
        ]
    );
    assert_eq!(
        files_with(&src, "emit_duty_exec("),
        ["agents/core/src/gate.rs", "agents/ops/src/checks/run.rs"]
    );
    assert_eq!(
        files_with(&src, "Permit::issue("),
        ["agents/core/src/gate.rs"]
    );
    let permit_for = body(&src, "agents/core/src/gate.rs", "pub fn permit_for(");
    assert!(permit_for.contains("Permit::issue("), "{permit_for}");
    for (file, function) in [
        ("agents/core/src/plans/runner.rs", "pub fn plan_verdict("),
        (
            "agents/core/src/agent_loop/tools.rs",
            "pub fn loop_verdict(",
        ),
        ("agents/ops/src/checks/run.rs", "fn duty_verdict("),
    ] {
        let f = body(&src, file, function);
        let issue = f.find("permit_for(").expect("the permit is asked for here");
        assert!(
            f.find("emit_exec(")
                .or_else(|| f.find("emit_duty_exec("))
                .is_some_and(|e| issue < e),
            "{file}: {function} asks for an execution only after its permit"
        );
    }
    // 6. The switches have one reader, and every verdict passes it: the
    //    classifier's fast path consults them before anything else.
    //    The executor and the mcp service read them again themselves (a
    //    hard wall), through the one function that assesses the action
    //    and consults them.
    assert_eq!(
        files_with(&src, "consult("),
        ["policy/src/gate.rs", "policy/src/switches.rs"]
    );
    assert_eq!(
        files_with(&src, "consult_action("),
        [
            "services/executor/src/walls.rs",
            "services/mcp/src/walls.rs"
        ]
    );
    let again = body(&src, "policy/src/switches.rs", "pub fn consult_action<");
    assert!(again.contains("consult("), "{again}");
    let fast = body(&src, "policy/src/gate.rs", "pub fn fast_path(");
    assert!(fast.find("consult(") < fast.find("NoSideEffects"), "{fast}");
    // 7. The executor runs a command in one place, and only after its walls
    //    (host binding, then the switches) and its "started" record.
    assert_eq!(
        files_with(&src, ".pool.run("),
        ["services/executor/src/run.rs"]
    );
    let walls = body(&src, "services/executor/src/walls.rs", "async fn check(");
    let signed = walls
        .find("wall.request(")
        .expect("the executor checks the signature");
    let binding = walls
        .find("host_binding(")
        .expect("the executor checks the binding");
    let switches = walls
        .find("consult_action(")
        .expect("the executor reads the switches");
    assert!(signed < binding && binding < switches, "{walls}");
    // The mcp service, likewise: the brain's signature, then the item's
    // signed mount, then the switches.
    let walls = body(&src, "services/mcp/src/walls.rs", "async fn check(");
    let signed = walls
        .find("wall.request(")
        .expect("the mcp service checks the signature");
    let mounted = walls
        .find("mount(")
        .expect("the mcp service checks the mount");
    let switches = walls
        .find("consult_action(")
        .expect("the mcp service reads the switches");
    assert!(signed < mounted && mounted < switches, "{walls}");
    // Both answer every request through the one at-most-once engine,
    // which passes the walls, then records "started", then carries the
    // request out; and they carry out only what passed it.
    for file in ["services/executor/src/run.rs", "services/mcp/src/run.rs"] {
        let handle = body(&src, file, "async fn handle(");
        assert!(
            handle.contains("self.once.answer(self, delivery)"),
            "{handle}"
        );
        let walls = body(&src, file, "async fn walls(");
        assert!(walls.contains("self.check(request)"), "{walls}");
    }
    assert_eq!(
        files_with(&src, "impl Work for"),
        ["services/executor/src/run.rs", "services/mcp/src/run.rs"]
    );
    let claimed = body(&src, "bus/src/once.rs", "async fn claimed<");
    let walls_at = claimed
        .find("work.walls(")
        .expect("claimed passes the walls");
    let started_at = claimed
        .find("self.write(&started")
        .expect("claimed records started");
    let perform_at = claimed
        .find("self.perform(")
        .expect("claimed carries it out");
    assert!(
        walls_at < started_at && started_at < perform_at,
        "{claimed}"
    );
    let perform = body(&src, "bus/src/once.rs", "async fn perform<");
    assert!(perform.contains("work.perform("), "{perform}");
    let execute = body(&src, "services/executor/src/run.rs", "async fn execute(");
    assert!(execute.contains(".pool.run("), "{execute}");
    let call = body(&src, "services/mcp/src/run.rs", "async fn make(");
    assert!(call.contains(".call_tool("), "{call}");
    assert_eq!(files_with(&src, ".call_tool("), ["services/mcp/src/run.rs"]);
    let classify = body(&src, "services/classifier/src/lib.rs", "pub fn decide(");
    assert!(
        classify.contains("fast_path("),
        "the classifier runs the fast path"
    );
}
