//! Reading failed records back from a dead-letter stream that
//! [`KinesisDestination`](super::KinesisDestination) wrote: each record's
//! parts put together again (see the format in `document`).

use std::collections::{HashMap, HashSet};

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
#[derive(Debug, Default)]
pub struct DeadLetterReassembler {
    partial: HashMap<String, Partial>,
}

#[derive(Debug)]
struct Partial {
    document: Value,
    data_bytes: u64,
    slices: Vec<Option<Vec<u8>>>,
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

    /// Takes one dead-letter record's data: the failed record it completes,
    /// if it was its last missing part. Once complete, a record is
    /// forgotten, so its parts written again by a retried send start it
    /// over (and complete it again if all of them were rewritten).
    pub fn push(&mut self, record_data: &[u8]) -> Result<Option<DeadLetter>, DeadLetterError> {
        let part = Part::parse(record_data)?;
        let id = part.id.clone();
        let partial = self.partial.entry(id.clone()).or_insert_with(|| Partial {
            document: part.document.clone(),
            data_bytes: part.data_bytes,
            slices: vec![None; part.parts],
        });
        if partial.slices.len() != part.parts || partial.data_bytes != part.data_bytes {
            return Err(invalid(
                &id,
                "its parts disagree on how many parts or bytes it has",
            ));
        }
        partial.slices[part.index].get_or_insert(part.slice);
        if partial.slices.iter().any(Option::is_none) {
            return Ok(None);
        }
        match self.partial.remove(&id) {
            Some(done) => done.finish(id).map(Some),
            None => Ok(None),
        }
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
