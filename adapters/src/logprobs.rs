//! The log-probabilities of an unstreamed chat completion (`choices[0].logprobs.content`), as
//! the equivalence rule reads them ([`switchyard_policy::compare::equivalence::Position`]).
//!
//! llama-server lists, per generated token, the token (`id`, decoded `token` text), its
//! `logprob` and its `top_logprobs`, most likely first. mlx_lm.server (0.32) lists the same
//! fields, but its entry's own `token` and `logprob` are the first of its `top_logprobs`, which
//! it does not sort (`mx.argpartition`): they are not necessarily the generated token, and its
//! texts are the tokenizer's pieces (`Ġthe`), not decoded text. So the generated token is taken
//! as the most likely listed one — right for a greedy answer, which is what replays are — and
//! tokens are matched by `id` (the same vocabulary for one model's GGUF and MLX conversion).
//! Where an engine lists nothing, the entry's own token stands.

use serde_json::Value;
use switchyard_policy::compare::equivalence::{Position, Token};

/// The generated tokens of a greedy chat completion `body`, with their alternatives; `Err` says
/// why there are none (no `logprobs`, or not in the shape above).
pub fn chat_logprobs(body: &[u8]) -> Result<Vec<Position>, String> {
    let answer: Value =
        serde_json::from_slice(body).map_err(|e| format!("the answer is not JSON: {e}"))?;
    let content = answer
        .pointer("/choices/0/logprobs/content")
        .ok_or("the answer carries no choices[0].logprobs.content")?
        .as_array()
        .ok_or("choices[0].logprobs.content is not a list")?;
    content
        .iter()
        .enumerate()
        .map(|(i, entry)| position(entry).map_err(|why| format!("token {i}: {why}")))
        .collect()
}

fn token(v: &Value) -> Result<(Token, f64), String> {
    let text = v
        .get("token")
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_owned();
    let id = v.get("id").and_then(Value::as_u64);
    if id.is_none() && text.is_empty() {
        return Err("a token without id or text".to_owned());
    }
    let logprob = v
        .get("logprob")
        .and_then(Value::as_f64)
        .ok_or("a token without a numeric logprob")?;
    Ok((Token { id, text }, logprob))
}

fn position(entry: &Value) -> Result<Position, String> {
    let top = match entry.get("top_logprobs") {
        None | Some(Value::Null) => Vec::new(),
        Some(Value::Array(top)) => top.iter().map(token).collect::<Result<Vec<_>, _>>()?,
        Some(_) => return Err("top_logprobs is not a list".to_owned()),
    };
    let chosen = top
        .iter()
        .filter(|(_, lp)| !lp.is_nan())
        .max_by(|a, b| a.1.total_cmp(&b.1))
        .cloned();
    let (token, logprob) = match chosen {
        Some(best) => best,
        None => token(entry)?,
    };
    Ok(Position {
        token,
        logprob,
        top,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use switchyard_policy::compare::equivalence::{judge_tokens, Equivalence, Rule};

    const LLAMA: &str = include_str!("../tests/data/llama-server-chat-logprobs.json");
    const MLX: &str = include_str!("../tests/data/mlx-lm-chat-logprobs.json");

    #[test]
    fn both_engines_answers_parse_and_their_tokens_match_by_id() {
        let llama = chat_logprobs(LLAMA.as_bytes()).unwrap();
        let mlx = chat_logprobs(MLX.as_bytes()).unwrap();
        assert_eq!((llama.len(), mlx.len()), (8, 8));
        // "The primary colors are": the same ids, though the texts are decoded on one side and
        // tokenizer pieces on the other.
        for i in 0..4 {
            assert!(
                llama[i].token.same(&mlx[i].token),
                "{i}: {:?} {:?}",
                llama[i],
                mlx[i]
            );
        }
        assert_eq!(llama[1].token.text, " primary");
        assert_eq!(mlx[1].token.text, "\u{120}primary");
        // mlx_lm.server's own first entry is not its choice: the most likely listed one is.
        let first: Value = serde_json::from_str(MLX).unwrap();
        let listed = &first["choices"][0]["logprobs"]["content"][0];
        assert!(mlx[0].logprob >= listed["logprob"].as_f64().unwrap());
        for p in llama.iter().chain(&mlx) {
            assert!(
                p.top.iter().all(|(_, lp)| *lp <= p.logprob + 1e-12),
                "{p:?}"
            );
        }
    }

    #[test]
    fn the_same_weights_on_two_engines_are_judged_by_the_rule() {
        // The bundled Q4_1 GGUF on llama-server against its MLX conversion: they part after
        // "The primary colors are:" (llama.cpp goes on with a line break, MLX with " Red").
        let llama = chat_logprobs(LLAMA.as_bytes()).unwrap();
        let mlx = chat_logprobs(MLX.as_bytes()).unwrap();
        let j = judge_tokens(&llama, &mlx, &Rule::default());
        let d = j.divergence.as_ref().expect("the answers differ");
        assert_eq!(j.positions, d.at + 1);
        assert!(j.prefix.starts_with("The primary colors are"), "{j:?}");
        assert!(j.mean_kl.is_finite() && j.mean_kl < 0.05, "{j:?}");
        assert_ne!(j.verdict, Equivalence::Identical);
    }

    #[test]
    fn answers_without_logprobs_are_refused_with_the_reason() {
        assert!(chat_logprobs(b"not json").unwrap_err().contains("not JSON"));
        let plain = br#"{"choices":[{"message":{"content":"hi"}}]}"#;
        assert!(chat_logprobs(plain)
            .unwrap_err()
            .contains("no choices[0].logprobs"));
        let odd = br#"{"choices":[{"logprobs":{"content":[{"token":"a"}]}}]}"#;
        assert!(chat_logprobs(odd).unwrap_err().contains("token 0"));
        let odd =
            br#"{"choices":[{"logprobs":{"content":[{"id":1,"logprob":-1,"top_logprobs":5}]}}]}"#;
        assert!(chat_logprobs(odd).is_err());
        let bare =
            br#"{"choices":[{"logprobs":{"content":[{"id":1,"token":"a","logprob":-0.5}]}}]}"#;
        let p = chat_logprobs(bare).unwrap();
        assert_eq!(
            (p[0].token.id, p[0].logprob, p[0].top.len()),
            (Some(1), -0.5, 0)
        );
    }
}
