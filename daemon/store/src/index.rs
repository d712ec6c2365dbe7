//! The tantivy index over runs. It is derived data: documents are built from the database
//! rows (never from what the daemon had in memory), added in commit-sequence order, and each
//! tantivy commit carries `{"last_seq": N}` as its payload, so a restart resumes after the
//! last run the index really holds. A missing or unreadable index is rebuilt from the
//! database.

use std::path::Path;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

use duckdb::{Connection, params};
use serde::{Deserialize, Serialize};
use tantivy::collector::TopDocs;
use tantivy::query::{BooleanQuery, Occur, QueryParser, TermQuery};
use tantivy::schema::{
    FAST, Field, INDEXED, IndexRecordOption, STORED, STRING, Schema, TEXT, Value,
};
use tantivy::snippet::SnippetGenerator;
use tantivy::{Index, IndexReader, IndexWriter, ReloadPolicy, TantivyDocument, Term, doc};

use crate::StoreError;

/// One search result.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct SearchHit {
    pub run_id: String,
    pub seq: u64,
    pub score: f32,
    /// The best matching passage of the run's text, matches in `[…]`.
    pub snippet: String,
}

/// A run as the index sees it.
pub(crate) struct RunDoc {
    seq: u64,
    run_id: String,
    tenant: Option<String>,
    status: String,
    policy: String,
    program: String,
    labels: Vec<String>,
    engines: Vec<String>,
    ops: Vec<String>,
    codes: Vec<String>,
    text: String,
}

struct Fields {
    seq: Field,
    run_id: Field,
    tenant: Field,
    status: Field,
    policy: Field,
    program: Field,
    label: Field,
    engine: Field,
    op: Field,
    code: Field,
    text: Field,
}

/// The tenant term of runs that have none (no real tenant name starts with a NUL).
const NO_TENANT: &str = "\u{0}none";

pub(crate) struct SearchIndex {
    index: Index,
    fields: Fields,
    writer: Mutex<IndexWriter>,
    reader: IndexReader,
    last_seq: AtomicU64,
}

#[derive(Serialize, Deserialize)]
struct Payload {
    last_seq: u64,
}

fn schema() -> (Schema, Fields) {
    let mut b = Schema::builder();
    let fields = Fields {
        seq: b.add_u64_field("seq", INDEXED | STORED | FAST),
        run_id: b.add_text_field("run", STRING | STORED),
        tenant: b.add_text_field("tenant", STRING),
        status: b.add_text_field("status", STRING),
        policy: b.add_text_field("policy", STRING),
        program: b.add_text_field("program", STRING),
        label: b.add_text_field("label", STRING),
        engine: b.add_text_field("engine", STRING),
        op: b.add_text_field("op", STRING),
        code: b.add_text_field("code", STRING),
        text: b.add_text_field("text", TEXT | STORED),
    };
    (b.build(), fields)
}

impl SearchIndex {
    pub(crate) fn open(dir: &Path) -> Result<SearchIndex, StoreError> {
        let (schema, fields) = schema();
        std::fs::create_dir_all(dir)
            .map_err(|e| StoreError::Index(format!("{}: {e}", dir.display())))?;
        let existing = Index::open_in_dir(dir).ok().filter(|i| i.schema() == schema);
        let index = match existing {
            Some(i) => i,
            None => {
                // Absent, unreadable or of another schema: start over; the database has
                // everything to rebuild it.
                for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
                    let p = entry.path();
                    let _ = if p.is_dir() {
                        std::fs::remove_dir_all(&p)
                    } else {
                        std::fs::remove_file(&p)
                    };
                }
                Index::create_in_dir(dir, schema)?
            }
        };
        let last_seq = index
            .load_metas()?
            .payload
            .and_then(|p| serde_json::from_str::<Payload>(&p).ok())
            .map_or(0, |p| p.last_seq);
        // tantivy's indexing and merge threads are spawned here and inherit this thread's
        // scheduling class: made from a background thread, they stay in the background.
        let writer = std::thread::scope(|scope| {
            scope
                .spawn(|| {
                    crate::lower_priority();
                    index.writer(30_000_000)
                })
                .join()
                .map_err(|_| StoreError::Index("creating the index writer panicked".into()))
        })??;
        let reader = index.reader_builder().reload_policy(ReloadPolicy::Manual).try_into()?;
        Ok(SearchIndex {
            index,
            fields,
            writer: Mutex::new(writer),
            reader,
            last_seq: AtomicU64::new(last_seq),
        })
    }

    pub(crate) fn last_seq(&self) -> u64 {
        self.last_seq.load(Ordering::Acquire)
    }

    /// Adds runs (in sequence order, all after `last_seq`) and commits them with the new
    /// last sequence as payload.
    pub(crate) fn add(&self, docs: &[RunDoc]) -> Result<(), StoreError> {
        let Some(last) = docs.last().map(|d| d.seq) else { return Ok(()) };
        let f = &self.fields;
        let mut w = self.writer.lock().map_err(|_| StoreError::Index("writer poisoned".into()))?;
        for d in docs {
            let mut doc = doc!(
                f.seq => d.seq,
                f.run_id => d.run_id.clone(),
                f.tenant => d.tenant.clone().unwrap_or_else(|| NO_TENANT.to_string()),
                f.status => d.status.clone(),
                f.policy => d.policy.clone(),
                f.program => d.program.clone(),
                f.text => d.text.clone(),
            );
            for (field, values) in
                [(f.label, &d.labels), (f.engine, &d.engines), (f.op, &d.ops), (f.code, &d.codes)]
            {
                for v in values {
                    doc.add_text(field, v);
                }
            }
            w.add_document(doc)?;
        }
        let mut commit = w.prepare_commit()?;
        commit.set_payload(&serde_json::to_string(&Payload { last_seq: last }).unwrap_or_default());
        commit.commit()?;
        self.last_seq.store(last, Ordering::Release);
        self.reader.reload()?;
        Ok(())
    }

    /// Removes every document (and commits the empty index with sequence 0).
    pub(crate) fn clear(&self) -> Result<(), StoreError> {
        let mut w = self.writer.lock().map_err(|_| StoreError::Index("writer poisoned".into()))?;
        w.delete_all_documents()?;
        let mut commit = w.prepare_commit()?;
        commit.set_payload(&serde_json::to_string(&Payload { last_seq: 0 }).unwrap_or_default());
        commit.commit()?;
        self.last_seq.store(0, Ordering::Release);
        self.reader.reload()?;
        Ok(())
    }

    pub(crate) fn search(
        &self,
        query: &str,
        tenant: Option<&str>,
        limit: usize,
    ) -> Result<Vec<SearchHit>, StoreError> {
        let f = &self.fields;
        let mut parser = QueryParser::for_index(&self.index, vec![f.text]);
        parser.set_conjunction_by_default();
        let parsed = parser
            .parse_query(query)
            .map_err(|e| StoreError::Query(format!("search query {query:?}: {e}")))?;
        let query: Box<dyn tantivy::query::Query> = match tenant {
            Some(t) => Box::new(BooleanQuery::new(vec![
                (Occur::Must, parsed.box_clone()),
                (
                    Occur::Must,
                    Box::new(TermQuery::new(
                        Term::from_field_text(f.tenant, t),
                        IndexRecordOption::Basic,
                    )),
                ),
            ])),
            None => parsed.box_clone(),
        };
        let searcher = self.reader.searcher();
        let top = searcher.search(&query, &TopDocs::with_limit(limit).order_by_score())?;
        let snippets = SnippetGenerator::create(&searcher, &*parsed, f.text)?;
        let mut hits = Vec::with_capacity(top.len());
        for (score, address) in top {
            let doc: TantivyDocument = searcher.doc(address)?;
            let run_id =
                doc.get_first(f.run_id).and_then(|v| v.as_str()).unwrap_or_default().to_string();
            let seq = doc.get_first(f.seq).and_then(|v| v.as_u64()).unwrap_or(0);
            let snippet = snippets.snippet_from_doc(&doc);
            let mut text = String::new();
            let fragment = snippet.fragment();
            let mut at = 0;
            for range in snippet.highlighted() {
                text.push_str(&fragment[at..range.start]);
                text.push('[');
                text.push_str(&fragment[range.clone()]);
                text.push(']');
                at = range.end;
            }
            text.push_str(&fragment[at..]);
            hits.push(SearchHit { run_id, seq, score, snippet: text });
        }
        Ok(hits)
    }
}

/// Builds the documents of up to `limit` runs after sequence `after`, from the database.
pub(crate) fn load_docs(
    c: &Connection,
    after: u64,
    limit: usize,
) -> Result<Vec<RunDoc>, StoreError> {
    let mut stmt = c.prepare(
        "SELECT seq, run_id, tenant, status, policy_name, program_name, program_kind, labels, \
         error, explanation FROM runs WHERE seq > ? ORDER BY seq LIMIT ?",
    )?;
    let rows = stmt.query_map(params![after as i64, limit as i64], |r| {
        Ok((
            r.get::<_, i64>(0)? as u64,
            r.get::<_, String>(1)?,
            r.get::<_, Option<String>>(2)?,
            r.get::<_, String>(3)?,
            r.get::<_, String>(4)?,
            r.get::<_, String>(5)?,
            r.get::<_, String>(6)?,
            r.get::<_, String>(7)?,
            r.get::<_, Option<String>>(8)?,
            r.get::<_, Option<String>>(9)?,
        ))
    })?;
    let mut docs = Vec::new();
    for row in rows {
        let (seq, run_id, tenant, status, policy, program, kind, labels, error, explanation) = row?;
        let labels: std::collections::BTreeMap<String, String> =
            serde_json::from_str(&labels).unwrap_or_default();
        let labels: Vec<String> = labels.iter().map(|(k, v)| format!("{k}={v}")).collect();
        let mut text = vec![
            format!("run {run_id}"),
            format!("program {program} ({kind})"),
            format!("policy {policy}"),
            format!("status {status}"),
        ];
        text.extend(labels.iter().map(|l| format!("label {l}")));
        if let Some(e) = &error {
            text.push(format!("error {e}"));
        }
        let (mut engines, mut ops, mut codes) = (Vec::new(), Vec::new(), Vec::new());
        let ex: Option<xpu_plan::Explanation> =
            explanation.as_deref().and_then(|t| serde_json::from_str(t).ok());
        if let Some(ex) = &ex {
            for d in &ex.decisions {
                text.push(xpu_plan::render::decision_sentence(d));
                if let Some(c) = &d.chosen {
                    engines.push(c.engine.to_string());
                }
                ops.push(d.op.to_string());
                if let Some(f) = &d.fallback {
                    codes.push(f.code.name().to_string());
                }
                codes.extend(d.rejected.iter().map(|r| r.code.name().to_string()));
            }
            for n in ex.warnings.iter().chain(&ex.errors) {
                text.push(n.message.clone());
                codes.push(n.code.name().to_string());
            }
            for f in &ex.facts {
                text.push(format!("{} {}: {}", f.engine, f.key, f.value));
            }
        }
        for v in [&mut engines, &mut ops, &mut codes] {
            v.sort();
            v.dedup();
        }
        docs.push(RunDoc {
            seq,
            run_id,
            tenant,
            status,
            policy,
            program,
            labels,
            engines,
            ops,
            codes,
            text: text.join("\n"),
        });
    }
    Ok(docs)
}
