//! Disk use of templates and their builds, and pruning what nothing uses (`warren template
//! prune`): images no tag, sandbox or snapshot names, the per-step build cache, pulled layers.

use std::collections::BTreeSet;

use super::{ImageUsers, Templates};
use crate::ControlError;

/// One kind of build data on disk.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DiskPart {
    pub count: u64,
    pub bytes: u64,
}

/// What template builds keep on disk (or, from a prune, what it freed).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DiskUse {
    /// Built and pulled template images something uses (a tag, a sandbox, a snapshot).
    pub images_in_use: DiskPart,
    /// Images nothing uses any more (older builds, pulled bases, build stages).
    pub images_unused: DiskPart,
    /// Cached build steps (a filesystem snapshot each).
    pub layers: DiskPart,
    /// Pulled registry layers, by digest.
    pub blobs: DiskPart,
}

impl Templates {
    fn require_admin(team: Option<&str>) -> Result<(), ControlError> {
        match team {
            None => Ok(()),
            Some(t) => Err(ControlError::PermissionDenied(format!(
                "template disk use and pruning are host-wide: they need an admin key, not team '{t}''s"
            ))),
        }
    }

    /// The images something still uses: every tag's build, every sandbox not gone, every
    /// snapshot.
    async fn images_in_use(&self, users: &dyn ImageUsers) -> Result<Vec<String>, ControlError> {
        let store = &self.store;
        let mut keep = BTreeSet::new();
        for t in store.templates().await? {
            for tag in t.tags.values() {
                if let Some(image) = store.get_build(&tag.build_id).await?.and_then(|b| b.image) {
                    keep.insert(image);
                }
            }
        }
        keep.extend(users.images_used().await?);
        Ok(keep.into_iter().collect())
    }

    /// What template builds keep on disk.
    pub(crate) async fn template_disk_use(
        &self,
        team: Option<&str>,
        users: &dyn ImageUsers,
    ) -> Result<DiskUse, ControlError> {
        Self::require_admin(team)?;
        let keep = self.images_in_use(users).await?;
        self.template_builder()?
            .disk_use(&keep)
            .await
            .map_err(super::builds::builder_error)
    }

    /// Deletes what nothing uses; waits for a running build to end first (so no build loses
    /// its layers midway) and holds builds off until done.
    pub(crate) async fn prune_templates(
        &self,
        team: Option<&str>,
        users: &dyn ImageUsers,
    ) -> Result<DiskUse, ControlError> {
        Self::require_admin(team)?;
        let builder = self.template_builder()?;
        let _turn = self
            .builds
            .gate
            .acquire()
            .await
            .map_err(|_| ControlError::Unavailable("the server is stopping".into()))?;
        let keep = self.images_in_use(users).await?;
        builder
            .prune(&keep)
            .await
            .map_err(super::builds::builder_error)
    }
}
