//! Unit tests of `validate`: every problem reported with its path, and the value checks.

use super::checks::check_url;
use super::*;

fn parse(text: &str) -> Config {
    toml::from_str(text).unwrap()
}

#[test]
fn valid_config_has_no_problems() {
    let config = parse(
        r#"
        [backends.llama]
        engine = "llama.cpp"
        url = "http://127.0.0.1:8081"
        [models.smollm2]
        aliases = ["default"]
        primary = "llama"
    "#,
    );
    assert_eq!(validate(&config), vec![]);
}

#[test]
fn a_backend_at_switchyards_own_listener_is_refused() {
    for (listen, metrics, url, expected) in [
        (
            "127.0.0.1:8080",
            None,
            "http://127.0.0.1:8080",
            Some("backends.self.url"),
        ),
        (
            "127.0.0.1:8080",
            None,
            "http://localhost:8080/",
            Some("backends.self.url"),
        ),
        (
            "0.0.0.0:8080",
            None,
            "http://127.0.0.1:8080",
            Some("backends.self.url"),
        ),
        (
            "[::1]:8080",
            None,
            "http://[::1]:8080",
            Some("backends.self.url"),
        ),
        (
            "127.0.0.1:8080",
            Some("127.0.0.1:9464"),
            "http://127.0.0.1:9464",
            Some("backends.self.url"),
        ),
        ("127.0.0.1:8080", None, "http://127.0.0.1:8081", None),
        ("127.0.0.1:8080", None, "http://10.0.0.2:8080", None),
        ("127.0.0.1:0", None, "http://127.0.0.1:8080", None),
        (
            "127.0.0.1:8080",
            Some("127.0.0.1:8080"),
            "http://127.0.0.1:8081",
            Some("server.metrics_listen"),
        ),
        (
            "0.0.0.0:8080",
            Some("127.0.0.1:8080"),
            "http://127.0.0.1:8081",
            Some("server.metrics_listen"),
        ),
    ] {
        let metrics = metrics.map_or(String::new(), |m| format!("metrics_listen = \"{m}\"\n"));
        let config = parse(&format!(
            "[server]\nlisten = \"{listen}\"\n{metrics}[backends.self]\nengine = \"llama.cpp\"\nurl = \"{url}\"\n[models.m]\nprimary = \"self\"\n"
        ));
        let paths: Vec<String> = validate(&config).into_iter().map(|p| p.path).collect();
        assert_eq!(
            paths,
            expected.into_iter().collect::<Vec<_>>(),
            "{listen} {url}"
        );
    }
}

#[test]
fn shadow_problems_are_reported() {
    let config = parse(
        r#"
        [backends.llama]
        engine = "llama.cpp"
        url = "http://127.0.0.1:8081"
        [models.a]
        primary = "llama"
        shadow = { backend = "llama", sample = 1.5, max_in_flight = 0 }
        [models.b]
        primary = "llama"
        shadow = { backend = "mlx", sample = nan }
    "#,
    );
    let paths: Vec<String> = validate(&config).into_iter().map(|p| p.path).collect();
    assert_eq!(
        paths,
        vec![
            "models.a.shadow.backend",
            "models.a.shadow.sample",
            "models.a.shadow.max_in_flight",
            "models.b.shadow.backend",
            "models.b.shadow.sample",
        ]
    );
}

#[test]
fn every_problem_is_reported_with_its_path() {
    let config = parse(
        r#"
        [server]
        connect_timeout_ms = 0
        workers = 0
        max_connections = 0
        max_in_flight = 0
        [backends.llama]
        engine = "llama.cpp"
        url = "127.0.0.1:8081"
        max_concurrency = 0
        [models.a]
        aliases = ["shared"]
        primary = "llama"
        [models.b]
        aliases = ["shared", "a"]
        primary = "missing"
        fallback = ["llama", "nope", "llama"]
    "#,
    );
    let paths: Vec<String> = validate(&config).into_iter().map(|p| p.path).collect();
    assert_eq!(
        paths,
        vec![
            "server.workers",
            "server.max_connections",
            "server.max_in_flight",
            "server.connect_timeout_ms",
            "backends.llama.url",
            "backends.llama.max_concurrency",
            "models.b.aliases[0]",
            "models.b.aliases[1]",
            "models.b.primary",
            "models.b.fallback[1]",
            "models.b.fallback[2]",
        ]
    );
}

#[test]
fn telemetry_is_checked() {
    let config = parse(
        r#"
        [telemetry]
        otlp_endpoint = "https://collector:4318"
        service_name = ""
        batch_delay_ms = 0
        queue = 0
        [backends.llama]
        engine = "llama.cpp"
        url = "http://127.0.0.1:8081"
        [models.smollm2]
        primary = "llama"
    "#,
    );
    let paths: Vec<String> = validate(&config).into_iter().map(|p| p.path).collect();
    assert_eq!(
        paths,
        vec![
            "telemetry.otlp_endpoint",
            "telemetry.service_name",
            "telemetry.batch_delay_ms",
            "telemetry.queue",
        ]
    );
    assert!(check_otlp_endpoint("http://127.0.0.1:4318").is_ok());
    assert!(check_otlp_endpoint("http://collector:4318/").is_ok());
    assert!(check_otlp_endpoint("http://collector:4318/otlp").is_ok());
    assert!(check_otlp_endpoint("http://collector:4318/v1/traces").is_err());
    assert!(check_otlp_endpoint("http://collector").is_err());
    assert!(check_otlp_endpoint("http://collector:0").is_err());
    assert!(check_otlp_endpoint("http://:4318").is_err());
    assert!(check_otlp_endpoint("http://u:p@collector:4318").is_err());
    assert!(check_otlp_endpoint("http://collector:4318/?x=1").is_err());
    assert!(check_otlp_endpoint("127.0.0.1:4318").is_err());
}

#[test]
fn urls_are_checked() {
    assert!(check_url("http://127.0.0.1:8081").is_ok());
    assert!(check_url("http://localhost:8081/").is_ok());
    assert!(check_url("https://127.0.0.1:8081").is_ok());
    assert!(check_url("http://127.0.0.1").is_err());
    assert!(check_url("http://127.0.0.1:8081/v1").is_ok());
    assert!(check_url("http://127.0.0.1:8081/v1?x").is_err());
    assert!(check_url("http://127.0.0.1:0").is_err());
    assert!(check_url("http://:80").is_err());
}

#[test]
fn an_admin_listener_off_loopback_needs_tokens_and_a_port_of_its_own() {
    let base = r#"
        [backends.llama]
        engine = "llama.cpp"
        url = "http://127.0.0.1:8081"
        [models.smollm2]
        primary = "llama"
    "#;
    let problems = |admin: &str| {
        validate(&parse(&format!("{base}\n[admin]\n{admin}")))
            .into_iter()
            .map(|p| p.to_string())
            .collect::<Vec<_>>()
    };
    assert_eq!(problems(""), Vec::<String>::new());
    assert_eq!(
        problems("listen = \"127.0.0.1:9100\""),
        Vec::<String>::new()
    );
    let open = problems("listen = \"0.0.0.0:9100\"");
    assert_eq!(open.len(), 1, "{open:?}");
    assert!(
        open[0].starts_with("admin.listen: ") && open[0].contains("admin.tokens"),
        "{open:?}"
    );
    assert_eq!(
        problems("listen = \"0.0.0.0:9100\"\ntokens = \"admin-tokens\""),
        Vec::<String>::new()
    );
    let shared = problems("listen = \"127.0.0.1:8080\"");
    assert_eq!(shared.len(), 1, "{shared:?}");
    assert!(shared[0].contains("server.listen"), "{shared:?}");
}

#[test]
fn a_declared_release_names_another_backend_a_plan_and_needs_a_ledger() {
    let base = r#"
        [backends.llama]
        engine = "llama.cpp"
        url = "http://127.0.0.1:8081"
        [backends.mlx]
        engine = "mlx"
        url = "http://127.0.0.1:8082"
    "#;
    let problems = |release: &str, ledger: bool| {
        let ledger = if ledger {
            "[ledger]\npath = \"l.db\"\n"
        } else {
            ""
        };
        validate(&parse(&format!(
            "{base}\n{ledger}[models.smollm2]\nprimary = \"llama\"\nrelease = {release}\n"
        )))
        .into_iter()
        .map(|p| p.path)
        .collect::<Vec<_>>()
    };
    assert_eq!(
        problems(r#"{ candidate = "mlx" }"#, true),
        Vec::<String>::new()
    );
    assert_eq!(
        problems(r#"{ candidate = "llama", plan = "nope" }"#, false),
        [
            "models.smollm2.release.candidate",
            "models.smollm2.release.plan",
            "models.smollm2.release"
        ]
    );
}

#[test]
fn admission_and_drain_settings_are_checked() {
    let config = parse(
        r#"
        [backends.a]
        engine = "llama.cpp"
        url = "http://127.0.0.1:8081"
        max_queue = 0
        queue_timeout_ms = 0
        drain_max_bytes = 100
        [backends.b]
        engine = "llama.cpp"
        url = "http://127.0.0.1:8082"
        on_client_disconnect = "drain"
        drain_max_bytes = 0
        drain_max_ms = 0
        [backends.c]
        engine = "llama.cpp"
        url = "http://127.0.0.1:8083"
        max_queue = 8
        queue_timeout_ms = 1
        on_client_disconnect = "drain"
        drain_max_bytes = 1
        drain_max_ms = 1
        [models.m]
        primary = "a"
    "#,
    );
    let problems: Vec<String> = validate(&config).iter().map(ToString::to_string).collect();
    assert_eq!(
        problems,
        vec![
            "backends.a.queue_timeout_ms: must be at least 1 millisecond (set max_queue = 0 for requests never to wait)",
            "backends.a.drain_max_bytes: applies only with on_client_disconnect = \"drain\"",
            "backends.b.drain_max_bytes: must be at least 1 (leave it out for the default)",
            "backends.b.drain_max_ms: must be at least 1 (leave it out for the default)",
        ]
    );
}

#[test]
fn managed_engine_problems_are_reported() {
    let config = parse(
        r#"
        [backends.ok]
        engine = "llama.cpp"
        launch = { command = ["llama-server", "--port", "${port}"], groups = ["gpu"] }
        [backends.remote]
        engine = "llama.cpp"
        url = "http://10.0.0.5:8081"
        launch = { command = ["llama-server"] }
        [backends.nourl]
        engine = "llama.cpp"
        [backends.typo]
        engine = "llama.cpp"
        launch = { command = ["x", "${prot}"], groups = ["gpus"], idle_unload_ms = 0 }
        [swap_groups.gpu]
        [models.m]
        primary = "ok"
    "#,
    );
    let problems: Vec<String> = validate(&config).iter().map(|p| p.path.clone()).collect();
    assert_eq!(
        problems,
        [
            "backends.nourl.url",
            "backends.remote.url",
            "backends.typo.launch.command[1]",
            "backends.typo.launch.idle_unload_ms",
            "backends.typo.launch.groups[0]",
        ],
        "{:?}",
        validate(&config)
    );
}

#[test]
fn cors_origins_are_origins_and_star_stands_alone() {
    for ok in [
        "https://app.example",
        "http://localhost:5173",
        "http://[::1]:8080",
    ] {
        assert_eq!(checks::check_origin(ok, 1), Ok(()), "{ok}");
    }
    assert_eq!(checks::check_origin("*", 1), Ok(()));
    for bad in [
        "app.example",
        "https://app.example/",
        "https://app.example/path",
        "https://app.example:http",
        "https://",
        "ftp://app.example",
    ] {
        assert!(checks::check_origin(bad, 1).is_err(), "{bad}");
    }
    assert!(checks::check_origin("*", 2).is_err());
    let config = parse(
        r#"
        [server]
        cors_origins = ["https://ok.example", "https://bad.example/"]
        drain_timeout_ms = 14000
    "#,
    );
    let paths: Vec<String> = validate(&config).into_iter().map(|p| p.path).collect();
    assert_eq!(
        paths[..2],
        ["server.shutdown_timeout_ms", "server.cors_origins[1]"]
    );
}

#[test]
fn client_keys_are_checked_against_the_models_with_their_paths() {
    let digest = crate::auth::digest_text(b"sy-k");
    let config = parse(&format!(
        r#"
        [auth.keys.agent]
        digest = "{digest}"
        models = ["default", "nope"]
        rpm = 0
        [auth.keys.broken]
        digest = "sha256:00"
        [backends.llama]
        engine = "llama.cpp"
        url = "http://127.0.0.1:8081"
        api_key_env = "1BAD-NAME"
        [backends.remote]
        engine = "openai"
        url = "http://127.0.0.1:8082"
        api_key_env = "REMOTE_KEY"
        [models.smollm2]
        aliases = ["default"]
        primary = "llama"
    "#
    ));
    let paths: Vec<String> = validate(&config).into_iter().map(|p| p.path).collect();
    assert_eq!(
        paths,
        vec![
            "auth.keys.agent.models[1]",
            "auth.keys.agent.rpm",
            "auth.keys.broken.digest",
            "backends.llama.api_key_env",
        ]
    );
}

#[test]
fn an_empty_auth_section_is_valid_and_locks_the_listener() {
    let config = parse(
        r#"
        [auth]
        [backends.llama]
        engine = "llama.cpp"
        url = "http://127.0.0.1:8081"
        [models.smollm2]
        primary = "llama"
    "#,
    );
    assert_eq!(validate(&config), vec![]);
    assert_eq!(config.auth.map(|a| a.keys.len()), Some(0));
}

#[test]
fn a_key_in_the_file_is_not_a_setting() {
    let refused: Result<Config, _> = toml::from_str(
        r#"
        [backends.llama]
        engine = "openai"
        url = "http://127.0.0.1:8081"
        api_key = "sk-in-the-file"
        [models.smollm2]
        primary = "llama"
    "#,
    );
    let message = refused.unwrap_err().to_string();
    assert!(message.contains("unknown field `api_key`"), "{message}");
}

#[test]
fn a_backend_key_is_never_shown() {
    let mut config = parse(
        r#"
        [backends.llama]
        engine = "openai"
        url = "http://127.0.0.1:8081"
        api_key_env = "REMOTE_KEY"
        [models.smollm2]
        primary = "llama"
    "#,
    );
    let backend = config.backends.get_mut("llama").unwrap();
    backend.api_key = Some(crate::config::Secret::new("sk-very-secret".into()));
    let debug = format!("{config:?}");
    assert!(!debug.contains("sk-very-secret"), "{debug}");
    assert!(debug.contains("[redacted]"), "{debug}");
    let toml = toml::to_string(&config).unwrap();
    assert!(!toml.contains("sk-very-secret"), "{toml}");
    assert!(toml.contains("REMOTE_KEY"), "{toml}");
}

#[test]
fn the_default_model_must_name_a_model_or_an_alias() {
    let config = |default: &str| {
        parse(&format!(
            r#"
            [server]
            default_model = "{default}"
            [backends.llama]
            engine = "llama.cpp"
            url = "http://127.0.0.1:8081"
            [models.smollm2]
            aliases = ["default"]
            primary = "llama"
        "#
        ))
    };
    assert_eq!(validate(&config("smollm2")), vec![]);
    assert_eq!(validate(&config("default")), vec![]);
    let problems = validate(&config("gpt-4"));
    assert_eq!(problems.len(), 1);
    assert_eq!(problems[0].path, "server.default_model");
    assert!(problems[0].message.contains("\"gpt-4\""), "{}", problems[0]);
}

#[test]
fn a_name_pattern_needs_a_wildcard_and_one_owner() {
    let problems = validate(&parse(
        r#"
        [backends.llama]
        engine = "llama.cpp"
        url = "http://127.0.0.1:8081"
        [models.big]
        patterns = ["claude-*", "gpt-4o"]
        primary = "llama"
        [models.small]
        patterns = ["claude-*", "*"]
        primary = "llama"
    "#,
    ));
    let paths: Vec<&str> = problems.iter().map(|p| p.path.as_str()).collect();
    assert_eq!(
        paths,
        ["models.big.patterns[1]", "models.small.patterns[0]"],
        "{problems:?}"
    );
    assert!(
        problems[0].message.contains("an exact name is an alias"),
        "{}",
        problems[0]
    );
    assert!(
        problems[1].message.contains("models.big.patterns[0]"),
        "{}",
        problems[1]
    );
}

/// The configurations the repository ships read and validate as they are (the files their
/// artifacts name aside: `switchyard check` looks for those on the user's machine).
#[test]
fn the_shipped_configurations_are_valid() {
    for (name, text) in [
        (
            "example.toml",
            include_str!("../../../deploy/configs/example.toml"),
        ),
        (
            "llama-to-mlx.toml",
            include_str!("../../../deploy/configs/llama-to-mlx.toml"),
        ),
    ] {
        let config: Config = toml::from_str(text).unwrap_or_else(|e| panic!("{name}: {e}"));
        assert_eq!(validate(&config), vec![], "{name}");
    }
}

/// The README's worked configuration is `deploy/configs/llama-to-mlx.toml`, whole: the one a
/// user copies from the README is the one the tests run.
#[test]
fn the_readmes_worked_configuration_is_the_shipped_file() {
    let readme = include_str!("../../../README.md");
    let shipped = include_str!("../../../deploy/configs/llama-to-mlx.toml");
    let start = readme
        .find("```toml\n# A model served by llama-server")
        .expect("the README shows deploy/configs/llama-to-mlx.toml in a ```toml block");
    let block = &readme[start + "```toml\n".len()..];
    let block = &block[..block.find("```").expect("the block ends")];
    assert_eq!(block, shipped);
}

#[test]
fn an_engine_key_goes_over_tls_or_to_this_machine_unless_plain_http_is_allowed() {
    let config = parse(
        r#"
        [backends.plain]
        engine = "openai"
        url = "http://10.0.0.7:8080"
        api_key_env = "REMOTE_KEY"
        [backends.allowed]
        engine = "openai"
        url = "http://10.0.0.8:8080"
        api_key_env = "REMOTE_KEY"
        allow_api_key_over_http = true
        [backends.tls]
        engine = "openai"
        url = "https://gpu.example/v1-proxy"
        api_key_env = "REMOTE_KEY"
        ca_file = "/etc/switchyard/ca.pem"
        [backends.local]
        engine = "openai"
        url = "http://localhost:9080"
        api_key_env = "REMOTE_KEY"
        ca_file = "/etc/switchyard/ca.pem"
        [backends.managed]
        engine = "llama.cpp"
        url = "https://127.0.0.1:8443"
        [backends.managed.launch]
        command = ["llama-server", "--port", "${port}"]
        [models.smollm2]
        primary = "plain"
        fallback = ["allowed", "tls", "local", "managed"]
    "#,
    );
    let problems: Vec<(String, String)> = validate(&config)
        .into_iter()
        .map(|p| (p.path, p.message))
        .collect();
    let paths: Vec<&str> = problems.iter().map(|(p, _)| p.as_str()).collect();
    assert_eq!(
        paths,
        [
            "backends.local.ca_file",
            "backends.managed.url",
            "backends.plain.api_key_env",
        ],
        "{problems:#?}"
    );
    assert!(
        problems[2].1.contains("10.0.0.7:8080 over plain HTTP"),
        "{problems:#?}"
    );
}

#[test]
fn pools_are_checked_all_at_once() {
    let config = parse(
        r#"
        [backends.a]
        engine = "llama.cpp"
        url = "http://127.0.0.1:8081"
        [backends.b]
        engine = "mlx"
        url = "http://127.0.0.1:8082"
        [backends.c]
        engine = "llama.cpp"
        url = "http://127.0.0.1:8083"
        [pools.mixed]
        members = ["a", "b", "ghost"]
        [pools.again]
        members = ["a", "c", "c"]
        affinity_entries = 0
        [pools.empty]
        members = []
        [pools.c]
        members = ["c"]
        [models.m]
        primary = "mixed"
        fallback = ["again"]
        shadow = { backend = "empty", sample = 1.0 }
        release = { candidate = "a" }
    "#,
    );
    let problems: Vec<String> = validate(&config).iter().map(ToString::to_string).collect();
    for expected in [
        "pools.mixed.members[0]: \"a\" is already a member of pool \"again\"",
        "pools.again.members[2]: \"c\" is listed twice",
        "pools.again.affinity_entries: must be at least 1 when affinity is on",
        "pools.c: \"c\" is also a backend's name",
        "pools.empty.members: a pool needs at least one member",
        "pools.mixed.members[2]: no backend named \"ghost\"",
        "pools.mixed.members: every member must run the same engine and artifact (a is llama.cpp, b is mlx)",
        "models.m.fallback[0]: names a pool; a pool serves only as a model's primary",
        "models.m.shadow.backend: names a pool",
        "models.m.release.candidate: \"a\" and the model's primary \"mixed\" share backend \"a\"",
    ] {
        assert!(
            problems.iter().any(|p| p.starts_with(expected)),
            "no {expected:?} in {problems:#?}"
        );
    }
    // A model served by a pool, with a backend's fallback and shadow, is valid; so is its
    // release to another pool.
    let config = parse(
        r#"
        [ledger]
        path = "ledger.db"
        [backends.a]
        engine = "llama.cpp"
        url = "http://127.0.0.1:8081"
        [backends.b]
        engine = "llama.cpp"
        url = "http://127.0.0.1:8082"
        [backends.spare]
        engine = "llama.cpp"
        url = "http://127.0.0.1:8083"
        [backends.next-a]
        engine = "mlx"
        url = "http://127.0.0.1:8084"
        [backends.next-b]
        engine = "mlx"
        url = "http://127.0.0.1:8085"
        [pools.llama]
        members = ["a", "b"]
        [pools.next]
        members = ["next-a", "next-b"]
        [models.m]
        primary = "llama"
        fallback = ["spare"]
        shadow = { backend = "spare", sample = 0.1 }
        release = { candidate = "next" }
    "#,
    );
    assert_eq!(validate(&config), vec![]);
    assert_eq!(config.pools["llama"].max_imbalance, 2, "the default");
}

#[test]
fn the_shared_ledger_is_postgresql_without_a_password_in_the_configuration() {
    let problems = |ledger: &str| -> Vec<String> {
        let config = parse(&format!(
            "[ledger]\npath = \"l.db\"\n{ledger}\n[backends.llama]\nengine = \"llama.cpp\"\nurl = \"http://127.0.0.1:8081\"\n[models.m]\nprimary = \"llama\"\n"
        ));
        validate(&config)
            .into_iter()
            .map(|p| format!("{}: {}", p.path, p.message))
            .collect()
    };
    assert_eq!(
        problems(
            "url = \"postgres://switchyard@db:5432/ledger?sslmode=require\"\npassword_env = \"LEDGER_PASSWORD\"\ninstance = \"studio-1\""
        ),
        Vec::<String>::new()
    );
    assert_eq!(
        problems(
            "url = \"postgresql://switchyard@db/ledger\"\npassword_file = \"/run/secrets/pg\""
        ),
        Vec::<String>::new()
    );
    for (ledger, expected) in [
        (
            "url = \"mysql://u:hunter2@db/ledger\"",
            "ledger.url: is not a PostgreSQL URL",
        ),
        (
            "url = \"postgres://switchyard:hunter2@db/ledger\"",
            "ledger.url: holds a password",
        ),
        (
            "url = \"postgres://db/ledger?user=s&password=hunter2\"",
            "ledger.url: holds a password",
        ),
        (
            "url = \"postgres://db/l\"\npassword_env = \"P\"\npassword_file = \"p\"",
            "ledger.password_file: set either",
        ),
        (
            "url = \"postgres://db/l\"\npassword_env = \"1-X\"",
            "ledger.password_env: \"1-X\" cannot name",
        ),
        (
            "url = \"postgres://db/l\"\ninstance = \"\"",
            "ledger.instance: must be 1 to 200",
        ),
        (
            "password_env = \"P\"",
            "ledger.password_env: is for the shared ledger",
        ),
        (
            "instance = \"a\"",
            "ledger.instance: is for the shared ledger",
        ),
    ] {
        let found = problems(ledger);
        assert!(
            found.iter().any(|p| p.starts_with(expected)),
            "no {expected:?} for {ledger:?} in {found:#?}"
        );
        assert!(
            !found.iter().any(|p| p.contains("hunter2")),
            "a problem repeats the password: {found:#?}"
        );
    }
}
