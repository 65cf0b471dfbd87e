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

/// What `nisse dev project add` is told about the project.
#[derive(Debug, Clone)]
pub struct NewProject {
    /// Its name (a key of `dev.projects`).
    pub name: String,
    /// `owner/name` in Gitea.
    pub repository: String,
    /// The branch work starts from and pull requests go to.
    pub base_branch: String,
    /// The executor host its workspace is on.
    pub build_host: String,
    /// The workspace's absolute path there.
    pub workspace: String,
    /// The URL the build host clones from and pushes to.
    pub clone_url: String,
    /// Gitea's SSH host key on the build host, when not the user's own.
    pub git_known_hosts: Option<String>,
    /// The project's test commands.
    pub test_commands: Vec<String>,
    /// Who merges (`operator-merges`, `agent-merges-after-approval`).
    pub trust: Option<String>,
}

/// `nisse dev project add`: registers a project the operator provisioned
/// (seed Nisse D1: the repository with its protection, the agent's
/// access, a build host). The project is written into the configuration
/// file as `[dev.projects.<name>]`, its repository added to
/// `gitea.repositories`, keeping the file's comments and layout, and only
/// when the configuration with it is valid: otherwise nothing changes and
/// every problem is named. Then its branch protection is checked as the
/// harness checks it. The services read the file when they start.
pub async fn add_project(file: &std::path::Path, new: &NewProject) -> anyhow::Result<()> {
    use anyhow::Context as _;
    let text = match std::fs::read_to_string(file) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => String::new(),
        Err(e) => return Err(e).with_context(|| format!("reading {}", file.display())),
    };
    let mut doc: toml_edit::DocumentMut = text
        .parse()
        .with_context(|| format!("{} is not valid TOML", file.display()))?;
    let projects = doc
        .entry("dev")
        .or_insert_with(implicit_table)
        .as_table_mut()
        .context("`dev` in the configuration is not a table")?
        .entry("projects")
        .or_insert_with(implicit_table)
        .as_table_mut()
        .context("`dev.projects` in the configuration is not a table")?;
    if projects.contains_key(&new.name) {
        anyhow::bail!(
            "dev.projects.{} exists already in {}: edit it there",
            new.name,
            file.display()
        );
    }
    let mut table = toml_edit::Table::new();
    table["repository"] = toml_edit::value(&new.repository);
    table["base-branch"] = toml_edit::value(&new.base_branch);
    table["build-host"] = toml_edit::value(&new.build_host);
    table["workspace"] = toml_edit::value(&new.workspace);
    table["clone-url"] = toml_edit::value(&new.clone_url);
    if let Some(k) = &new.git_known_hosts {
        table["git-known-hosts"] = toml_edit::value(k);
    }
    if !new.test_commands.is_empty() {
        let mut commands = toml_edit::Array::new();
        for c in &new.test_commands {
            commands.push(c.as_str());
        }
        table["test-commands"] = toml_edit::value(commands);
    }
    if let Some(t) = &new.trust {
        table["trust"] = toml_edit::value(t);
    }
    projects.insert(&new.name, toml_edit::Item::Table(table));
    if let Some(gitea) = doc.get_mut("gitea").and_then(|g| g.as_table_mut()) {
        let repositories = gitea
            .entry("repositories")
            .or_insert_with(|| toml_edit::value(toml_edit::Array::new()))
            .as_array_mut()
            .context("`gitea.repositories` in the configuration is not a list")?;
        if !repositories
            .iter()
            .any(|r| r.as_str() == Some(new.repository.as_str()))
        {
            repositories.push(new.repository.as_str());
        }
    }

    // The configuration with the project must load as the services load
    // it (the environment included) before anything is written.
    let dir = file
        .parent()
        .filter(|d| !d.as_os_str().is_empty())
        .unwrap_or(std::path::Path::new("."));
    let mut scratch = tempfile::Builder::new()
        .prefix(".nisse-project-")
        .suffix(".toml")
        .tempfile_in(dir)
        .with_context(|| format!("making a scratch file in {}", dir.display()))?;
    std::io::Write::write_all(&mut scratch, doc.to_string().as_bytes())?;
    scratch.as_file().sync_all()?;
    let cfg = Config::load(Some(scratch.path())).map_err(|e| {
        anyhow::anyhow!(
            "project {} was not added, {} is unchanged: {e:#}",
            new.name,
            file.display()
        )
    })?;
    scratch
        .persist(file)
        .with_context(|| format!("writing {}", file.display()))?;
    if let Ok(d) = std::fs::File::open(dir) {
        let _ = d.sync_all();
    }
    println!(
        "project {} added to {}: restart nisse (or its dev brain, intake-gitea, executor and classifier) for the services to take it",
        new.name,
        file.display()
    );
    check(&cfg, &new.name).await
}

fn implicit_table() -> toml_edit::Item {
    let mut t = toml_edit::Table::new();
    t.set_implicit(true);
    toml_edit::Item::Table(t)
}
