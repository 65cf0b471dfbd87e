//! `nisse dev …`: the dev agent's projects, from the operator's side.

use crate::config::Config;

/// `nisse dev check <project>`: the branch protection check the harness
/// makes before working on a project and before every publish (seed
/// Nisse D4), made now with the agent's own Gitea token through the same
/// client and rule as intake-gitea. Prints what Gitea reports and exits
/// non-zero, naming every failing check, when the protection does not
/// hold.
pub async fn check(cfg: &Config, project: &str) -> anyhow::Result<()> {
    let Some(p) = cfg.dev.projects.get(project) else {
        let known: Vec<&str> = cfg.dev.projects.keys().map(String::as_str).collect();
        anyhow::bail!(
            "there is no project `{project}` in dev.projects (configured: {})",
            if known.is_empty() {
                "none".to_string()
            } else {
                known.join(", ")
            }
        );
    };
    let found = nisse_intake_gitea::check_protection(
        &cfg.gitea,
        &p.repository,
        &p.base_branch,
        p.agent_merges(),
    )
    .await?;
    let yes = |b: bool| if b { "yes" } else { "no" };
    println!(
        "project {project}: branch `{}` of {} as `{}` sees it (trust: {})",
        p.base_branch,
        p.repository,
        cfg.gitea.account,
        serde_json::to_value(p.trust)?.as_str().unwrap_or_default()
    );
    let row = |label: &str, value: String| println!("  {label:<28} {value}");
    row("protected:", yes(found.protected).into());
    row(
        "the agent may push to it:",
        yes(found.agent_can_push).into(),
    );
    row(
        "the agent may merge into it:",
        yes(found.agent_can_merge).into(),
    );
    row(
        "approvals a merge needs:",
        found.required_approvals.to_string(),
    );
    row(
        "status checks required:",
        if found.status_check_contexts.is_empty() {
            "none".to_string()
        } else {
            found.status_check_contexts.join(", ")
        },
    );
    if found.problems.is_empty() {
        println!("the protection holds");
        return Ok(());
    }
    anyhow::bail!(
        "the protection of `{}` in {} does not hold, so the agent does not work on project {project}:\n{}",
        p.base_branch,
        p.repository,
        found
            .problems
            .iter()
            .map(|x| format!("  - {x}"))
            .collect::<Vec<_>>()
            .join("\n")
    )
}
