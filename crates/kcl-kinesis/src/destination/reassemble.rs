//! Reading failed records back from a dead-letter stream that
//! [`KinesisDestination`](super::KinesisDestination) wrote: each record's
//! parts put together again (see the format in `document`).

use std::collections::{BTreeMap, HashMap, HashSet};

use aws_smithy_types::base64;
use bytes::Bytes;
use serde_json::Value;

/// One failed record read back from a dead-letter stream, whole.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct DeadLetter {
    /// `stream/shard/sequence/sub-sequence`: where it was in its source
    /// stream.
    pub id: String,
    /// Its metadata (position, partition key, error, attempts, reason...):
    /// a part's document without its `part` and `data_base64`.
    pub document: Value,
    /// Its data, whole.
    pub data: Bytes,
}

/// Why dead-letter records could not be read back.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum DeadLetterError {
    /// A record that is not a document `KinesisDestination` writes.
    #[error("a dead-letter record is not a kcl failure document: {0}")]
    NotADocument(String),
    /// A part that contradicts the record's other parts, or data that does
    /// not decode.
    #[error("dead letter {id}: {problem}")]
    Invalid {
        /// The record's `id`.
        id: String,
        /// What is wrong.
        problem: String,
    },
    /// Some of the record's parts were not among those read (read further:
    /// the parts of one record share a partition key, and so a shard).
    #[error("dead letter {id}: only {held} of its {parts} parts were read")]
    Incomplete {
        /// The record's `id`.
        id: String,
        /// Parts read.
        held: usize,
        /// Parts it has.
        parts: usize,
    },
}

/// Puts failed records back together from a dead-letter stream's records,
/// fed in any order, repeats included (a retried send writes parts again).
///
/// The parts of records not yet complete are held, up to
/// [`Self::with_max_partial_bytes`] (64 MiB by default): a long-lived
/// reader meets records whose other parts never come (trimmed, or read
/// from `LATEST` mid-record, or a send cut off after some parts), and held
/// them all for good. Past the bound the records that started longest ago
/// are dropped, counted by [`Self::dropped`]; [`Self::take_incomplete`]
/// lets their reader give them up itself.
#[derive(Debug)]
pub struct DeadLetterReassembler {
    partial: HashMap<String, Partial>,
    /// The records of `partial` by when their first part came: removed
    /// by key as a record completes, in no pass over the others.
    arrival: BTreeMap<u64, String>,
    /// The arrival number of the next record.
    next_arrival: u64,
    /// Bytes of the parts held.
    held: usize,
    max_held: usize,
    dropped: u64,
}

/// The parts a reassembler holds by default, in bytes.
const DEFAULT_MAX_PARTIAL_BYTES: usize = 64 << 20;

impl Default for DeadLetterReassembler {
    fn default() -> Self {
        DeadLetterReassembler {
            partial: HashMap::new(),
            arrival: BTreeMap::new(),
            next_arrival: 0,
            held: 0,
            max_held: DEFAULT_MAX_PARTIAL_BYTES,
            dropped: 0,
        }
    }
}

#[derive(Debug)]
struct Partial {
    document: Value,
    data_bytes: u64,
    slices: Vec<Option<Vec<u8>>>,
    /// Its key in `arrival`.
    arrived: u64,
}

/// More parts than any record has (a part holds about 750 KiB), so that a
/// stray document cannot make the reassembler allocate without bound.
const MAX_PARTS: u64 = 4096;

/// One dead-letter record, parsed.
struct Part {
    id: String,
    index: usize,
    parts: usize,
    data_bytes: u64,
    slice: Vec<u8>,
    document: Value,
}

impl DeadLetterReassembler {
    /// An empty reassembler.
    pub fn new() -> Self {
        Self::default()
    }

    /// Holds at most `bytes` of the parts of records not yet complete
    /// (the record being completed is never dropped, whatever its size).
    pub fn with_max_partial_bytes(mut self, bytes: usize) -> Self {
        self.max_held = bytes;
        self
    }

    /// Records dropped unfinished to keep within the bound.
    pub fn dropped(&self) -> u64 {
        self.dropped
    }

    /// Takes one dead-letter record's data: the failed record it completes,
    /// if it was its last missing part. Once complete, a record is
    /// forgotten, so its parts written again by a retried send start it
    /// over (and complete it again if all of them were rewritten).
    pub fn push(&mut self, record_data: &[u8]) -> Result<Option<DeadLetter>, DeadLetterError> {
        let part = Part::parse(record_data)?;
        let id = part.id.clone();
        let partial = self.partial.entry(id.clone()).or_insert_with(|| {
            self.arrival.insert(self.next_arrival, id.clone());
            self.next_arrival += 1;
            Partial {
                document: part.document.clone(),
                data_bytes: part.data_bytes,
                slices: vec![None; part.parts],
                arrived: self.next_arrival - 1,
            }
        });
        if partial.slices.len() != part.parts || partial.data_bytes != part.data_bytes {
            return Err(invalid(
                &id,
                "its parts disagree on how many parts or bytes it has",
            ));
        }
        let slot = &mut partial.slices[part.index];
        if slot.is_none() {
            self.held += part.slice.len();
            *slot = Some(part.slice);
        }
        if partial.slices.iter().any(Option::is_none) {
            self.drop_oldest_but(&id);
            return Ok(None);
        }
        match self.forget(&id) {
            Some(done) => done.finish(id).map(Some),
            None => Ok(None),
        }
    }

    /// Drops the records started longest ago, but `keep`, while more than
    /// the bound is held.
    fn drop_oldest_but(&mut self, keep: &str) {
        while self.held > self.max_held {
            let Some(oldest) = self.arrival.values().find(|id| *id != keep).cloned() else {
                return;
            };
            if let Some(dropped) = self.forget(&oldest) {
                self.dropped += 1;
                tracing::warn!(id = %oldest, held = dropped.slices.iter().flatten().count(),
                    parts = dropped.slices.len(),
                    "dropping a dead letter whose other parts did not come, to stay within \
                     the reassembler's bound");
            }
        }
    }

    /// Removes record `id`, its parts and its place in the arrival order.
    fn forget(&mut self, id: &str) -> Option<Partial> {
        let partial = self.partial.remove(id)?;
        self.arrival.remove(&partial.arrived);
        self.held -= partial.slices.iter().flatten().map(Vec::len).sum::<usize>();
        Some(partial)
    }

    /// The records some of whose parts were pushed, but not all, given up:
    /// for a long-lived reader, to call now and then (say, once its reads
    /// are past the point where the missing parts could still come).
    pub fn take_incomplete(&mut self) -> Vec<DeadLetterError> {
        let incomplete = self.incomplete();
        self.partial.clear();
        self.arrival.clear();
        self.held = 0;
        incomplete
    }

    /// The records some of whose parts were pushed, but not all.
    pub fn incomplete(&self) -> Vec<DeadLetterError> {
        self.partial
            .iter()
            .map(|(id, p)| DeadLetterError::Incomplete {
                id: id.clone(),
                held: p.slices.iter().flatten().count(),
                parts: p.slices.len(),
            })
            .collect()
    }
}

/// The failed records in `records` (a dead-letter stream's records' data,
/// in any order), each once, in the order they completed. Fails on a record
/// that is not a dead-letter document, and on a failed record some of
/// whose parts are missing (unless an earlier copy of it was complete).
pub fn reassemble_dead_letters<'a>(
    records: impl IntoIterator<Item = &'a [u8]>,
) -> Result<Vec<DeadLetter>, DeadLetterError> {
    let mut reassembler = DeadLetterReassembler::new();
    let mut done = HashSet::new();
    let mut out = Vec::new();
    for data in records {
        if let Some(letter) = reassembler.push(data)?
            && done.insert(letter.id.clone())
        {
            out.push(letter);
        }
    }
    let missing = reassembler.incomplete().into_iter().find(|e| match e {
        DeadLetterError::Incomplete { id, .. } => !done.contains(id),
        _ => true,
    });
    match missing {
        Some(e) => Err(e),
        None => Ok(out),
    }
}

impl Partial {
    fn finish(self, id: String) -> Result<DeadLetter, DeadLetterError> {
        let data: Vec<u8> = self.slices.into_iter().flatten().flatten().collect();
        if data.len() as u64 != self.data_bytes {
            return Err(invalid(
                &id,
                &format!(
                    "its parts hold {} bytes, not the {} it had",
                    data.len(),
                    self.data_bytes
                ),
            ));
        }
        Ok(DeadLetter {
            id,
            document: self.document,
            data: data.into(),
        })
    }
}

impl Part {
    fn parse(record_data: &[u8]) -> Result<Part, DeadLetterError> {
        let not_one = |why: String| DeadLetterError::NotADocument(why);
        let mut doc: Value =
            serde_json::from_slice(record_data).map_err(|e| not_one(format!("not JSON: {e}")))?;
        let id = doc["id"]
            .as_str()
            .ok_or_else(|| not_one("no \"id\"".into()))?
            .to_owned();
        let number = |field: &str| {
            doc[field]
                .as_u64()
                .ok_or_else(|| invalid(&id, &format!("no number \"{field}\"")))
        };
        let (index, parts, data_bytes) = (number("part")?, number("parts")?, number("data_bytes")?);
        if index >= parts || parts > MAX_PARTS {
            return Err(invalid(&id, &format!("part {index} of {parts}")));
        }
        let encoded = doc["data_base64"]
            .as_str()
            .ok_or_else(|| invalid(&id, "no \"data_base64\""))?;
        let slice = base64::decode(encoded)
            .map_err(|e| invalid(&id, &format!("data_base64 does not decode: {e}")))?;
        if let Some(fields) = doc.as_object_mut() {
            fields.remove("part");
            fields.remove("data_base64");
        }
        let size = |n: u64| usize::try_from(n).map_err(|_| invalid(&id, "too many parts"));
        Ok(Part {
            index: size(index)?,
            parts: size(parts)?,
            id,
            data_bytes,
            slice,
            document: doc,
        })
    }
}

fn invalid(id: &str, problem: &str) -> DeadLetterError {
    DeadLetterError::Invalid {
        id: id.to_owned(),
        problem: problem.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Part `index` of `parts` of record `id`, each part `len` bytes.
    fn part(id: &str, index: u64, parts: u64, len: usize) -> Vec<u8> {
        let data = vec![b'x'; len];
        serde_json::to_vec(&serde_json::json!({
            "id": id,
            "part": index,
            "parts": parts,
            "data_bytes": len as u64 * parts,
            "data_base64": base64::encode(&data),
        }))
        .unwrap()
    }

    /// Records whose other parts never come are held up to the bound, the
    /// oldest dropped first and counted: a long-lived reader held every one
    /// for good. A record completing meanwhile is still put together.
    #[test]
    fn records_whose_parts_never_come_are_held_up_to_the_bound() {
        let mut r = DeadLetterReassembler::new().with_max_partial_bytes(10_000);
        for i in 0..1000 {
            assert_eq!(
                r.push(&part(&format!("orphan-{i}"), 0, 2, 1000)).unwrap(),
                None
            );
        }
        assert!(r.held <= 10_000, "{} bytes held", r.held);
        assert_eq!(r.incomplete().len(), 10);
        assert_eq!(r.dropped(), 990);
        assert!(r.partial.contains_key("orphan-999"), "the newest are kept");
        r.push(&part("whole", 0, 2, 1000)).unwrap();
        let letter = r
            .push(&part("whole", 1, 2, 1000))
            .unwrap()
            .expect("complete");
        assert_eq!(letter.data.len(), 2000);
        assert_eq!(r.arrival.len(), r.partial.len());
    }

    /// Its reader can give the unfinished records up itself.
    #[test]
    fn unfinished_records_can_be_given_up() {
        let mut r = DeadLetterReassembler::new();
        r.push(&part("a", 0, 3, 10)).unwrap();
        r.push(&part("b", 1, 2, 10)).unwrap();
        let given_up = r.take_incomplete();
        assert_eq!(given_up.len(), 2);
        assert!(r.incomplete().is_empty());
        assert_eq!((r.held, r.arrival.len()), (0, 0));
    }
}
