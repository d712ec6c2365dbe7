//! The tantivy index over runs and asks. It is derived data: documents are built from the
//! database rows (never from what the daemon had in memory), added in commit-sequence order,
//! and each tantivy commit carries `{"last_seq": N, "last_ask": M}` as its payload, so a
//! restart resumes after the last run and ask the index really holds. A missing or
//! unreadable index (or one of an older schema) is rebuilt from the database.

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

/// What a search result is.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum HitKind {
    Run,
    Ask,
}

impl HitKind {
    pub fn name(self) -> &'static str {
        match self {
            HitKind::Run => "run",
            HitKind::Ask => "ask",
        }
    }
}

/// One search result.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct SearchHit {
    pub kind: HitKind,
    /// The run's id, or the ask's (`ask-…`).
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

/// An ask as the index sees it.
pub(crate) struct AskDoc {
    pub(crate) seq: u64,
    pub(crate) ask_id: String,
    pub(crate) tenant: Option<String>,
    pub(crate) accepted: bool,
    /// The question and the data's columns: what a later question is compared with.
    pub(crate) topic: String,
    pub(crate) text: String,
}

/// How [`SearchIndex::put_asks`] takes its documents.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub(crate) enum Put {
    New,
    Replace,
}

/// A stored accepted ask similar to a question.
pub(crate) struct Similar {
    pub(crate) ask_id: String,
    pub(crate) score: f32,
}

struct Fields {
    kind: Field,
    accepted: Field,
    topic: Field,
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

/// How every ask's id starts (a run's id is a bare ULID).
pub const ASK_ID_PREFIX: &str = "ask-";

/// The tenant term of runs that have none (no real tenant name starts with a NUL).
const NO_TENANT: &str = "\u{0}none";

pub(crate) struct SearchIndex {
    index: Index,
    fields: Fields,
    writer: Mutex<IndexWriter>,
    reader: IndexReader,
    last_seq: AtomicU64,
    last_ask: AtomicU64,
}

#[derive(Serialize, Deserialize)]
struct Payload {
    last_seq: u64,
    #[serde(default)]
    last_ask: u64,
}

fn schema() -> (Schema, Fields) {
    let mut b = Schema::builder();
    let fields = Fields {
        kind: b.add_text_field("kind", STRING),
        accepted: b.add_text_field("accepted", STRING),
        topic: b.add_text_field("topic", TEXT),
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
        let payload = index
            .load_metas()?
            .payload
            .and_then(|p| serde_json::from_str::<Payload>(&p).ok())
            .unwrap_or(Payload { last_seq: 0, last_ask: 0 });
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
            last_seq: AtomicU64::new(payload.last_seq),
            last_ask: AtomicU64::new(payload.last_ask),
        })
    }

    pub(crate) fn last_seq(&self) -> u64 {
        self.last_seq.load(Ordering::Acquire)
    }

    pub(crate) fn last_ask(&self) -> u64 {
        self.last_ask.load(Ordering::Acquire)
    }

    fn lock_writer(&self) -> Result<std::sync::MutexGuard<'_, IndexWriter>, StoreError> {
        self.writer.lock().map_err(|_| StoreError::Index("writer poisoned".into()))
    }

    /// Commits what the writer holds with the given high-water marks as payload.
    fn commit(&self, w: &mut IndexWriter, last_seq: u64, last_ask: u64) -> Result<(), StoreError> {
        let mut commit = w.prepare_commit()?;
        let payload = Payload { last_seq, last_ask };
        commit.set_payload(&serde_json::to_string(&payload).unwrap_or_default());
        commit.commit()?;
        self.last_seq.store(last_seq, Ordering::Release);
        self.last_ask.store(last_ask, Ordering::Release);
        self.reader.reload()?;
        Ok(())
    }

    /// Adds runs (in sequence order, all after `last_seq`) and commits them with the new
    /// last sequence as payload.
    pub(crate) fn add(&self, docs: &[RunDoc]) -> Result<(), StoreError> {
        let Some(last) = docs.last().map(|d| d.seq) else { return Ok(()) };
        let f = &self.fields;
        let mut w = self.lock_writer()?;
        for d in docs {
            let mut doc = doc!(
                f.kind => HitKind::Run.name(),
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
        self.commit(&mut w, last, self.last_ask())
    }

    /// Adds new asks (`Put::New`: those after the last indexed one; documents loaded
    /// before another caller indexed them are dropped, so a stale copy never replaces a
    /// newer one) or replaces indexed ones (`Put::Replace`: an ask accepted since, its
    /// earlier document removed first; the last indexed ask stays where it is).
    pub(crate) fn put_asks(&self, docs: &[AskDoc], put: Put) -> Result<(), StoreError> {
        let f = &self.fields;
        let mut w = self.lock_writer()?;
        let mut last = self.last_ask();
        let docs: Vec<&AskDoc> = match put {
            Put::New => docs.iter().filter(|d| d.seq > last).collect(),
            Put::Replace => docs.iter().collect(),
        };
        if docs.is_empty() {
            return Ok(());
        }
        for d in docs {
            w.delete_term(Term::from_field_text(f.run_id, &d.ask_id));
            w.add_document(doc!(
                f.kind => HitKind::Ask.name(),
                f.seq => d.seq,
                f.run_id => d.ask_id.clone(),
                f.tenant => d.tenant.clone().unwrap_or_else(|| NO_TENANT.to_string()),
                f.accepted => if d.accepted { "yes" } else { "no" },
                f.topic => d.topic.clone(),
                f.text => d.text.clone(),
            ))?;
            if put == Put::New {
                last = last.max(d.seq);
            }
        }
        self.commit(&mut w, self.last_seq(), last)
    }

    /// Removes every document (and commits the empty index with sequence 0).
    pub(crate) fn clear(&self) -> Result<(), StoreError> {
        let mut w = self.lock_writer()?;
        w.delete_all_documents()?;
        self.commit(&mut w, 0, 0)
    }

    /// The accepted asks visible to `tenant` whose question and columns share the most
    /// words with `topic` (BM25), best first. The words are taken as terms, never parsed
    /// as a query: a question is not query syntax.
    pub(crate) fn similar_asks(
        &self,
        topic: &str,
        tenant: Option<&str>,
        limit: usize,
    ) -> Result<Vec<Similar>, StoreError> {
        let f = &self.fields;
        let mut words: Vec<String> = topic
            .split(|c: char| !c.is_alphanumeric())
            .filter(|w| !w.is_empty() && w.len() <= 40)
            .map(str::to_lowercase)
            .collect();
        words.sort();
        words.dedup();
        words.truncate(200);
        if words.is_empty() || limit == 0 {
            return Ok(Vec::new());
        }
        let term = |field: Field, text: &str| -> Box<dyn tantivy::query::Query> {
            Box::new(TermQuery::new(
                Term::from_field_text(field, text),
                IndexRecordOption::WithFreqs,
            ))
        };
        let any_word: Vec<(Occur, Box<dyn tantivy::query::Query>)> =
            words.iter().map(|w| (Occur::Should, term(f.topic, w))).collect();
        let mut must = vec![
            (Occur::Must, Box::new(BooleanQuery::new(any_word)) as Box<dyn tantivy::query::Query>),
            (Occur::Must, term(f.kind, HitKind::Ask.name())),
            (Occur::Must, term(f.accepted, "yes")),
        ];
        if let Some(t) = tenant {
            must.push((Occur::Must, term(f.tenant, t)));
        }
        let searcher = self.reader.searcher();
        let top = searcher
            .search(&BooleanQuery::new(must), &TopDocs::with_limit(limit).order_by_score())?;
        let mut out = Vec::with_capacity(top.len());
        for (score, address) in top {
            let doc: TantivyDocument = searcher.doc(address)?;
            let ask_id =
                doc.get_first(f.run_id).and_then(|v| v.as_str()).unwrap_or_default().to_string();
            out.push(Similar { ask_id, score });
        }
        Ok(out)
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
            let kind = match doc.get_first(f.run_id).and_then(|v| v.as_str()) {
                Some(id) if id.starts_with(ASK_ID_PREFIX) => HitKind::Ask,
                _ => HitKind::Run,
            };
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
            hits.push(SearchHit { kind, run_id, seq, score, snippet: text });
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
