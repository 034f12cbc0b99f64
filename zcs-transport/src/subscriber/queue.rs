//! The application's queue of a subscriber when it must not wait: a full queue gives up
//! its oldest item for the new one.

/// Queues `item` on `tx` without waiting: while the queue is full, its oldest item is
/// taken off through `rx` (a receiving end of the same channel) and dropped. Returns how
/// many items were dropped (0 when there was room; more than 1 only when other writers
/// filled the queue again meanwhile).
pub fn push_dropping_oldest<T>(tx: &flume::Sender<T>, rx: &flume::Receiver<T>, item: T) -> u64 {
    let mut item = item;
    let mut dropped = 0;
    loop {
        match tx.try_send(item) {
            Ok(()) | Err(flume::TrySendError::Disconnected(_)) => return dropped,
            Err(flume::TrySendError::Full(back)) => {
                item = back;
                if rx.try_recv().is_ok() {
                    dropped += 1;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_full_queue_keeps_the_newest_items() {
        let (tx, rx) = flume::bounded(3);
        let dropped: u64 = (1..=5).map(|i| push_dropping_oldest(&tx, &rx, i)).sum();
        assert_eq!(dropped, 2);
        assert_eq!(rx.drain().collect::<Vec<_>>(), [3, 4, 5]);
    }

    #[test]
    fn room_drops_nothing() {
        let (tx, rx) = flume::bounded(2);
        assert_eq!(push_dropping_oldest(&tx, &rx, 1), 0);
        assert_eq!(rx.try_recv(), Ok(1));
    }
}
