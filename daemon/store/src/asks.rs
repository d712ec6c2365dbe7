//! Asks: each question put to a model through `xpuctl ask` or `POST /v1/asks`, with every
//! attempt, kept so that `explain` can show the conversation, `search` finds it, accepted
//! answers become examples for later prompts, and `ask stats` measures the loop. An ask is
//! written in its own transaction when it ends (asks are few and slow: seconds of a model's
//! time each), then indexed at once; the index catches up at open after a crash between
//! the two.

use duckdb::types::Value as DuckValue;
use duckdb::{Connection, params};
use serde::{Deserialize, Serialize};

use crate::index::{ASK_ID_PREFIX, AskDoc, Put};
use crate::{Scope, Store, StoreError, micros, opt_text, poisoned, scope_tenant};

/// An ask as the daemon hands it to the store when it ends.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct AskRecord {
    /// `ask-` and a ULID.
    pub ask_id: String,
    pub tenant: Option<String>,
    pub question: String,
    pub model: String,
    /// Without credentials (user info, query).
    pub endpoint: String,
    pub policy_name: Option<String>,
    /// The data files' paths, as the question named them.
    pub data: Vec<String>,
    /// The data's columns as the prompt gave them (`file: name type, …` per line).
    pub schema_text: String,
    pub prompt_digest: String,
    /// accepted | out_of_attempts | out_of_tokens | out_of_time | endpoint_failed
    pub outcome: String,
    pub program: Option<String>,
    pub error: Option<String>,
    pub attempts: Vec<AskAttemptRecord>,
    pub elapsed_ms: u64,
    /// The run the ask started (`--run`).
    pub run_id: Option<String>,
    /// Microseconds since the Unix epoch.
    pub created_us: i64,
    pub finished_us: i64,
    /// The whole conversation as the assistant recorded it (JSON), for `explain`.
    pub answer: serde_json::Value,
}

/// One attempt's figures.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct AskAttemptRecord {
    pub n: u32,
    pub model: String,
    pub prompt_digest: String,
    pub prompt_tokens: u64,
    pub completion_tokens: u64,
    pub latency_ms: u64,
    /// parse | check | dry_run; `None`: the attempt passed.
    pub failed_at: Option<String>,
    pub codes: Vec<String>,
    pub finish_reason: String,
}

/// A stored ask.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct StoredAsk {
    pub seq: u64,
    pub record: AskRecord,
    /// Whether it is an example for later prompts.
    pub accepted: bool,
    pub accepted_us: Option<i64>,
}

/// What accepting an ask did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Accepted {
    /// It is an example now (`false`: it already was).
    Now { ask_id: String, newly: bool },
    /// No such ask (or run started by one) visible to the caller.
    NotFound,
    /// The ask ended without a program: there is nothing to learn from.
    NoProgram { ask_id: String, outcome: String },
}

/// An accepted ask similar to a new question.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct AskExample {
    pub ask_id: String,
    pub question: String,
    pub program: String,
    pub score: f32,
}

/// The loop's figures for one model on one day (UTC).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct AskStatsRow {
    pub model: String,
    /// `YYYY-MM-DD`.
    pub day: String,
    pub asks: u64,
    /// Shares of asks whose first attempt parsed, checked, and passed the dry run (`None`
    /// when no ask got a first reply).
    pub first_parse: Option<f64>,
    pub first_check: Option<f64>,
    pub first_run: Option<f64>,
    /// Share of asks that ended with a program (after feedback).
    pub answered: f64,
    /// Means over the asks that ended with a program.
    pub attempts_per_answer: Option<f64>,
    pub tokens_per_answer: Option<f64>,
}

impl AskRecord {
    fn tokens(&self) -> (u64, u64) {
        self.attempts
            .iter()
            .fold((0, 0), |(p, c), a| (p + a.prompt_tokens, c + a.completion_tokens))
    }
}

impl Store {
    /// Stores an ended ask and indexes it; returns its sequence number.
    pub fn record_ask(&self, ask: &AskRecord) -> Result<u64, StoreError> {
        if !ask.ask_id.starts_with(ASK_ID_PREFIX) {
            return Err(StoreError::Query(format!(
                "an ask's id starts with `{ASK_ID_PREFIX}`: {}",
                ask.ask_id
            )));
        }
        let seq = {
            let mut conn = self.shared.writer.lock().map_err(|_| poisoned("writer"))?;
            write_ask(&mut conn, ask)?
        };
        // Stored: an index that fails now catches up at the next `index_pending`.
        if let Err(e) = self.index_pending_asks() {
            tracing::warn!("ask {}: stored, not indexed yet: {e}", ask.ask_id);
        }
        Ok(seq)
    }

    /// The ask, if it exists and `scope` may see it.
    pub fn ask(&self, ask_id: &str, scope: Scope<'_>) -> Result<Option<StoredAsk>, StoreError> {
        self.with_reader(|c| {
            let tenant = scope_tenant(scope);
            let sql = format!("{ASK_SELECT} WHERE ask_id = ? AND (? IS NULL OR tenant = ?)");
            let mut stmt = c.prepare(&sql)?;
            let mut rows = stmt.query(params![ask_id, tenant, tenant])?;
            let Some(row) = rows.next()? else { return Ok(None) };
            let mut ask = read_ask(row)?;
            ask.record.attempts = read_attempts(c, ask_id)?;
            Ok(Some(ask))
        })
    }

    /// Asks newest first (`before`: a sequence number from the previous page).
    pub fn asks(
        &self,
        scope: Scope<'_>,
        before: Option<u64>,
        limit: usize,
    ) -> Result<Vec<StoredAsk>, StoreError> {
        self.with_reader(|c| {
            let tenant = scope_tenant(scope);
            let sql = format!(
                "{ASK_SELECT} WHERE (? IS NULL OR tenant = ?) AND (? IS NULL OR seq < ?) \
                 ORDER BY seq DESC LIMIT ?"
            );
            let before = before.map(|b| b as i64);
            let limit = limit.clamp(1, 1000) as i64;
            let mut stmt = c.prepare(&sql)?;
            let rows = stmt.query_map(params![tenant, tenant, before, before, limit], read_ask)?;
            Ok(rows.collect::<Result<Vec<_>, _>>()?)
        })
    }

    /// Makes an ask an example for later prompts: by its id, or by the id of the run it
    /// started (a run the user marks good).
    pub fn accept_ask(&self, id: &str, scope: Scope<'_>) -> Result<Accepted, StoreError> {
        let tenant = scope_tenant(scope);
        let found: Option<(String, String, bool, Option<String>)> = self.with_reader(|c| {
            let mut stmt = c.prepare(
                "SELECT ask_id, outcome, accepted, program FROM asks \
                 WHERE (ask_id = ? OR run_id = ?) AND (? IS NULL OR tenant = ?) \
                 ORDER BY seq DESC LIMIT 1",
            )?;
            let mut rows = stmt.query(params![id, id, tenant, tenant])?;
            Ok(match rows.next()? {
                Some(r) => Some((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?)),
                None => None,
            })
        })?;
        let Some((ask_id, outcome, accepted, program)) = found else {
            return Ok(Accepted::NotFound);
        };
        if program.is_none() {
            return Ok(Accepted::NoProgram { ask_id, outcome });
        }
        if accepted {
            // Indexed again: an earlier accept may have failed after its update.
            let docs = self.with_reader(|c| load_ask_docs(c, "ask_id = ?", &ask_id))?;
            self.shared.index.put_asks(&docs, Put::Replace)?;
            return Ok(Accepted::Now { ask_id, newly: false });
        }
        {
            let conn = self.shared.writer.lock().map_err(|_| poisoned("writer"))?;
            // The time from here, in UTC like every other stored time (DuckDB's
            // current_timestamp would be cast to a TIMESTAMP in the host's zone).
            let now = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_micros() as i64);
            conn.execute(
                "UPDATE asks SET accepted = true, accepted_at = ? WHERE ask_id = ?",
                params![micros(now), ask_id],
            )?;
        }
        // Indexed first (as it stands now, accepted), so an indexer that loaded it before
        // cannot put the stale copy back; then replaced, in case it was indexed before.
        self.index_pending_asks()?;
        let docs = self.with_reader(|c| load_ask_docs(c, "ask_id = ?", &ask_id))?;
        self.shared.index.put_asks(&docs, Put::Replace)?;
        Ok(Accepted::Now { ask_id, newly: true })
    }

    /// Up to `limit` accepted asks visible to `scope` most like a question over data with
    /// these columns (`topic`: the question and the schema text), best first.
    pub fn ask_examples(
        &self,
        topic: &str,
        scope: Scope<'_>,
        limit: usize,
    ) -> Result<Vec<AskExample>, StoreError> {
        let similar = self.shared.index.similar_asks(topic, scope_tenant(scope), limit)?;
        let mut out = Vec::with_capacity(similar.len());
        for s in similar {
            let Some(ask) = self.ask(&s.ask_id, scope)? else { continue };
            if let Some(program) = ask.record.program {
                out.push(AskExample {
                    ask_id: s.ask_id,
                    question: ask.record.question,
                    program,
                    score: s.score,
                });
            }
        }
        Ok(out)
    }

    /// The loop's figures per model and day, oldest day first; `since_us`: only asks
    /// created then or later.
    pub fn ask_stats(
        &self,
        scope: Scope<'_>,
        since_us: Option<i64>,
    ) -> Result<Vec<AskStatsRow>, StoreError> {
        self.with_reader(|c| {
            let tenant = scope_tenant(scope);
            let since = since_us.map(micros).unwrap_or(DuckValue::Null);
            let mut stmt = c.prepare(STATS_SQL)?;
            let rows = stmt.query_map(params![tenant, tenant, since, since], |r| {
                Ok(AskStatsRow {
                    model: r.get(0)?,
                    day: r.get(1)?,
                    asks: r.get::<_, i64>(2)? as u64,
                    first_parse: r.get(3)?,
                    first_check: r.get(4)?,
                    first_run: r.get(5)?,
                    answered: r.get(6)?,
                    attempts_per_answer: r.get(7)?,
                    tokens_per_answer: r.get(8)?,
                })
            })?;
            Ok(rows.collect::<Result<Vec<_>, _>>()?)
        })
    }

    /// Indexes every stored ask the search index does not hold yet; returns how many.
    pub(crate) fn index_pending_asks(&self) -> Result<usize, StoreError> {
        let after = self.shared.index.last_ask();
        let docs = self.with_reader(|c| load_ask_docs(c, "seq > ?", &(after as i64)))?;
        self.shared.index.put_asks(&docs, Put::New)?;
        Ok(docs.len())
    }
}

/// Per model and day, over the asks that reached the model (a `failed` ask ended before
/// it: unreadable data, a broken ask): the first attempt's stage (`failed_at` NULL: it passed; no first
/// attempt: the endpoint failed before replying, counted in none of the first-attempt
/// shares) and the means over answered asks.
const STATS_SQL: &str = "
SELECT a.model,
       strftime(a.created_at, '%Y-%m-%d') AS day,
       count(*) AS asks,
       avg(CASE WHEN f.ask_id IS NULL THEN NULL WHEN f.failed_at = 'parse' THEN 0.0 ELSE 1.0 END),
       avg(CASE WHEN f.ask_id IS NULL THEN NULL
                WHEN f.failed_at IN ('parse', 'check') THEN 0.0 ELSE 1.0 END),
       avg(CASE WHEN f.ask_id IS NULL THEN NULL WHEN f.failed_at IS NULL THEN 1.0 ELSE 0.0 END),
       avg(CASE WHEN a.program IS NOT NULL THEN 1.0 ELSE 0.0 END),
       avg(a.attempts::DOUBLE) FILTER (WHERE a.program IS NOT NULL),
       avg((a.prompt_tokens + a.completion_tokens)::DOUBLE) FILTER (WHERE a.program IS NOT NULL)
FROM asks a LEFT JOIN ask_attempts f ON f.ask_id = a.ask_id AND f.n = 1
WHERE (? IS NULL OR a.tenant = ?) AND (? IS NULL OR a.created_at >= ?)
  AND a.outcome <> 'failed'
GROUP BY a.model, day
ORDER BY day, a.model";

const ASK_SELECT: &str = "SELECT seq, ask_id, tenant, question, model, endpoint, policy_name, \
    data, schema_text, prompt_digest, outcome, program, error, elapsed_ms, run_id, \
    epoch_us(created_at), epoch_us(finished_at), accepted, epoch_us(accepted_at), answer FROM asks";

fn read_ask(r: &duckdb::Row<'_>) -> duckdb::Result<StoredAsk> {
    let data: String = r.get(7)?;
    let answer: String = r.get(19)?;
    Ok(StoredAsk {
        seq: r.get::<_, i64>(0)? as u64,
        record: AskRecord {
            ask_id: r.get(1)?,
            tenant: r.get(2)?,
            question: r.get(3)?,
            model: r.get(4)?,
            endpoint: r.get(5)?,
            policy_name: r.get(6)?,
            data: serde_json::from_str(&data).unwrap_or_default(),
            schema_text: r.get(8)?,
            prompt_digest: r.get(9)?,
            outcome: r.get(10)?,
            program: r.get(11)?,
            error: r.get(12)?,
            attempts: Vec::new(),
            elapsed_ms: r.get::<_, i64>(13)? as u64,
            run_id: r.get(14)?,
            created_us: r.get(15)?,
            finished_us: r.get(16)?,
            answer: serde_json::from_str(&answer).unwrap_or(serde_json::Value::Null),
        },
        accepted: r.get(17)?,
        accepted_us: r.get(18)?,
    })
}

fn read_attempts(c: &Connection, ask_id: &str) -> Result<Vec<AskAttemptRecord>, StoreError> {
    let mut stmt = c.prepare(
        "SELECT n, model, prompt_digest, prompt_tokens, completion_tokens, latency_ms, \
         failed_at, codes, finish_reason FROM ask_attempts WHERE ask_id = ? ORDER BY n",
    )?;
    let rows = stmt.query_map(params![ask_id], |r| {
        let codes: String = r.get(7)?;
        Ok(AskAttemptRecord {
            n: r.get::<_, i64>(0)? as u32,
            model: r.get(1)?,
            prompt_digest: r.get(2)?,
            prompt_tokens: r.get::<_, i64>(3)? as u64,
            completion_tokens: r.get::<_, i64>(4)? as u64,
            latency_ms: r.get::<_, i64>(5)? as u64,
            failed_at: r.get(6)?,
            codes: codes.split(',').filter(|c| !c.is_empty()).map(str::to_string).collect(),
            finish_reason: r.get(8)?,
        })
    })?;
    Ok(rows.collect::<Result<Vec<_>, _>>()?)
}

/// Writes an ask and its attempts in one transaction; returns its sequence number.
fn write_ask(conn: &mut Connection, a: &AskRecord) -> Result<u64, StoreError> {
    let tx = conn.transaction()?;
    let seq: i64 = tx.query_row("SELECT coalesce(max(seq), 0) + 1 FROM asks", [], |r| r.get(0))?;
    let (prompt_tokens, completion_tokens) = a.tokens();
    tx.execute(
        "INSERT INTO asks (seq, ask_id, tenant, question, model, endpoint, policy_name, data, \
         schema_text, prompt_digest, outcome, program, error, attempts, prompt_tokens, \
         completion_tokens, elapsed_ms, run_id, created_at, finished_at, answer) \
         VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
        params![
            seq,
            a.ask_id,
            opt_text(a.tenant.as_deref()),
            a.question,
            a.model,
            a.endpoint,
            opt_text(a.policy_name.as_deref()),
            to_json(&a.data),
            a.schema_text,
            a.prompt_digest,
            a.outcome,
            opt_text(a.program.as_deref()),
            opt_text(a.error.as_deref()),
            a.attempts.len() as i64,
            prompt_tokens as i64,
            completion_tokens as i64,
            a.elapsed_ms as i64,
            opt_text(a.run_id.as_deref()),
            micros(a.created_us),
            micros(a.finished_us),
            to_json(&a.answer),
        ],
    )?;
    for t in &a.attempts {
        tx.execute(
            "INSERT INTO ask_attempts (ask_id, n, model, prompt_digest, prompt_tokens, \
             completion_tokens, latency_ms, failed_at, codes, finish_reason) \
             VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            params![
                a.ask_id,
                t.n as i64,
                t.model,
                t.prompt_digest,
                t.prompt_tokens as i64,
                t.completion_tokens as i64,
                t.latency_ms as i64,
                opt_text(t.failed_at.as_deref()),
                t.codes.join(","),
                t.finish_reason,
            ],
        )?;
    }
    tx.commit()?;
    Ok(seq as u64)
}

/// The text of a JSON-typed column.
fn to_json<T: Serialize>(v: &T) -> String {
    serde_json::to_string(v).unwrap_or_else(|_| "null".into())
}

/// The index documents of the asks matching `filter` (one `?`, bound to `arg`), in
/// sequence order.
fn load_ask_docs(
    c: &Connection,
    filter: &str,
    arg: &dyn duckdb::ToSql,
) -> Result<Vec<AskDoc>, StoreError> {
    let sql = format!(
        "SELECT seq, ask_id, tenant, accepted, question, schema_text, model, outcome, \
         coalesce(program, ''), coalesce(error, ''), data FROM asks WHERE {filter} ORDER BY seq"
    );
    let mut stmt = c.prepare(&sql)?;
    let rows = stmt.query_map([arg], |r| {
        let question: String = r.get(4)?;
        let schema: String = r.get(5)?;
        let (model, outcome, program, error, data): (String, String, String, String, String) =
            (r.get(6)?, r.get(7)?, r.get(8)?, r.get(9)?, r.get(10)?);
        let ask_id: String = r.get(1)?;
        let mut text = vec![
            format!("ask {ask_id}"),
            format!("question {question}"),
            format!("model {model}"),
            format!("outcome {outcome}"),
            format!("data {data}"),
            schema.clone(),
            program,
        ];
        if !error.is_empty() {
            text.push(format!("error {error}"));
        }
        Ok(AskDoc {
            seq: r.get::<_, i64>(0)? as u64,
            ask_id,
            tenant: r.get(2)?,
            accepted: r.get(3)?,
            topic: format!("{question}\n{schema}"),
            text: text.join("\n"),
        })
    })?;
    Ok(rows.collect::<Result<Vec<_>, _>>()?)
}
