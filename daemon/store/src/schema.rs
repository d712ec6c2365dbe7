//! The store's tables and their migrations. Each migration runs once, in order, inside one
//! transaction with the row that records it in `schema_migrations`; a store written by a
//! newer xpu (a version this build does not know) is refused rather than guessed at.
//! `docs/store.md` documents every column.

use duckdb::Connection;

use crate::StoreError;

/// The migrations, oldest first. Never edit one that has shipped: append a new one.
pub const MIGRATIONS: &[(u32, &str, &str)] = &[
    (
        1,
        "runs, labels, decisions, candidates, transfers, timings, facts, environment",
        r#"
CREATE TABLE runs (
    seq            BIGINT PRIMARY KEY,   -- commit order, 1, 2, …; the search index follows it
    run_id         VARCHAR NOT NULL UNIQUE,
    tenant         VARCHAR,
    status         VARCHAR NOT NULL,     -- succeeded | failed | cancelled | timed_out
    program_name   VARCHAR NOT NULL,
    program_kind   VARCHAR NOT NULL,     -- minilang | sgr | onnx
    program_sha256 VARCHAR NOT NULL,
    program_source VARCHAR,              -- the text of a MiniLang or SGR program
    policy_name    VARCHAR NOT NULL,
    policy_version BIGINT NOT NULL,
    policy_sha256  VARCHAR NOT NULL,
    labels         VARCHAR NOT NULL,     -- JSON object
    graph_hash     VARCHAR,
    inventory      VARCHAR,              -- inventory fingerprint
    submitted_at   TIMESTAMP NOT NULL,
    started_at     TIMESTAMP,
    finished_at    TIMESTAMP NOT NULL,
    queue_us       BIGINT NOT NULL,
    run_us         BIGINT NOT NULL,
    nodes          BIGINT NOT NULL,
    fallbacks      BIGINT NOT NULL,
    error          VARCHAR,
    outputs        VARCHAR NOT NULL,     -- JSON list of {name, dtype, shape, sha256, bytes}
    explanation    VARCHAR               -- the full explanation, JSON
);
CREATE TABLE decisions (
    run_id          VARCHAR NOT NULL,
    node            BIGINT NOT NULL,
    name            VARCHAR,
    op              VARCHAR NOT NULL,
    class           VARCHAR NOT NULL,
    engine          VARCHAR,
    kernel          VARCHAR,
    precision       VARCHAR,
    device          VARCHAR,
    rule            VARCHAR,
    rule_at         VARCHAR,
    precision_from  VARCHAR,
    fallback_from   VARCHAR,
    fallback_code   VARCHAR,
    fallback_detail VARCHAR,
    sentence        VARCHAR NOT NULL
);
CREATE TABLE candidates (
    run_id    VARCHAR NOT NULL,
    node      BIGINT NOT NULL,
    engine    VARCHAR NOT NULL,
    kernel    VARCHAR,
    precision VARCHAR,
    code      VARCHAR NOT NULL,
    detail     VARCHAR NOT NULL,
    policy_key VARCHAR,                -- the policy key behind the rejection
    policy_at  VARCHAR                 -- where it is set (file:line)
);
CREATE TABLE transfers (
    run_id    VARCHAR NOT NULL,
    value     BIGINT NOT NULL,
    direction VARCHAR NOT NULL,
    bytes     BIGINT,
    planned   BOOLEAN NOT NULL       -- true: in the plan; false: what GraphExec really moved
);
CREATE TABLE timings (
    run_id VARCHAR NOT NULL,
    node   BIGINT NOT NULL,
    engine VARCHAR NOT NULL,
    kernel VARCHAR NOT NULL,
    nanos  BIGINT NOT NULL
);
CREATE TABLE facts (
    run_id VARCHAR NOT NULL,
    engine VARCHAR NOT NULL,
    node   BIGINT,
    key    VARCHAR NOT NULL,
    value  VARCHAR NOT NULL
);
CREATE TABLE labels (
    run_id VARCHAR NOT NULL,
    key    VARCHAR NOT NULL,
    value  VARCHAR NOT NULL
);
CREATE TABLE environment (
    run_id VARCHAR NOT NULL,
    key    VARCHAR NOT NULL,
    value  VARCHAR NOT NULL
);
"#,
    ),
    (
        2,
        "evidence: each run's machine fingerprint, each timing's node signature, the evidence view",
        r#"
ALTER TABLE runs ADD COLUMN machine VARCHAR;      -- machine fingerprint: CPU, features, engine versions
ALTER TABLE timings ADD COLUMN signature VARCHAR; -- the node's signature (16 hex digits)
CREATE VIEW evidence AS
SELECT r.machine, t.signature, t.engine, t.kernel,
       count(*)                                   AS samples,
       median(t.nanos::DOUBLE) / 1000.0           AS median_us,
       quantile_cont(t.nanos::DOUBLE, 0.9) / 1000.0 AS p90_us,
       max(r.finished_at)                         AS last_seen
FROM timings t JOIN runs r ON r.run_id = t.run_id
WHERE r.status = 'succeeded' AND r.machine IS NOT NULL AND t.signature IS NOT NULL
GROUP BY r.machine, t.signature, t.engine, t.kernel;
"#,
    ),
    (
        3,
        "asks: each question put to a model, its attempts, and the examples users accepted",
        r#"
CREATE TABLE asks (
    seq               BIGINT PRIMARY KEY,  -- commit order; the search index follows it
    ask_id            VARCHAR NOT NULL UNIQUE,
    tenant            VARCHAR,
    question          VARCHAR NOT NULL,
    model             VARCHAR NOT NULL,
    endpoint          VARCHAR NOT NULL,    -- without credentials (user info, query)
    policy_name       VARCHAR,
    data              VARCHAR NOT NULL,    -- JSON list of the data files' paths
    schema_text       VARCHAR NOT NULL,    -- the data's columns, as the prompt gave them
    prompt_digest     VARCHAR NOT NULL,
    outcome           VARCHAR NOT NULL,    -- accepted | out_of_attempts | out_of_tokens | out_of_time | endpoint_failed | failed
    program           VARCHAR,             -- the accepted program
    error             VARCHAR,
    attempts          BIGINT NOT NULL,
    prompt_tokens     BIGINT NOT NULL,
    completion_tokens BIGINT NOT NULL,
    elapsed_ms        BIGINT NOT NULL,
    run_id            VARCHAR,             -- the run `--run` started
    created_at        TIMESTAMP NOT NULL,
    finished_at       TIMESTAMP NOT NULL,
    accepted          BOOLEAN NOT NULL DEFAULT false, -- an example for later prompts
    accepted_at       TIMESTAMP,
    answer            VARCHAR NOT NULL     -- the whole conversation, JSON
);
CREATE TABLE ask_attempts (
    ask_id            VARCHAR NOT NULL,
    n                 BIGINT NOT NULL,     -- 1, 2, …
    model             VARCHAR NOT NULL,
    prompt_digest     VARCHAR NOT NULL,
    prompt_tokens     BIGINT NOT NULL,
    completion_tokens BIGINT NOT NULL,
    latency_ms        BIGINT NOT NULL,
    failed_at         VARCHAR,             -- parse | check | dry_run; NULL: it passed
    codes             VARCHAR NOT NULL,    -- the findings' codes, comma-separated
    finish_reason     VARCHAR NOT NULL,
    PRIMARY KEY (ask_id, n)
);
"#,
    ),
];

/// The newest schema version this build writes.
pub fn current_version() -> u32 {
    MIGRATIONS.last().map_or(0, |m| m.0)
}

/// Brings the database up to [`current_version`].
pub fn migrate(conn: &mut Connection) -> Result<u32, StoreError> {
    conn.execute_batch(
        "CREATE TABLE IF NOT EXISTS schema_migrations (
            version INTEGER PRIMARY KEY, description VARCHAR NOT NULL,
            applied_at TIMESTAMP NOT NULL DEFAULT current_timestamp)",
    )?;
    let have: u32 =
        conn.query_row("SELECT coalesce(max(version), 0) FROM schema_migrations", [], |r| {
            r.get::<_, i64>(0)
        })? as u32;
    if have > current_version() {
        return Err(StoreError::NewerSchema { found: have, supported: current_version() });
    }
    for (version, description, sql) in MIGRATIONS.iter().filter(|m| m.0 > have) {
        let tx = conn.transaction()?;
        tx.execute_batch(sql)?;
        tx.execute(
            "INSERT INTO schema_migrations (version, description) VALUES (?, ?)",
            duckdb::params![*version as i64, description],
        )?;
        tx.commit()?;
    }
    Ok(current_version())
}
