//! `FreeQueue`: the queue of free KV blocks, a doubly linked list threaded through per-block arrays so that popping
//! the head, pushing at either end and unlinking any block (a cache hit on a free block) are all O(1) without
//! allocation. The head is the next block to hand out (least recently used); the tail the most recently freed.

/// Marks "no block" in the link arrays.
const NIL: u32 = u32::MAX;

/// Intrusive doubly linked list over block indices `0..n` (`n < u32::MAX`).
#[derive(Debug, Clone)]
pub(crate) struct FreeQueue {
    prev: Vec<u32>,
    next: Vec<u32>,
    in_queue: Vec<bool>,
    head: u32,
    tail: u32,
    len: usize,
}

impl FreeQueue {
    /// A queue holding every block `0..n`, in index order.
    pub(crate) fn new_full(n: usize) -> Self {
        debug_assert!(n < NIL as usize);
        let mut q =
            Self { prev: vec![NIL; n], next: vec![NIL; n], in_queue: vec![false; n], head: NIL, tail: NIL, len: 0 };
        for b in 0..n {
            q.push_back(b as u32);
        }
        q
    }

    pub(crate) fn len(&self) -> usize {
        self.len
    }

    pub(crate) fn contains(&self, b: u32) -> bool {
        self.in_queue.get(b as usize).copied().unwrap_or(false)
    }

    /// Appends `b` at the tail (it will be handed out last).
    pub(crate) fn push_back(&mut self, b: u32) {
        debug_assert!(!self.contains(b), "block {b} pushed twice");
        let i = b as usize;
        self.prev[i] = self.tail;
        self.next[i] = NIL;
        if self.tail == NIL {
            self.head = b;
        } else {
            self.next[self.tail as usize] = b;
        }
        self.tail = b;
        self.in_queue[i] = true;
        self.len += 1;
    }

    /// Inserts `b` at the head (it will be handed out first).
    pub(crate) fn push_front(&mut self, b: u32) {
        debug_assert!(!self.contains(b), "block {b} pushed twice");
        let i = b as usize;
        self.next[i] = self.head;
        self.prev[i] = NIL;
        if self.head == NIL {
            self.tail = b;
        } else {
            self.prev[self.head as usize] = b;
        }
        self.head = b;
        self.in_queue[i] = true;
        self.len += 1;
    }

    /// Removes and returns the head.
    pub(crate) fn pop_front(&mut self) -> Option<u32> {
        let b = self.head;
        if b == NIL {
            return None;
        }
        self.unlink(b);
        Some(b)
    }

    /// Unlinks `b` wherever it is; returns false when `b` was not queued.
    pub(crate) fn remove(&mut self, b: u32) -> bool {
        if !self.contains(b) {
            return false;
        }
        self.unlink(b);
        true
    }

    fn unlink(&mut self, b: u32) {
        let i = b as usize;
        let (p, n) = (self.prev[i], self.next[i]);
        if p == NIL {
            self.head = n;
        } else {
            self.next[p as usize] = n;
        }
        if n == NIL {
            self.tail = p;
        } else {
            self.prev[n as usize] = p;
        }
        self.prev[i] = NIL;
        self.next[i] = NIL;
        self.in_queue[i] = false;
        self.len -= 1;
    }

    /// Blocks from head to tail.
    pub(crate) fn iter(&self) -> impl Iterator<Item = u32> + '_ {
        let mut cur = self.head;
        std::iter::from_fn(move || {
            if cur == NIL {
                return None;
            }
            let b = cur;
            cur = self.next[b as usize];
            Some(b)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn push_pop_remove_keep_order() {
        let mut q = FreeQueue::new_full(5);
        assert_eq!(q.iter().collect::<Vec<_>>(), vec![0, 1, 2, 3, 4]);
        assert!(q.remove(2));
        assert!(!q.remove(2));
        assert_eq!(q.pop_front(), Some(0));
        q.push_back(0);
        q.push_front(2);
        assert_eq!(q.iter().collect::<Vec<_>>(), vec![2, 1, 3, 4, 0]);
        assert!(q.remove(0));
        assert!(q.remove(2));
        assert_eq!(q.len(), 3);
        assert_eq!(q.iter().collect::<Vec<_>>(), vec![1, 3, 4]);
        while q.pop_front().is_some() {}
        assert_eq!(q.len(), 0);
        q.push_front(4);
        assert_eq!(q.iter().collect::<Vec<_>>(), vec![4]);
    }
}
