//! The controls a test drives the stand-in with, standing for what people
//! do in Gitea's web interface: each changes the state as Gitea would,
//! with the given user as the one who did it, and returns once the
//! webhooks Gitea sends for it were attempted.

use super::ops::{self, NewCodeComment};
use super::{EventKind, GiteaRepo, ReviewState};

impl GiteaRepo {
    /// Opens an issue by `by` with `labels` (created in the repository
    /// when new); webhook `issues`, action `opened`. Returns its number.
    pub async fn open_issue(
        &self,
        by: &str,
        title: &str,
        body: &str,
        labels: &[&str],
    ) -> anyhow::Result<i64> {
        let (number, sent) = ops::open_issue(&self.shared, self.id, by, title, body, labels)?;
        sent.delivered().await;
        Ok(number)
    }

    /// Assigns `assignee` to issue or pull request `number`, by `by`;
    /// webhook `issue_assign` (`pull_request_assign`), action `assigned`.
    pub async fn assign(&self, number: i64, assignee: &str, by: &str) -> anyhow::Result<()> {
        ops::assign(&self.shared, self.id, number, assignee, by, false)
            .await?
            .delivered()
            .await;
        Ok(())
    }

    /// Unassigns `assignee` from `number`, by `by`; action `unassigned`.
    pub async fn unassign(&self, number: i64, assignee: &str, by: &str) -> anyhow::Result<()> {
        ops::assign(&self.shared, self.id, number, assignee, by, true)
            .await?
            .delivered()
            .await;
        Ok(())
    }

    /// Adds the label `label` to `number`, by `by`; webhook
    /// `issue_label` (`pull_request_label`), action `label_updated`.
    pub async fn add_label(&self, number: i64, label: &str, by: &str) -> anyhow::Result<()> {
        ops::add_label(&self.shared, self.id, number, label, by)
            .await?
            .delivered()
            .await;
        Ok(())
    }

    /// Comments on `number` as `by`; webhook `issue_comment`
    /// (`pull_request_comment` on a pull request, `is_pull` true), action
    /// `created`. Returns the comment's id.
    pub async fn comment(&self, number: i64, by: &str, body: &str) -> anyhow::Result<i64> {
        let (id, sent) = ops::comment(&self.shared, self.id, number, by, body).await?;
        sent.delivered().await;
        Ok(id)
    }

    /// Edits comment `id` to say `body`, as `by` (its author, or anyone
    /// with write access); webhook `issue_comment` (`pull_request_comment`
    /// on a pull request), action `edited`, the old body in `changes`.
    /// Gitea keeps whole seconds: an edit is told apart from the comment,
    /// and from an earlier edit, by its `updated_at` only when it is made
    /// in a later second.
    pub async fn edit_comment(&self, id: i64, by: &str, body: &str) -> anyhow::Result<()> {
        let (_, sent) = ops::edit_comment(&self.shared, self.id, id, by, body).await?;
        sent.delivered().await;
        Ok(())
    }

    /// Makes issue `depends_on` block issue `number` (Gitea sends no
    /// webhook for dependencies: clients read them).
    pub fn add_dependency(&self, number: i64, depends_on: i64) -> anyhow::Result<()> {
        Ok(ops::add_dependency(
            &self.shared,
            self.id,
            number,
            depends_on,
        )?)
    }

    /// Closes `number` as `by`; webhook `issues` (`pull_request`), action
    /// `closed`. Refused, as by Gitea, while it has open dependencies.
    pub async fn close_issue(&self, number: i64, by: &str) -> anyhow::Result<()> {
        ops::set_state(&self.shared, self.id, number, by, true, "")
            .await?
            .delivered()
            .await;
        Ok(())
    }

    /// Reopens `number` as `by`; action `reopened`.
    pub async fn reopen(&self, number: i64, by: &str) -> anyhow::Result<()> {
        ops::set_state(&self.shared, self.id, number, by, false, "")
            .await?
            .delivered()
            .await;
        Ok(())
    }

    /// Comments `body` on `line` of `path` in pull request `pull`'s diff
    /// as `by` (a positive line is of the new file, a negative one of the
    /// old file): a review of type comment holding that one comment, as
    /// Gitea's "add single comment" makes it; webhook
    /// `pull_request_review_comment`, action `reviewed`. A comment on the
    /// same path and line as an earlier one joins its conversation.
    /// Returns the inline comment's id.
    pub async fn inline_comment(
        &self,
        pull: i64,
        by: &str,
        path: &str,
        line: i64,
        body: &str,
    ) -> anyhow::Result<i64> {
        let comment = NewCodeComment {
            path: path.to_string(),
            line,
            body: body.to_string(),
        };
        let (review, sent) = ops::review(
            &self.shared,
            self.id,
            pull,
            by,
            ReviewState::Comment,
            "",
            vec![comment],
        )
        .await?;
        sent.delivered().await;
        let state = self.shared.lock();
        state
            .events
            .iter()
            .rev()
            .find(|e| matches!(&e.kind, EventKind::Code { review: r, .. } if *r == review))
            .map(|e| e.id)
            .ok_or_else(|| anyhow::anyhow!("the inline comment just made on #{pull} is gone"))
    }

    /// Submits a review of `pull` by `by` with `verdict` and `body`;
    /// webhook `pull_request_review_approved`, `_rejected` or `_comment`.
    /// Returns the review's id.
    pub async fn review(
        &self,
        pull: i64,
        by: &str,
        verdict: ReviewState,
        body: &str,
    ) -> anyhow::Result<i64> {
        let (id, sent) =
            ops::review(&self.shared, self.id, pull, by, verdict, body, Vec::new()).await?;
        sent.delivered().await;
        Ok(id)
    }

    /// Approves `pull` as `by` (not its author: Gitea refuses that).
    pub async fn approve(&self, pull: i64, by: &str) -> anyhow::Result<i64> {
        self.review(pull, by, ReviewState::Approved, "").await
    }

    /// Merges `pull` as `by` with a merge commit on its base branch (the
    /// protected default branch moves only this way), as a repository
    /// admin forcing the merge: neither approvals nor status checks are
    /// needed (the merge API, `POST .../pulls/{index}/merge`, checks them
    /// for whoever calls it). Closes it with webhook `pull_request`, action
    /// `closed`, `merged` true, and closes the issues its title or body
    /// close with Gitea's keywords (`Fixes #3`). Returns the merge commit.
    pub async fn merge_pull(&self, pull: i64, by: &str) -> anyhow::Result<String> {
        let (commit, sent) = ops::merge(&self.shared, self.id, pull, by).await?;
        sent.delivered().await;
        Ok(commit)
    }

    /// Reports a commit status on commit `sha` (full or abbreviated), as a
    /// CI does through `POST /repos/{owner}/{repo}/statuses/{sha}`: its
    /// `context` (the check's name, which a branch protection rule may
    /// require), its `state` (`pending`, `success`, `error`, `failure`,
    /// `warning` or `skipped`; anything else is refused) and `description`,
    /// reported by the repository's owner. The latest status of a context
    /// is the one that counts. Gitea sends no webhook for it. Returns the
    /// status's id (its index among the commit's statuses).
    pub async fn set_status(
        &self,
        sha: &str,
        context: &str,
        state: &str,
        description: &str,
    ) -> anyhow::Result<i64> {
        let owner = self.owner();
        let status = ops::NewStatus {
            state,
            context,
            description,
            target_url: "",
        };
        let (_, index) = ops::create_status(&self.shared, self.id, &owner, sha, &status).await?;
        Ok(index)
    }
}
