//! A request row's texts, kept one after another in one allocation, come back as they went in.

use super::{Text, Texts, TEXTS};

/// A row's texts come back as they went in: absent apart from empty, each between its
/// neighbours' bounds, multi-byte text whole.
#[test]
fn texts_keep_each_value_and_its_absence() {
    let mut values = [None; TEXTS];
    values[Text::RequestId as usize] = Some("01ABC");
    values[Text::Method as usize] = Some("");
    values[Text::Model as usize] = Some("m\u{e9}t\u{e9}o");
    values[Text::Output as usize] = Some("sha256:00");
    values[Text::FallbackFrom as usize] = Some("llama; code=502");
    let texts = Texts::new(values);
    assert_eq!(
        texts.buf.len(),
        values.iter().flatten().map(|s| s.len()).sum::<usize>()
    );
    for text in [
        Text::RequestId,
        Text::Method,
        Text::Path,
        Text::Model,
        Text::Backend,
        Text::Engine,
        Text::Artifact,
        Text::Workload,
        Text::Sampling,
        Text::SamplingJson,
        Text::Output,
        Text::Error,
        Text::FallbackFrom,
    ] {
        assert_eq!(texts.get(text), values[text as usize], "{text:?}");
    }
}
