//! Schema: OpenAPI validation (422 with the field path), defaults and pruning, CEL rules.

use super::*;

#[tokio::test]
async fn schema_violations_are_422_with_the_field_path() {
    let env = Env::with_widgets().await;
    let api = env.widgets();
    let message = expect_invalid(try_create(&api, "w", json!({"size": 0})).await, &[]);
    assert_eq!(
        message,
        format!("Widget.{WIDGET_GROUP} \"w\" is invalid: spec.size: Invalid value: 0: spec.size in body should be greater than or equal to 1")
    );
    let post = |name: &str, spec: Value| widget(name, spec);
    expect_invalid(
        api.create(
            &PostParams::default(),
            &post("w", json!({"color": "green"})),
        )
        .await,
        &[
            "spec.size: Required value",
            "spec.color: Unsupported value: \"green\": supported values: \"blue\", \"red\"",
        ],
    );
    expect_invalid(
        api.create(&PostParams::default(), &post("w", json!({"size": "big"})))
            .await,
        &["spec.size: Invalid value: \"string\": spec.size in body must be of type integer: \"string\""],
    );
    expect_invalid(
        api.create(
            &PostParams::default(),
            &post("Bad_Name", json!({"size": 1})),
        )
        .await,
        &["metadata.name: Invalid value: \"Bad_Name\""],
    );
    // ObjectMeta rules hold for every kind: label values, finalizer names.
    let mut labelled = widget("labelled", json!({"size": 1}));
    labelled.metadata.labels = Some([("tier".to_string(), "not valid!".to_string())].into());
    expect_invalid(
        api.create(&PostParams::default(), &labelled).await,
        &["metadata.labels: Invalid value: \"not valid!\""],
    );
    // Updates are validated too.
    create(&api, "ok", json!({"size": 1})).await;
    expect_invalid(merge(&api, "ok", json!({"spec": {"size": 11}})).await, &[]);
}

#[tokio::test]
async fn schema_defaults_are_applied_and_unknown_fields_pruned() {
    let env = Env::with_widgets().await;
    let api = env.widgets();
    let created = api
        .create(
            &PostParams::default(),
            &widget(
                "w",
                json!({"size": 1, "bogus": true, "extra": {"anything": {"goes": 1}}, "note": null}),
            ),
        )
        .await
        .unwrap();
    assert_eq!(created.data["spec"]["color"], "blue", "defaulted");
    assert!(created.data["spec"].get("bogus").is_none(), "pruned");
    assert_eq!(
        created.data["spec"]["extra"],
        json!({"anything": {"goes": 1}}),
        "x-kubernetes-preserve-unknown-fields keeps it"
    );
    // Defaults apply on update as well (a removed defaulted field comes back).
    let updated = merge(&api, "w", json!({"spec": {"color": null}}))
        .await
        .unwrap();
    assert_eq!(updated.data["spec"]["color"], "blue");
    // fieldValidation=Strict rejects unknown fields instead (what kubectl sends).
    let (code, _, body) = env
        .raw(
            "POST",
            &format!("{}?fieldValidation=Strict", widgets_path(&env)),
            &[("content-type", "application/json")],
            Some(serde_json::to_value(widget("s", json!({"size": 1, "bogus": 1}))).unwrap()),
        )
        .await;
    assert_eq!(code, 400, "{body}");
    assert!(
        body.contains("strict decoding error: unknown field \\\"spec.bogus\\\""),
        "{body}"
    );
    // The default (Warn) answers with a warning header.
    let (code, headers, _) = env
        .raw(
            "POST",
            &widgets_path(&env),
            &[("content-type", "application/json")],
            Some(serde_json::to_value(widget("warned", json!({"size": 1, "bogus": 1}))).unwrap()),
        )
        .await;
    assert_eq!(code, 201);
    let warning = headers
        .get("warning")
        .and_then(|w| w.to_str().ok())
        .unwrap_or_default()
        .to_string();
    assert_contains_all(&warning, &["unknown field", "spec.bogus"]);
}

#[tokio::test]
async fn cel_rules_are_evaluated_including_transition_rules() {
    let env = Env::with_widgets().await;
    let api = env.widgets();
    create(&api, "w", json!({"size": 1, "lockName": "db"})).await;
    merge(&api, "w", json!({"spec": {"size": 2}}))
        .await
        .unwrap();
    expect_invalid(
        merge(&api, "w", json!({"spec": {"lockName": "other"}})).await,
        &["spec.lockName: Invalid value: \"other\": lockName is immutable"],
    );
}
