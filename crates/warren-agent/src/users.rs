//! Unix accounts read straight from `/etc/passwd` and `/etc/group`.
//!
//! The agent is linked statically, where glibc's NSS lookups are unreliable, and sandboxes only
//! have local files anyway, so it parses the files itself.

use std::collections::HashMap;
use std::path::PathBuf;

/// A Unix account the agent can run commands as.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct User {
    pub name: String,
    pub uid: u32,
    pub gid: u32,
    pub home: PathBuf,
    pub shell: String,
    /// Supplementary groups (from `/etc/group` membership lists), primary group included.
    pub groups: Vec<u32>,
}

/// A snapshot of the account databases.
#[derive(Debug, Default, Clone)]
pub struct UserDb {
    users: Vec<User>,
    groups: HashMap<u32, String>,
}

impl UserDb {
    /// Reads the system databases; missing files give an empty database.
    pub fn load() -> Self {
        let passwd = std::fs::read_to_string("/etc/passwd").unwrap_or_default();
        let group = std::fs::read_to_string("/etc/group").unwrap_or_default();
        Self::parse(&passwd, &group)
    }

    pub fn parse(passwd: &str, group: &str) -> Self {
        let mut groups = HashMap::new();
        let mut members: HashMap<String, Vec<u32>> = HashMap::new();
        for line in group.lines() {
            let f: Vec<&str> = line.split(':').collect();
            if f.len() < 4 {
                continue;
            }
            let Ok(gid) = f[2].parse::<u32>() else {
                continue;
            };
            groups.entry(gid).or_insert_with(|| f[0].to_string());
            for m in f[3].split(',').filter(|m| !m.is_empty()) {
                members.entry(m.to_string()).or_default().push(gid);
            }
        }
        let mut users = Vec::new();
        for line in passwd.lines() {
            let f: Vec<&str> = line.split(':').collect();
            if f.len() < 7 {
                continue;
            }
            let (Ok(uid), Ok(gid)) = (f[2].parse::<u32>(), f[3].parse::<u32>()) else {
                continue;
            };
            let mut g = vec![gid];
            for extra in members.get(f[0]).into_iter().flatten() {
                if !g.contains(extra) {
                    g.push(*extra);
                }
            }
            users.push(User {
                name: f[0].to_string(),
                uid,
                gid,
                home: PathBuf::from(if f[5].is_empty() { "/" } else { f[5] }),
                shell: if f[6].is_empty() {
                    "/bin/sh".into()
                } else {
                    f[6].to_string()
                },
                groups: g,
            });
        }
        Self { users, groups }
    }

    pub fn by_name(&self, name: &str) -> Option<&User> {
        self.users.iter().find(|u| u.name == name)
    }

    /// Account name of a uid, or the number when unknown.
    pub fn user_name(&self, uid: u32) -> String {
        self.users
            .iter()
            .find(|u| u.uid == uid)
            .map(|u| u.name.clone())
            .unwrap_or(uid.to_string())
    }

    /// Group name of a gid, or the number when unknown.
    pub fn group_name(&self, gid: u32) -> String {
        self.groups.get(&gid).cloned().unwrap_or(gid.to_string())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_accounts_and_memberships() {
        let db = UserDb::parse(
            "root:x:0:0:root:/root:/bin/bash\nuser:x:1000:1000::/home/user:/bin/bash\nbad line\n",
            "root:x:0:\nuser:x:1000:\nsudo:x:27:user,other\n",
        );
        let u = db.by_name("user").unwrap();
        assert_eq!((u.uid, u.gid), (1000, 1000));
        assert_eq!(u.home, PathBuf::from("/home/user"));
        assert_eq!(u.groups, vec![1000, 27]);
        assert_eq!(db.user_name(0), "root");
        assert_eq!(db.user_name(4242), "4242");
        assert_eq!(db.group_name(27), "sudo");
        assert!(db.by_name("nobody").is_none());
    }
}
