//! Turning rendered role sections into `prompts` messages (§1.2.1, §3).
//!
//! Attachment directives are found here, after rendering, so that directives produced
//! by loops and variables work. Jinja comments are gone by then, which is why a
//! directive inside `{# … #}` is never seen.

use std::sync::LazyLock;

use minijinja::Value;
use regex::Regex;

use crate::bundle::Role;
use crate::provider::exchange::{Content, Message, Part};

/// Builds the message for one rendered role section, or `None` when it is empty.
///
/// Every line that is a whole attachment directive (§1.2.1: column 0, `https` only) is
/// removed from the text and becomes a content part. What remains, trimmed and with CRLF
/// line endings turned into `\n`, is the text.
/// Without attachments the content is the text; with attachments it is a list of parts:
/// the text part first (when the text is not empty), then the attachments in the order
/// they appear. A section with no text and no attachments gives `None`: the spec has no
/// use for an empty message and providers reject them.
pub(crate) fn build_message(role: Role, rendered: &str) -> Option<Message> {
    let (text, attachments) = split_attachments(rendered);
    // A file saved with CRLF line endings renders CRLF text; the model gets `\n` only.
    let text = text.trim().replace("\r\n", "\n");
    let content = if attachments.is_empty() {
        if text.is_empty() {
            return None;
        }
        Content::Text(text)
    } else {
        let text_part = (!text.is_empty()).then_some(Part::Text(text));
        Content::Parts(
            text_part
                .into_iter()
                .chain(attachments.iter().map(Attachment::to_part))
                .collect(),
        )
    };
    Some(Message::new(role, content))
}

/// The message as the `prompts` variable shows it (§3): `{"role", "content"}`, the
/// content a string or a list of OpenAI-style parts.
pub(crate) fn message_value(message: &Message) -> Value {
    let content = match &message.content {
        Content::Text(text) => Value::from(text.as_str()),
        Content::Parts(parts) => parts.iter().map(part_value).collect(),
    };
    Value::from_pairs([
        ("role", Value::from(message.role.as_str())),
        ("content", content),
    ])
}

/// `{"type": "text", "text": …}` or `{"type": kind, kind: {"url": url}}`.
fn part_value(part: &Part) -> Value {
    let (kind, url) = match part {
        Part::Text(text) => {
            return Value::from_pairs([
                ("type", Value::from("text")),
                ("text", Value::from(text.as_str())),
            ]);
        }
        Part::ImageUrl(url) => ("image_url", url),
        Part::AudioInput(url) => ("audio_input", url),
        Part::File(url) => ("file", url),
    };
    Value::from_pairs([
        ("type", Value::from(kind)),
        (
            kind,
            Value::from_pairs([("url", Value::from(url.as_str()))]),
        ),
    ])
}

/// One `@<kind> <url>` directive.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Attachment<'a> {
    /// `image_url`, `audio_input` or `file`: also the part's `type` and its inner key.
    kind: &'a str,
    url: &'a str,
}

impl Attachment<'_> {
    /// The content part.
    fn to_part(&self) -> Part {
        let url = self.url.to_owned();
        match self.kind {
            "image_url" => Part::ImageUrl(url),
            "audio_input" => Part::AudioInput(url),
            _ => Part::File(url),
        }
    }
}

/// The spec's line-scan regex (§1.2.1), applied to one line without its `\n`.
static DIRECTIVE: LazyLock<Regex> = LazyLock::new(|| {
    // A literal known to compile: a failure here is a bug in this file, not bad input.
    Regex::new(r"^@(?P<kind>image_url|audio_input|file)\s+(?P<url>https://\S+)\s*$")
        .expect("the attachment regex compiles")
});

/// Splits `rendered` into the text without directive lines and the directives in order.
///
/// Kept lines keep their own line endings, so CRLF text stays CRLF.
fn split_attachments(rendered: &str) -> (std::borrow::Cow<'_, str>, Vec<Attachment<'_>>) {
    // Most sections have no directive at all; skip the per-line scan for them.
    if !rendered.starts_with('@') && !rendered.contains("\n@") {
        return (rendered.into(), Vec::new());
    }
    let mut text = String::with_capacity(rendered.len());
    let mut attachments = Vec::new();
    for line in rendered.split_inclusive('\n') {
        let body = line.strip_suffix('\n').unwrap_or(line);
        match DIRECTIVE.captures(body) {
            Some(caps) => {
                if let (Some(kind), Some(url)) = (caps.name("kind"), caps.name("url")) {
                    attachments.push(Attachment {
                        kind: kind.as_str(),
                        url: url.as_str(),
                    });
                }
            }
            None => text.push_str(line),
        }
    }
    (text.into(), attachments)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The message as JSON text, for readable assertions.
    fn json(role: Role, rendered: &str) -> Option<String> {
        build_message(role, rendered).map(|m| serde_json::to_string(&message_value(&m)).unwrap())
    }

    #[test]
    fn plain_text() {
        assert_eq!(
            json(Role::User, "How are you?").as_deref(),
            Some(r#"{"role":"user","content":"How are you?"}"#)
        );
        assert_eq!(
            json(Role::ToolResult, "42").as_deref(),
            Some(r#"{"role":"tool_result","content":"42"}"#)
        );
    }

    #[test]
    fn text_is_trimmed() {
        assert_eq!(
            json(Role::System, "\n\n  Be brief.\n  Be kind.  \n\n").as_deref(),
            Some(r#"{"role":"system","content":"Be brief.\n  Be kind."}"#)
        );
    }

    #[test]
    fn empty_section_is_dropped() {
        assert_eq!(json(Role::User, ""), None);
        assert_eq!(json(Role::User, " \n\t\r\n "), None);
    }

    #[test]
    fn each_attachment_kind() {
        for kind in ["image_url", "audio_input", "file"] {
            let rendered = format!("Look:\n@{kind} https://example.com/x\n");
            let expected = format!(
                r#"{{"role":"user","content":[{{"type":"text","text":"Look:"}},{{"type":"{kind}","{kind}":{{"url":"https://example.com/x"}}}}]}}"#
            );
            assert_eq!(json(Role::User, &rendered), Some(expected), "{kind}");
        }
    }

    #[test]
    fn directive_not_at_column_zero_stays_text() {
        assert_eq!(
            json(Role::User, " @image_url https://example.com/a.png").as_deref(),
            Some(r#"{"role":"user","content":"@image_url https://example.com/a.png"}"#)
        );
        assert_eq!(
            json(Role::User, "see @file https://example.com/a.pdf").as_deref(),
            Some(r#"{"role":"user","content":"see @file https://example.com/a.pdf"}"#)
        );
    }

    #[test]
    fn http_and_other_lines_stay_text() {
        for line in [
            "@image_url http://example.com/a.png",
            "@image_url https://example.com/a.png trailing words",
            "@video https://example.com/a.mp4",
            "@image_url",
            "@image_urlhttps://example.com/a.png",
        ] {
            let expected = serde_json::json!({"role": "user", "content": line}).to_string();
            assert_eq!(json(Role::User, line), Some(expected), "{line}");
        }
    }

    #[test]
    fn trailing_whitespace_is_allowed() {
        assert_eq!(
            json(
                Role::User,
                "Hi\n@image_url\thttps://example.com/a.png  \t\nBye"
            )
            .as_deref(),
            Some(
                r#"{"role":"user","content":[{"type":"text","text":"Hi\nBye"},{"type":"image_url","image_url":{"url":"https://example.com/a.png"}}]}"#
            )
        );
    }

    #[test]
    fn several_attachments_keep_their_order() {
        let rendered = "@file https://e.com/1.pdf\nFirst\n@image_url https://e.com/2.png\n\
                        Second\n@audio_input https://e.com/3.mp3\n@image_url https://e.com/4.png";
        assert_eq!(
            json(Role::Developer, rendered).as_deref(),
            Some(concat!(
                r#"{"role":"developer","content":["#,
                r#"{"type":"text","text":"First\nSecond"},"#,
                r#"{"type":"file","file":{"url":"https://e.com/1.pdf"}},"#,
                r#"{"type":"image_url","image_url":{"url":"https://e.com/2.png"}},"#,
                r#"{"type":"audio_input","audio_input":{"url":"https://e.com/3.mp3"}},"#,
                r#"{"type":"image_url","image_url":{"url":"https://e.com/4.png"}}"#,
                "]}"
            ))
        );
    }

    #[test]
    fn attachment_only_message_has_no_text_part() {
        assert_eq!(
            json(Role::User, "\n@image_url https://e.com/a.png\n\n").as_deref(),
            Some(
                r#"{"role":"user","content":[{"type":"image_url","image_url":{"url":"https://e.com/a.png"}}]}"#
            )
        );
    }

    #[test]
    fn crlf_line_endings() {
        assert_eq!(
            json(
                Role::Assistant,
                "One\r\n@image_url https://e.com/a.png\r\nTwo\r\n"
            )
            .as_deref(),
            Some(
                r#"{"role":"assistant","content":[{"type":"text","text":"One\nTwo"},{"type":"image_url","image_url":{"url":"https://e.com/a.png"}}]}"#
            )
        );
    }

    #[test]
    fn value_is_a_map_usable_from_templates() {
        let msg =
            message_value(&build_message(Role::User, "Hi\n@file https://e.com/a.pdf").unwrap());
        let env = minijinja::Environment::new();
        let out = env
            .render_str(
                "{{ m.role }}|{{ m.content[0].text }}|{{ m.content[1].file.url }}",
                minijinja::context! { m => msg },
            )
            .unwrap();
        assert_eq!(out, "user|Hi|https://e.com/a.pdf");
    }
}
