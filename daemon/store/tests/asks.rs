//! Asks in the store: written whole with their attempts, read back per tenant, found by
//! search, accepted (by ask or by the run it started) into examples that similar questions
//! retrieve, counted per model and day, and indexed again after a re-open or a reindex.

use xpu_store::{Accepted, AskAttemptRecord, AskRecord, HitKind, Scope, Store};

const DAY: i64 = 86_400_000_000;

fn attempt(n: u32, failed_at: Option<&str>, codes: &[&str]) -> AskAttemptRecord {
    AskAttemptRecord {
        n,
        model: "tiny".into(),
        prompt_digest: "d1".into(),
        prompt_tokens: 100,
        completion_tokens: 20,
        latency_ms: 5,
        failed_at: failed_at.map(str::to_string),
        codes: codes.iter().map(|c| c.to_string()).collect(),
        finish_reason: "stop".into(),
    }
}

fn ask(
    id: &str,
    tenant: Option<&str>,
    question: &str,
    attempts: Vec<AskAttemptRecord>,
) -> AskRecord {
    let answered = attempts.last().is_some_and(|a| a.failed_at.is_none());
    AskRecord {
        ask_id: id.into(),
        tenant: tenant.map(str::to_string),
        question: question.into(),
        model: "tiny".into(),
        endpoint: "http://127.0.0.1:1/v1".into(),
        policy_name: None,
        data: vec!["sales.csv".into()],
        schema_text: "sales.csv: region text, amount double".into(),
        prompt_digest: "d1".into(),
        outcome: if answered { "accepted" } else { "out_of_attempts" }.into(),
        program: answered.then(|| "t = read_csv(\"sales.csv\")\nprint(t)\n".to_string()),
        error: (!answered).then(|| "3 attempts, none passed".to_string()),
        attempts,
        elapsed_ms: 40,
        run_id: answered.then(|| format!("run{id}")),
        created_us: 1_700_000_000_000_000,
        finished_us: 1_700_000_000_100_000,
        answer: serde_json::json!({"question": question}),
    }
}

#[test]
fn asks_are_stored_searched_accepted_and_counted() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path()).unwrap();
    let a1 = ask("ask-1", Some("acme"), "total amount per region", vec![attempt(1, None, &[])]);
    let a2 = ask(
        "ask-2",
        Some("acme"),
        "the largest sale in each region",
        vec![attempt(1, Some("check"), &["E0201", "E0202"]), attempt(2, None, &[])],
    );
    let mut a3 =
        ask("ask-3", Some("other"), "count the rows", vec![attempt(1, Some("parse"), &["E0001"])]);
    a3.created_us += DAY;
    let refused = AskRecord { ask_id: "run-looking".into(), ..a1.clone() };
    assert!(store.record_ask(&refused).is_err(), "an ask's id starts with ask-");
    for a in [&a1, &a2, &a3] {
        store.record_ask(a).unwrap();
    }

    // Read back whole, per tenant.
    let got = store.ask("ask-2", Scope::Tenant("acme")).unwrap().expect("stored");
    assert_eq!(got.record, a2);
    assert!(!got.accepted);
    assert!(store.ask("ask-2", Scope::Tenant("other")).unwrap().is_none(), "another tenant's");
    let listed: Vec<String> =
        store.asks(Scope::All, None, 10).unwrap().into_iter().map(|a| a.record.ask_id).collect();
    assert_eq!(listed, ["ask-3", "ask-2", "ask-1"]);
    let page = store.asks(Scope::All, Some(3), 1).unwrap();
    assert_eq!(page[0].record.ask_id, "ask-2");

    // Search finds asks (and says so); tenants stay apart.
    let hits = store.search("largest region", Scope::Tenant("acme"), 10).unwrap();
    assert_eq!(hits.len(), 1, "{hits:?}");
    assert_eq!((hits[0].kind, hits[0].run_id.as_str()), (HitKind::Ask, "ask-2"));
    assert!(store.search("count rows", Scope::Tenant("acme"), 10).unwrap().is_empty());
    assert_eq!(store.search("kind:ask", Scope::All, 10).unwrap().len(), 3);

    // Nothing is an example until accepted.
    let topic = "amount by region\nsales.csv: region text, amount double";
    assert!(store.ask_examples(topic, Scope::Tenant("acme"), 3).unwrap().is_empty());
    assert_eq!(
        store.accept_ask("ask-3", Scope::Tenant("other")).unwrap(),
        Accepted::NoProgram { ask_id: "ask-3".into(), outcome: "out_of_attempts".into() }
    );
    assert_eq!(store.accept_ask("ask-1", Scope::Tenant("other")).unwrap(), Accepted::NotFound);
    assert_eq!(
        store.accept_ask("ask-1", Scope::Tenant("acme")).unwrap(),
        Accepted::Now { ask_id: "ask-1".into(), newly: true }
    );
    // By the run it started; twice is not an error.
    assert_eq!(
        store.accept_ask("runask-2", Scope::All).unwrap(),
        Accepted::Now { ask_id: "ask-2".into(), newly: true }
    );
    assert_eq!(
        store.accept_ask("ask-2", Scope::All).unwrap(),
        Accepted::Now { ask_id: "ask-2".into(), newly: false }
    );
    let examples = store.ask_examples(topic, Scope::Tenant("acme"), 3).unwrap();
    let ids: Vec<&str> = examples.iter().map(|e| e.ask_id.as_str()).collect();
    assert_eq!(ids, ["ask-1", "ask-2"], "the closer question first");
    assert!(examples[0].program.contains("read_csv"));
    assert!(store.ask_examples(topic, Scope::Tenant("other"), 3).unwrap().is_empty());
    assert!(store.ask_examples("", Scope::All, 3).unwrap().is_empty());
    assert!(store.ask_examples(topic, Scope::All, 0).unwrap().is_empty(), "examples = 0");
    let accepted_us = store.ask("ask-1", Scope::All).unwrap().unwrap().accepted_us.unwrap();
    let now_us =
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_micros()
            as i64;
    assert!((now_us - accepted_us).abs() < 60_000_000, "accepted_at is UTC: {accepted_us}");
    // Query syntax in a question is only words.
    assert!(store.ask_examples("region:( \"amount AND", Scope::All, 3).is_ok());

    // Per model and day: first-attempt shares, answers after feedback.
    let stats = store.ask_stats(Scope::All, None).unwrap();
    assert_eq!(stats.len(), 2, "{stats:?}");
    let first = &stats[0];
    assert_eq!((first.model.as_str(), first.asks), ("tiny", 2));
    assert_eq!(first.day, "2023-11-14");
    assert_eq!(
        (first.first_parse, first.first_check, first.first_run),
        (Some(1.0), Some(0.5), Some(0.5))
    );
    assert_eq!(first.answered, 1.0);
    assert_eq!(first.attempts_per_answer, Some(1.5));
    assert_eq!(first.tokens_per_answer, Some(180.0));
    let second = &stats[1];
    assert_eq!(
        (second.first_parse, second.answered, second.attempts_per_answer),
        (Some(0.0), 0.0, None)
    );
    let acme = store.ask_stats(Scope::Tenant("acme"), Some(a1.created_us + 1)).unwrap();
    assert!(acme.is_empty(), "{acme:?}");

    // Re-opened and re-indexed: accepted asks stay examples, no duplicates.
    drop(store);
    let store = Store::open(dir.path()).unwrap();
    assert_eq!(store.search("kind:ask", Scope::All, 10).unwrap().len(), 3);
    store.reindex().unwrap();
    assert_eq!(store.search("kind:ask", Scope::All, 10).unwrap().len(), 3);
    assert_eq!(store.ask_examples(topic, Scope::All, 5).unwrap().len(), 2);
}
