//! Engine answers as llama-server and mlx_lm.server really send them, copied verbatim from
//! the recorded transcripts (`shared/engine-transcripts/`, SmolLM2-135M-Instruct asked "What is
//! the capital of France? Answer in one sentence."), and tool-call answers in the shapes each
//! engine's source writes them (llama-server: a call's id and name in its first delta, the
//! arguments in pieces after; mlx_lm.server: whole calls, each with an index and an id, on the
//! chunk that finishes).

/// llama-server's streamed answer: a role chunk with null content, one chunk per token, the
/// finish chunk, then the usage chunk with empty `choices` (and `timings`), and `[DONE]`.
pub(crate) const LLAMA_TEXT_STREAM: &[&str] = &[
    r#"{"choices":[{"finish_reason":null,"index":0,"delta":{"role":"assistant","content":null}}],"created":1795989553,"id":"chatcmpl-O335Bi7uCuaC7SyoinyPOxuOsj3i9EDA","model":"/models/SmolLM2-135M-Instruct.Q4_1.gguf","system_fingerprint":"b0-unknown","object":"chat.completion.chunk"}"#,
    r#"{"choices":[{"finish_reason":null,"index":0,"delta":{"content":"The"}}],"created":1795989553,"id":"chatcmpl-O335Bi7uCuaC7SyoinyPOxuOsj3i9EDA","model":"/models/SmolLM2-135M-Instruct.Q4_1.gguf","system_fingerprint":"b0-unknown","object":"chat.completion.chunk"}"#,
    r#"{"choices":[{"finish_reason":null,"index":0,"delta":{"content":" capital"}}],"created":1795989553,"id":"chatcmpl-O335Bi7uCuaC7SyoinyPOxuOsj3i9EDA","model":"/models/SmolLM2-135M-Instruct.Q4_1.gguf","system_fingerprint":"b0-unknown","object":"chat.completion.chunk"}"#,
    r#"{"choices":[{"finish_reason":null,"index":0,"delta":{"content":" of"}}],"created":1795989553,"id":"chatcmpl-O335Bi7uCuaC7SyoinyPOxuOsj3i9EDA","model":"/models/SmolLM2-135M-Instruct.Q4_1.gguf","system_fingerprint":"b0-unknown","object":"chat.completion.chunk"}"#,
    r#"{"choices":[{"finish_reason":null,"index":0,"delta":{"content":" France"}}],"created":1795989553,"id":"chatcmpl-O335Bi7uCuaC7SyoinyPOxuOsj3i9EDA","model":"/models/SmolLM2-135M-Instruct.Q4_1.gguf","system_fingerprint":"b0-unknown","object":"chat.completion.chunk"}"#,
    r#"{"choices":[{"finish_reason":null,"index":0,"delta":{"content":" is"}}],"created":1795989553,"id":"chatcmpl-O335Bi7uCuaC7SyoinyPOxuOsj3i9EDA","model":"/models/SmolLM2-135M-Instruct.Q4_1.gguf","system_fingerprint":"b0-unknown","object":"chat.completion.chunk"}"#,
    r#"{"choices":[{"finish_reason":null,"index":0,"delta":{"content":" Paris"}}],"created":1795989553,"id":"chatcmpl-O335Bi7uCuaC7SyoinyPOxuOsj3i9EDA","model":"/models/SmolLM2-135M-Instruct.Q4_1.gguf","system_fingerprint":"b0-unknown","object":"chat.completion.chunk"}"#,
    r#"{"choices":[{"finish_reason":null,"index":0,"delta":{"content":"."}}],"created":1795989553,"id":"chatcmpl-O335Bi7uCuaC7SyoinyPOxuOsj3i9EDA","model":"/models/SmolLM2-135M-Instruct.Q4_1.gguf","system_fingerprint":"b0-unknown","object":"chat.completion.chunk"}"#,
    r#"{"choices":[{"finish_reason":"stop","index":0,"delta":{}}],"created":1795989553,"id":"chatcmpl-O335Bi7uCuaC7SyoinyPOxuOsj3i9EDA","model":"/models/SmolLM2-135M-Instruct.Q4_1.gguf","system_fingerprint":"b0-unknown","object":"chat.completion.chunk"}"#,
    r#"{"choices":[],"created":1795989553,"id":"chatcmpl-O335Bi7uCuaC7SyoinyPOxuOsj3i9EDA","model":"/models/SmolLM2-135M-Instruct.Q4_1.gguf","system_fingerprint":"b0-unknown","object":"chat.completion.chunk","usage":{"completion_tokens":8,"prompt_tokens":42,"total_tokens":50,"prompt_tokens_details":{"cached_tokens":41}},"timings":{"cache_n":41,"prompt_n":1,"prompt_ms":10.146,"prompt_per_token_ms":10.146,"prompt_per_second":98.56100926473486,"predicted_n":8,"predicted_ms":68.213,"predicted_per_token_ms":9.744714285714284,"predicted_per_second":102.61973524108309}}"#,
    r#"[DONE]"#,
];

/// mlx_lm.server's streamed answer: `role` in every delta, the finish chunk, the usage chunk
/// with `object` = `chat.completion`, and `[DONE]`.
pub(crate) const MLX_TEXT_STREAM: &[&str] = &[
    r#"{"id": "chatcmpl-627c03b7-eff5-4c62-b380-dfedc9b7773e", "system_fingerprint": "0.32.2-0.32.4-Linux-6.1.0-x86_64-with-glibc2.36-x86_64", "object": "chat.completion.chunk", "model": "default_model", "created": 1795989557, "choices": [{"index": 0, "finish_reason": null, "delta": {"role": "assistant", "content": "The"}}]}"#,
    r#"{"id": "chatcmpl-627c03b7-eff5-4c62-b380-dfedc9b7773e", "system_fingerprint": "0.32.2-0.32.4-Linux-6.1.0-x86_64-with-glibc2.36-x86_64", "object": "chat.completion.chunk", "model": "default_model", "created": 1795989557, "choices": [{"index": 0, "finish_reason": null, "delta": {"role": "assistant", "content": " capital"}}]}"#,
    r#"{"id": "chatcmpl-627c03b7-eff5-4c62-b380-dfedc9b7773e", "system_fingerprint": "0.32.2-0.32.4-Linux-6.1.0-x86_64-with-glibc2.36-x86_64", "object": "chat.completion.chunk", "model": "default_model", "created": 1795989557, "choices": [{"index": 0, "finish_reason": null, "delta": {"role": "assistant", "content": " of"}}]}"#,
    r#"{"id": "chatcmpl-627c03b7-eff5-4c62-b380-dfedc9b7773e", "system_fingerprint": "0.32.2-0.32.4-Linux-6.1.0-x86_64-with-glibc2.36-x86_64", "object": "chat.completion.chunk", "model": "default_model", "created": 1795989557, "choices": [{"index": 0, "finish_reason": null, "delta": {"role": "assistant", "content": " France"}}]}"#,
    r#"{"id": "chatcmpl-627c03b7-eff5-4c62-b380-dfedc9b7773e", "system_fingerprint": "0.32.2-0.32.4-Linux-6.1.0-x86_64-with-glibc2.36-x86_64", "object": "chat.completion.chunk", "model": "default_model", "created": 1795989557, "choices": [{"index": 0, "finish_reason": null, "delta": {"role": "assistant", "content": " is"}}]}"#,
    r#"{"id": "chatcmpl-627c03b7-eff5-4c62-b380-dfedc9b7773e", "system_fingerprint": "0.32.2-0.32.4-Linux-6.1.0-x86_64-with-glibc2.36-x86_64", "object": "chat.completion.chunk", "model": "default_model", "created": 1795989557, "choices": [{"index": 0, "finish_reason": null, "delta": {"role": "assistant", "content": " Paris"}}]}"#,
    r#"{"id": "chatcmpl-627c03b7-eff5-4c62-b380-dfedc9b7773e", "system_fingerprint": "0.32.2-0.32.4-Linux-6.1.0-x86_64-with-glibc2.36-x86_64", "object": "chat.completion.chunk", "model": "default_model", "created": 1795989557, "choices": [{"index": 0, "finish_reason": null, "delta": {"role": "assistant", "content": "."}}]}"#,
    r#"{"id": "chatcmpl-627c03b7-eff5-4c62-b380-dfedc9b7773e", "system_fingerprint": "0.32.2-0.32.4-Linux-6.1.0-x86_64-with-glibc2.36-x86_64", "object": "chat.completion.chunk", "model": "default_model", "created": 1795989557, "choices": [{"index": 0, "finish_reason": "stop", "delta": {"role": "assistant"}}]}"#,
    r#"{"id": "chatcmpl-627c03b7-eff5-4c62-b380-dfedc9b7773e", "system_fingerprint": "0.32.2-0.32.4-Linux-6.1.0-x86_64-with-glibc2.36-x86_64", "object": "chat.completion", "model": "default_model", "created": 1795989557, "choices": [], "usage": {"prompt_tokens": 42, "completion_tokens": 8, "total_tokens": 50, "prompt_tokens_details": {"cached_tokens": 41}}}"#,
    r#"[DONE]"#,
];

/// llama-server's whole answer to the same request.
pub(crate) const LLAMA_TEXT_WHOLE: &str = r#"{"choices":[{"finish_reason":"stop","index":0,"message":{"role":"assistant","content":"The capital of France is Paris."}}],"created":1795989553,"model":"/models/SmolLM2-135M-Instruct.Q4_1.gguf","system_fingerprint":"b0-unknown","object":"chat.completion","usage":{"completion_tokens":8,"prompt_tokens":42,"total_tokens":50,"prompt_tokens_details":{"cached_tokens":0}},"id":"chatcmpl-ApqxVQKHnjWjwKVDkJqULxATP55UVqO7","timings":{"cache_n":0,"prompt_n":42,"prompt_ms":179.475,"prompt_per_token_ms":4.273214285714285,"prompt_per_second":234.0158796489762,"predicted_n":8,"predicted_ms":68.023,"predicted_per_token_ms":9.717571428571429,"predicted_per_second":102.90636990429708}}"#;

/// mlx_lm.server's whole answer to the same request.
pub(crate) const MLX_TEXT_WHOLE: &str = r#"{"id": "chatcmpl-fd0a1961-3be0-4251-9535-d9e2e237072d", "system_fingerprint": "0.32.2-0.32.4-Linux-6.1.0-x86_64-with-glibc2.36-x86_64", "object": "chat.completion", "model": "default_model", "created": 1795989553, "choices": [{"index": 0, "finish_reason": "stop", "message": {"role": "assistant", "content": "The capital of France is Paris."}}], "usage": {"prompt_tokens": 42, "completion_tokens": 8, "total_tokens": 50, "prompt_tokens_details": {"cached_tokens": 0}}}"#;

/// llama-server calling two tools in one turn after a sentence: each call's id and name come
/// in its first delta, its arguments in pieces split anywhere (here mid-key and mid-value).
pub(crate) const LLAMA_TOOL_STREAM: &[&str] = &[
    r#"{"choices":[{"finish_reason":null,"index":0,"delta":{"role":"assistant","content":null}}],"created":1795989553,"id":"chatcmpl-T","model":"m.gguf","object":"chat.completion.chunk"}"#,
    r#"{"choices":[{"finish_reason":null,"index":0,"delta":{"content":"Let me check."}}],"created":1795989553,"id":"chatcmpl-T","model":"m.gguf","object":"chat.completion.chunk"}"#,
    r#"{"choices":[{"finish_reason":null,"index":0,"delta":{"tool_calls":[{"index":0,"id":"KqWeather0","type":"function","function":{"name":"get_weather","arguments":"{\"ci"}}]}}],"created":1795989553,"id":"chatcmpl-T","model":"m.gguf","object":"chat.completion.chunk"}"#,
    r#"{"choices":[{"finish_reason":null,"index":0,"delta":{"tool_calls":[{"index":0,"function":{"arguments":"ty\": \"Par"}}]}}],"created":1795989553,"id":"chatcmpl-T","model":"m.gguf","object":"chat.completion.chunk"}"#,
    r#"{"choices":[{"finish_reason":null,"index":0,"delta":{"tool_calls":[{"index":0,"function":{"arguments":"is\"}"}}]}}],"created":1795989553,"id":"chatcmpl-T","model":"m.gguf","object":"chat.completion.chunk"}"#,
    r#"{"choices":[{"finish_reason":null,"index":0,"delta":{"tool_calls":[{"index":1,"id":"KqTime1","type":"function","function":{"name":"get_time","arguments":"{\"zone\":"}}]}}],"created":1795989553,"id":"chatcmpl-T","model":"m.gguf","object":"chat.completion.chunk"}"#,
    r#"{"choices":[{"finish_reason":null,"index":0,"delta":{"tool_calls":[{"index":1,"function":{"arguments":" \"CET\"}"}}]}}],"created":1795989553,"id":"chatcmpl-T","model":"m.gguf","object":"chat.completion.chunk"}"#,
    r#"{"choices":[{"finish_reason":"tool_calls","index":0,"delta":{}}],"created":1795989553,"id":"chatcmpl-T","model":"m.gguf","object":"chat.completion.chunk"}"#,
    r#"{"choices":[],"created":1795989553,"id":"chatcmpl-T","model":"m.gguf","object":"chat.completion.chunk","usage":{"completion_tokens":31,"prompt_tokens":210,"total_tokens":241,"prompt_tokens_details":{"cached_tokens":200}}}"#,
    "[DONE]",
];

/// The same answer whole, as llama-server gives it.
pub(crate) const LLAMA_TOOL_WHOLE: &str = r#"{"choices":[{"finish_reason":"tool_calls","index":0,"message":{"role":"assistant","content":"Let me check.","tool_calls":[{"type":"function","function":{"name":"get_weather","arguments":"{\"city\": \"Paris\"}"},"id":"KqWeather0"},{"type":"function","function":{"name":"get_time","arguments":"{\"zone\": \"CET\"}"},"id":"KqTime1"}]}}],"created":1795989553,"model":"m.gguf","object":"chat.completion","usage":{"completion_tokens":31,"prompt_tokens":210,"total_tokens":241,"prompt_tokens_details":{"cached_tokens":200}},"id":"chatcmpl-T"}"#;

/// mlx_lm.server calling a tool: the text streams first, then the finish chunk carries the
/// whole call (arguments written at once, an index and a uuid id), and here the usage on that
/// same chunk, with no separate usage chunk.
pub(crate) const MLX_TOOL_STREAM: &[&str] = &[
    r#"{"id": "chatcmpl-M", "object": "chat.completion.chunk", "model": "default_model", "created": 1795989557, "choices": [{"index": 0, "finish_reason": null, "delta": {"role": "assistant", "content": "Checking"}}]}"#,
    r#"{"id": "chatcmpl-M", "object": "chat.completion.chunk", "model": "default_model", "created": 1795989557, "choices": [{"index": 0, "finish_reason": null, "delta": {"role": "assistant", "content": " now."}}]}"#,
    r#"{"id": "chatcmpl-M", "object": "chat.completion.chunk", "model": "default_model", "created": 1795989557, "choices": [{"index": 0, "finish_reason": "tool_calls", "delta": {"role": "assistant", "tool_calls": [{"function": {"name": "read_file", "arguments": "{\"path\": \"src/main.rs\"}"}, "type": "function", "id": "5f0c2a3e-7f7e-4a51-9d2a-0c7c3f1e2b11", "index": 0}]}}], "usage": {"prompt_tokens": 120, "completion_tokens": 14, "total_tokens": 134, "prompt_tokens_details": {"cached_tokens": 96}}}"#,
    "[DONE]",
];
