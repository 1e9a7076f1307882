//! `suffuse gateway` in front of real pool servers over mutual TLS: the
//! OpenAI wire format, the same tokens as `suffuse generate`, and the
//! faults of issue 30 (bad bodies, unknown models, long prompts, an empty
//! pool, a full queue, a client gone mid-stream, a server killed
//! mid-query, servers that cannot be reached).

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::net::TcpListener;

use serde_json::{Value, json};

#[path = "gateway/http.rs"]
mod http;
#[path = "gateway/stack.rs"]
mod stack;

use stack::{DECODER_KEYS, Pair, SEED, gateway, generated, pool, run, setup};

fn chat(prompt: &str, extra: Value) -> Value {
    let mut body = json!({
        "model": "tiny-llama",
        "messages": [{"role": "user", "content": prompt}],
        "temperature": 0.8,
        "seed": SEED,
    });
    for (k, v) in extra.as_object().unwrap() {
        body[k] = v.clone();
    }
    body
}

/// The error object of an OpenAI-shaped error body.
fn error(reply: &http::Reply) -> Value {
    let e = reply.json()["error"].clone();
    assert!(
        e["message"].as_str().is_some_and(|m| !m.is_empty()),
        "{}",
        reply.body
    );
    assert!(
        e["type"].is_string() && e["code"].is_string(),
        "{}",
        reply.body
    );
    e
}

#[test]
fn a_streamed_chat_gives_generates_tokens_and_plain_completions_work() {
    let dir = setup("stream");
    let (expected, ids) = generated(&dir, "hi there");
    assert!(
        !ids.contains(&2),
        "the reference ended at eos; pick another seed: {ids:?}"
    );
    let p = pool(&dir, "llama", "tiny-llama", 4, &DECODER_KEYS);
    let pair = Pair::start(&dir, "llama", "tiny-llama", &p, &[]);
    let gw = gateway(&dir, &[("tiny-llama", &pair.servers())], &[]);
    let addr = gw.addr();

    let r = http::post(
        &addr,
        "/v1/chat/completions",
        &chat("hi there", json!({"stream": true})),
    );
    assert_eq!(r.status, 200, "{}", r.body);
    assert!(
        r.header("content-type")
            .unwrap()
            .starts_with("text/event-stream")
    );
    let events = r.events();
    assert_eq!(events.last().map(String::as_str), Some("[DONE]"));
    let chunks: Vec<Value> = events[..events.len() - 1]
        .iter()
        .map(|e| serde_json::from_str(e).unwrap())
        .collect();
    // One chunk per token, then the last with the reason and the usage.
    assert_eq!(chunks.len(), ids.len() + 1, "{events:?}");
    let text: String = chunks
        .iter()
        .filter_map(|c| c["choices"][0]["delta"]["content"].as_str())
        .collect();
    assert_eq!(text, expected);
    let last = chunks.last().unwrap();
    assert_eq!(last["object"], "chat.completion.chunk");
    assert_eq!(last["choices"][0]["finish_reason"], "length");
    assert_eq!(last["usage"]["completion_tokens"], ids.len());
    assert!(last["usage"]["prompt_tokens"].as_u64().unwrap() > 0);

    // The same conversation, not streamed, stopped after 3 tokens.
    let r = http::post(
        &addr,
        "/v1/chat/completions",
        &chat("hi there", json!({"max_tokens": 3})),
    );
    assert_eq!(r.status, 200, "{}", r.body);
    let v = r.json();
    assert_eq!(v["object"], "chat.completion");
    assert_eq!(v["choices"][0]["finish_reason"], "length");
    assert_eq!(v["usage"]["completion_tokens"], 3);
    let content = v["choices"][0]["message"]["content"].as_str().unwrap();
    assert!(expected.starts_with(content), "{content:?} vs {expected:?}");

    // A stop string from the middle of the text: cut there, not sent.
    let stop: String = expected.chars().skip(2).take(2).collect();
    let cut = &expected[..expected.find(&stop).unwrap()];
    let r = http::post(
        &addr,
        "/v1/chat/completions",
        &chat("hi there", json!({"stop": [stop]})),
    );
    assert_eq!(r.status, 200, "{}", r.body);
    let v = r.json();
    assert_eq!(v["choices"][0]["message"]["content"], cut);
    assert_eq!(v["choices"][0]["finish_reason"], "stop");

    // A plain completion.
    let body =
        json!({"model": "tiny-llama", "prompt": "once upon", "max_tokens": 4, "temperature": 0});
    let r = http::post(&addr, "/v1/completions", &body);
    assert_eq!(r.status, 200, "{}", r.body);
    let v = r.json();
    assert_eq!(v["object"], "text_completion");
    assert!(v["choices"][0]["text"].is_string());
    assert!(v["usage"]["completion_tokens"].as_u64().unwrap() <= 4);

    let models = http::request(&addr, "GET", "/v1/models", "").json();
    assert_eq!(models["data"][0]["id"], "tiny-llama");
    assert_eq!(models["data"][0]["servers_plan"]["seq"], 32);
    assert_eq!(http::request(&addr, "GET", "/health", "").status, 200);
}

#[test]
fn bad_requests_get_openai_errors_and_a_client_gone_mid_stream_leaves_the_servers_serving() {
    let dir = setup("faults");
    let p = pool(&dir, "llama", "tiny-llama", 3, &DECODER_KEYS);
    let pair = Pair::start(&dir, "llama", "tiny-llama", &p, &[]);
    let gw = gateway(&dir, &[("tiny-llama", &pair.servers())], &[]);
    let addr = gw.addr();

    let r = http::request(&addr, "POST", "/v1/chat/completions", "{\"model\": ");
    assert_eq!(r.status, 400);
    assert_eq!(error(&r)["type"], "invalid_request_error");
    let r = http::post(
        &addr,
        "/v1/chat/completions",
        &json!({"model": "gpt-9", "messages": []}),
    );
    assert_eq!(r.status, 404);
    assert_eq!(error(&r)["code"], "model_not_found");
    let r = http::post(
        &addr,
        "/v1/embeddings",
        &json!({"model": "tiny-llama", "input": "x"}),
    );
    assert_eq!(r.status, 400, "{}", r.body);
    // Over the bucket of 32: refused, and no key set is spent on it.
    let long = "a b c d e f g h i j k l m n o p q r s t u v w x y z ".repeat(2);
    let r = http::post(
        &addr,
        "/v1/completions",
        &json!({"model": "tiny-llama", "prompt": long.trim_end()}),
    );
    assert_eq!(r.status, 400, "{}", r.body);
    assert_eq!(error(&r)["code"], "context_length_exceeded");

    // A client that reads one token and goes away.
    let body = chat("hi there", json!({"stream": true})).to_string();
    let (status, _, mut stream) = http::open(&addr, "POST", "/v1/chat/completions", &body);
    assert_eq!(status, 200);
    let mut line = String::new();
    while !line.starts_with("data:") {
        line.clear();
        std::io::BufRead::read_line(&mut stream, &mut line).unwrap();
    }
    drop(stream);
    pair.p0.wait_for("served");
    pair.p1.wait_for("served");

    // Both servers serve the next request, from the third set.
    let r = http::post(
        &addr,
        "/v1/chat/completions",
        &chat("hello", json!({"max_tokens": 2})),
    );
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(r.json()["usage"]["completion_tokens"], 2);
}

#[test]
fn an_empty_pool_is_503_and_a_full_queue_429() {
    let dir = setup("busy");
    let empty = pool(&dir, "empty", "demo", 0, &[]);
    let pair = Pair::start(&dir, "empty", "demo", &empty, &[]);
    let gw = gateway(&dir, &[("demo", &pair.servers())], &[]);
    let r = http::post(
        &gw.addr(),
        "/v1/embeddings",
        &json!({"model": "demo", "input": "x"}),
    );
    assert_eq!(r.status, 503, "{}", r.body);
    assert_eq!(r.header("retry-after"), Some("1"));
    assert_eq!(error(&r)["code"], "key_pool_empty");

    // A "server" that accepts and says nothing holds the one slot.
    let silent = TcpListener::bind("127.0.0.1:0").unwrap();
    let servers = format!("{0},{0}", silent.local_addr().unwrap());
    let gw = gateway(
        &dir,
        &[("demo", &servers)],
        &["--max-concurrent", "1", "--queue", "0", "--timeout", "20"],
    );
    let addr = gw.addr();
    let first = std::thread::spawn({
        let addr = addr.clone();
        move || {
            http::post(
                &addr,
                "/v1/embeddings",
                &json!({"model": "demo", "input": "x"}),
            )
        }
    });
    let (conn, _) = silent.accept().unwrap();
    let r = http::post(
        &addr,
        "/v1/embeddings",
        &json!({"model": "demo", "input": "y"}),
    );
    assert_eq!(r.status, 429, "{}", r.body);
    assert_eq!(error(&r)["code"], "rate_limit_exceeded");
    // The silent server hangs up: the first request fails, OpenAI-shaped.
    drop(conn);
    drop(silent);
    let r = first.join().unwrap();
    assert_eq!(r.status, 502, "{}", r.body);
    assert_eq!(error(&r)["type"], "server_error");
}

#[test]
fn a_server_killed_or_unreachable_gives_an_openai_error() {
    let dir = setup("killed");
    let keys = ["--seq", "16", "--max-new-tokens", "48"];
    let p = pool(&dir, "llama", "tiny-llama", 2, &keys);
    let mut pair = Pair::start(&dir, "llama", "tiny-llama", &p, &[]);
    let gw = gateway(
        &dir,
        &[("tiny-llama", &pair.servers())],
        &["--timeout", "20"],
    );
    let body = json!({"model": "tiny-llama", "prompt": "hi", "stream": true, "temperature": 0.0});
    let (status, _, mut stream) =
        http::open(&gw.addr(), "POST", "/v1/completions", &body.to_string());
    assert_eq!(status, 200);
    let mut line = String::new();
    while !line.starts_with("data:") {
        line.clear();
        std::io::BufRead::read_line(&mut stream, &mut line).unwrap();
    }
    pair.p1.kill();
    let mut rest = String::new();
    std::io::Read::read_to_string(&mut stream, &mut rest).unwrap();
    let errors: Vec<Value> = rest
        .lines()
        .filter_map(|l| l.strip_prefix("data: "))
        .filter_map(|d| serde_json::from_str::<Value>(d).ok())
        .filter(|v| v.get("error").is_some())
        .collect();
    assert_eq!(errors.len(), 1, "no error event in {rest}");
    assert_eq!(errors[0]["error"]["type"], "server_error");

    // Nothing listening at all: 502 within the gateway's timeout.
    let gw = gateway(
        &dir,
        &[("demo", "127.0.0.1:9,127.0.0.1:9")],
        &["--timeout", "2"],
    );
    let r = http::post(
        &gw.addr(),
        "/v1/embeddings",
        &json!({"model": "demo", "input": "x"}),
    );
    assert_eq!(r.status, 502, "{}", r.body);
    assert!(
        error(&r)["message"]
            .as_str()
            .unwrap()
            .contains("nothing is listening"),
        "{}",
        r.body
    );
}

/// `suffuse embed`'s vector and token count for `text` on `demo`.
fn embedded(text: &str) -> (Vec<f32>, usize) {
    let out = run(&["embed", "--model", "demo", text]);
    let line: Value = serde_json::from_slice(&out.stdout).unwrap();
    (
        floats(&line["embedding"]),
        line["tokens"].as_u64().unwrap() as usize,
    )
}

/// A JSON vector as f32s: the gateway and `embed` both print f32s.
fn floats(v: &Value) -> Vec<f32> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_f64().unwrap() as f32)
        .collect()
}

fn base64_floats(v: &Value) -> Vec<f32> {
    use base64::Engine as _;
    let bytes = base64::engine::general_purpose::STANDARD
        .decode(v.as_str().unwrap())
        .unwrap();
    bytes
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect()
}

#[test]
fn embeddings_equal_embeds_and_the_metrics_count_them() {
    let dir = setup("metrics");
    let text = "Two servers compute on secret shares.";
    let (expected, tokens) = embedded(text);
    let seq = tokens.to_string();
    let p = pool(&dir, "demo", "demo", 3, &["--seq", &seq]);
    let pair = Pair::start(&dir, "demo", "demo", &p, &["--metrics", "127.0.0.1:0"]);
    let metrics = pair.p0.wait_for("metrics on http://");
    let metrics = metrics
        .rsplit("http://")
        .next()
        .unwrap()
        .trim_end_matches("/metrics")
        .to_string();
    let gw = gateway(&dir, &[("demo", &pair.servers())], &[]);
    let addr = gw.addr();

    let r = http::post(
        &addr,
        "/v1/embeddings",
        &json!({"model": "demo", "input": text}),
    );
    assert_eq!(r.status, 200, "{}", r.body);
    let v = r.json();
    assert_eq!(floats(&v["data"][0]["embedding"]), expected);
    assert_eq!(v["usage"]["prompt_tokens"], tokens);
    let body = json!({"model": "demo", "input": [text], "encoding_format": "base64"});
    let r = http::post(&addr, "/v1/embeddings", &body);
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(base64_floats(&r.json()["data"][0]["embedding"]), expected);
    pair.p0.wait_for("served");
    pair.p0.wait_for("served");

    let m = http::request(&metrics, "GET", "/metrics", "");
    assert_eq!(m.status, 200);
    let has = |line: &str| m.body.lines().any(|l| l == line);
    assert!(has("suffuse_queries_served_total 2"), "{}", m.body);
    let pool_line = m
        .body
        .lines()
        .find(|l| l.starts_with("suffuse_pool_key_sets{plan=\""))
        .unwrap_or_else(|| panic!("no pool gauge in {}", m.body));
    assert!(pool_line.ends_with("} 1"), "{pool_line}");
    assert!(has("suffuse_online_seconds_count 2"), "{}", m.body);
    assert!(has("suffuse_ready 1"), "{}", m.body);
    assert!(!m.body.contains(text));
    assert_eq!(http::request(&metrics, "GET", "/livez", "").status, 200);
    assert_eq!(http::request(&metrics, "GET", "/readyz", "").status, 200);
}
