//! The label index stored with each series: label name → its values, or
//! `null` when some segment had more distinct values of the name than the
//! server indexes (`SYMTRACE_MAX_LABEL_VALUES`). Stored as JSON text
//! (`{"region":["eu","us"],"pod":null}`).

use std::collections::{BTreeMap, BTreeSet};

/// Name → values (`None`: too many to index).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LabelIndex(pub BTreeMap<String, Option<BTreeSet<String>>>);

impl LabelIndex {
    /// Adds `name`'s `values` (`None`: too many), merging with what is
    /// there: too many anywhere is too many.
    pub fn add(&mut self, name: &str, values: Option<impl IntoIterator<Item = String>>) {
        let entry = self
            .0
            .entry(name.to_owned())
            .or_insert_with(|| Some(BTreeSet::new()));
        match (entry.as_mut(), values) {
            (Some(set), Some(values)) => set.extend(values),
            _ => *entry = None,
        }
    }

    /// Merges another index into this one.
    pub fn merge(&mut self, other: LabelIndex) {
        for (name, values) in other.0 {
            self.add(&name, values);
        }
    }

    /// The stored form.
    pub fn encode(&self) -> String {
        let map: serde_json::Map<String, serde_json::Value> = self
            .0
            .iter()
            .map(|(name, values)| {
                let v = match values {
                    Some(set) => set
                        .iter()
                        .map(|s| serde_json::Value::from(s.as_str()))
                        .collect(),
                    None => serde_json::Value::Null,
                };
                (name.clone(), v)
            })
            .collect();
        serde_json::Value::Object(map).to_string()
    }

    /// Reads the stored form; what is not an index (a row written by hand,
    /// a value of another type) reads as what it can: an entry of another
    /// shape as "too many", text that is no object as empty.
    pub fn decode(text: &str) -> Self {
        let Ok(serde_json::Value::Object(map)) = serde_json::from_str(text) else {
            return Self::default();
        };
        let mut index = Self::default();
        for (name, values) in map {
            let values = match values {
                serde_json::Value::Array(values) => Some(
                    values
                        .into_iter()
                        .filter_map(|v| v.as_str().map(str::to_owned))
                        .collect::<Vec<_>>(),
                ),
                _ => None,
            };
            index.add(&name, values);
        }
        index
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_stored_form_reads_back_and_merges() {
        let mut a = LabelIndex::default();
        a.add("region", Some(["us".to_owned(), "eu".to_owned()]));
        a.add("pod", None::<Vec<String>>);
        let text = a.encode();
        assert_eq!(text, r#"{"pod":null,"region":["eu","us"]}"#);
        assert_eq!(LabelIndex::decode(&text), a);
        let mut b = LabelIndex::decode(r#"{"region":["ap"],"pod":["p1"],"zone":["z"]}"#);
        b.merge(a);
        assert_eq!(
            b.encode(),
            r#"{"pod":null,"region":["ap","eu","us"],"zone":["z"]}"#
        );
        assert_eq!(LabelIndex::decode("not json"), LabelIndex::default());
        assert_eq!(LabelIndex::decode(r#"{"x":1}"#).0["x"], None);
    }
}
