//! The ledger's writer on a real PostgreSQL server (a cluster of its own per test): what it
//! writes reads back as what the same entries write to SQLite, column by column; every row
//! names its instance; migrations apply once when two instances start together; and after the
//! server restarts, the writer writes again on a new connection, with what it could not write
//! counted.

use std::sync::atomic::Ordering;
use std::time::{Duration, SystemTime};

use rusqlite::types::Value;
use switchyard_record::RequestRecord;
use tokio_postgres::types::Type;
use tokio_postgres::NoTls;

use super::cluster::Cluster;
use super::{Connect, PgStore};
use crate::ledger::batch::Entry;
use crate::ledger::detections::Detection;
use crate::ledger::rows::{ComparisonRow, ConfigChange, EngineAction, IdentitySnapshot, Row};
use crate::ledger::tests::{config, skipped, varied_record};
use crate::ledger::writer::tests::varied_pairs;
use crate::ledger::writer::{Store, Writer};
use crate::ledger::{open, open_read_only, read_comparisons, Ledger};

/// Runs `f` with a client of `url`'s database, on a runtime of its own.
/// How to reach the test's server, as `instance`.
fn connect(url: &str, instance: &str) -> Connect {
    Connect {
        url: url.to_owned(),
        password: None,
        ca_file: None,
        instance: instance.to_owned(),
    }
}

fn with_client<T>(url: &str, f: impl AsyncFnOnce(&tokio_postgres::Client) -> T) -> T {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let (client, connection) = tokio_postgres::connect(url, NoTls).await.unwrap();
        #[allow(clippy::disallowed_methods)] // ends with the connection, at the end of the test
        tokio::spawn(connection);
        f(&client).await
    })
}

/// The one number `sql` selects from `url`'s database.
fn number(url: &str, sql: &str) -> i64 {
    with_client(url, async |client| {
        client.query_one(sql, &[]).await.unwrap().get(0)
    })
}

/// `table`'s rows in id order, as SQLite's values, without the id: `columns` of them.
fn pg_rows(url: &str, table: &str, columns: &[String]) -> Vec<Vec<Value>> {
    let sql = format!("SELECT {} FROM {table} ORDER BY 1", select_list(columns));
    with_client(url, async |client| {
        client
            .query(&sql, &[])
            .await
            .unwrap()
            .iter()
            .map(|row| {
                (1..row.len())
                    .map(|i| match *row.columns()[i].type_() {
                        Type::INT8 => row
                            .get::<_, Option<i64>>(i)
                            .map_or(Value::Null, Value::Integer),
                        Type::FLOAT8 => row
                            .get::<_, Option<f64>>(i)
                            .map_or(Value::Null, Value::Real),
                        Type::TEXT => row
                            .get::<_, Option<String>>(i)
                            .map_or(Value::Null, Value::Text),
                        ref other => panic!("column {i} of {table}: type {other}"),
                    })
                    .collect()
            })
            .collect()
    })
}

/// `table`'s rows in id order from SQLite, without the id, and its columns.
fn sqlite_rows(path: &std::path::Path, table: &str) -> (Vec<String>, Vec<Vec<Value>>) {
    let conn = open_read_only(path).unwrap();
    let mut select = conn
        .prepare(&format!("SELECT * FROM {table} ORDER BY 1"))
        .unwrap();
    let columns: Vec<String> = select.column_names().map(str::to_owned).collect();
    let rows = select
        .query_map([], |row| (1..columns.len()).map(|c| row.get(c)).collect())
        .unwrap()
        .collect::<Result<_, _>>()
        .unwrap();
    (columns, rows)
}

/// `ORDER BY 1` then orders by the table's first column, its id (or `run_id`).
fn select_list(columns: &[String]) -> String {
    columns.join(", ")
}

/// One entry of each kind, and a run of skips: what a batch may hold.
fn every_kind_of_entry() -> (
    Vec<Entry>,
    Vec<(i64, crate::ledger::skips::SkippedShadow, i64)>,
) {
    let at = SystemTime::UNIX_EPOCH + Duration::from_millis(5_000);
    let mut entries: Vec<Entry> = (0..7)
        .map(|i| Entry::Request(Box::new(Row::from_record(&varied_record(i)))))
        .collect();
    let mut nul = RequestRecord::new(
        "req-nul".into(),
        http::Method::POST,
        "/v1/chat/completions".into(),
        std::time::Instant::now(),
    );
    nul.model = Some("a\0b".into());
    entries.push(Entry::Request(Box::new(Row::from_record(&nul))));
    entries.extend(varied_pairs().into_iter().map(|pair| {
        Entry::Comparison(Box::new(ComparisonRow {
            ts_ms: 7,
            source: "shadow",
            sampling_json: "{}".to_owned(),
            equivalence: pair
                .equivalence
                .as_ref()
                .map(|j| serde_json::to_string(j).unwrap()),
            pair,
        }))
    }));
    entries.push(Entry::Identity(
        at,
        Box::new(IdentitySnapshot {
            backend: "main".into(),
            health: "ready".into(),
            engine: "llama.cpp/b1".into(),
            artifact: "sha256:aa".into(),
            verification: "verified".into(),
            served_model: Some("m".into()),
            model_path: None,
            slots: Some(4),
            n_ctx: Some(4096),
            chat_template: None,
            note: Some("note".into()),
        }),
    ));
    entries.push(Entry::ConfigChange(
        at,
        Box::new(ConfigChange {
            actor: "admin".into(),
            outcome: "applied",
            digest_before: "sha256:01".into(),
            digest_after: Some("sha256:02".into()),
            summary: "one backend added".into(),
            errors: None,
        }),
    ));
    entries.push(Entry::EngineAction(
        at,
        Box::new(EngineAction {
            backend: "main".into(),
            action: "unload",
            actor: "admin".into(),
            reason: "maintenance".into(),
            state_before: "ready",
            outcome: "unloaded".into(),
        }),
    ));
    entries.push(Entry::Detection(
        at,
        Box::new(Detection {
            backend: "main".into(),
            detector: "slowdown",
            state: "degraded",
            engine: "llama.cpp/b1".into(),
            artifact: "sha256:aa".into(),
            mode: "warn",
            rule: "a rule".into(),
            figures: "{}".into(),
            since_ms: 4_000,
        }),
    ));
    entries.push(Entry::Skipped(9, Box::new(skipped("wl:b", true))));
    (entries, vec![(8, skipped("wl:a", false), 3)])
}

fn writer(store: Store, path: &std::path::Path) -> Writer {
    let (_tx, rx) = tokio::sync::mpsc::channel(1);
    Writer::new(
        store,
        rx,
        Default::default(),
        &config(path.to_path_buf(), None),
    )
}

/// One batch of every kind of entry reads back from PostgreSQL as from SQLite, in every column
/// of every table (text that PostgreSQL cannot hold aside), and each row names its instance.
#[test]
fn a_batch_reads_back_from_postgresql_as_from_sqlite() {
    let cluster = Cluster::start();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("ledger.db");
    let (entries, runs) = every_kind_of_entry();
    writer(Store::sqlite(open(&path).unwrap()), &path)
        .write(&entries, &runs)
        .unwrap();
    let pg = PgStore::connect(&connect(&cluster.url(), "host-a:8080")).unwrap();
    writer(Store::Postgres(Box::new(pg)), &path)
        .write(&entries, &runs)
        .unwrap();
    for table in [
        "requests",
        "comparisons",
        "identities",
        "config_changes",
        "engine_actions",
        "detections",
    ] {
        let (columns, mut expected) = sqlite_rows(&path, table);
        assert!(!expected.is_empty(), "{table}: the batch wrote rows");
        if table == "requests" {
            // PostgreSQL's text holds no NUL: the model name a client sent with one keeps its
            // place with U+FFFD.
            let model = columns.iter().position(|c| c == "model").unwrap() - 1;
            let last = expected.last_mut().unwrap();
            assert_eq!(last[model], Value::Text("a\0b".into()));
            last[model] = Value::Text("a\u{FFFD}b".into());
        }
        assert_eq!(
            pg_rows(&cluster.url(), table, &columns),
            expected,
            "{table}"
        );
        let instances: Vec<String> = with_client(&cluster.url(), async |client| {
            let sql = format!("SELECT DISTINCT instance FROM {table}");
            client
                .query(&sql, &[])
                .await
                .unwrap()
                .iter()
                .map(|r| r.get(0))
                .collect()
        });
        assert_eq!(instances, ["host-a:8080"], "{table}");
    }
    // The comparisons read back as the comparator's pairs, from both stores alike (the
    // shared ledger's in time order, the local one's in row order: compared as sets).
    let mut shared_config = config(path.clone(), None);
    shared_config.url = Some(cluster.url());
    let fleet = crate::ledger::Fleet::new(&shared_config).unwrap().unwrap();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let sorted = |pairs: Vec<switchyard_policy::compare::Pair>| {
        let mut texts: Vec<String> = pairs.iter().map(|p| format!("{p:?}")).collect();
        texts.sort();
        texts
    };
    let shared = runtime.block_on(fleet.comparisons(i64::MIN)).unwrap();
    let local = read_comparisons(&open_read_only(&path).unwrap(), None).unwrap();
    assert!(!local.is_empty());
    assert_eq!(sorted(shared), sorted(local));
}

/// Through the ledger's handle: what is recorded is written, counted, and on the record of the
/// run in `ledger_health`, under its instance.
#[test]
fn recorded_requests_are_written_and_counted() {
    let cluster = Cluster::start();
    let mut config = config("unused".into(), None);
    config.queue = 64;
    let (ledger, writer) =
        Ledger::start_postgres(&cluster.url(), None, "host-b:8080", &config).unwrap();
    for i in 0..50 {
        ledger.record(&varied_record(i));
    }
    let counters = ledger.counters.clone();
    drop(ledger);
    writer.join().unwrap();
    assert_eq!(counters.written.load(Ordering::Relaxed), 50);
    let health: (i64, i64, String) = with_client(&cluster.url(), async |client| {
        let row = client
            .query_one(
                "SELECT written, dropped_full + dropped_failed, instance FROM ledger_health",
                &[],
            )
            .await
            .unwrap();
        (row.get(0), row.get(1), row.get(2))
    });
    let rows = number(&cluster.url(), "SELECT count(*) FROM requests");
    assert_eq!(rows, 50);
    assert_eq!(health, (50, 0, "host-b:8080".to_owned()));
}

/// Two instances starting together on a new database: both start, and each migration is
/// applied once.
#[test]
fn migrations_apply_once_when_two_instances_start_together() {
    let cluster = Cluster::start();
    let url = cluster.url();
    let starts: Vec<_> = ["a", "b"]
        .into_iter()
        .map(|instance| {
            let url = url.clone();
            std::thread::spawn(move || PgStore::connect(&connect(&url, instance)).map(|_| ()))
        })
        .collect();
    for start in starts {
        start.join().unwrap().unwrap();
    }
    let (applied, versions): (i64, i64) = with_client(&url, async |client| {
        let row = client
            .query_one(
                "SELECT count(*), count(DISTINCT version) FROM switchyard_schema",
                &[],
            )
            .await
            .unwrap();
        (row.get(0), row.get(1))
    });
    assert_eq!(applied, versions);
    assert_eq!(applied, super::schema::migrations().len() as i64);
}

/// The server restarts between two batches, the writer idle meanwhile: the first batch after
/// it meets the pooled connection closed before its commit, and is written again on a new
/// connection; nothing is lost, and every later batch is written.
#[test]
fn after_a_server_restart_the_writer_writes_again() {
    let cluster = Cluster::start();
    let dir = tempfile::tempdir().unwrap();
    let pg = PgStore::connect(&connect(&cluster.url(), "host-c")).unwrap();
    let mut writer = writer(Store::Postgres(Box::new(pg)), &dir.path().join("unused"));
    let batch = |from: u32| -> Vec<Entry> {
        (from..from + 10)
            .map(|i| Entry::Request(Box::new(Row::from_record(&varied_record(i)))))
            .collect()
    };
    let (mut written, mut lost) = (0, 0);
    let mut write = |entries: Vec<Entry>| match writer.write(&entries, &[]) {
        Ok(()) => written += entries.len(),
        Err(_) => lost += entries.len(),
    };
    write(batch(0));
    cluster.restart();
    for n in 1..4 {
        write(batch(n * 10));
    }
    assert_eq!(lost, 0, "a batch lost to the restart");
    let rows = number(&cluster.url(), "SELECT count(*) FROM requests");
    assert_eq!(rows as usize, written);
    assert_eq!(written, 40);
}

/// The server stopped under load, then started again: records keep being taken (never a
/// wait), what could not be written is counted as dropped, writing resumes by itself, and the
/// rows plus the counted drops are every record.
#[test]
fn a_server_stopped_for_a_while_costs_only_counted_drops() {
    let cluster = Cluster::start();
    let mut config = config("unused".into(), None);
    config.queue = 64;
    config.batch = 16;
    let (ledger, writer) = Ledger::start_postgres(&cluster.url(), None, "host-d", &config).unwrap();
    // Answered once everything queued before it is written or lost; refused while the queue is
    // full, so asked again until the writer has taken everything.
    let settled = |ledger: &Ledger| {
        let deadline = std::time::Instant::now() + Duration::from_secs(60);
        while !ledger.flush(Duration::from_secs(10)) {
            assert!(
                std::time::Instant::now() < deadline,
                "the writer took the queue"
            );
        }
    };
    let sent = 300;
    for i in 0..100 {
        ledger.record(&varied_record(i));
        if i % 32 == 31 {
            settled(&ledger);
        }
    }
    settled(&ledger);
    cluster.stop();
    for i in 100..200 {
        ledger.record(&varied_record(i));
    }
    settled(&ledger);
    let lost_while_down = ledger.counters.dropped();
    cluster.resume();
    for i in 200..sent {
        ledger.record(&varied_record(i));
        if i % 32 == 31 {
            settled(&ledger);
        }
    }
    let counters = ledger.counters.clone();
    drop(ledger);
    writer.join().unwrap();
    let written = counters.written.load(Ordering::Relaxed);
    assert!(
        lost_while_down > 0,
        "nothing can be written while the server is down"
    );
    assert_eq!(written + counters.dropped(), u64::from(sent));
    let rows = number(&cluster.url(), "SELECT count(*) FROM requests");
    // A record's time is 1,000 ms after the epoch plus its number.
    let after = number(
        &cluster.url(),
        "SELECT count(*) FROM requests WHERE ts_ms >= 1200",
    );
    assert_eq!(rows as u64, written);
    assert!(after > 0, "writing resumed after the restart");
}

/// `[ledger] url`: each record goes to the local SQLite ledger and to the shared one, over
/// TLS verified against the configured CA, with the password read from a file; a wrong
/// password, an unset password variable or an untrusted server stop the start with a message
/// that names the cause and never the password.
#[test]
fn the_shared_ledger_is_written_beside_the_local_one_over_verified_tls() {
    let password = "s3cret-pw";
    let (cluster, ca_pem) = Cluster::start_secured(password);
    let dir = tempfile::tempdir().unwrap();
    let ca_file = dir.path().join("ca.pem");
    std::fs::write(&ca_file, &ca_pem).unwrap();
    let password_file = dir.path().join("password");
    std::fs::write(&password_file, format!("{password}\n")).unwrap();
    let mut config = config(dir.path().join("ledger.db"), None);
    config.queue = 64;
    config.url = Some(format!("{}?sslmode=require", cluster.url()));
    config.password_file = Some(password_file.clone());
    config.ca_file = Some(ca_file.clone());
    config.instance = Some("studio-1:8080".to_owned());

    let (ledger, writers) = Ledger::start(&config).unwrap();
    for i in 0..20 {
        ledger.record(&varied_record(i));
    }
    assert!(ledger.flush(Duration::from_secs(10)));
    let local = ledger.counters.clone();
    let shared = ledger.shared_counters().unwrap().clone();
    drop(ledger);
    writers.join().unwrap();
    assert_eq!(local.written.load(Ordering::Relaxed), 20);
    assert_eq!(shared.written.load(Ordering::Relaxed), 20);
    let local_rows: i64 = open_read_only(&config.path)
        .unwrap()
        .query_row("SELECT count(*) FROM requests", [], |r| r.get(0))
        .unwrap();
    assert_eq!(local_rows, 20);
    let with_password = cluster
        .url()
        .replace("switchyard@", &format!("switchyard:{password}@"));
    let instances: Vec<(String, i64)> = with_client(&with_password, async |client| {
        client
            .query("SELECT instance, count(*) FROM requests GROUP BY 1", &[])
            .await
            .unwrap()
            .iter()
            .map(|r| (r.get(0), r.get(1)))
            .collect()
    });
    assert_eq!(instances, [("studio-1:8080".to_owned(), 20)]);

    let refused = |config: &switchyard_policy::LedgerConfig| {
        let e = Ledger::start(config).expect_err("a start that should be refused");
        let message = format!("{e}: {:?}", std::error::Error::source(&e));
        assert!(!message.contains(password), "{message}");
        message
    };
    let mut wrong = config.clone();
    let wrong_file = dir.path().join("wrong");
    std::fs::write(&wrong_file, "not-it").unwrap();
    wrong.password_file = Some(wrong_file);
    let message = refused(&wrong);
    assert!(
        message.contains("password authentication failed"),
        "{message}"
    );

    let mut unset = config.clone();
    unset.password_file = None;
    unset.password_env = Some("SWITCHYARD_TEST_NO_SUCH_PASSWORD_VARIABLE".to_owned());
    let message = refused(&unset);
    assert!(
        message.contains("SWITCHYARD_TEST_NO_SUCH_PASSWORD_VARIABLE, which is not set"),
        "{message}"
    );

    // Without the CA, the server's certificate is not trusted: no connection, no rows.
    let mut untrusted = config.clone();
    untrusted.ca_file = None;
    let message = refused(&untrusted);
    assert!(message.to_lowercase().contains("certificate"), "{message}");
}

/// A server down when the ledger starts is an outage, not a mistake: the start goes on, the
/// records meanwhile are dropped and counted, and once the server answers the schema is
/// brought forward and writing begins.
#[test]
fn a_server_down_at_start_is_waited_for_not_refused() {
    let cluster = Cluster::start();
    cluster.stop();
    let mut config = config("unused".into(), None);
    config.queue = 64;
    let (ledger, writer) = Ledger::start_postgres(&cluster.url(), None, "host-e", &config)
        .expect("a start while the server is down");
    for i in 0..10 {
        ledger.record(&varied_record(i));
    }
    assert!(ledger.flush(Duration::from_secs(10)));
    assert_eq!(ledger.counters.dropped(), 10);
    cluster.resume();
    for i in 10..30 {
        ledger.record(&varied_record(i));
    }
    assert!(ledger.flush(Duration::from_secs(10)));
    let counters = ledger.counters.clone();
    drop(ledger);
    writer.join().unwrap();
    assert_eq!(counters.written.load(Ordering::Relaxed), 20);
    assert_eq!(number(&cluster.url(), "SELECT count(*) FROM requests"), 20);
}

/// The dashboard's reads of the fleet (`Fleet::phase_stats`, `model_stats`, `latest_requests`)
/// give what the same reads of the local ledger give for the same records, the request rows
/// naming their instance besides.
#[test]
fn the_fleets_dashboard_reads_agree_with_the_local_ones() {
    use crate::ledger::{
        latest_requests, model_stats, phase_stats, Fleet, PhaseFilter, RequestFilter,
    };
    let cluster = Cluster::start();
    let dir = tempfile::tempdir().unwrap();
    let mut config = config(dir.path().join("ledger.db"), None);
    config.url = Some(cluster.url());
    config.instance = Some("studio-1".to_owned());
    config.queue = 64;
    let (ledger, writers) = Ledger::start(&config).unwrap();
    for i in 0..40 {
        ledger.record(&varied_record(i));
    }
    assert!(ledger.flush(Duration::from_secs(10)));
    drop(ledger);
    writers.join().unwrap();

    let every = RequestFilter {
        limit: 100,
        ..RequestFilter::default()
    };
    let conn = open_read_only(&config.path).unwrap();
    let phases = phase_stats(&conn, &PhaseFilter::default()).unwrap();
    let models = model_stats(&conn, 0).unwrap();
    let requests = latest_requests(&conn, &every).unwrap();
    assert!(phases.len() > 1 && models.len() > 1 && requests.len() == 40);

    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let fleet = Fleet::new(&config).unwrap().unwrap();
    let (fleet_phases, fleet_models, fleet_requests) = runtime.block_on(async {
        (
            fleet.phase_stats(&PhaseFilter::default()).await.unwrap(),
            fleet.model_stats(0).await.unwrap(),
            fleet.latest_requests(&every).await.unwrap(),
        )
    });
    assert_eq!(fleet_phases, phases);
    assert_eq!(fleet_models, models);
    let without = |rows: Vec<serde_json::Value>, key: &str| -> Vec<serde_json::Value> {
        rows.into_iter()
            .map(|mut r| {
                r.as_object_mut().unwrap().remove(key);
                r.as_object_mut().unwrap().remove("id");
                r
            })
            .collect()
    };
    assert!(fleet_requests.iter().all(|r| r["instance"] == "studio-1"));
    assert_eq!(
        without(fleet_requests, "instance"),
        without(requests, "instance")
    );
}
