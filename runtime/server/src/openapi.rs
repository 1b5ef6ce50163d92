//! The server's OpenAPI 3.0 description (`openapi.json` beside `src/`, served at
//! `GET /openapi.json`): every route, request body, response and error shape. It is written by
//! hand; the tests below keep its request schemas field-for-field equal to the structs in
//! `protocol`, and `scripts/schemathesis.sh` checks the running server against it.

use axum::http::header;
use axum::response::{IntoResponse, Response};

/// The document, as served.
pub const DOCUMENT: &str = include_str!("../openapi.json");

pub async fn handler() -> Response {
    ([(header::CONTENT_TYPE, "application/json")], DOCUMENT).into_response()
}

#[cfg(test)]
mod tests {
    use super::DOCUMENT;
    use crate::protocol::{ChatMessageIn, ChatRequest, CompletionRequest, Sampling};
    use serde::de::{self, Deserialize, Deserializer, Visitor};
    use serde_json::Value;
    use std::collections::BTreeSet;

    /// A deserializer that only records the field names a struct asks for, then fails.
    struct FieldNames<'a>(&'a mut Vec<&'static str>);

    impl<'de> Deserializer<'de> for FieldNames<'_> {
        type Error = de::value::Error;
        fn deserialize_any<V: Visitor<'de>>(self, _: V) -> Result<V::Value, Self::Error> {
            Err(de::Error::custom("not a struct"))
        }
        fn deserialize_struct<V: Visitor<'de>>(self, _: &'static str, fields: &'static [&'static str], _: V) -> Result<V::Value, Self::Error> {
            self.0.extend_from_slice(fields);
            Err(de::Error::custom("fields recorded"))
        }
        serde::forward_to_deserialize_any! {
            bool i8 i16 i32 i64 i128 u8 u16 u32 u64 u128 f32 f64 char str string bytes byte_buf option unit
            unit_struct newtype_struct seq tuple tuple_struct map enum identifier ignored_any
        }
    }

    fn fields<'de, T: Deserialize<'de>>() -> BTreeSet<String> {
        let mut v = vec![];
        let _ = T::deserialize(FieldNames(&mut v));
        v.into_iter().map(String::from).collect()
    }

    fn schema_props(doc: &Value, name: &str) -> BTreeSet<String> {
        doc["components"]["schemas"][name]["properties"].as_object().unwrap_or_else(|| panic!("schema {name} has no properties")).keys().cloned().collect()
    }

    #[test]
    fn request_schemas_list_exactly_the_fields_the_server_reads() {
        let doc: Value = serde_json::from_str(DOCUMENT).expect("openapi.json is JSON");
        assert_eq!(doc["openapi"], "3.0.3");
        let sampling = fields::<Sampling>();
        assert!(sampling.len() > 10, "the field recorder works: {sampling:?}");
        let with_sampling = |mut s: BTreeSet<String>| {
            s.extend(sampling.iter().cloned());
            s
        };
        assert_eq!(schema_props(&doc, "CompletionRequest"), with_sampling(fields::<CompletionRequest>()));
        assert_eq!(schema_props(&doc, "ChatCompletionRequest"), with_sampling(fields::<ChatRequest>()));
        assert_eq!(schema_props(&doc, "ChatMessage"), fields::<ChatMessageIn>());
    }

    #[test]
    fn every_route_is_described_and_every_reference_resolves() {
        let doc: Value = serde_json::from_str(DOCUMENT).unwrap();
        let paths = doc["paths"].as_object().unwrap();
        for p in ["/v1/completions", "/v1/chat/completions", "/v1/models", "/health", "/metrics", "/openapi.json", "/admin/plugins", "/admin/engine"] {
            assert!(paths.contains_key(p), "{p} is not described");
        }
        fn refs(v: &Value, out: &mut Vec<String>) {
            match v {
                Value::Object(m) => m.iter().for_each(|(k, x)| if k == "$ref" { out.push(x.as_str().unwrap().to_string()) } else { refs(x, out) }),
                Value::Array(a) => a.iter().for_each(|x| refs(x, out)),
                _ => {}
            }
        }
        let mut all = vec![];
        refs(&doc, &mut all);
        assert!(!all.is_empty());
        for r in all {
            let name = r.strip_prefix("#/components/schemas/").unwrap_or_else(|| panic!("unexpected reference {r}"));
            assert!(doc["components"]["schemas"].get(name).is_some(), "{r} does not resolve");
        }
    }
}
