//! Journal rows (schema version 3): one row of `inputs` or `events` holds several
//! consecutive entries, so a group of steps costs a few rows instead of one per entry.
//!
//! A row is `(run_id, seq, n, data)`: `seq` is the number of its first entry, `n` how
//! many it holds (at least 1). With `n = 1` the data is the entry itself, which is also
//! every row written before version 3 (the migration adds `n` with default 1, so old rows
//! read unchanged). With `n > 1`:
//!
//! * inputs: each entry as a 4-byte little-endian length and then its bytes;
//! * events: the entries joined by `\n`. An event is JSON text as serde_json writes it
//!   compactly, which never holds a raw newline (JSON escapes control characters inside
//!   strings, and the compact form puts no whitespace between tokens); an event that
//!   holds one all the same (text from elsewhere) goes in a row of its own.
//!
//! What is read back is outside input: a row that does not decode to exactly `n`
//! entries, or rows that leave a gap, are [`StoreError::Corrupt`].

use super::StoreError;

/// The most entry bytes packed in one row: a read of a few entries (an events page) never
/// loads more than about this much of a row it does not need. An entry larger than this
/// gets a row of its own.
const ROW_BYTES: usize = 64 * 1024;

/// The length before each input of a row of several: a `u32`, little-endian.
pub(super) const FRAME: usize = 4;

/// A row to write: its first entry's number, its entry count, its data.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Packed<T> {
    pub(super) seq: i64,
    pub(super) n: i64,
    pub(super) data: T,
}

/// Splits `entries` (numbered from `first`) into runs of consecutive entries, each run
/// at most [`ROW_BYTES`] (but at least one entry); `alone` entries get a run of their own.
fn chunks<T>(
    first: i64,
    entries: &[T],
    len: impl Fn(&T) -> usize,
    alone: impl Fn(&T) -> bool,
) -> Vec<(i64, &[T])> {
    let mut out = Vec::new();
    let (mut start, mut bytes) = (0, 0);
    for (i, entry) in entries.iter().enumerate() {
        let size = len(entry);
        let full = i > start && (bytes + size > ROW_BYTES || alone(entry));
        if full {
            out.push((first + start as i64, &entries[start..i]));
            (start, bytes) = (i, 0);
        }
        bytes += size;
        if alone(entry) {
            out.push((first + start as i64, &entries[start..=i]));
            (start, bytes) = (i + 1, 0);
        }
    }
    if start < entries.len() {
        out.push((first + start as i64, &entries[start..]));
    }
    out
}

/// The rows of inputs numbered from `first`.
pub(super) fn pack_inputs(first: i64, inputs: &[Vec<u8>]) -> Vec<Packed<Vec<u8>>> {
    chunks(first, inputs, Vec::len, |_| false)
        .into_iter()
        .map(|(seq, entries)| {
            let data = match entries {
                [one] => one.clone(),
                many => {
                    let size = many.iter().map(|e| FRAME + e.len()).sum();
                    let mut data = Vec::with_capacity(size);
                    for entry in many {
                        // An entry is far below 4 GiB: the journal's window bounds a
                        // group to megabytes.
                        let len = u32::try_from(entry.len()).unwrap_or(u32::MAX);
                        data.extend_from_slice(&len.to_le_bytes());
                        data.extend_from_slice(entry);
                    }
                    data
                }
            };
            Packed {
                seq,
                n: entries.len() as i64,
                data,
            }
        })
        .collect()
}

/// The rows of events numbered from `first`.
pub(super) fn pack_events(first: i64, events: &[String]) -> Vec<Packed<String>> {
    chunks(first, events, String::len, |e| e.contains('\n'))
        .into_iter()
        .map(|(seq, entries)| Packed {
            seq,
            n: entries.len() as i64,
            data: entries.join("\n"),
        })
        .collect()
}

/// A row's entry count, checked.
fn entry_count(what: &str, seq: i64, n: i64) -> Result<usize, StoreError> {
    usize::try_from(n)
        .ok()
        .filter(|&n| n >= 1)
        .ok_or_else(|| StoreError::Corrupt(format!("{what} row {seq} holds {n} entries")))
}

/// The inputs of one row.
pub(super) fn unpack_inputs(seq: i64, n: i64, data: Vec<u8>) -> Result<Vec<Vec<u8>>, StoreError> {
    let n = entry_count("input", seq, n)?;
    if n == 1 {
        return Ok(vec![data]);
    }
    let bad = |why: &str| {
        StoreError::Corrupt(format!(
            "input row {seq} ({n} entries, {} bytes): {why}",
            data.len()
        ))
    };
    // Each entry takes at least its frame: a count the data cannot hold is refused before
    // anything is allocated for it.
    if n > data.len() / FRAME {
        return Err(bad("too short for its entry count"));
    }
    let mut out = Vec::with_capacity(n);
    let mut rest = data.as_slice();
    while !rest.is_empty() {
        let (len, tail) = rest
            .split_first_chunk::<FRAME>()
            .ok_or_else(|| bad("a truncated length"))?;
        let len =
            usize::try_from(u32::from_le_bytes(*len)).map_err(|_| bad("a length too large"))?;
        if len > tail.len() {
            return Err(bad("an entry runs past the end"));
        }
        let (entry, tail) = tail.split_at(len);
        out.push(entry.to_vec());
        rest = tail;
    }
    if out.len() != n {
        return Err(bad(&format!("it decodes to {} entries", out.len())));
    }
    Ok(out)
}

/// The events of one row.
pub(super) fn unpack_events(seq: i64, n: i64, text: String) -> Result<Vec<String>, StoreError> {
    let n = entry_count("event", seq, n)?;
    if n == 1 {
        return Ok(vec![text]);
    }
    let out: Vec<String> = text.split('\n').map(str::to_string).collect();
    if out.len() != n {
        return Err(StoreError::Corrupt(format!(
            "event row {seq} holds {} lines, not its {n} entries",
            out.len()
        )));
    }
    Ok(out)
}

/// Entries read from rows in order, from entry number `from` on, at most `limit`: the
/// first row may start before `from` (it is sliced), and each row must start where the
/// one before ended.
pub(super) struct Entries<T> {
    what: &'static str,
    /// The number of the next entry expected (the end of the rows so far).
    next: Option<u64>,
    from: u64,
    limit: usize,
    out: Vec<T>,
}

impl<T> Entries<T> {
    pub(super) fn new(what: &'static str, from: u64, limit: u64) -> Entries<T> {
        Entries {
            what,
            next: None,
            from,
            limit: usize::try_from(limit).unwrap_or(usize::MAX),
            out: Vec::new(),
        }
    }

    /// Whether `limit` entries are in hand: the rest of the rows need not be read (and
    /// are not looked at).
    pub(super) fn full(&self) -> bool {
        self.out.len() >= self.limit
    }

    /// Adds one row, starting at entry `seq` and decoded by `decode` (only when needed).
    pub(super) fn add(
        &mut self,
        seq: i64,
        decode: impl FnOnce() -> Result<Vec<T>, StoreError>,
    ) -> Result<(), StoreError> {
        if self.full() {
            return Ok(());
        }
        let start = u64::try_from(seq)
            .map_err(|_| StoreError::Corrupt(format!("{} row number {seq}", self.what)))?;
        // The first row is the one holding `from` (or the first of all when `from` is
        // before it: then it must start at `from`, or entries are missing).
        let expected = self.next.unwrap_or(start.min(self.from));
        if start != expected {
            return Err(StoreError::Corrupt(format!(
                "{} rows leave a gap: a row starts at {start}, the entry expected is {expected}",
                self.what
            )));
        }
        let entries = decode()?;
        self.next = Some(start + entries.len() as u64);
        let skip = usize::try_from(self.from.saturating_sub(start)).unwrap_or(usize::MAX);
        let room = self.limit - self.out.len();
        self.out.extend(entries.into_iter().skip(skip).take(room));
        Ok(())
    }

    /// The entries, after checking that the rows reach `end` (the count the run's row
    /// records) when it is given.
    pub(super) fn finish(self, end: Option<u64>) -> Result<Vec<T>, StoreError> {
        if let Some(end) = end {
            let reached = self.next.unwrap_or(self.from.min(end));
            if reached != end {
                return Err(StoreError::Corrupt(format!(
                    "the run records {end} {}s, its rows hold entries up to {reached}",
                    self.what
                )));
            }
        }
        Ok(self.out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn inputs(lens: &[usize]) -> Vec<Vec<u8>> {
        lens.iter()
            .enumerate()
            .map(|(i, &len)| vec![i as u8; len])
            .collect()
    }

    #[test]
    fn inputs_round_trip_in_rows_of_bounded_size() {
        for lens in [
            vec![],
            vec![0],
            vec![3],
            vec![0, 0, 5],
            vec![10; 100],
            vec![ROW_BYTES, 1, 2],
            vec![ROW_BYTES / 2, ROW_BYTES / 2 + 1, 7],
        ] {
            let entries = inputs(&lens);
            let rows = pack_inputs(5, &entries);
            let mut next = 5;
            let mut back = Vec::new();
            for row in rows {
                assert_eq!(row.seq, next, "{lens:?}");
                next += row.n;
                assert!(row.n == 1 || row.data.len() <= ROW_BYTES + FRAME * row.n as usize);
                back.extend(unpack_inputs(row.seq, row.n, row.data).expect("decodes"));
            }
            assert_eq!(back, entries, "{lens:?}");
        }
        // One entry is stored as itself, as before version 3.
        assert_eq!(pack_inputs(0, &[vec![9, 9]])[0].data, vec![9, 9]);
    }

    #[test]
    fn events_round_trip_and_an_event_with_a_newline_is_alone() {
        let events: Vec<String> = ["{\"a\":1}", "", "x\ny", "{}", "{\"b\":\"\\n\"}"]
            .iter()
            .map(|s| s.to_string())
            .collect();
        let rows = pack_events(0, &events);
        assert_eq!(
            rows.iter().map(|r| (r.seq, r.n)).collect::<Vec<_>>(),
            [(0, 2), (2, 1), (3, 2)]
        );
        let back: Vec<String> = rows
            .into_iter()
            .flat_map(|r| unpack_events(r.seq, r.n, r.data).expect("decodes"))
            .collect();
        assert_eq!(back, events);
    }

    #[test]
    fn malformed_rows_are_corrupt() {
        let good = pack_inputs(0, &inputs(&[2, 3]))[0].data.clone();
        let cases: Vec<(i64, Vec<u8>)> = vec![
            (0, vec![1]),
            (-1, vec![1]),
            (3, good.clone()),
            (2, good[..good.len() - 1].to_vec()),
            (2, good[..5].to_vec()),
            (2, [good.clone(), vec![0]].concat()),
            (1_000_000_000, good.clone()),
            (2, vec![0xFF; 12]),
        ];
        for (n, data) in cases {
            let err = unpack_inputs(7, n, data).unwrap_err();
            assert!(matches!(err, StoreError::Corrupt(_)), "{err}");
        }
        assert!(matches!(
            unpack_events(0, 3, "{}\n{}".into()),
            Err(StoreError::Corrupt(_))
        ));
    }

    #[test]
    fn entries_slice_the_first_row_and_refuse_gaps() {
        let rows = [(0, 3), (3, 1), (4, 4)];
        let read = |from, limit, rows: &[(i64, i64)]| {
            let mut entries = Entries::new("event", from, limit);
            for &(seq, n) in rows {
                entries.add(seq, || Ok((seq..seq + n).collect::<Vec<_>>()))?;
            }
            // A page stops early; a whole read must reach the recorded count.
            entries.finish((limit == 100).then_some(8))
        };
        assert_eq!(read(0, 100, &rows).unwrap(), (0..8).collect::<Vec<_>>());
        assert_eq!(read(1, 3, &rows[..]).unwrap(), [1, 2, 3]);
        assert_eq!(read(5, 2, &rows[2..]).unwrap(), [5, 6]);
        assert!(matches!(
            read(0, 100, &[(0, 3), (4, 4)]),
            Err(StoreError::Corrupt(_))
        ));
        assert!(matches!(
            read(0, 100, &rows[..2]),
            Err(StoreError::Corrupt(_))
        ));
        // A first row after `from`: entries before it are missing.
        assert!(matches!(
            read(2, 100, &rows[1..]),
            Err(StoreError::Corrupt(_))
        ));
    }
}
