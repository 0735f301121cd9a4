//! Which offered file is published next: fairly, within the host's
//! budgets. Offers wait per owner (the user owning the file: a user that
//! makes files with fresh build-IDs by the thousand waits behind its own
//! files, not in front of everyone's); the owners take turns (round robin),
//! each sending its smallest file first; and the host as a whole sends at
//! most `files_per_minute` new files and `bytes_per_hour` bytes. A file
//! over the budget waits (it is not dropped); the queue holds at most
//! [`MAX_QUEUED`] offers, [`MAX_PER_OWNER`] of one owner — beyond, an
//! offer is refused (counted, and offered again when sampled anew).
//!
//! Pure logic over offers' sizes and owners: no I/O, no clock of its own.

use std::collections::{BTreeMap, VecDeque};
use std::time::{Duration, Instant};

use crate::process::budget::Bucket;

/// Offers waiting, at most.
pub const MAX_QUEUED: usize = 1024;
/// Offers of one owner waiting, at most.
pub const MAX_PER_OWNER: usize = 64;

/// What an offer needs to be queued.
pub trait Queued {
    /// Whom the file belongs to.
    fn owner(&self) -> u32;
    /// Bytes its upload sends (at most).
    fn bytes(&self) -> u64;
}

/// The host's budgets.
#[derive(Debug, Clone, Copy)]
pub struct Budgets {
    /// New files published per minute (0: no bound).
    pub files_per_minute: u32,
    /// Bytes published per hour (0: no bound).
    pub bytes_per_hour: u64,
}

/// The waiting offers.
pub struct Queue<T> {
    /// Per owner, smallest first (a sorted vector: a few dozen each).
    by_owner: BTreeMap<u32, Vec<T>>,
    /// Owners in turn order.
    turns: VecDeque<u32>,
    len: usize,
    files: Option<Bucket>,
    bytes: Option<Bucket>,
}

/// Why an offer was not queued.
#[derive(Debug, PartialEq, Eq)]
pub enum Refused {
    Full,
    OwnerFull,
}

impl<T: Queued> Queue<T> {
    pub fn new(budgets: Budgets, now: Instant) -> Self {
        let files = (budgets.files_per_minute > 0).then(|| {
            let per_minute = f64::from(budgets.files_per_minute);
            Bucket::new(per_minute / 60.0, per_minute, now)
        });
        let bytes = (budgets.bytes_per_hour > 0).then(|| {
            let per_hour = budgets.bytes_per_hour as f64;
            Bucket::new(per_hour / 3600.0, per_hour, now)
        });
        Queue {
            by_owner: BTreeMap::new(),
            turns: VecDeque::new(),
            len: 0,
            files,
            bytes,
        }
    }

    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.len
    }

    /// Queues an offer, or gives it back with why not.
    pub fn push(&mut self, offer: T) -> Result<(), (T, Refused)> {
        if self.len >= MAX_QUEUED {
            return Err((offer, Refused::Full));
        }
        let owner = offer.owner();
        let waiting = self.by_owner.entry(owner).or_default();
        if waiting.len() >= MAX_PER_OWNER {
            return Err((offer, Refused::OwnerFull));
        }
        if waiting.is_empty() {
            self.turns.push_back(owner);
        }
        let at = waiting.partition_point(|o| o.bytes() <= offer.bytes());
        waiting.insert(at, offer);
        self.len += 1;
        Ok(())
    }

    /// The next offer to publish now whose upload is at most `max_bytes`
    /// (its lane), within the host's budgets, taken from the queue and
    /// charged to them: the owner whose turn it is sends its smallest
    /// file. `Err(when)`: nothing may go before `when` (the budgets), or
    /// nothing waits (`None`).
    pub fn pop(&mut self, max_bytes: u64, now: Instant) -> Result<T, Option<Instant>> {
        if self.len == 0 {
            return Err(None);
        }
        if let Some(files) = &mut self.files {
            if !files.has(now) || !files.take(now) {
                return Err(Some(files.next_token()));
            }
        }
        // The first owner in turn with a file for this lane.
        let turn = self.turns.iter().position(|owner| {
            self.by_owner
                .get(owner)
                .and_then(|w| w.first())
                .is_some_and(|o| o.bytes() <= max_bytes)
        });
        let Some(turn) = turn else {
            self.give_back_file_token();
            return Err(None);
        };
        let owner = self.turns.remove(turn).expect("found");
        let waiting = self.by_owner.get_mut(&owner).expect("owner in turn");
        let size = waiting[0].bytes();
        if let Some(bytes) = &mut self.bytes {
            if !bytes.has(now) {
                self.turns.insert(turn, owner);
                self.give_back_file_token();
                let bytes = self.bytes.as_ref().expect("checked");
                return Err(Some(bytes.next_token().max(now + Duration::from_secs(1))));
            }
            bytes.charge(size as f64);
        }
        let offer = waiting.remove(0);
        self.len -= 1;
        if waiting.is_empty() {
            self.by_owner.remove(&owner);
        } else {
            self.turns.push_back(owner); // the next owner's turn
        }
        Ok(offer)
    }

    fn give_back_file_token(&mut self) {
        if let Some(files) = &mut self.files {
            files.charge(-1.0);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, PartialEq)]
    struct O(u32, u64);

    impl Queued for O {
        fn owner(&self) -> u32 {
            self.0
        }
        fn bytes(&self) -> u64 {
            self.1
        }
    }

    const NO_BOUND: Budgets = Budgets {
        files_per_minute: 0,
        bytes_per_hour: 0,
    };

    #[test]
    fn owners_take_turns_smallest_first() {
        let t = Instant::now();
        let mut q = Queue::new(NO_BOUND, t);
        // A flooding user's 50 files, then root's two.
        for i in 0..50 {
            q.push(O(65534, 1000 + i)).unwrap();
        }
        q.push(O(0, 5_000_000)).unwrap();
        q.push(O(0, 300)).unwrap();
        let order: Vec<O> = (0..4).map(|_| q.pop(u64::MAX, t).unwrap()).collect();
        assert_eq!(
            order,
            vec![O(65534, 1000), O(0, 300), O(65534, 1001), O(0, 5_000_000)]
        );
        // The small lane never takes a big file, nor waits behind one.
        q.push(O(7, 10 << 20)).unwrap();
        q.push(O(8, 10)).unwrap();
        assert_eq!(q.pop(1 << 20, t).unwrap(), O(65534, 1002));
        assert_eq!(q.pop(1 << 20, t).unwrap(), O(8, 10));
    }

    #[test]
    fn bounded_per_owner_and_in_all() {
        let t = Instant::now();
        let mut q = Queue::new(NO_BOUND, t);
        for i in 0..MAX_PER_OWNER as u64 {
            q.push(O(1, i)).unwrap();
        }
        assert_eq!(q.push(O(1, 0)).unwrap_err().1, Refused::OwnerFull);
        assert!(q.push(O(2, 0)).is_ok(), "another owner still gets in");
        for owner in 3..100 {
            for i in 0..MAX_PER_OWNER as u64 {
                let _ = q.push(O(owner, i));
            }
        }
        assert_eq!(q.len(), MAX_QUEUED);
        assert_eq!(q.push(O(999, 1)).unwrap_err().1, Refused::Full);
    }

    #[test]
    fn the_hosts_budgets_hold_offers_back_not_away() {
        let t = Instant::now();
        let mut q = Queue::new(
            Budgets {
                files_per_minute: 2,
                bytes_per_hour: 3600 * 100,
            },
            t,
        );
        for i in 0..5 {
            q.push(O(i, 100)).unwrap();
        }
        assert!(q.pop(u64::MAX, t).is_ok());
        assert!(q.pop(u64::MAX, t).is_ok());
        let when = q.pop(u64::MAX, t).unwrap_err().expect("a time");
        assert!(when > t && when <= t + Duration::from_secs(31), "{when:?}");
        assert_eq!(q.len(), 3, "nothing dropped");
        // Half a minute later one more file may go.
        assert!(q.pop(u64::MAX, t + Duration::from_secs(30)).is_ok());
        // Bytes: the hour's 360,000 are spent by a big file, the next waits.
        let mut q = Queue::new(
            Budgets {
                files_per_minute: 0,
                bytes_per_hour: 3600 * 100,
            },
            t,
        );
        q.push(O(1, 400_000)).unwrap();
        q.push(O(2, 10)).unwrap();
        assert_eq!(q.pop(u64::MAX, t).unwrap(), O(1, 400_000));
        assert!(q.pop(u64::MAX, t).is_err(), "in debt");
        assert!(q.pop(u64::MAX, t + Duration::from_secs(3600)).is_ok());
    }
}
