//! Tags of built templates: names for builds beyond `default` (`my-app:v2`), moved and removed
//! by the owner (`Template.assign_tags` / `remove_tags` / `get_tags` in the SDKs).

use chrono::Utc;

use super::Templates;
use crate::templates::{tag_ok, TagRef, Template, TemplateName, DEFAULT_TAG};
use crate::ControlError;

/// One tag of a template, as `GET /templates/{id}/tags` lists it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TagInfo {
    pub tag: String,
    pub build_id: String,
    pub created_at: chrono::DateTime<Utc>,
}

/// What an assignment did: the tags now naming `build_id`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Assigned {
    pub tags: Vec<String>,
    pub build_id: String,
}

fn clean_tags(tags: &[String]) -> Result<Vec<String>, ControlError> {
    if tags.is_empty() {
        return Err(ControlError::InvalidArgument(
            "tags: at least one tag is required".into(),
        ));
    }
    let mut out: Vec<String> = Vec::new();
    for t in tags {
        let t = t.trim().to_ascii_lowercase();
        if !tag_ok(&t) {
            return Err(ControlError::InvalidArgument(format!(
                "invalid tag {t:?}: lowercase letters, digits, '-', '_' or '.', not a UUID"
            )));
        }
        if !out.contains(&t) {
            out.push(t);
        }
    }
    Ok(out)
}

impl Templates {
    /// The template `name` (no tag) names for `team`, which must own it: another team's is
    /// PermissionDenied, as upstream answers 403.
    async fn owned_template(
        &self,
        team: Option<&str>,
        name: &TemplateName,
        raw: &str,
    ) -> Result<Template, ControlError> {
        if let (Some(ns), Some(team)) = (&name.namespace, team) {
            if ns != team {
                return Err(ControlError::PermissionDenied(format!(
                    "namespace '{ns}' is not your team's ('{team}')"
                )));
            }
        }
        let t = self
            .store
            .template_by_alias(&name.alias)
            .await?
            .ok_or_else(|| ControlError::NotFound(format!("template '{raw}' not found")))?;
        if team.is_some_and(|team| t.team != team) {
            return Err(ControlError::PermissionDenied(format!(
                "template '{raw}' belongs to another team"
            )));
        }
        Ok(t)
    }

    /// Points `tags` at the build `target` (`name[:tag]`, default tag when none) names.
    pub(crate) async fn assign_tags(
        &self,
        team: Option<&str>,
        target: &str,
        tags: &[String],
    ) -> Result<Assigned, ControlError> {
        let name = TemplateName::parse(target)?;
        let tags = clean_tags(tags)?;
        let _guard = self.docs.lock().await;
        let mut t = self.owned_template(team, &name, target).await?;
        let from = name.tag.as_deref().unwrap_or(DEFAULT_TAG);
        let build_id = t
            .tags
            .get(from)
            .map(|r| r.build_id.clone())
            .ok_or_else(|| {
                ControlError::NotFound(format!("template '{target}' has no tag '{from}'"))
            })?;
        let now = Utc::now();
        for tag in &tags {
            t.tags.insert(
                tag.clone(),
                TagRef {
                    build_id: build_id.clone(),
                    created_at: now,
                },
            );
        }
        t.updated_at = now;
        self.store.put_template(&t).await?;
        Ok(Assigned { tags, build_id })
    }

    /// Removes `tags` from the template `name` (which must carry no tag itself). `default`
    /// cannot be removed: it is what a name without a tag means.
    pub(crate) async fn remove_tags(
        &self,
        team: Option<&str>,
        name: &str,
        tags: &[String],
    ) -> Result<(), ControlError> {
        if name.contains(':') {
            return Err(ControlError::InvalidArgument(format!(
                "name '{name}' must not carry a tag; list the tags to remove in 'tags'"
            )));
        }
        let parsed = TemplateName::parse(name)?;
        let tags = clean_tags(tags)?;
        if tags.iter().any(|t| t == DEFAULT_TAG) {
            return Err(ControlError::InvalidArgument(
                "the 'default' tag cannot be removed".into(),
            ));
        }
        let _guard = self.docs.lock().await;
        let mut t = self.owned_template(team, &parsed, name).await?;
        if let Some(missing) = tags.iter().find(|tag| !t.tags.contains_key(*tag)) {
            return Err(ControlError::NotFound(format!(
                "template '{name}' has no tag '{missing}'"
            )));
        }
        for tag in &tags {
            t.tags.remove(tag);
        }
        t.updated_at = Utc::now();
        self.store.put_template(&t).await?;
        Ok(())
    }

    /// The tags of a template `team` may see, by id or name, oldest first.
    pub(crate) async fn template_tags(
        &self,
        team: Option<&str>,
        id_or_name: &str,
    ) -> Result<Vec<TagInfo>, ControlError> {
        let t = self
            .find_template(id_or_name, team)
            .await?
            .ok_or_else(|| ControlError::NotFound(format!("template '{id_or_name}' not found")))?;
        let mut out: Vec<TagInfo> = t
            .tags
            .into_iter()
            .map(|(tag, r)| TagInfo {
                tag,
                build_id: r.build_id,
                created_at: r.created_at,
            })
            .collect();
        out.sort_by(|a, b| a.created_at.cmp(&b.created_at).then(a.tag.cmp(&b.tag)));
        Ok(out)
    }
}

impl Templates {
    /// Counts a sandbox created from template `id` (`spawnCount`, `lastSpawnedAt`). A failure
    /// to record it is logged, never the create's failure.
    pub(crate) async fn count_spawn(&self, id: &str) {
        let _guard = self.docs.lock().await;
        let result = async {
            if let Some(mut t) = self.store.get_template(id).await? {
                t.spawn_count += 1;
                t.last_spawned_at = Some(Utc::now());
                self.store.put_template(&t).await?;
            }
            Ok::<_, ControlError>(())
        }
        .await;
        if let Err(e) = result {
            tracing::warn!(template = id, error = %warren_runtime::chain(&e), "counting a spawn");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tags_are_checked_lowercased_and_deduplicated() {
        let t = clean_tags(&["V1".into(), "v1".into(), "prod".into()]).unwrap();
        assert_eq!(t, ["v1", "prod"]);
        assert!(clean_tags(&[]).is_err());
        assert!(clean_tags(&["has space".into()]).is_err());
        assert!(clean_tags(&["0b8f8d7a-3c1e-4c2a-9f00-1234567890ab".into()]).is_err());
    }
}
