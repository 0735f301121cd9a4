//! `POST /api/v1/debuginfo/missing`: the items a publisher could upload,
//! and the server's answer — those it lacks, each by its index in the
//! request, with the key to upload under for a granted claim.

use serde::{Deserialize, Serialize};

/// The path of the request.
pub const PATH: &str = "/api/v1/debuginfo/missing";

/// Items one request may hold (the server refuses more).
pub const MAX_ITEMS: usize = 100_000;

/// One entry of a `missing` request.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize, Serialize)]
pub struct WantedItem {
    /// The file's build-ID (hex): its GNU build-ID, or (`id_kind`
    /// `htlhash`) its htlhash.
    pub build_id: String,
    /// `executable`, `debuginfo` or `source`.
    pub kind: String,
    /// The file's SHA-256 (may be empty in a claim).
    #[serde(default)]
    pub sha256: String,
    /// For `source`: the absolute path the DWARF names.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub path: Option<String>,
    /// For artifacts: the quality rank the client computed (0–3); when the
    /// server already serves something strictly better the item is not missing.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub quality: Option<i32>,
    /// A claim (an agent publishing what it found on a host): the holder's
    /// name. The item is missing only when nothing of its quality or
    /// better is stored for the file, and then only to the first claimant
    /// for a while (a lease), so a fleet uploads a file once.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub claim: Option<String>,
    /// In a claim: what `build_id` is — `gnu` (the default) or `htlhash`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub id_kind: Option<String>,
    /// In a claim: the SHA-256 of the file the agent found (what the
    /// upload will be bound to; a file of other content with the same ID
    /// is another claim).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub content_sha256: Option<String>,
    /// In a claim: only ask, before the agent hashes the file, whether a
    /// CI or upstream file of its ID and its quality or better is stored
    /// (then its frames never need an agent's file, and no hash is
    /// needed). Missing when there is none; nothing is claimed.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub probe: bool,
}

/// A `missing` request.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize, Serialize)]
pub struct MissingRequest {
    /// What the publisher could upload.
    pub items: Vec<WantedItem>,
}

/// An item the server lacks.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize)]
pub struct MissingItem {
    /// Its index in the request.
    pub index: usize,
    /// The item as asked.
    #[serde(flatten)]
    pub item: WantedItem,
    /// For a granted claim: the key to upload the file under (its GNU
    /// build-ID, its htlhash, or the key of the file it is a copy of).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub upload_as: Option<String>,
}

/// The server's answer.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize, Serialize)]
pub struct MissingAnswer {
    /// How many items the request held.
    pub total: usize,
    /// Those the server lacks, in request order.
    pub missing: Vec<MissingItem>,
}

impl MissingAnswer {
    /// Whether the server lacks item `index`.
    pub fn lacks(&self, index: usize) -> bool {
        self.missing.iter().any(|m| m.index == index)
    }

    /// The key a granted claim of item `index` uploads under: hex digits
    /// only (it goes into a URL path), else none.
    pub fn upload_key(&self, index: usize) -> Option<&str> {
        self.missing
            .iter()
            .find(|m| m.index == index)
            .and_then(|m| m.upload_as.as_deref())
            .filter(|k| !k.is_empty() && k.bytes().all(|b| b.is_ascii_hexdigit()))
    }

    /// Checks the answer belongs to a request of `asked` items: the total
    /// matches and every index is inside it (anything else — a web page
    /// behind a wrong URL, say — must not read as "the server has
    /// everything").
    pub fn check(&self, asked: usize) -> Result<(), String> {
        if self.total != asked {
            return Err(format!("answered for {} items, not {asked}", self.total));
        }
        match self.missing.iter().find(|m| m.index >= asked) {
            Some(m) => Err(format!("answered with index {} of {asked} items", m.index)),
            None => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_item_is_written_as_it_always_was() {
        let item = WantedItem {
            build_id: "ab".into(),
            kind: "executable".into(),
            quality: Some(2),
            claim: Some("host".into()),
            probe: true,
            ..Default::default()
        };
        // Fields left out when unset; `sha256` always there.
        assert_eq!(
            serde_json::to_string(&item).unwrap(),
            r#"{"build_id":"ab","kind":"executable","sha256":"","quality":2,"claim":"host","probe":true}"#
        );
        let back: WantedItem =
            serde_json::from_str(r#"{"build_id":"ab","kind":"source","path":"/a.c"}"#).unwrap();
        assert_eq!(back.path.as_deref(), Some("/a.c"));
        assert!(!back.probe);
    }

    #[test]
    fn an_answer_is_checked_and_read_by_index() {
        let answer: MissingAnswer = serde_json::from_str(
            r#"{"total":3,"missing":[{"index":1,"build_id":"ab","kind":"executable","upload_as":"abcd"},
                                     {"index":2,"build_id":"cd","kind":"executable","upload_as":"../x"}]}"#,
        )
        .unwrap();
        assert!(answer.check(3).is_ok());
        assert!(answer.check(2).is_err());
        assert!(!answer.lacks(0) && answer.lacks(1));
        assert_eq!(answer.upload_key(1), Some("abcd"));
        assert_eq!(answer.upload_key(2), None, "not hex: never a path");
        let bad = MissingAnswer {
            total: 1,
            missing: vec![MissingItem {
                index: 5,
                item: WantedItem::default(),
                upload_as: None,
            }],
        };
        assert!(bad.check(1).is_err());
        // Not an answer at all.
        assert!(serde_json::from_str::<MissingAnswer>("<html>").is_err());
    }
}
