//! The fake's fault hooks: injected errors, 429s with Retry-After, and slow responses.

use super::*;

#[tokio::test]
async fn injected_faults_answer_the_next_writes() {
    let (env, api) = fake_widgets!("injected_faults_answer_the_next_writes");
    env.server().inject_faults(&widgets_path(&env), 2, 409);
    for _ in 0..2 {
        expect_error(
            try_create(&api, "w", json!({"size": 1})).await,
            409,
            "Conflict",
        );
    }
    assert!(
        api.get_opt("w").await.unwrap().is_none(),
        "a fault has no effect"
    );
    create(&api, "w", json!({"size": 1})).await;
    env.server().inject_faults(&widget_path(&env, "w"), 1, 500);
    let (code, _, _) = api_code(merge(&api, "w", json!({"spec": {"size": 2}})).await);
    assert_eq!(code, 500);
    assert_eq!(
        merge(&api, "w", json!({"spec": {"size": 2}}))
            .await
            .unwrap()
            .data["spec"]["size"],
        2
    );
    env.server().inject_faults(&widget_path(&env, "w"), 1, 403);
    // As RBAC refuses.
    expect_error(
        merge(&api, "w", json!({"spec": {"size": 3}})).await,
        403,
        "Forbidden",
    );
    let log = env.server().request_log();
    assert_eq!(log.iter().filter(|r| r.injected_fault).count(), 4);
}

/// Sent over a bare connection: kube's client retries a 429 by itself, which would hide it.
#[tokio::test]
async fn an_injected_429_says_when_to_retry() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let env = Env::fake_only_with_widgets("an_injected_429_says_when_to_retry").await;
    env.server().inject_faults(&widgets_path(&env), 1, 429);
    let body = serde_json::to_string(&widget("w", json!({"size": 1}))).unwrap();
    let request = format!(
        "POST {} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n\
         Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
        widgets_path(&env),
        body.len()
    );
    let mut stream = tokio::net::TcpStream::connect(env.server().addr())
        .await
        .unwrap();
    stream.write_all(request.as_bytes()).await.unwrap();
    let mut answer = String::new();
    stream.read_to_string(&mut answer).await.unwrap();
    assert!(answer.starts_with("HTTP/1.1 429"), "{answer}");
    assert!(answer.contains("TooManyRequests"), "{answer}");
    assert!(
        answer.to_ascii_lowercase().contains("retry-after: 1\r\n"),
        "{answer}"
    );
    assert!(
        env.widgets().get_opt("w").await.unwrap().is_none(),
        "a fault has no effect"
    );
    create(&env.widgets(), "w", json!({"size": 1})).await;
}

#[tokio::test]
async fn injected_delays_slow_the_next_requests_down() {
    let (env, api) = fake_widgets!("injected_delays_slow_the_next_requests_down");
    create(&api, "w", json!({"size": 1})).await;
    let delay = Duration::from_millis(400);
    env.server()
        .inject_delays(&widget_path(&env, "w"), 2, delay);
    for _ in 0..2 {
        let started = std::time::Instant::now();
        api.get("w").await.unwrap();
        assert!(started.elapsed() >= delay, "{:?}", started.elapsed());
    }
    // Used up: the request is served and the object is unchanged by the delays.
    assert_eq!(api.get("w").await.unwrap().data["spec"]["size"], 1);
}

#[tokio::test]
async fn a_slow_spell_slows_every_request_down_until_it_ends() {
    let (env, api) = fake_widgets!("a_slow_spell_slows_every_request_down_until_it_ends");
    create(&api, "w", json!({"size": 1})).await;
    let delay = Duration::from_millis(300);
    let length = Duration::from_secs(2);
    env.server()
        .slow_down(&widget_path(&env, "w"), length, delay);
    let spell = std::time::Instant::now();
    // More requests than a count-based delay would take: the spell is a time, not a number.
    for _ in 0..3 {
        let started = std::time::Instant::now();
        api.get("w").await.unwrap();
        assert!(started.elapsed() >= delay, "{:?}", started.elapsed());
    }
    // Time: the spell of delays is a time: wait it out.
    tokio::time::sleep(length.saturating_sub(spell.elapsed())).await;
    let started = std::time::Instant::now();
    api.get("w").await.unwrap();
    assert!(
        started.elapsed() < delay,
        "after the spell: {:?}",
        started.elapsed()
    );
}
