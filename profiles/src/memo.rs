//! A table index → value memo that is reset in time proportional to what
//! was set, not to the table: a request's dictionary is mapped into each
//! of its parts in turn, and a part touches only a few of its entries.

pub(crate) struct Memo<T: Copy> {
    slots: Vec<Option<T>>,
    touched: Vec<u32>,
}

impl<T: Copy> Memo<T> {
    /// A memo over a table of `len` entries, none set.
    pub(crate) fn new(len: usize) -> Self {
        Self {
            slots: vec![None; len],
            touched: Vec::new(),
        }
    }

    pub(crate) fn get(&self, i: usize) -> Option<T> {
        self.slots[i]
    }

    pub(crate) fn set(&mut self, i: usize, value: T) {
        if self.slots[i].replace(value).is_none() {
            self.touched.push(i as u32);
        }
    }

    /// Forgets every value set.
    pub(crate) fn reset(&mut self) {
        for i in self.touched.drain(..) {
            self.slots[i as usize] = None;
        }
    }
}

impl Memo<u32> {
    /// Entry `i`'s value, or `None` the first time, when it becomes `next`
    /// (the caller then pushes the entry `next` numbers).
    pub(crate) fn get_or_assign(&mut self, i: u32, next: usize) -> Option<u32> {
        if let Some(v) = self.slots[i as usize] {
            return Some(v);
        }
        self.set(i as usize, next as u32);
        None
    }
}

#[cfg(test)]
mod tests {
    use super::Memo;

    #[test]
    fn a_reset_forgets_only_and_all_of_what_was_set() {
        let mut m = Memo::new(4);
        m.set(1, 10u32);
        m.set(1, 11);
        assert_eq!(m.get_or_assign(3, 7), None);
        assert_eq!(m.get_or_assign(3, 8), Some(7));
        assert_eq!((m.get(0), m.get(1), m.get(3)), (None, Some(11), Some(7)));
        m.reset();
        assert_eq!((m.get(1), m.get(3)), (None, None));
        assert!(m.touched.is_empty());
    }
}
