//! The controls a test drives the stand-in with, standing for what
//! people do in Vikunja's web interface: each makes the change the
//! frontend's API call makes, checked the same way, as the given user
//! (by username), and returns once each webhook it fires was attempted
//! once. A refusal comes back as an error carrying Vikunja's status,
//! code and message.

use anyhow::Context as _;

use super::ops::{self, ApiError, TaskFields};
use super::{Permission, VikunjaStandIn};

impl VikunjaStandIn {
    fn user_id(&self, username: &str) -> anyhow::Result<i64> {
        self.shared
            .lock()
            .user_by_name(username)
            .map(|u| u.id)
            .with_context(|| format!("the Vikunja stand-in has no user {username:?}"))
    }

    /// Shares project `project_id` with `username` as `permission`, by
    /// the project's owner (sharing again changes it); webhook
    /// `project.shared.user`.
    pub async fn share_project(
        &self,
        project_id: i64,
        username: &str,
        permission: Permission,
    ) -> anyhow::Result<()> {
        let user = self.user_id(username)?;
        let sent = ops::share_project(&self.shared, project_id, user, permission)
            .with_context(|| format!("sharing project {project_id} with {username}"))?;
        sent.delivered().await;
        Ok(())
    }

    /// Creates a task titled `title` with `description` (HTML) in
    /// project `project_id` as `by`, who needs write access; webhook
    /// `task.created`. Returns its id.
    pub async fn create_task(
        &self,
        project_id: i64,
        by: &str,
        title: &str,
        description: &str,
    ) -> anyhow::Result<i64> {
        let caller = self.user_id(by)?;
        let fields = TaskFields {
            title: title.to_string(),
            description: description.to_string(),
            ..TaskFields::default()
        };
        let (id, sent) = ops::create_task(&self.shared, caller, project_id, fields)
            .map_err(refused)
            .with_context(|| format!("{by} creating a task in project {project_id}"))?;
        sent.delivered().await;
        Ok(id)
    }

    /// Assigns `assignee` (who must be able to read the project) to task
    /// `task_id`, by `by`; webhooks `task.assignee.created`, then
    /// `task.updated`.
    pub async fn assign(&self, task_id: i64, assignee: &str, by: &str) -> anyhow::Result<()> {
        let caller = self.user_id(by)?;
        let user = self.user_id(assignee)?;
        let sent = ops::add_assignee(&self.shared, caller, task_id, user)
            .map_err(refused)
            .with_context(|| format!("{by} assigning {assignee} to task {task_id}"))?;
        sent.delivered().await;
        Ok(())
    }

    /// Unassigns `assignee` from task `task_id`, by `by`; webhooks
    /// `task.assignee.deleted`, then `task.updated`.
    pub async fn unassign(&self, task_id: i64, assignee: &str, by: &str) -> anyhow::Result<()> {
        let caller = self.user_id(by)?;
        let user = self.user_id(assignee)?;
        let sent = ops::remove_assignee(&self.shared, caller, task_id, user)
            .map_err(refused)
            .with_context(|| format!("{by} unassigning {assignee} from task {task_id}"))?;
        sent.delivered().await;
        Ok(())
    }

    /// Comments `text` (HTML) on task `task_id` as `author`, who needs
    /// write access; webhook `task.comment.created`, the task's `updated`
    /// moving. Returns the comment's id.
    pub async fn comment(&self, task_id: i64, author: &str, text: &str) -> anyhow::Result<i64> {
        let caller = self.user_id(author)?;
        let (id, sent) = ops::add_comment(&self.shared, caller, task_id, text)
            .map_err(refused)
            .with_context(|| format!("{author} commenting on task {task_id}"))?;
        sent.delivered().await;
        Ok(id)
    }

    /// Edits comment `comment_id` on task `task_id` to say `text`, as
    /// `by` (only its author may); webhook `task.comment.edited`. Times
    /// are whole seconds: an edit is told apart from the comment by its
    /// `updated` only when made in a later second.
    pub async fn edit_comment(
        &self,
        task_id: i64,
        comment_id: i64,
        by: &str,
        text: &str,
    ) -> anyhow::Result<()> {
        let caller = self.user_id(by)?;
        let sent = ops::edit_comment(&self.shared, caller, task_id, comment_id, text)
            .map_err(refused)
            .with_context(|| format!("{by} editing comment {comment_id} on task {task_id}"))?;
        sent.delivered().await;
        Ok(())
    }

    /// Marks task `task_id` done (or not done), as `by` ticking its box:
    /// the frontend saves the whole task with `done` changed, so this is
    /// `POST /tasks/{id}` with everything else as it is; webhook
    /// `task.updated` (`done_at` set or cleared).
    pub async fn set_done(&self, task_id: i64, done: bool, by: &str) -> anyhow::Result<()> {
        self.save_task(task_id, by, |f| f.done = done).await
    }

    /// Changes task `task_id`'s description to `description` (HTML), as
    /// `by` editing it; webhook `task.updated`.
    pub async fn set_description(
        &self,
        task_id: i64,
        description: &str,
        by: &str,
    ) -> anyhow::Result<()> {
        self.save_task(task_id, by, |f| f.description = description.to_string())
            .await
    }

    /// Puts the label `label` on task `task_id`, as `by` (the label is
    /// made if no label has that title); webhook `task.updated`.
    pub async fn add_label(&self, task_id: i64, label: &str, by: &str) -> anyhow::Result<()> {
        let caller = self.user_id(by)?;
        let sent = ops::add_label(&self.shared, caller, task_id, label)
            .map_err(refused)
            .with_context(|| format!("{by} labelling task {task_id} {label:?}"))?;
        sent.delivered().await;
        Ok(())
    }

    /// Saves task `task_id` as the frontend does, the whole task as `by`
    /// sees it with `change` made to it.
    async fn save_task(
        &self,
        task_id: i64,
        by: &str,
        change: impl FnOnce(&mut TaskFields),
    ) -> anyhow::Result<()> {
        let caller = self.user_id(by)?;
        let mut fields = {
            let state = self.shared.lock();
            let task = state
                .task(task_id)
                .with_context(|| format!("the Vikunja stand-in has no task {task_id}"))?;
            TaskFields::of(task, caller)
        };
        change(&mut fields);
        let sent = ops::update_task(&self.shared, caller, task_id, fields)
            .map_err(refused)
            .with_context(|| format!("{by} saving task {task_id}"))?;
        sent.delivered().await;
        Ok(())
    }
}

/// A control's refusal; a 403 says how the user gets access, since a
/// test's people reach only projects they own or were shared.
fn refused(e: ApiError) -> anyhow::Error {
    if e.status == axum::http::StatusCode::FORBIDDEN {
        anyhow::anyhow!(
            "{e} (a user may change only the tasks of projects it owns or that were shared with it for writing, with VikunjaStandIn::share_project, and edit only its own comments)"
        )
    } else {
        e.into()
    }
}
