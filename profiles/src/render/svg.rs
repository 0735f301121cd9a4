//! SVG flamegraphs, drawn by inferno from folded lines (a diff from lines
//! with two counts, which inferno colours by the change).

use inferno::flamegraph::{self, Options};

use super::folded_names;
use crate::aggregate::Aggregate;
use crate::resolved::Resolved;
use crate::tree::Expanded;

/// The aggregate as an SVG flamegraph titled `title` (`diff`: both sides,
/// coloured by the change).
pub fn render(
    agg: &Aggregate,
    resolved: &Resolved,
    title: &str,
    count_name: &str,
    diff: bool,
) -> Result<Vec<u8>, String> {
    let lines: Vec<String> = Expanded::new(agg, resolved)
        .iter()
        .filter(|(_, v)| v[0] != 0 || (diff && v[1] != 0))
        .map(|(stack, v)| {
            let stack = folded_names(stack, agg, resolved);
            if diff {
                format!("{stack} {} {}", v[0].max(0), v[1].max(0))
            } else {
                format!("{stack} {}", v[0].max(0))
            }
        })
        .collect();
    let mut options = Options::default();
    options.title = title.to_owned();
    options.count_name = count_name.to_owned();
    options.hash = true;
    if lines.is_empty() {
        // inferno refuses empty input; an empty selection is a valid answer.
        return Ok(EMPTY_SVG.as_bytes().to_vec());
    }
    let mut out = Vec::new();
    flamegraph::from_lines(&mut options, lines.iter().map(String::as_str), &mut out)
        .map_err(|e| format!("rendering the SVG: {e}"))?;
    Ok(out)
}

const EMPTY_SVG: &str = r#"<?xml version="1.0" standalone="no"?><svg xmlns="http://www.w3.org/2000/svg" width="1200" height="60"><text x="600" y="30" text-anchor="middle" font-family="Verdana" font-size="14">no samples in this selection</text></svg>"#;
