//! Whether a project's default branch is protected against the agent
//! itself (seed Nisse D4: "verified, not assumed"; L3, D5 for the trust
//! dial).
//!
//! Gitea is asked with the agent's own token, through its Branch API
//! (`GET /repos/{owner}/{repo}/branches/{branch}`), which answers for the
//! caller: `user_can_push` is the rule Gitea's own pre-receive check
//! applies to that account's pushes, `required_approvals` what a merge
//! needs. Reading the protection rule itself needs repository admin, which
//! the agent never has (D4: it never administers a repository), and an
//! actual push to the default branch would change it when protection is
//! missing, so the Branch API is the check that is both real and safe.
//!
//! The protection holds when the branch is protected, the agent's account
//! may not push to it, and a merge needs at least one approval (which the
//! agent cannot give: Gitea refuses an approval of one's own pull
//! request). With the trust dial at `agent-merges-after-approval` the
//! account must also be allowed to merge, or the dial cannot work.

use nisse_proto::v1::GiteaProtection;

use crate::api::{ApiError, Gitea};
use crate::shapes::BranchInfo;

/// What does not hold in `branch`'s protection for `account`, each in
/// words naming the check; empty when it holds.
pub(crate) fn problems(
    branch: &BranchInfo,
    repo: &str,
    account: &str,
    agent_merges: bool,
) -> Vec<String> {
    let name = &branch.name;
    let mut out = Vec::new();
    if !branch.protected {
        out.push(format!(
            "`{name}` of {repo} is not a protected branch: add a branch protection rule for it in Gitea"
        ));
    }
    if branch.user_can_push {
        out.push(format!(
            "the agent's account `{account}` may push to `{name}` of {repo}: take it off the rule's push allowlist (or disable pushing)"
        ));
    }
    if branch.required_approvals < 1 {
        out.push(format!(
            "merging into `{name}` of {repo} needs no approval: the rule must require at least one, so the agent's account cannot merge its own work unreviewed"
        ));
    }
    if agent_merges && !branch.user_can_merge {
        out.push(format!(
            "the trust dial lets the agent merge after an approval, but Gitea does not let `{account}` merge into `{name}` of {repo}: add it to the rule's merge allowlist or set the dial to operator-merges"
        ));
    }
    out
}

/// Checks `branch` of `repo` with the agent's token.
pub(crate) async fn check(
    gitea: &Gitea,
    repo: &str,
    branch: &str,
    account: &str,
    agent_merges: bool,
) -> Result<GiteaProtection, ApiError> {
    let info = gitea
        .retrying("reading the branch protection", |_| {
            gitea.branch(repo, branch)
        })
        .await?;
    Ok(GiteaProtection {
        branch: info.name.clone(),
        protected: info.protected,
        agent_can_push: info.user_can_push,
        agent_can_merge: info.user_can_merge,
        required_approvals: u32::try_from(info.required_approvals.max(0)).unwrap_or(u32::MAX),
        status_checks: info.enable_status_check,
        status_check_contexts: info.status_check_contexts.clone().unwrap_or_default(),
        problems: problems(&info, repo, account, agent_merges),
    })
}

/// The check as `nisse dev check` runs it, from the agent's Gitea
/// settings: the same client and rule intake-gitea uses.
pub async fn check_with(
    config: &crate::Config,
    repo: &str,
    branch: &str,
    agent_merges: bool,
) -> anyhow::Result<GiteaProtection> {
    let (Some(url), Some(token_file)) = (&config.url, &config.token_file) else {
        anyhow::bail!("gitea.url and gitea.token-file must be set to ask Gitea");
    };
    let gitea = Gitea::new(url, token_file.clone(), config.call_timeout)
        .map_err(|e| anyhow::anyhow!("gitea: {e}"))?;
    check(&gitea, repo, branch, &config.account, agent_merges)
        .await
        .map_err(|e| anyhow::anyhow!("asking Gitea about `{branch}` of {repo}: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn branch(protected: bool, push: bool, merge: bool, approvals: i64) -> BranchInfo {
        BranchInfo {
            name: "main".into(),
            protected,
            user_can_push: push,
            user_can_merge: merge,
            required_approvals: approvals,
            enable_status_check: false,
            status_check_contexts: None,
        }
    }

    #[test]
    fn protection_holds_only_when_the_agent_can_neither_push_nor_merge_unreviewed() {
        assert!(problems(&branch(true, false, true, 1), "a/b", "dev", false).is_empty());
        assert!(problems(&branch(true, false, true, 2), "a/b", "dev", true).is_empty());
        let open = problems(&branch(false, true, true, 0), "a/b", "dev", false);
        assert_eq!(open.len(), 3, "{open:#?}");
        assert!(open[0].contains("not a protected branch"));
        assert!(open[1].contains("may push to `main`"));
        assert!(open[2].contains("needs no approval"));
        let push = problems(&branch(true, true, true, 1), "a/b", "dev", false);
        assert!(
            push.len() == 1 && push[0].contains("`dev` may push"),
            "{push:#?}"
        );
        let dial = problems(&branch(true, false, false, 1), "a/b", "dev", true);
        assert!(
            dial.len() == 1 && dial[0].contains("trust dial"),
            "{dial:#?}"
        );
        // With the default dial the agent need not merge at all.
        assert!(problems(&branch(true, false, false, 1), "a/b", "dev", false).is_empty());
    }
}
