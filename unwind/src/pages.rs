//! A table's page index: for each page of its offsets, the rows that may
//! hold an offset in that page, so the BPF walk searches a page's few
//! rows (a few cache lines) instead of the whole table (its first steps
//! touch a line each, which a walk on a busy host finds cold).

/// The rows `[lowest, highest]` (indices in [`crate::Table::starts`]) that
/// may rule an offset of one page: the row ruling the page's first byte
/// (or row 0 when the first row starts later) up to the last row that
/// starts inside the page.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Span {
    /// The first row that may rule an offset of the page.
    pub lowest: u32,
    /// The last.
    pub highest: u32,
}

/// The page index of a table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PageIndex {
    /// Offsets `[p << shift, (p + 1) << shift)` form page `p` (at most
    /// 32: one page).
    pub shift: u32,
    /// One span per page, from page 0 to the page of the last start; an
    /// offset past the last page is ruled by the last page's rows.
    pub spans: Vec<Span>,
}

impl PageIndex {
    /// The index of sorted `starts` with pages of `1 << min_shift` bytes,
    /// or larger ones (a power of two each step) until there are no more
    /// pages than rows: the index never outgrows its table. Empty
    /// `starts`: no pages.
    pub fn new(starts: &[u32], min_shift: u32) -> PageIndex {
        let Some(&last) = starts.last() else {
            return PageIndex {
                shift: min_shift,
                spans: Vec::new(),
            };
        };
        let mut shift = min_shift.min(32);
        while shift < 32 && (u64::from(last) >> shift) + 1 > starts.len() as u64 {
            shift += 1;
        }
        let pages = (u64::from(last) >> shift) as usize + 1;
        let mut spans = Vec::with_capacity(pages);
        // `below`: the number of rows starting before the current page.
        let mut below = 0usize;
        for page in 0..pages {
            let begin = (page as u64) << shift;
            let end = begin + (1u64 << shift);
            while below < starts.len() && u64::from(starts[below]) < begin {
                below += 1;
            }
            // The row ruling `begin`: the last starting at or before it.
            let lowest = if below < starts.len() && u64::from(starts[below]) == begin {
                below
            } else {
                below.saturating_sub(1)
            };
            let mut inside = below;
            while inside < starts.len() && u64::from(starts[inside]) < end {
                inside += 1;
            }
            let highest = inside.saturating_sub(1).max(lowest);
            spans.push(Span {
                lowest: lowest as u32,
                highest: highest as u32,
            });
        }
        PageIndex { shift, spans }
    }

    /// The row ruling `offset` as the BPF walk finds it: in its page's
    /// span, the last row starting at or before it (None: before the
    /// first row). What the index's tests compare with a whole search.
    pub fn row(&self, starts: &[u32], offset: u32) -> Option<usize> {
        let last = self.spans.len().checked_sub(1)?;
        let page = ((u64::from(offset) >> self.shift) as usize).min(last);
        let span = self.spans[page];
        let rows = starts.get(span.lowest as usize..=span.highest as usize)?;
        let at = rows.partition_point(|&s| s <= offset);
        at.checked_sub(1).map(|i| span.lowest as usize + i)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The whole table's search: the last row starting at or before.
    fn whole(starts: &[u32], offset: u32) -> Option<usize> {
        starts.partition_point(|&s| s <= offset).checked_sub(1)
    }

    fn check(starts: &[u32], min_shift: u32) -> PageIndex {
        let index = PageIndex::new(starts, min_shift);
        assert!(index.spans.len() <= starts.len().max(1), "{index:?}");
        let last = starts.last().copied().unwrap_or(0);
        let step = (last / 20_000).max(7) as usize;
        let mut offsets: Vec<u32> = (0..last.saturating_add(300)).step_by(step).collect();
        for &s in starts {
            offsets.extend([s.saturating_sub(1), s, s.saturating_add(1)]);
        }
        offsets.extend([u32::MAX, u32::MAX - 1]);
        for offset in offsets {
            assert_eq!(
                index.row(starts, offset),
                whole(starts, offset),
                "offset {offset:#x} in {starts:?} by {index:?}"
            );
        }
        index
    }

    #[test]
    fn every_offset_finds_the_row_a_whole_search_finds() {
        check(&[0, 5, 9, 4096, 4097, 8191, 8192, 20000], 12);
        check(&[100, 200, 300], 4);
        check(&[4096 * 3 + 5], 12); // one row, after pages with none
        check(&[0], 12);
        check(&[7, 7000, 70000, 700000], 2); // sparse: coarser pages
                                             // Dense and irregular, as a real libc's table.
        let mut starts = Vec::new();
        let mut at = 16u32;
        for i in 0..5000u32 {
            at += 1 + i.wrapping_mul(2_654_435_761) % 97;
            starts.push(at);
        }
        let index = check(&starts, 12);
        assert_eq!(index.shift, 12);
        let widest = index
            .spans
            .iter()
            .map(|s| s.highest - s.lowest + 1)
            .max()
            .unwrap();
        assert!(widest < 100, "a page holds at most {widest} rows");
    }

    #[test]
    fn no_more_pages_than_rows_and_none_for_no_rows() {
        let index = PageIndex::new(&[0, u32::MAX - 10], 12);
        assert!(index.spans.len() <= 2, "{index:?}");
        assert!(index.shift >= 31);
        check(&[u32::MAX - 10], 12); // one row: one page (shift 32)
        assert!(PageIndex::new(&[], 12).spans.is_empty());
        check(&[0, u32::MAX - 10], 12);
    }
}
